"""One parser module per raw source. Each exposes::

    SOURCE: str                         # short name used in record ids ("apibank")
    LICENSE: str                        # as stated upstream
    UPSTREAM: str                       # "owner/repo@commit" (several joined by "; ")
    def parse(root: Path) -> Iterator[dict | Reject]
        # root = the source's folder under ingest.source, e.g. <datasets>/apibank/raw
        # yields records (pipelines.records.make_record) or Reject(source, split, local_id, reason, detail)

The parsers only translate; schema validation of tools and calls is done once, by the ingest stage
(``records.validate_record``), so every source gets the same reject reasons for the same faults.
"""

from __future__ import annotations

import importlib

# source name -> (module, folder under ingest.source)
SOURCES: dict[str, tuple[str, str]] = {
    "apibank": ("ooospec.pipelines.sources.apibank", "apibank/raw"),
    "toolalpaca": ("ooospec.pipelines.sources.toolalpaca", "toolalpaca/raw"),
    "bfcl": ("ooospec.pipelines.sources.bfcl", "bfcl/raw"),
    "sealtools": ("ooospec.pipelines.sources.sealtools", "sealtools/raw"),
    "glaive": ("ooospec.pipelines.sources.glaive", "glaive_toolcall/raw"),
    "toolrl": ("ooospec.pipelines.sources.toolrl", "toolrl/raw"),
}


def load(name: str):
    if name not in SOURCES:
        raise KeyError(f"unknown source {name!r}; known: {sorted(SOURCES)}")
    return importlib.import_module(SOURCES[name][0])
