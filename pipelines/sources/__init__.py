"""One parser module per raw source. Each exposes::

    SOURCE: str                         # short name used in record ids ("apibank")
    LICENSE: str                        # as stated upstream
    UPSTREAM: str                       # "owner/repo@commit" (several joined by "; ")
    def parse(root: Path) -> Iterator[dict | Reject]
        # root = the source's folder under ingest.source, e.g. <datasets>/apibank/raw
        # yields records (pipelines.records.make_record) or Reject(source, split, local_id, reason, detail)

The parsers only translate; schema validation of tools and calls is done once, by the ingest stage
(``records.validate_record``), so every source gets the same reject reasons for the same faults. Next to them:
``pytypes`` (type strings -> JSON Schema, and the coercion of gold values every parser uses), ``apibank_text``
(API-Bank's text spellings) and ``fetch`` (the download of the raw files).
"""

from __future__ import annotations

import importlib

# parser module -> its folder under ingest.source; the source's name is the module's own name
_PARSERS: dict[str, str] = {
    "ooospec.pipelines.sources.apibank": "apibank/raw",
    "ooospec.pipelines.sources.toolalpaca": "toolalpaca/raw",
    "ooospec.pipelines.sources.bfcl": "bfcl/raw",
    "ooospec.pipelines.sources.sealtools": "sealtools/raw",
    "ooospec.pipelines.sources.glaive": "glaive_toolcall/raw",
    "ooospec.pipelines.sources.toolrl": "toolrl/raw",
}
# source name -> (module, folder under ingest.source)
SOURCES: dict[str, tuple[str, str]] = {module.rpartition(".")[2]: (module, folder)
                                       for module, folder in _PARSERS.items()}


def load(name: str):
    if name not in SOURCES:
        raise KeyError(f"unknown source {name!r}; known: {sorted(SOURCES)}")
    return importlib.import_module(SOURCES[name][0])
