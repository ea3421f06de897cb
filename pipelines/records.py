"""The one record format every stage reads and writes, and its validation.

A record is a plain JSON object, the shape chat templates take::

    {"id": "apibank/test-l1/AddAgenda-level-1-1.jsonl#3",   # stable: source/split/local id
     "source": "apibank", "split": "test-l1",
     "tools": [{"type": "function", "function": {"name": ..., "description": ..., "parameters": <JSON Schema>}}],
     "messages": [{"role": "system"|"user"|"assistant"|"tool", "content": str}, ...],
     "calls": [{"name": ..., "arguments": {...}}],             # the gold call(s) that answer the last message
     "meta": {...}}                                            # optional: dialogue id, allowed values, language ...

``meta`` keys used across stages:
  ``dialogue``          id of the source dialogue the record was cut from (dedupe removes siblings of eval records)
  ``allowed``           BFCL: per call, per argument, the list of accepted values (the evaluation needs them)
  ``lang``              natural language of the request, when not English

A record that cannot be parsed or fails validation becomes a :class:`Reject` and goes to the rejects file.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator

ROLES = ("system", "user", "assistant", "tool")

# reject reasons shared by every source (a source parser may add its own, e.g. "unparseable_call")
INVALID_TOOL_SCHEMA = "invalid_tool_schema"
CALL_UNKNOWN_TOOL = "call_unknown_tool"
CALL_SCHEMA_VIOLATION = "call_schema_violation"
MALFORMED_RECORD = "malformed_record"
NO_GOLD_CALL = "no_gold_call"


@dataclass(frozen=True)
class Reject:
    """A raw item that did not become a record. ``reason`` is a short snake_case key counted in the stats."""

    source: str
    split: str
    local_id: str
    reason: str
    detail: str = ""
    raw: Any = field(default=None, compare=False)

    def to_json(self) -> dict:
        d = asdict(self)
        d["id"] = f"{self.source}/{self.split}/{self.local_id}"
        # the raw item is kept for inspection; anything JSON cannot hold is stored as its repr
        d["raw"] = json.loads(json.dumps(self.raw, default=repr, ensure_ascii=False))
        return d


def tool(name: str, description: str, parameters: dict) -> dict:
    """An OpenAI-style tool entry, as chat templates take it."""
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def call(name: str, arguments: dict) -> dict:
    return {"name": name, "arguments": arguments}


def make_record(source: str, split: str, local_id: str, tools: list[dict], messages: list[dict],
                calls: list[dict], meta: dict | None = None) -> dict:
    rec = {"id": f"{source}/{split}/{local_id}", "source": source, "split": split, "tools": tools,
           "messages": messages, "calls": calls}
    if meta:
        rec["meta"] = meta
    return rec


def tool_by_name(record: dict) -> dict[str, dict]:
    return {t["function"]["name"]: t["function"] for t in record["tools"]}


@functools.lru_cache(maxsize=16384)
def _schema_problem(schema_json: str) -> str | None:
    """Checking a schema against the metaschema is slow; tools repeat across records, so cache by content."""
    try:
        Draft202012Validator.check_schema(json.loads(schema_json))
    except jsonschema.SchemaError as e:
        return e.message[:200]
    return None


@functools.lru_cache(maxsize=16384)
def _validator(schema_json: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads(schema_json))


def validate_record(rec: dict) -> tuple[str, str] | None:
    """Return ``(reason, detail)`` if the record is not usable, else None.

    Checks the shape, that every tool's ``parameters`` is a valid JSON Schema (Draft 2020-12) of type object,
    and that every gold call names a listed tool and its arguments validate against that tool's schema.
    """
    try:
        for key in ("id", "source", "split", "tools", "messages", "calls"):
            if key not in rec:
                return MALFORMED_RECORD, f"missing field {key!r}"
        if not rec["messages"] or any(m.get("role") not in ROLES or not isinstance(m.get("content"), str)
                                      for m in rec["messages"]):
            return MALFORMED_RECORD, "messages must be a non-empty list of {role, content: str}"
        if not rec["calls"]:
            return NO_GOLD_CALL, "record has no gold call"
        tools = {}
        for t in rec["tools"]:
            fn = t.get("function", {}) if t.get("type") == "function" else {}
            name = fn.get("name")
            if not isinstance(name, str) or not name:
                return MALFORMED_RECORD, f"tool without a name: {str(t)[:120]}"
            params = fn.get("parameters")
            if not isinstance(params, dict) or params.get("type") != "object":
                return INVALID_TOOL_SCHEMA, f"tool {name!r}: parameters must be a JSON Schema of type object"
            problem = _schema_problem(canonical_json(params))
            if problem:
                return INVALID_TOOL_SCHEMA, f"tool {name!r}: {problem}"
            tools[name] = params
        for c in rec["calls"]:
            name, args = c.get("name"), c.get("arguments")
            if name not in tools:
                return CALL_UNKNOWN_TOOL, f"call {name!r} not in tools {sorted(tools)[:8]}"
            if not isinstance(args, dict):
                return CALL_SCHEMA_VIOLATION, f"call {name!r}: arguments must be an object"
            err = jsonschema.exceptions.best_match(_validator(canonical_json(tools[name])).iter_errors(args))
            if err is not None:
                path = "/".join(str(p) for p in err.absolute_path) or "<root>"
                return CALL_SCHEMA_VIOLATION, f"call {name!r} at {path}: {err.message[:200]}"
    except Exception as e:  # a record shaped so oddly that the checks themselves fail
        return MALFORMED_RECORD, f"{type(e).__name__}: {e}"[:300]
    return None


# ---------------------------------------------------------------- canonical forms (dedupe, hashing)

def norm_text(s: str) -> str:
    """Unicode NFKC, casefold, collapse whitespace."""
    return " ".join(unicodedata.normalize("NFKC", s).casefold().split())


def norm_value(v: Any) -> Any:
    """Normalize a call argument value: strings as :func:`norm_text`, integral floats as ints, recursively."""
    if isinstance(v, str):
        return norm_text(v)
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, dict):
        return {norm_text(str(k)): norm_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [norm_value(x) for x in v]
    return v


def canonical_json(obj: Any) -> str:
    """Compact JSON with sorted keys: the one serialization hashed and compared."""
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def canonical_calls(calls: list[dict]) -> str:
    return canonical_json([{"name": norm_text(c["name"]), "arguments": norm_value(c["arguments"])} for c in calls])


def last_user_text(rec: dict) -> str:
    for m in reversed(rec["messages"]):
        if m["role"] == "user":
            return m["content"]
    return ""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------- JSONL I/O (atomic)

def read_jsonl(path: Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def compact_json(obj: Any) -> str:
    """Compact JSON that keeps key order (schemas' property order is meaningful to the models that read them)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def write_jsonl(path: Path, rows: Iterable[dict]) -> int:
    """Write rows as compact JSONL atomically (temp file + rename), key order kept; returns the row count.

    Determinism comes from the producers (sorted rows, fixed key order), not from sorting keys here: a tool's
    ``properties`` order is what a chat template shows the model, so it must survive the pipeline.
    """
    lines = [compact_json(r) for r in rows]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
