"""API-Bank's text spellings -> values: API schemas, calls and Python-repr results.

* API schemas come in three spellings (:class:`ApiSpec`): ``{"name", "description", "input_parameters"}`` (level-1/2
  prompts, ToolSearcher results), ``{"apiCode", "description", "parameters"}`` (level-3) and the Python source of
  ``all_apis.csv``; parameter types are Python-ish strings (:func:`~ooospec.pipelines.sources.pytypes.type_schema`).
* Gold and history calls are Python call syntax in brackets, ``API-Request: [Name(k='v', n=2)]``, optionally
  followed by ``->result`` (a Python repr). :func:`parse_request` reads them with ``ast``; text that is not valid
  Python (nested quotes, unquoted values, missing brackets) goes through a fallback split (datasets README §7.1)
  and the call says how it was recovered (``ParsedCall.recovered``).

:mod:`ooospec.pipelines.sources.apibank` walks the files and dialogues and assembles the records.

    >>> calls, result = split_request_line("API-Request: [QueryStock(stock_code='MSFT')]->{'price': 1}")
    >>> [(c.name, c.arguments) for c in calls], parse_result(result)
    ([('QueryStock', {'stock_code': 'MSFT'})], {'price': 1})
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

from ooospec.pipelines.records import tool
from ooospec.pipelines.sources.pytypes import type_schema
from ooospec.runtime.calls import compact_json

_ARG_SPLIT_RE = re.compile(r",\s*(?=\w+\s*=)")
_CALL_TEXT_RE = re.compile(r"^\s*(\w+)\s*\((.*)\)\s*$", re.DOTALL)
_EMBEDDED_CALL_RE = re.compile(r"\[(\w+\(.*?\))\]")


class CallParseError(ValueError):
    """A gold ``API-Request`` text that neither ``ast`` nor the fallback split can read."""


# ---------------------------------------------------------------- API schemas

def params_schema(input_parameters: Any) -> dict:
    """``{"k": {"type": "str", "description": ...}}`` -> a closed JSON Schema object.

    API-Bank does not say which parameters are required, so ``required`` is left out.
    """
    props: dict[str, dict] = {}
    if isinstance(input_parameters, dict):
        for name, spec in input_parameters.items():
            spec = spec if isinstance(spec, dict) else {"description": str(spec)}
            prop = type_schema(spec.get("type"))
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


# ---------------------------------------------------------------- call text

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
    return compact_json(val, allow_nan=True, default=str)


def embedded_calls(text: str) -> tuple[str, list[ParsedCall]]:
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
