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
import math
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator

from ooospec.runtime import schemas
from ooospec.runtime.calls import canonical_calls, canonical_json, norm_text, norm_value  # noqa: F401

ROLES = ("system", "user", "assistant", "tool")

# reject reasons shared by every source (a source parser may add its own, e.g. "unparseable_call")
INVALID_TOOL_SCHEMA = "invalid_tool_schema"
CALL_UNKNOWN_TOOL = "call_unknown_tool"
CALL_SCHEMA_VIOLATION = "call_schema_violation"
MALFORMED_RECORD = "malformed_record"
NO_GOLD_CALL = "no_gold_call"
UNCHECKABLE_SCHEMA = "uncheckable_schema"  # e.g. a pattern that backtracks past the time budget on the call


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
    except RecursionError:
        return "too deeply nested to check"
    return None


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def _json_problem(value: Any, limit: int = schemas.MAX_JSON_DEPTH) -> str | None:
    """Why ``value`` is not plain JSON within ``limit`` levels (NaN, Infinity, a set, too deep), or None.
    Iterative, so any depth is safe."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return f"holds {v!r}, which is not a JSON value"
        if isinstance(v, dict):
            if any(not isinstance(k, str) for k in v):
                return "has a non-string key"
            children = list(v.values())
        elif isinstance(v, list):
            children = v
        elif v is None or isinstance(v, (str, bool, int, float)):
            continue
        else:
            return f"holds a {type(v).__name__}, which is not a JSON value"
        if depth > limit:
            return f"nests deeper than {limit} levels"
        stack.extend((c, depth + 1) for c in children)
    return None


def _shape_problem(rec: Any) -> str | None:
    """The first field of ``rec`` that has the wrong type, named (``messages[1].content: expected ...``)."""
    if not isinstance(rec, dict):
        return f"a record must be a JSON object, got {_kind(rec)}"
    for key in ("id", "source", "split", "tools", "messages", "calls"):
        if key not in rec:
            return f"missing field {key!r}"
    for key in ("id", "source", "split"):
        if not isinstance(rec[key], str) or not rec[key]:
            return f"{key}: expected a non-empty string, got {_kind(rec[key])}"
    for key in ("tools", "messages", "calls"):
        if not isinstance(rec[key], list):
            return f"{key}: expected a list, got {_kind(rec[key])}"
    if "meta" in rec and not isinstance(rec["meta"], dict):
        return f"meta: expected an object, got {_kind(rec['meta'])}"
    if not rec["messages"]:
        return "messages: expected a non-empty list of {role, content: str}"
    for i, m in enumerate(rec["messages"]):
        if not isinstance(m, dict):
            return f"messages[{i}]: expected an object {{role, content}}, got {_kind(m)}"
        if m.get("role") not in ROLES:
            return f"messages[{i}].role: expected one of {list(ROLES)}, got {str(m.get('role'))[:40]!r}"
        if not isinstance(m.get("content"), str):
            return f"messages[{i}].content: expected a string, got {_kind(m.get('content'))}"
    for i, t in enumerate(rec["tools"]):
        if not isinstance(t, dict):
            return f"tools[{i}]: expected an object, got {_kind(t)}"
        if t.get("type") != "function" or not isinstance(t.get("function"), dict):
            return f"tools[{i}]: expected {{\"type\": \"function\", \"function\": {{...}}}}"
    for i, c in enumerate(rec["calls"]):
        if not isinstance(c, dict):
            return f"calls[{i}]: expected an object {{name, arguments}}, got {_kind(c)}"
    return None


def validate_record(rec: Any) -> tuple[str, str] | None:
    """Return ``(reason, detail)`` if the record is not usable, else None; never raises.

    Checks the shape (the detail names the field: ``tools[1]: expected an object, got a string``), that every
    tool's ``parameters`` is a valid JSON Schema (Draft 2020-12) of type object, and that every gold call
    names a listed tool and its arguments validate against that tool's schema. Schemas and arguments nest at
    most ``schemas.MAX_JSON_DEPTH`` levels and hold no NaN / Infinity. Patterns run under a time budget
    (``schemas.PATTERN_BUDGET_S``): a pattern that backtracks catastrophically on the call's value makes the
    record :data:`UNCHECKABLE_SCHEMA`, with the pattern and what to do in the detail.
    """
    problem = _shape_problem(rec)
    if problem is not None:
        return MALFORMED_RECORD, problem
    if not rec["calls"]:
        return NO_GOLD_CALL, "record has no gold call"
    tools = {}
    for i, t in enumerate(rec["tools"]):
        fn = t["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            return MALFORMED_RECORD, f"tools[{i}]: tool without a name: {str(t)[:120]}"
        params = fn.get("parameters")
        if not isinstance(params, dict) or params.get("type") != "object":
            return INVALID_TOOL_SCHEMA, f"tool {name!r}: parameters must be a JSON Schema of type object"
        problem = _json_problem(params)
        if problem is None:
            problem = _schema_problem(canonical_json(params))
        if problem:
            return INVALID_TOOL_SCHEMA, f"tool {name!r}: {problem}"
        tools[name] = params
    for i, c in enumerate(rec["calls"]):
        name, args = c.get("name"), c.get("arguments")
        if not isinstance(name, str) or name not in tools:
            return CALL_UNKNOWN_TOOL, f"calls[{i}]: call {str(name)[:80]!r} not in tools {sorted(tools)[:8]}"
        if not isinstance(args, dict):
            got = _kind(args)
            return CALL_SCHEMA_VIOLATION, f"calls[{i}] {name!r}: arguments must be an object, got {got}"
        problem = _json_problem(args)
        if problem:
            return MALFORMED_RECORD, f"calls[{i}] {name!r}: arguments {problem}"
        try:
            err = schemas.first_error(args, tools[name])
        except schemas.UncheckableSchema as e:
            return UNCHECKABLE_SCHEMA, f"calls[{i}] {name!r}: {e}"[:300]
        except Exception as e:  # noqa: BLE001 - a valid metaschema still leaves odd corners to jsonschema
            why = f"{type(e).__name__}: {e}"
            return MALFORMED_RECORD, f"calls[{i}] {name!r}: schema check failed ({why})"[:300]
        if err is not None:
            path = "/".join(str(p) for p in err.absolute_path) or "<root>"
            return CALL_SCHEMA_VIOLATION, f"call {name!r} at {path}: {err.message[:200]}"
    return None


# ---------------------------------------------------------------- canonical forms (dedupe, hashing)

# norm_text, norm_value, canonical_json and canonical_calls live in runtime/calls.py (imported above), one
# canonicalization shared with the runtime's tool cache; they stay importable from here.


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

def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for every non-blank line of a JSON-lines file (blank lines count too).

    Raises ValueError naming ``path:line`` for a line that is not UTF-8, not JSON (NaN and Infinity are not),
    nests too deep for the parser, or is not an object.
    """
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not UTF-8 (bytes {raw[e.start:e.start + 4]!r} at column "
                                 f"{e.start + 1}); re-encode the file as UTF-8") from None
            if not line.strip():
                continue
            line = line.rstrip("\r\n")
            try:
                obj = json.loads(line, parse_constant=_reject_constant)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg}, column {e.pos + 1})") from None
            except RecursionError:
                raise ValueError(f"{path}:{lineno}: JSON nests too deep to read") from None
            except ValueError as e:  # NaN / Infinity, an integer past int_max_str_digits
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e})") from None
            if not isinstance(obj, dict):  # a data error like the others: one exception type for callers
                got = _kind(obj)
                raise ValueError(f"{path}:{lineno}: expected a JSON object per line, got {got}")  # noqa: TRY004
            yield lineno, obj


def read_jsonl(path: Path) -> Iterator[dict]:
    """The objects of a JSON-lines file (see :func:`iter_jsonl` for what raises)."""
    for _, obj in iter_jsonl(path):
        yield obj


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
