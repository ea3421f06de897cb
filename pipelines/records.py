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

Every stage and command that reads a records file reads it with :func:`load_records` (:func:`validate_record` on
each line): a bad line is a :class:`BadRecord` whose message names ``file:line``, the record, the reason and the
field; the caller's ``on_reject`` (``fail`` | ``skip``) decides whether it stops the run or is counted and left out.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator

from ooospec.runtime import schemas
from ooospec.runtime.calls import canonical_json, compact_json

logger = logging.getLogger(__name__)

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


def _tool_calls_problem(tool_calls: Any) -> str | None:
    """What is wrong with a message's ``tool_calls`` (``[{"type": "function", "function": {name, arguments}}]``,
    or bare ``{name, arguments}`` items), as a suffix of the field path; None when usable."""
    if not isinstance(tool_calls, list):
        return f": expected a list, got {_kind(tool_calls)}"
    for j, tc in enumerate(tool_calls):
        fn = tc.get("function", tc) if isinstance(tc, dict) else None
        if not (isinstance(fn, dict) and isinstance(fn.get("name"), str) and isinstance(fn.get("arguments"), dict)):
            return f'[{j}]: expected {{"type": "function", "function": {{"name": str, "arguments": {{...}}}}}}'
        problem = _json_problem(fn["arguments"])
        if problem:
            return f"[{j}].arguments: {problem}"
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
        if "tool_calls" in m:
            problem = _tool_calls_problem(m["tool_calls"])
            if problem:
                return f"messages[{i}].tool_calls{problem}"
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


# ---------------------------------------------------------------- hashing (canonical forms: runtime/calls.py)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------- JSONL I/O (atomic)

def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _decode_line(raw: bytes, lineno: int) -> dict | None:
    """The JSON object on one line (None for a blank line). Raises ValueError saying what is wrong (no path)."""
    try:
        line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 (bytes {raw[e.start:e.start + 4]!r} at column {e.start + 1}); re-encode "
                         "the file as UTF-8") from None
    if not line.strip():
        return None
    line = line.rstrip("\r\n")
    try:
        obj = json.loads(line, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg}, column {e.pos + 1})") from None
    except RecursionError:
        raise ValueError("JSON nests too deep to read") from None
    except ValueError as e:  # NaN / Infinity, an integer past int_max_str_digits
        raise ValueError(f"not valid JSON ({e})") from None
    if not isinstance(obj, dict):  # a data error like the others: one exception type for callers
        raise ValueError(f"expected a JSON object per line, got {_kind(obj)}")  # noqa: TRY004
    return obj


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with open(path, "rb") as f:
        yield from enumerate(f, 1)


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for every non-blank line of a JSON-lines file (blank lines count too).

    Raises ValueError naming ``path:line`` for a line that is not UTF-8, not JSON (NaN and Infinity are not),
    nests too deep for the parser, or is not an object.
    """
    for lineno, raw in _lines(path):
        try:
            obj = _decode_line(raw, lineno)
        except ValueError as e:
            raise ValueError(f"{path}:{lineno}: {e}") from None
        if obj is not None:
            yield lineno, obj


# ---------------------------------------------------------------- record files (every stage's one reader)

DUPLICATE_ID = "duplicate_id"
ON_REJECT = ("skip", "fail")


@dataclass(frozen=True)
class BadRecord:
    """One line of a record file that is not a usable record: where, which record, why."""

    path: str
    line: int
    id: str | None       # the record's id when it has a string one
    reason: str          # a reject reason of this module (``malformed_record``, ``no_gold_call``, ...)
    detail: str          # names the field: ``messages: expected a non-empty list ...``

    def message(self) -> str:
        rid = f"record {self.id!r}: " if self.id is not None else ""
        return " ".join(f"{self.path}:{self.line}: {rid}{self.reason}: {self.detail}".split())  # one line


@dataclass
class RecordFile:
    """The usable records (or rows) of a file, in file order, and its bad lines."""

    path: str
    rows: list[dict]
    bad: list[BadRecord]

    def summary(self) -> dict:
        """``{"num_read", "num_bad", "bad_by_reason", "bad_examples"}`` for a stage's metrics."""
        reasons = Counter(b.reason for b in self.bad)
        return {"num_read": len(self.rows), "num_bad": len(self.bad),
                "bad_by_reason": dict(sorted(reasons.items())),
                "bad_examples": [b.message()[:300] for b in self.bad[:5]]}


def record_problem(rec: Any) -> tuple[str, str] | None:
    """:func:`validate_record`, never raising even on a bug in it (the reader must not crash on any line)."""
    try:
        return validate_record(rec)
    except Exception as e:  # noqa: BLE001 - a record must not take the stage down; it is reported instead
        return MALFORMED_RECORD, f"validation failed ({type(e).__name__}: {str(e)[:200]})"


def load_rows(path: str | os.PathLike, check: Callable[[dict], tuple[str, str] | None], on_reject: str = "fail",
              *, what: str = "rows", knob: str | None = None) -> RecordFile:
    """Read a JSONL file and check every line with ``check`` (``(reason, detail)`` or None) and for a unique
    string ``id``; what :func:`load_records` does for records, for other row kinds (teacher traces).

    See :func:`load_records` for ``on_reject``, ``what``, ``knob`` and what raises.
    """
    if on_reject not in ON_REJECT:
        raise ValueError(f"on_reject must be one of {list(ON_REJECT)}, got {on_reject!r}")
    rows: list[dict] = []
    bad: list[BadRecord] = []
    seen: set[str] = set()
    for lineno, raw in _lines(Path(path)):
        try:
            row = _decode_line(raw, lineno)
        except ValueError as e:
            bad.append(BadRecord(str(path), lineno, None, MALFORMED_RECORD, str(e)))
            continue
        if row is None:
            continue
        rid = row.get("id") if isinstance(row.get("id"), str) else None
        problem = check(row)
        if problem is None and rid in seen:
            problem = (DUPLICATE_ID, f"id: {rid!r} already appears earlier in the file")
        if problem is not None:
            bad.append(BadRecord(str(path), lineno, rid, *problem))
            continue
        if rid is not None:
            seen.add(rid)
        rows.append(row)
    out = RecordFile(str(path), rows, bad)
    if bad and on_reject == "fail":
        more = f" (and {len(bad) - 1} more bad line(s))" if len(bad) > 1 else ""
        skip = f", or set {knob}: skip in params.yaml to leave bad lines out" if knob else ""
        raise ValueError(f"{bad[0].message()}{more}; fix the {what}{skip}")
    for b in bad[:20]:
        logger.warning("skipped: %s", b.message())
    if len(bad) > 20:
        logger.warning("%s: %d more bad lines skipped", path, len(bad) - 20)
    return out


def load_records(path: str | os.PathLike, on_reject: str = "fail", *, what: str = "records",
                 knob: str | None = None) -> RecordFile:
    """Read a JSONL file of records and validate each one; the one reader of every stage and command.

    Every line is checked (a JSON object, then :func:`validate_record`, then a unique ``id``), so the error
    or the report covers the whole file.

    Args:
        path: the JSONL file.
        on_reject: ``"fail"``: any bad line raises; ``"skip"``: bad lines are logged and left out (the stage
            reports :meth:`RecordFile.summary` in its metrics).
        what: how the caller names the file in the error (``"training records"``).
        knob: the params key that turns skipping on (``"dedupe.on_reject"``), named in the error; None when the
            caller has no such knob.

    Returns:
        The :class:`RecordFile` (valid records in file order, and the bad lines).

    Raises:
        ValueError: with ``on_reject="fail"``, naming ``path:line``, the record, the reason and the field
            (``data/x.jsonl:3: record 'a/b/1': malformed_record: messages: expected a list, got a string``)
            and how many lines are bad.
    """
    return load_rows(path, record_problem, on_reject, what=what, knob=knob)


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


def write_jsonl(path: Path, rows: Iterable[dict]) -> int:
    """Write rows as compact JSONL atomically (temp file + rename), key order kept; returns the row count.

    Determinism comes from the producers (sorted rows, fixed key order), not from sorting keys here: a tool's
    ``properties`` order is what a chat template shows the model, so it must survive the pipeline. NaN and Infinity
    are written as ``NaN`` / ``Infinity`` (``allow_nan``): validation rejects a record that holds them, and its
    reject row carries the raw item as the source has it.
    """
    lines = [compact_json(r, allow_nan=True) for r in rows]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
