"""Python-ish parameter type strings -> JSON Schema, and gold values -> the declared type: one module for every
source parser.

Several sources describe parameters with Python type names instead of JSON Schema (Seal-Tools ``"int"``,
ToolRL ``"List[str]"``, ``"str, optional"``, ``"Tuple[float, float]"``, API-Bank ``"list(str)"``, ``"datetime"``).
:func:`type_schema` turns such a string into a JSON Schema fragment. Separately, :func:`coerce_value` converts a
gold argument value that is obviously meant as the declared type (``"63"`` for an ``int``) so that the gold call
validates against the schema the model sees. Which conversions are made is the parser's choice: it passes the
rules its source needs (:data:`SCALAR_RULES` by default; API-Bank adds literals in strings, ToolAlpaca lists of
strings joined by commas), and every conversion comes back with a note for ``meta.coerced``.

    >>> type_schema("List[float]")
    {'type': 'array', 'items': {'type': 'number'}}
    >>> type_schema("str, optional"), type_schema("list(str)")
    ({'type': 'string'}, {'type': 'array', 'items': {'type': 'string'}})
    >>> type_schema("Callable[[float], float]")     # unknown -> no constraint
    {}
    >>> coerce_value("63", {"type": "integer"})
    (63, 'str->integer')
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

# base names (lower-cased) -> JSON Schema type
_BASE: dict[str, str] = {
    "str": "string", "string": "string", "text": "string", "char": "string",
    "int": "integer", "integer": "integer", "long": "integer",
    "float": "number", "double": "number", "number": "number", "decimal": "number",
    "bool": "boolean", "boolean": "boolean",
    "list": "array", "array": "array", "tuple": "array", "set": "array", "sequence": "array",
    "dict": "object", "object": "object", "mapping": "object", "json": "object",
    "datetime": "string", "date": "string", "time": "string",  # JSON has no time type: the description gives the format
    "none": "null", "null": "null", "nonetype": "null",
}


def split_top_level(s: str) -> list[str]:
    """Split on commas outside brackets/parentheses: ``"int, List[str], Dict(a, b)"`` -> 3 parts (empties dropped)."""
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur).strip())
    return [p for p in parts if p]


def is_optional(type_str: Any) -> bool:
    """``"str, optional"`` / ``"Optional[int]"`` -> True (xLAM / ToolRL spelling of an optional parameter)."""
    return isinstance(type_str, str) and bool(
        re.search(r",\s*optional\s*$|^optional\[", type_str.strip(), re.IGNORECASE))


def type_schema(type_str: Any) -> dict:
    """Translate one type spelling into a JSON Schema fragment (without description).

    Accepts a JSON-Schema-like list (``["string", "null"]``), a base name (``str``, ``float``, ``dict``,
    ``datetime``), a typing generic (``List[int]``, ``Dict[str, int]``, ``Tuple[float, float]``, ``Union[int, float]``,
    ``Optional[str]``, or with parentheses: ``list(str)``) and the xLAM suffix ``", optional"``. Anything it cannot
    read becomes ``{}`` (no constraint): a wrong type would reject valid gold values, a missing one only loses a hint.
    """
    if isinstance(type_str, list):
        subs = [type_schema(t) for t in type_str]
        types = [s["type"] for s in subs if set(s) == {"type"} and isinstance(s["type"], str)]
        return {"type": sorted(set(types), key=types.index)} if len(types) == len(subs) and types else {}
    if not isinstance(type_str, str):
        return {}
    s = re.sub(r",\s*optional\s*$", "", type_str.strip(), flags=re.IGNORECASE).strip()
    m = re.fullmatch(r"([A-Za-z_.]+)\s*(?:\[(.*)\]|\((.*)\))", s, re.DOTALL)
    if m is None:
        base = s.lower().split(".")[-1]
        return {"type": _BASE[base]} if base in _BASE else {}
    inner = m.group(2) if m.group(2) is not None else m.group(3)
    head, args = m.group(1).lower().split(".")[-1], split_top_level(inner)
    if head == "optional" and len(args) == 1:
        return type_schema(args[0])
    if head == "union":
        subs = [type_schema(a) for a in args]
        if any(sub == {} for sub in subs):
            return {}
        types = [sub.get("type") for sub in subs]
        if all(set(sub) == {"type"} and isinstance(t, str) for sub, t in zip(subs, types)):
            uniq = sorted(set(types), key=types.index)
            if set(uniq) == {"integer", "number"}:
                return {"type": "number"}
            return {"type": uniq[0]} if len(uniq) == 1 else {"type": uniq}
        return {"anyOf": subs}
    base = _BASE.get(head)
    if base == "array":
        if head == "tuple" and args and "..." not in args:
            items = [type_schema(a) for a in args]
            if all(i == items[0] for i in items):  # Tuple[float, float]: fixed-length homogeneous
                out = {"type": "array", "minItems": len(items), "maxItems": len(items)}
                return out | ({"items": items[0]} if items[0] else {})
            return {"type": "array", "prefixItems": items, "minItems": len(items), "maxItems": len(items)}
        item = type_schema(args[0]) if len(args) == 1 else {}
        return {"type": "array", "items": item} if item else {"type": "array"}
    if base == "object":
        if len(args) == 2 and type_schema(args[1]):
            return {"type": "object", "additionalProperties": type_schema(args[1])}
        return {"type": "object"}
    return {}


# ---------------------------------------------------------------- gold values -> the declared type

# A rule looks at one value against the JSON types its schema allows; it returns (new value, note) when it
# converts, else None. Each parser passes the rules its source's gold values need, in the order they are tried.
Rule = Callable[[Any, list[str], dict], tuple[Any, str] | None]

_INT_RE = re.compile(r"[+-]?\d+")
_NUM_RE = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_LITERAL_ERRORS = (ValueError, SyntaxError, TypeError, MemoryError, RecursionError)
_BRACKETS = "[{("


def schema_types(schema: dict) -> list[str]:
    """The JSON types a schema allows: its ``type`` (one or a list), else those of its ``anyOf`` branches."""
    if "type" in schema:
        return [schema["type"]] if isinstance(schema["type"], str) else list(schema["type"])
    return [t for alt in schema.get("anyOf", []) for t in schema_types(alt)]


def _allowed(value: Any, types: list[str]) -> bool:
    """Whether the value's JSON type is one of ``types`` (an int is a number too; a float is only a number)."""
    if isinstance(value, bool):
        return "boolean" in types
    if isinstance(value, int):
        return "integer" in types or "number" in types
    kind = {float: "number", str: "string", list: "array", dict: "object", type(None): "null"}.get(type(value))
    return kind in types


def _int_text(s: str) -> bool:
    """``"63"``, ``"+5"``, ``"-7"``: an integer written as ``str(int)`` writes it (``"05"`` is not: a code, maybe)."""
    return bool(_INT_RE.fullmatch(s)) and str(int(s)) == s.lstrip("+")


def jsonable(v: Any) -> Any:
    """Python literal -> JSON value (tuples to lists, sets to sorted lists, non-string keys to strings)."""
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (set, frozenset)):
        return sorted((jsonable(x) for x in v), key=repr)
    return v


def str_to_integer(value: Any, types: list[str], schema: dict) -> tuple[Any, str] | None:
    """``"63"`` -> ``63`` for an integer."""
    if isinstance(value, str) and "integer" in types and _int_text(value.strip()):
        return int(value.strip()), "str->integer"
    return None


def str_to_number(value: Any, types: list[str], schema: dict) -> tuple[Any, str] | None:
    """``"37"`` -> ``37``, ``"74.0060"`` -> ``74.006`` for a number (finite values only)."""
    if not (isinstance(value, str) and "number" in types):
        return None
    s = value.strip()
    if _int_text(s):
        return int(s), "str->number"
    if _NUM_RE.fullmatch(s) and math.isfinite(float(s)):
        return float(s), "str->number"
    return None


def str_to_boolean(value: Any, types: list[str], schema: dict) -> tuple[Any, str] | None:
    """``"true"`` / ``"False"`` -> ``True`` / ``False`` for a boolean."""
    if isinstance(value, str) and "boolean" in types and value.strip() in ("true", "false", "True", "False"):
        return value.strip() in ("true", "True"), "str->boolean"
    return None


def number_to_string(value: Any, types: list[str], schema: dict, note: str | None = None) -> tuple[Any, str] | None:
    """``80`` -> ``"80"``, ``0.92`` -> ``"0.92"`` for a string that allows no number; the note says
    ``integer->string`` or ``number->string`` by the value's kind unless ``note`` fixes it."""
    if (isinstance(value, (int, float)) and not isinstance(value, bool) and "string" in types
            and not {"integer", "number"} & set(types)):
        return str(value), note or f"{'integer' if isinstance(value, int) else 'number'}->string"
    return None


def bool_to_string(value: Any, types: list[str], schema: dict) -> tuple[Any, str] | None:
    """``True`` -> ``"true"`` for a string."""
    if isinstance(value, bool) and "string" in types:
        return ("true" if value else "false"), "boolean->string"
    return None


def float_to_integer(value: Any, types: list[str], schema: dict) -> tuple[Any, str] | None:
    """``5.0`` -> ``5`` for an integer."""
    if isinstance(value, float) and "integer" in types and value.is_integer():
        return int(value), "number->integer"
    return None


def str_to_literal(value: Any, types: list[str], schema: dict) -> tuple[Any, str] | None:
    """``"['a', 'b']"`` -> ``['a', 'b']`` for an array, ``"{'k': 1}"`` -> ``{'k': 1}`` for an object: a Python
    (else JSON) literal written as a string."""
    s = value.strip() if isinstance(value, str) else ""
    if not (s[:1] and s[:1] in _BRACKETS and ("array" in types or "object" in types)):
        return None
    try:
        lit = ast.literal_eval(s)
    except _LITERAL_ERRORS:
        try:
            lit = json.loads(s)
        except json.JSONDecodeError:
            return None
    if isinstance(lit, (list, tuple)) and "array" in types:
        return jsonable(lit), "str->array"
    if isinstance(lit, dict) and "object" in types:
        return jsonable(lit), "str->object"
    return None


def str_to_singleton(value: Any, types: list[str], schema: dict) -> tuple[Any, str] | None:
    """``"EUR"`` -> ``["EUR"]`` for an array (first of its types) of strings; text that opens a bracket is not one
    item."""
    if not (isinstance(value, str) and types[:1] == ["array"]):
        return None
    s = value.strip()
    if s and s[:1] not in _BRACKETS and schema_types(schema.get("items", {})) == ["string"]:
        return [s], "str->array[1]"
    return None


def strings_to_comma_string(value: Any, types: list[str], schema: dict) -> tuple[Any, str] | None:
    """``["EUR", "GBP"]`` -> ``"EUR,GBP"`` for a string (a "list of currencies" typed as one string)."""
    if isinstance(value, list) and value and all(isinstance(x, str) for x in value) and "string" in types:
        return ",".join(value), "array->comma_string"
    return None


SCALAR_RULES: tuple[Rule, ...] = (str_to_integer, str_to_number, str_to_boolean, number_to_string, bool_to_string)


def coerce_value(value: Any, schema: dict, rules: Sequence[Rule] = SCALAR_RULES) -> tuple[Any, str | None]:
    """Convert a gold value the schema rejects to the declared type, with the first of ``rules`` that applies.

    Returns ``(value, note)``, ``note`` None when nothing changed. A value whose JSON type the schema allows is
    left as it is (``"5"`` for ``["string", "integer"]``); so is everything no rule converts: the schema check
    downstream decides. Strings naming an earlier call's output (Seal-Tools ``"API_call_0"``) are never numbers.

    >>> coerce_value("63", {"type": "integer"}), coerce_value("05", {"type": "integer"})
    ((63, 'str->integer'), ('05', None))
    >>> coerce_value(0.92, {"type": "string"}), coerce_value("['a']", {"type": "array"}, (str_to_literal,))
    (('0.92', 'number->string'), (['a'], 'str->array'))
    """
    types = schema_types(schema)
    if not types or _allowed(value, types):
        return value, None
    for rule in rules:
        out = rule(value, types, schema)
        if out is not None:
            return out
    return value, None


def coerce_arguments(arguments: dict, parameters: dict,
                     rules: Sequence[Rule] = SCALAR_RULES) -> tuple[dict, dict[str, str]]:
    """:func:`coerce_value` on each top-level argument that ``parameters`` declares.

    Returns ``(new_arguments, {param: note})`` for the converted ones, in argument order.
    """
    props = parameters.get("properties", {})
    out, notes = {}, {}
    for k, v in arguments.items():
        out[k], note = coerce_value(v, props[k], rules) if k in props else (v, None)
        if note:
            notes[k] = note
    return out, notes
