"""API-Bank (Li et al., EMNLP 2023) -> records.

Raw layout (``root`` = ``<datasets>/apibank/raw``, see datasets README §3 and §7)::

    test-data/level-1-api.json          -> split "test-l1"    (gold = ``expected_output`` text call)
    test-data/level-2-api.json          -> split "test-l2"
    test-data/level-3-batch-inf.json    -> split "test-l3"    (gold = ``output``)
    training-data/lv3-api-train.json    -> split "train-l3"
    lv1-lv2-samples/level-1-given-desc/*.jsonl     -> split "samples-l1" (one record per API turn)
    lv1-lv2-samples/level-2-toolsearcher/*.jsonl   -> split "samples-l2"
    all_apis.csv                        schema catalogue (``api_info`` = Python source, parsed with ``ast``)

Skipped on purpose (no reject): ``*-response*.json`` (reply-only, no gold call),
``level-3-batch-inf-icl.json`` and ``level-3.json`` (same steps as ``level-3-batch-inf.json``),
``lv3-train.json`` (= api-train + response-train).

Every record's ``messages`` is the dialogue so far: ``User:`` -> user, ``AI:`` -> assistant, an earlier
``API-Request: [Name(k='v')]->result`` -> an assistant message with ``tool_calls`` followed by a ``tool``
message holding the result as compact JSON. A one-line system message carries only the date context the
gold arguments depend on ("The current year is 2023." for level 1/2 and the samples, "The current time is
<TIME>." for lv3 training steps that have a ``TIME:``); the dataset's prompt template and API-description
block are not copied -- the APIs go in ``tools``.

Worked example (test-l2, ``QueryStock-level-3-1.jsonl`` turn 1)::

    input  "User: ...Microsoft on 4th February 2022?\\nAI: Sure, let me check.\\n
            API-Request: [ToolSearcher(keywords='Query Stock')]->{'name': 'QueryStock', ...}\\n
            Generate API Request:"
    gold   "API-Request: [QueryStock(stock_code='MSFT', date='2022-02-04')]"
    ->  tools    [ToolSearcher, QueryStock]      (QueryStock = the schema the ToolSearcher result returned)
        messages [system, user, assistant, assistant{tool_calls: ToolSearcher}, tool{QueryStock schema}]
        calls    [{"name": "QueryStock", "arguments": {"stock_code": "MSFT", "date": "2022-02-04"}}]
"""

from __future__ import annotations

import ast
import csv
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ooospec.pipelines.records import MALFORMED_RECORD, Reject, make_record, tool
from ooospec.pipelines.sources.pytypes import split_top_level

SOURCE = "apibank"
LICENSE = "Apache-2.0"
UPSTREAM = ("AlibabaResearch/DAMO-ConvAI@1d76900822d9ecfcd6e9eb0ca64a073cb892b735; "
            "AlibabaResearch/DAMO-ConvAI@483554eae102996f5ec1f4feab4e78ef29c2a394")

UNPARSEABLE_CALL = "unparseable_call"

# split -> file under root (the test/train call-step files)
STEP_FILES: dict[str, str] = {
    "test-l1": "test-data/level-1-api.json",
    "test-l2": "test-data/level-2-api.json",
    "test-l3": "test-data/level-3-batch-inf.json",
    "train-l3": "training-data/lv3-api-train.json",
}
SAMPLE_DIRS: dict[str, str] = {
    "samples-l1": "level-1-given-desc",
    "samples-l2": "level-2-toolsearcher",
}
YEAR_CONTEXT = "The current year is 2023."  # stated by every level-1/2 prompt; gold dates depend on it
TOOL_SEARCHER = "ToolSearcher"

_TIME_RE = re.compile(r"\s*TIME:\s*(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\s*$")
_ARG_SPLIT_RE = re.compile(r",\s*(?=\w+\s*=)")
_CALL_TEXT_RE = re.compile(r"^\s*(\w+)\s*\((.*)\)\s*$", re.DOTALL)
_EMBEDDED_CALL_RE = re.compile(r"\[(\w+\(.*?\))\]")
_TURN_PREFIXES = ("User:", "AI:", "API-Request:", "Generate API Request:")


class CallParseError(ValueError):
    """A gold ``API-Request`` text that neither ``ast`` nor the fallback split can read."""


# ---------------------------------------------------------------- type strings -> JSON Schema

_SCALAR_TYPES = {
    "str": "string", "string": "string", "int": "integer", "integer": "integer", "float": "number",
    "number": "number", "bool": "boolean", "boolean": "boolean", "dict": "object", "object": "object",
    "json": "object", "list": "array", "array": "array", "tuple": "array",
}
_TIME_TYPES = ("datetime", "date", "time")  # strings; the parameter description states the format


def type_to_schema(type_str: Any) -> dict:
    """Map an API-Bank Python-ish type string to a JSON Schema fragment.

    >>> type_to_schema("int"), type_to_schema("list(str)"), type_to_schema("datetime")
    ({'type': 'integer'}, {'type': 'array', 'items': {'type': 'string'}}, {'type': 'string'})
    >>> type_to_schema("Union[List[dict], dict]")
    {'anyOf': [{'type': 'array', 'items': {'type': 'object'}}, {'type': 'object'}]}

    Unknown spellings give ``{}`` (any value) rather than a guess.
    """
    if not isinstance(type_str, str):
        return {}
    t = type_str.strip()
    low = t.lower()
    if low in _SCALAR_TYPES:
        return {"type": _SCALAR_TYPES[low]}
    if low in _TIME_TYPES:
        return {"type": "string"}
    m = re.fullmatch(r"(?:list|List|tuple|Tuple)\s*[\[(]\s*(.+?)\s*[\])]", t)
    if m:
        return {"type": "array", "items": type_to_schema(m.group(1))}
    m = re.fullmatch(r"(?:Optional)\s*\[\s*(.+)\s*\]", t)
    if m:
        return type_to_schema(m.group(1))
    m = re.fullmatch(r"Union\s*\[\s*(.+)\s*\]", t)
    if m:
        alts = [type_to_schema(a) for a in split_top_level(m.group(1))]
        return {} if any(a == {} for a in alts) else {"anyOf": alts}
    m = re.fullmatch(r"(?:dict|Dict)\s*\[.*\]", t)
    if m:
        return {"type": "object"}
    return {}


def params_schema(input_parameters: Any) -> dict:
    """``{"k": {"type": "str", "description": ...}}`` -> a closed JSON Schema object.

    API-Bank does not say which parameters are required, so ``required`` is left out.
    """
    props: dict[str, dict] = {}
    if isinstance(input_parameters, dict):
        for name, spec in input_parameters.items():
            spec = spec if isinstance(spec, dict) else {"description": str(spec)}
            prop = dict(type_to_schema(spec.get("type")))
            desc = spec.get("description")
            if isinstance(desc, str) and desc:
                prop["description"] = desc
            props[str(name)] = prop
    return {"type": "object", "properties": props, "additionalProperties": False}


@dataclass(frozen=True)
class ApiSpec:
    """One API schema, whichever of the three spellings it came in."""

    name: str
    description: str
    parameters: dict  # JSON Schema, type object

    def to_tool(self) -> dict:
        return tool(self.name, self.description, self.parameters)


def spec_from_dict(d: Any) -> ApiSpec | None:
    """Read ``{"name", "description", "input_parameters", ...}`` (level-1/2 prompts, ToolSearcher results) or
    ``{"apiCode", "description", "parameters", "response"}`` (level-3 first input line); None if neither."""
    if not isinstance(d, dict):
        return None
    if isinstance(d.get("name"), str) and "input_parameters" in d:
        name, params = d["name"], d.get("input_parameters")
    elif isinstance(d.get("apiCode"), str) and "parameters" in d:
        name, params = d["apiCode"], d.get("parameters")
    else:
        return None
    return ApiSpec(name, str(d.get("description") or ""), params_schema(params))


def spec_from_api_info(name: str, api_info: str) -> ApiSpec | None:
    """``all_apis.csv`` ``api_info`` cell: Python assignments ``description = "..."``,
    ``input_parameters = {...}``."""
    try:
        tree = ast.parse(api_info)
    except SyntaxError:
        return None
    ns: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                ns[node.targets[0].id] = ast.literal_eval(node.value)
            except (ValueError, SyntaxError, TypeError):
                pass
    if not isinstance(ns.get("input_parameters"), dict):
        return None
    return ApiSpec(name, str(ns.get("description") or ""), params_schema(ns["input_parameters"]))


def specs_from_result(result: Any) -> list[ApiSpec]:
    """The API schemas a (unwrapped) ToolSearcher result returned: one dict or a list of dicts."""
    items = result if isinstance(result, list) else [result]
    return [s for s in (spec_from_dict(x) for x in items) if s is not None]


def specs_from_instruction(instruction: str) -> list[ApiSpec]:
    """Level-1/2 prompts: one JSON schema per line after ``API descriptions:``."""
    _, sep, tail = instruction.partition("API descriptions:")
    out = []
    for line in tail.splitlines() if sep else []:
        line = line.strip()
        if line.startswith("{"):
            try:
                s = spec_from_dict(json.loads(line))
            except json.JSONDecodeError:
                s = None
            if s is not None:
                out.append(s)
    return out


# ---------------------------------------------------------------- call text parsing

@dataclass
class ParsedCall:
    name: str
    arguments: dict
    recovered: str | None = None  # None: plain ast parse; else how the text was recovered


def _strip_request(text: str) -> tuple[str, bool]:
    """``"API-Request: [A(x=1)]"`` -> ``("A(x=1)", True)``; the bool says whether brackets were present."""
    s = text.strip()
    if s.startswith("API-Request:"):
        s = s[len("API-Request:"):].strip()
    if s.startswith("[") and s.endswith("]"):
        return s[1:-1].strip(), True
    return s, False


def _ast_calls(body: str) -> list[ParsedCall]:
    """Parse ``"A(k='v'), B(x=1)"`` with ``ast``: keyword arguments only, values Python literals."""
    node = ast.parse(f"[{body}]", mode="eval").body
    assert isinstance(node, ast.List)
    calls = []
    for c in node.elts:
        if not (isinstance(c, ast.Call) and isinstance(c.func, ast.Name)) or c.args:
            raise ValueError("not a keyword-only call")
        args = {}
        for kw in c.keywords:
            if kw.arg is None:
                raise ValueError("**kwargs")
            args[kw.arg] = ast.literal_eval(kw.value)
        calls.append(ParsedCall(c.func.id, args))
    if not calls:
        raise ValueError("empty call list")
    return calls


def _fallback_value(raw: str) -> tuple[Any, str]:
    """One fallback argument value: strip one pair of outer quotes (nested quotes stay in the string);
    an unquoted value is a Python literal if it is one (``80``), else the bare text (``New York``)."""
    v = raw.strip()
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
        return v[1:-1], "quoted"
    try:
        lit = ast.literal_eval(v)
        if isinstance(lit, (int, float, bool)) or lit is None:
            return lit, "literal"
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    return v, "unquoted"


def _fallback_call(body: str) -> ParsedCall:
    """README §7.1 fallback: split the argument text on ``,\\s*(?=\\w+\\s*=)`` and strip outer quotes."""
    m = _CALL_TEXT_RE.match(body)
    if not m:
        raise CallParseError(f"not a call: {body[:120]!r}")
    name, argtext = m.group(1), m.group(2).strip()
    args, kinds = {}, set()
    for part in _ARG_SPLIT_RE.split(argtext) if argtext else []:
        key, eq, val = part.partition("=")
        if not eq or not key.strip().isidentifier():
            raise CallParseError(f"argument without key in {body[:120]!r}")
        args[key.strip()], kind = _fallback_value(val)
        kinds.add(kind)
    how = "unquoted_value" if "unquoted" in kinds else "split_args"
    return ParsedCall(name, args, recovered=how)


def parse_request(text: str) -> list[ParsedCall]:
    """Parse a gold/history ``API-Request`` text into calls.

    >>> [(c.name, c.arguments, c.recovered) for c in parse_request("API-Request: [A(x='1', y=2)]")]
    [('A', {'x': '1', 'y': 2}, None)]
    >>> parse_request("API-Request: [A(l='['M', 'P']')]")[0].arguments     # nested quotes: fallback split
    {'l': "['M', 'P']"}
    >>> parse_request("API-Request: [A(location=New York)]")[0].recovered
    'unquoted_value'

    Handles missing brackets (``API-Request: A(x='1')``) and several calls in one bracket.
    Raises :class:`CallParseError` if nothing works.
    """
    body, bracketed = _strip_request(text)
    if not body:
        raise CallParseError("empty API-Request")
    try:
        calls = _ast_calls(body)
    except (SyntaxError, ValueError, TypeError, AssertionError, MemoryError, RecursionError):
        calls = [_fallback_call(body)]
    if not bracketed:
        for c in calls:
            c.recovered = "no_brackets" if c.recovered is None else f"no_brackets+{c.recovered}"
    return calls


def split_request_line(line: str) -> tuple[list[ParsedCall], str | None]:
    """``"API-Request: [A(x='1')]->{'k': 1}"`` -> (calls, result text).

    Tries each ``->`` in turn until the text before it parses as a call."""
    body = line.removeprefix("API-Request:")
    starts = [m.start() for m in re.finditer(r"->", body)]
    for pos in starts:
        head = body[:pos].strip()
        if head.endswith(("]", ")")):
            try:
                return parse_request(head), body[pos + 2:]
            except CallParseError:
                continue
    return parse_request(body), None


def parse_result(text: str | None) -> Any:
    """Python-repr result -> value (``ast.literal_eval``); plain text (``success``) stays a string.
    Level-3 / sample results wrapped as ``{api_name, input, output, exception}`` are unwrapped to ``output``
    (or ``{"exception": ...}`` when the call failed)."""
    if text is None:
        return None
    s = text.strip()
    val = lenient_literal(s)
    return unwrap_result(s if val is _FAIL else val)


_FAIL = object()
_LITERAL_ERRORS = (ValueError, SyntaxError, TypeError, MemoryError, RecursionError)
# a double-quoted string | a single-quoted string whose inner quotes are not followed by a delimiter
# (``'The user's budget'``) | a bare identifier in value position (``'type': str``)
_REPAIR_RE = re.compile(r'"(?:[^"\\\n]|\\.)*"'
                        r"|'((?:[^'\\\n]|\\.|'(?!\s*[:,}\]]))*)'"
                        r"|(?<=:)(\s*)([A-Za-z_]\w*)(?=\s*[,}])")


def _repair(m: re.Match) -> str:
    if m.group(1) is not None:
        return repr(m.group(1))
    if m.group(3) is not None:
        ident = m.group(3)
        return m.group(0) if ident in ("None", "True", "False") else f"{m.group(2)}{ident!r}"
    return m.group(0)


def lenient_literal(s: str) -> Any:
    """``ast.literal_eval`` with two repairs seen in ToolSearcher results of the lv3 training data:
    unescaped inner quotes (``'The user's budget'``) and bare type names (``{'type': str}``).
    Returns the module sentinel ``_FAIL`` if even the repaired text is not a literal.

    >>> lenient_literal("{'type': str, 'description': 'The user's budget.'}")
    {'type': 'str', 'description': "The user's budget."}
    """
    try:
        return ast.literal_eval(s)
    except _LITERAL_ERRORS:
        pass
    try:
        return ast.literal_eval(_REPAIR_RE.sub(_repair, s))
    except _LITERAL_ERRORS:
        return _FAIL


def unwrap_result(val: Any) -> Any:
    if isinstance(val, dict) and {"api_name", "input", "output", "exception"} <= set(val):
        return {"exception": val["exception"]} if val.get("exception") else val["output"]
    return val


def result_content(val: Any) -> str:
    """Tool message content: strings as they are, everything else compact JSON."""
    if isinstance(val, str):
        return val
    return json.dumps(val, ensure_ascii=False, separators=(",", ":"), default=str)


# ---------------------------------------------------------------- argument coercion

_INT_RE = re.compile(r"[+-]?\d+")
_FLOAT_RE = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")


def _types(schema: dict) -> list[str]:
    if "type" in schema:
        return [schema["type"]] if isinstance(schema["type"], str) else list(schema["type"])
    return [t for alt in schema.get("anyOf", []) for t in _types(alt)]


def coerce_value(value: Any, schema: dict) -> tuple[Any, str | None]:
    """Convert ``value`` to the schema's type when that is lossless and unambiguous.

    >>> coerce_value("5", {"type": "integer"}), coerce_value("05", {"type": "integer"})
    ((5, 'str->integer'), ('05', None))
    >>> coerce_value("['a', 'b']", {"type": "array"})
    (['a', 'b'], 'str->array')
    >>> coerce_value(80, {"type": "string"})
    ('80', 'integer->string')
    """
    types = _types(schema)
    if not types:
        return value, None
    if isinstance(value, str):
        s = value.strip()
        if "integer" in types and _INT_RE.fullmatch(s) and str(int(s)) == s.lstrip("+"):
            return int(s), "str->integer"
        if "number" in types and _FLOAT_RE.fullmatch(s):
            num = float(s)
            if _INT_RE.fullmatch(s) and str(int(s)) == s.lstrip("+"):
                return int(s), "str->number"
            if math.isfinite(num):  # '74.0060' -> 74.006 (same value)
                return num, "str->number"
        if "boolean" in types and s in ("True", "False", "true", "false"):
            return s in ("True", "true"), "str->boolean"
        if ("array" in types or "object" in types) and s[:1] in "[{(":
            try:
                lit = ast.literal_eval(s)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                try:
                    lit = json.loads(s)
                except json.JSONDecodeError:
                    lit = None
            if isinstance(lit, tuple):
                lit = list(lit)
            if isinstance(lit, list) and "array" in types:
                return _jsonable(lit), "str->array"
            if isinstance(lit, dict) and "object" in types:
                return _jsonable(lit), "str->object"
        if "array" in types and "string" not in types and "array" == types[0]:
            item = schema.get("items", {})
            if _types(item) == ["string"] and s and s[:1] not in "[{(":
                return [s], "str->array[1]"
        return value, None
    if isinstance(value, bool):
        return value, None
    if isinstance(value, (int, float)) and "string" in types and not {"integer", "number"} & set(types):
        return str(value), f"{'integer' if isinstance(value, int) else 'number'}->string"
    if isinstance(value, float) and "integer" in types and "number" not in types and value.is_integer():
        return int(value), "number->integer"
    if isinstance(value, tuple):
        return list(value), "tuple->array"
    return value, None


def _jsonable(v: Any) -> Any:
    """Python literal -> JSON value (tuples to lists, non-string keys to strings)."""
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (set, frozenset)):
        return sorted((_jsonable(x) for x in v), key=repr)
    return v


def coerce_arguments(args: dict, params: dict) -> tuple[dict, list[str]]:
    """Coerce every argument against the tool schema; returns (arguments, ["key: str->integer", ...])."""
    props = params.get("properties", {})
    out, notes = {}, []
    for k, v in args.items():
        v = _jsonable(v)
        if k in props:
            v, how = coerce_value(v, props[k])
            if how:
                notes.append(f"{k}: {how}")
        out[k] = v
    return out, notes


# ---------------------------------------------------------------- dialogue text -> messages

@dataclass
class Context:
    """A dialogue rendered as messages + the APIs whose schemas ToolSearcher results returned so far."""

    messages: list[dict] = field(default_factory=list)
    retrieved: dict[str, ApiSpec] = field(default_factory=dict)  # insertion order = retrieval order
    now: str | None = None  # lv3 training: the TIME: stamp taken off the user line
    header_specs: list[ApiSpec] = field(default_factory=list)  # level-3: the apiCode line (ToolSearcher)


def assistant_call_message(calls: list[ParsedCall], content: str = "") -> dict:
    """An earlier API call in the history: ``{"role": "assistant", "content": "", "tool_calls": [...]}``."""
    tcs = [{"type": "function", "function": {"name": c.name, "arguments": _jsonable(c.arguments)}}
           for c in calls]
    return {"role": "assistant", "content": content, "tool_calls": tcs}


def _note_retrieval(ctx: Context, call_names: list[str], result: Any) -> None:
    if TOOL_SEARCHER in call_names:
        for s in specs_from_result(result):
            ctx.retrieved.setdefault(s.name, s)


def parse_input(text: str) -> Context:
    """Turn a test/train ``input`` (one turn per line) into messages.

    Lines that start with none of the turn prefixes continue the previous turn; a leading JSON line
    (level 3) is the ToolSearcher schema; ``TIME: ...`` glued to a user line (lv3 training) is cut off into
    ``ctx.now``; the final ``Generate API Request:`` line is dropped.
    """
    ctx = Context()
    turns: list[list[str]] = []
    for line in text.split("\n"):
        if line.startswith("{") and not turns:
            s = None
            try:
                s = spec_from_dict(json.loads(line))
            except json.JSONDecodeError:
                pass
            if s is not None:
                ctx.header_specs.append(s)
                continue
        if line.startswith(_TURN_PREFIXES) or not turns:
            turns.append([line])
        else:
            turns[-1].append(line)
    for lines in turns:
        turn = "\n".join(lines).strip()
        if not turn or turn.startswith("Generate API Request:"):
            continue
        if turn.startswith("User:"):
            content = turn[len("User:"):].strip()
            m = _TIME_RE.search(content)
            if m:
                ctx.now = m.group(1)
                content = content[:m.start()].rstrip()
            ctx.messages.append({"role": "user", "content": content})
        elif turn.startswith("AI:"):
            ctx.messages.append({"role": "assistant", "content": turn[len("AI:"):].strip()})
        elif turn.startswith("API-Request:"):
            calls, res_text = split_request_line(turn)
            result = parse_result(res_text)
            ctx.messages.append(assistant_call_message(calls))
            ctx.messages.append({"role": "tool", "content": result_content(result)})
            _note_retrieval(ctx, [c.name for c in calls], result)
        else:
            raise ValueError(f"unrecognised turn {turn[:80]!r}")
    return ctx


# ---------------------------------------------------------------- catalogue of level-1/2 schemas

def load_catalogue(root: Path) -> dict[str, ApiSpec]:
    """name -> schema for the level-1/2 APIs: level-1 test prompts first, then ToolSearcher results of the
    level-2 samples, then ``all_apis.csv`` ``api_info`` (first seen wins, so order is deterministic)."""
    cat: dict[str, ApiSpec] = {}
    l1 = root / STEP_FILES["test-l1"]
    l2 = root / STEP_FILES["test-l2"]
    for path in (l1, l2):
        if path.exists():
            for r in json.loads(path.read_text(encoding="utf-8")):
                for s in specs_from_instruction(r.get("instruction", "")):
                    cat.setdefault(s.name, s)
    sdir = root / "lv1-lv2-samples" / SAMPLE_DIRS["samples-l2"]
    for path in sorted(sdir.glob("*.jsonl")) if sdir.exists() else []:
        for turn in _read_turns(path):
            if turn.get("role") == "API" and turn.get("api_name") == TOOL_SEARCHER:
                for s in specs_from_result(unwrap_result(turn.get("result"))):
                    cat.setdefault(s.name, s)
    csv_path = root / "all_apis.csv"
    if csv_path.exists():
        with open(csv_path, encoding="utf-8", newline="") as f:
            for row in csv.DictReader(f):
                name = (row.get("类名") or "").strip()
                s = spec_from_api_info(name, row.get("api_info") or "") if name else None
                if s is not None:
                    cat.setdefault(name, s)
    return cat


def dialogue_tools_l1(root: Path) -> dict[str, list[ApiSpec]]:
    """Level-1 dialogue file -> the APIs its level-1 test prompts describe (union, first-seen order)."""
    out: dict[str, dict[str, ApiSpec]] = {}
    path = root / STEP_FILES["test-l1"]
    if path.exists():
        for r in json.loads(path.read_text(encoding="utf-8")):
            d = out.setdefault(r["file"], {})
            for s in specs_from_instruction(r.get("instruction", "")):
                d.setdefault(s.name, s)
    return {k: list(v.values()) for k, v in out.items()}


def _read_turns(path: Path) -> list[dict]:
    turns = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                turns.append(json.loads(line))
    return turns


# ---------------------------------------------------------------- record assembly

def _system(now: str | None) -> dict:
    return {"role": "system", "content": f"The current time is {now}." if now else YEAR_CONTEXT}


def _build(split: str, local_id: str, tools: list[ApiSpec], messages: list[dict], calls: list[ParsedCall],
           meta: dict) -> dict:
    """Coerce the gold arguments to the tool schemas and assemble the record (ingest validates it)."""
    by_name = {t.name: t for t in tools}
    out_calls, coerced, recovered = [], [], []
    for i, c in enumerate(calls):
        args = _jsonable(c.arguments)
        if c.name in by_name:
            args, notes = coerce_arguments(args, by_name[c.name].parameters)
            coerced += [f"{i}.{n}" if len(calls) > 1 else n for n in notes]
        out_calls.append({"name": c.name, "arguments": args})
        if c.recovered:
            recovered.append(c.recovered)
    meta = dict(meta)
    if coerced:
        meta["coerced"] = coerced
    if recovered:
        meta["recovered"] = sorted(set(recovered))
    return make_record(SOURCE, split, local_id, [t.to_tool() for t in tools], messages, out_calls, meta)


def _dedup_specs(specs: list[ApiSpec]) -> list[ApiSpec]:
    seen, out = set(), []
    for s in specs:
        if s.name not in seen:
            seen.add(s.name)
            out.append(s)
    return out


def _add_missing(tools: list[ApiSpec], names: list[str],
                 catalogue: dict[str, ApiSpec]) -> tuple[list[ApiSpec], list[str]]:
    """Append catalogue schemas for called APIs the dialogue never retrieved (level-2 GetUserToken etc.)."""
    have = {t.name for t in tools}
    added = []
    for n in names:
        if n not in have and n in catalogue:
            tools = tools + [catalogue[n]]
            have.add(n)
            added.append(n)
    return tools, added


def parse_step_file(root: Path, split: str, catalogue: dict[str, ApiSpec]) -> Iterator[dict | Reject]:
    """test-l1 / test-l2 / test-l3 / train-l3: one record per JSON element."""
    path = root / STEP_FILES[split]
    fname = path.name
    rows = json.loads(path.read_text(encoding="utf-8"))
    for idx, r in enumerate(rows):
        if split in ("test-l1", "test-l2"):
            local_id = f"{r['file']}#{r['id']}"
            folder = SAMPLE_DIRS["samples-l1" if split == "test-l1" else "samples-l2"]
            meta = {"dialogue": f"{folder}/{r['file']}", "turn": r["id"]}
            gold_text = r.get("expected_output", "")
        elif split == "test-l3":
            local_id = f"{r['sample_id']}#{r['api_id']}"
            meta = {"sample": f"level-3/{r['sample_id']}", "step": r["api_id"]}
            gold_text = r.get("output", "")
        else:
            local_id = f"{fname}#{idx}"
            meta = {}
            gold_text = r.get("output", "")
        where = f"{fname}[{idx}] ({local_id})"
        try:
            ctx = parse_input(r.get("input", ""))
        except (CallParseError, ValueError) as e:
            yield Reject(SOURCE, split, local_id, UNPARSEABLE_CALL, f"{where}: history: {e}"[:300], raw=r)
            continue
        try:
            calls = parse_request(gold_text)
        except CallParseError as e:
            detail = f"{where}: gold {gold_text[:120]!r}: {e}"
            yield Reject(SOURCE, split, local_id, UNPARSEABLE_CALL, detail[:300], raw=r)
            continue
        prompt_specs = specs_from_instruction(r.get("instruction", ""))
        tools = _dedup_specs(prompt_specs + ctx.header_specs + list(ctx.retrieved.values()))
        if split == "test-l2":
            called = [tc["function"]["name"] for m in ctx.messages for tc in m.get("tool_calls", [])]
            tools, added = _add_missing(tools, called + [c.name for c in calls], catalogue)
            if added:
                meta["tools_from_catalogue"] = added
        if split == "train-l3" and ctx.now:
            meta["time"] = ctx.now
        if split in ("test-l1", "test-l2"):
            system = [_system(None)]
        else:  # level 3 states no date; lv3 training has one only when the user line carries TIME:
            system = [_system(ctx.now)] if ctx.now else []
        yield _build(split, local_id, tools, system + ctx.messages, calls, meta)


def _embedded_calls(text: str) -> tuple[str, list[ParsedCall]]:
    """``"Great. Let me register. [RegisterUser(username='u')]"`` -> (text without the call, calls)."""
    calls = []
    for m in _EMBEDDED_CALL_RE.finditer(text):
        try:
            cs = parse_request(f"[{m.group(1)}]")
        except CallParseError:
            continue
        for c in cs:
            c.recovered = "call_in_ai_text" if c.recovered is None else f"call_in_ai_text+{c.recovered}"
        calls.extend(cs)
    rest = _EMBEDDED_CALL_RE.sub("", text) if calls else text
    return " ".join(rest.split()), calls


def parse_sample_dir(root: Path, split: str, catalogue: dict[str, ApiSpec],
                     l1_tools: dict[str, list[ApiSpec]]) -> Iterator[dict | Reject]:
    """samples-l1 / samples-l2: one record per API turn (or per call embedded in AI text when a dialogue
    has no API turns), messages = the dialogue before it."""
    folder = SAMPLE_DIRS[split]
    searcher = catalogue.get(TOOL_SEARCHER)
    for path in sorted((root / "lv1-lv2-samples" / folder).glob("*.jsonl")):
        fname = path.name
        try:
            turns = _read_turns(path)
        except json.JSONDecodeError as e:
            yield Reject(SOURCE, split, fname, MALFORMED_RECORD, f"{folder}/{fname}: {e}")
            continue
        if not turns:
            continue  # SearchEngine-level-1-1.jsonl is empty: nothing to yield
        embedded = not any(t.get("role") == "API" for t in turns)
        if split == "samples-l2":
            base: list[ApiSpec] = [searcher] if searcher else []
        else:
            base = list(l1_tools.get(fname, []))
            if not base:  # not in the level-1 test: the APIs named in the file name, from the catalogue
                names = fname.split("-level-")[0].split("-")
                base = [catalogue[n] for n in names if n in catalogue]
        retrieved: dict[str, ApiSpec] = {}
        messages: list[dict] = [_system(None)]
        called: list[str] = []
        for ti, t in enumerate(turns):
            role = t.get("role")
            if role == "User":
                messages.append({"role": "user", "content": str(t.get("text", ""))})
                continue
            if role == "AI":
                text = str(t.get("text", ""))
                prefix, calls = _embedded_calls(text) if embedded else (text, [])
                if not calls:
                    messages.append({"role": "assistant", "content": text})
                    continue
                for ci, c in enumerate(calls):
                    local_id = f"{fname}#{ti}" + (f".{ci}" if len(calls) > 1 else "")
                    history = messages + ([{"role": "assistant", "content": prefix}] if prefix else [])
                    yield _sample_record(split, local_id, f"{folder}/{fname}", ti,
                                         base + list(retrieved.values()), called, catalogue, history, c)
                    called.append(c.name)
                messages.append(assistant_call_message(calls, content=prefix))
                continue
            if role != "API":
                yield Reject(SOURCE, split, f"{fname}#{ti}", MALFORMED_RECORD,
                             f"{folder}/{fname} turn {ti}: unknown role {role!r}", raw=t)
                continue
            name, args = t.get("api_name"), t.get("param_dict")
            if not isinstance(name, str) or not isinstance(args, dict):
                yield Reject(SOURCE, split, f"{fname}#{ti}", UNPARSEABLE_CALL,
                             f"{folder}/{fname} turn {ti}: api_name/param_dict missing", raw=t)
                continue
            c = ParsedCall(name, args)
            yield _sample_record(split, f"{fname}#{ti}", f"{folder}/{fname}", ti,
                                 base + list(retrieved.values()), called, catalogue, messages, c)
            called.append(name)
            result = unwrap_result(t.get("result"))
            messages.append(assistant_call_message([c]))
            messages.append({"role": "tool", "content": result_content(result)})
            if name == TOOL_SEARCHER:
                for s in specs_from_result(result):
                    retrieved.setdefault(s.name, s)


def _sample_record(split: str, local_id: str, dialogue: str, turn: int, specs: list[ApiSpec],
                   called: list[str], catalogue: dict[str, ApiSpec], messages: list[dict],
                   c: ParsedCall) -> dict:
    """One sample API turn: tools = the dialogue's APIs (+ catalogue schemas of called, undescribed ones)."""
    tools = _dedup_specs(specs)
    meta: dict = {"dialogue": dialogue, "turn": turn}
    tools, added = _add_missing(tools, called + [c.name], catalogue)
    if added:
        meta["tools_from_catalogue"] = added
    return _build(split, local_id, tools, list(messages), [c], meta)


def parse(root: Path) -> Iterator[dict | Reject]:
    """All API-Bank splits, in a fixed order (see module docstring)."""
    root = Path(root)
    catalogue = load_catalogue(root)
    for split, rel in STEP_FILES.items():
        if (root / rel).exists():
            yield from parse_step_file(root, split, catalogue)
    l1_tools = dialogue_tools_l1(root)
    for split, folder in SAMPLE_DIRS.items():
        if (root / "lv1-lv2-samples" / folder).exists():
            yield from parse_sample_dir(root, split, catalogue, l1_tools)
