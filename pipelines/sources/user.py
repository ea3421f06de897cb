"""Your own tool calls as a source of ``ingest``: a call log, JSON-lines conversations, or a Hugging Face dataset.

Declared in ``params.yaml`` under ``ingest.user_sources`` (one :class:`UserSource` each)::

    ingest:
      user_sources:
        - name: mylog                  # the records' source; its held-out conversations are the benchmark `mylog`
          kind: openai_chat            # JSON lines {"tools", "messages"} (what `ooospec serve --call-log` writes)
          path: data/user/calls.jsonl* # a file, a folder of *.jsonl, or a glob (rotated logs: calls.jsonl.1, ...)
        - name: xlam
          kind: hf                     # anything datasets.load_dataset opens, streamed
          path: Salesforce/xlam-function-calling-60k   # a Hub id (needs `revision`) or local parquet/json/jsonl/arrow
          revision: 26d14ebfe18b1f7b524bd39b404b50af5dc97866
          split: train
          schema: xlam                 # the row layout: openai_chat | xlam | hermes | glaive (sources/layouts.py)
          limit: 5000

Every conversation gets a key (:func:`~ooospec.pipelines.sources.openai_chat.conversation_key`) and lands whole on
one side: ``heldout_fraction`` of the conversations (by a hash of the key) get split ``heldout`` -- ``dedupe`` makes
them the benchmark named like the source, and keeps every training record that shares a request with them out of
training -- the rest split ``train``. A record larger than ``max_record_chars`` (a 10 MB value, a pasted file) is
a ``record_too_large`` reject; the rest is validated by ``ingest`` exactly as the built-in sources are.
"""

from __future__ import annotations

import glob
import hashlib
import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ooospec.pipelines.records import Reject
from ooospec.pipelines.sources import SOURCES
from ooospec.pipelines.sources.layouts import LAYOUTS
from ooospec.pipelines.sources.openai_chat import (
    RAW_KEEP_CHARS,
    BadConversation,
    conversation_records,
    parse_file,
)

KINDS = ("openai_chat", "hf")
RECORD_TOO_LARGE = "record_too_large"
UNREADABLE_ROW = "unreadable_row"
HUB_COMMIT = re.compile(r"^[0-9a-f]{40}$")
LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".arrow": "arrow", ".csv": "csv"}
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


class SourceUnavailable(RuntimeError):
    """A user source that cannot be opened at all (missing file, unknown dataset, no network); names the source."""


@dataclass(frozen=True)
class UserSource:
    name: str                                   # the records' source and the held-out benchmark's name
    kind: Literal["openai_chat", "hf"]
    path: str                                   # file / folder / glob (openai_chat); Hub id or local files (hf)
    revision: str | None = None                 # hf Hub id: the commit to read (required: data must not move)
    split: str = "train"                        # hf: the dataset split to read
    config: str | None = None                   # hf: the dataset config name
    schema: Literal["openai_chat", "xlam", "hermes", "glaive"] = "openai_chat"   # the row layout
    limit: int | None = None                    # first N conversations (rows / lines), None = all
    heldout_fraction: float = 0.1               # conversations held out as the benchmark `name`
    on_reject: Literal["skip", "fail"] = "skip"
    max_reject_fraction: float = 0.05
    max_record_chars: int = 100_000             # a record's JSON past this is a record_too_large reject
    license: str = "user data"                  # for the data cards

    def __post_init__(self) -> None:
        problems = []
        if not _NAME.match(self.name or ""):
            problems.append(f"name {self.name!r} must be lower-case letters, digits, '_', '-', '.'")
        if self.name in SOURCES:
            problems.append(f"name {self.name!r} is a built-in source")
        if self.kind == "openai_chat" and self.schema != "openai_chat":
            problems.append(f"kind openai_chat reads schema openai_chat only, got {self.schema!r} (use kind: hf)")
        if not 0.0 <= self.heldout_fraction < 1.0:
            problems.append(f"heldout_fraction must be in [0, 1), got {self.heldout_fraction}")
        if self.limit is not None and self.limit <= 0:
            problems.append(f"limit must be > 0 or null, got {self.limit}")
        if self.max_record_chars <= 0:
            problems.append(f"max_record_chars must be > 0, got {self.max_record_chars}")
        if problems:
            raise ValueError(f"ingest.user_sources {self.name!r}: " + "; ".join(problems))

    @property
    def upstream(self) -> str:
        return f"{self.path}@{self.revision}" if self.revision else self.path


def split_of(source: str, heldout_fraction: float):
    """``key -> "heldout" | "train"`` by the hash of ``source:key`` (the record's ``meta.dialogue``)."""
    def split(key: str) -> str:
        digest = hashlib.sha256(f"{source}:{key}".encode()).hexdigest()[:16]
        return "heldout" if int(digest, 16) / 2 ** 64 < heldout_fraction else "train"
    return split


def local_files(pattern: str) -> list[Path]:
    """The JSON-lines files a path names: a file, a folder's ``*.jsonl`` (and rotated ``*.jsonl.N``), or a glob."""
    p = Path(pattern)
    if p.is_dir():
        return sorted(f for f in p.iterdir() if f.is_file() and re.search(r"\.jsonl(\.\d+)?$", f.name))
    if p.is_file():
        return [p]
    return sorted(Path(f) for f in glob.glob(pattern) if Path(f).is_file())


def too_large(item: dict, limit: int) -> Reject | None:
    size = len(json.dumps(item, ensure_ascii=False))
    if size <= limit:
        return None
    return Reject(item["source"], item["split"], item["id"].split("/", 2)[-1], RECORD_TOO_LARGE,
                  f"record is {size} characters > max_record_chars {limit} (a huge value or pasted file?)",
                  raw=json.dumps(item, ensure_ascii=False)[:RAW_KEEP_CHARS])


def parse(spec: UserSource) -> Iterator[dict | Reject]:
    """Records and Rejects of one user source. Raises :class:`SourceUnavailable` when it cannot be opened."""
    items = openai_chat_items(spec) if spec.kind == "openai_chat" else hf_items(spec)
    for item in items:
        if not isinstance(item, Reject):
            item["meta"]["user_source"] = True          # dedupe: its held-out split is a benchmark of its own
            if (rej := too_large(item, spec.max_record_chars)) is not None:
                item = rej
        yield item


def openai_chat_items(spec: UserSource) -> Iterator[dict | Reject]:
    files = local_files(spec.path)
    if not files:
        raise SourceUnavailable(f"user source {spec.name!r}: no file matches path {spec.path!r} (log some traffic "
                                "first: `ooospec serve --call-log FILE`, or OOOSPEC_CALL_LOG=FILE for vLLM)")
    split = split_of(spec.name, spec.heldout_fraction)
    left = spec.limit
    for f in files:
        read = yield from parse_file(f, spec.name, split, label=f.name, limit=left)
        if left is not None:
            left -= read
            if left <= 0:
                return


def hf_rows(spec: UserSource):
    """The rows of an ``hf`` source, streamed by ``datasets.load_dataset`` (a Hub id at ``revision``, or local files
    by extension); raises :class:`SourceUnavailable` naming the source when datasets cannot open it."""
    import datasets

    local = local_files(spec.path) if not Path(spec.path).is_dir() else sorted(
        f for f in Path(spec.path).rglob("*") if f.suffix in LOCAL_BUILDERS)
    try:
        if local:
            builders = {LOCAL_BUILDERS.get(f.suffix) for f in local}
            if len(builders) != 1 or None in builders:
                raise SourceUnavailable(f"user source {spec.name!r}: files of one format please "
                                        f"({sorted(LOCAL_BUILDERS)}), got {[f.name for f in local[:5]]}")
            return datasets.load_dataset(builders.pop(), data_files=[str(f) for f in local], split=spec.split,
                                         streaming=True)
        if Path(spec.path).exists() or spec.path.startswith((".", "/")):
            raise SourceUnavailable(f"user source {spec.name!r}: no data file under {spec.path!r} "
                                    f"(looked for {sorted(LOCAL_BUILDERS)})")
        if not spec.revision:
            raise SourceUnavailable(f"user source {spec.name!r}: Hub dataset {spec.path!r} needs a pinned "
                                    "`revision` (a commit sha from the dataset's history), so that the data "
                                    "cannot change under the pipeline")
        return datasets.load_dataset(spec.path, spec.config, revision=spec.revision, split=spec.split,
                                     streaming=True)
    except SourceUnavailable:
        raise
    except Exception as e:  # noqa: BLE001 - datasets raises many types (network, missing split, bad file)
        raise SourceUnavailable(f"user source {spec.name!r}: datasets could not open {spec.path!r} "
                                f"(split {spec.split!r}): {type(e).__name__}: {str(e)[:300]}") from None


def hf_items(spec: UserSource) -> Iterator[dict | Reject]:
    """Each row through its layout mapper, then :func:`conversation_records`; a row the mapper cannot read is a
    Reject naming ``row N`` and the field, a file datasets cannot read a :class:`SourceUnavailable`."""
    mapper = LAYOUTS[spec.schema]
    split = split_of(spec.name, spec.heldout_fraction)
    rows = iter(hf_rows(spec))
    for i in itertools.count():
        if spec.limit is not None and i >= spec.limit:
            return
        try:
            row = next(rows)
        except StopIteration:
            return
        except Exception as e:  # noqa: BLE001 - a file datasets fails on half way (a line that is not JSON)
            raise SourceUnavailable(f"user source {spec.name!r}: datasets failed reading {spec.path!r} after "
                                    f"row {i}: {type(e).__name__}: {str(e)[:300]}") from None
        where = f"row{i}"
        try:
            conversation = mapper(dict(row))
        except BadConversation as e:
            yield Reject(spec.name, "?", where, UNREADABLE_ROW, f"{spec.path} row {i} ({spec.schema}): {e}"[:400],
                         raw={k: str(v)[:500] for k, v in dict(row).items()})
            continue
        for item in conversation_records(conversation, spec.name, where, split):
            if isinstance(item, Reject):
                item = Reject(item.source, item.split, item.local_id, item.reason,
                              f"{spec.path} row {i} ({spec.schema}): {item.detail}", raw=item.raw)
            yield item
