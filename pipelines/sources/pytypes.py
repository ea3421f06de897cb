"""Python-ish parameter type strings -> JSON Schema, and gold values -> the declared type.

Several sources describe parameters with Python type names instead of JSON Schema (Seal-Tools ``"int"``,
ToolRL ``"List[str]"``, ``"str, optional"``, ``"Tuple[float, float]"``). This module turns such a string into a
JSON Schema fragment and, separately, coerces a gold argument value that is obviously meant as the declared type
(``"63"`` for an ``int``) so that the gold call validates against the schema the model sees.

    >>> type_schema("List[float]")
    {'type': 'array', 'items': {'type': 'number'}}
    >>> type_schema("str, optional")
    {'type': 'string'}
    >>> type_schema("Callable[[float], float]")     # unknown -> no constraint
    {}
    >>> coerce_value("63", {"type": "integer"})
    (63, True)
"""

from __future__ import annotations

import re
from typing import Any

# base names (lower-cased) -> JSON Schema type
_BASE: dict[str, str] = {
    "str": "string", "string": "string", "text": "string", "char": "string",
    "int": "integer", "integer": "integer", "long": "integer",
    "float": "number", "double": "number", "number": "number", "decimal": "number",
    "bool": "boolean", "boolean": "boolean",
    "list": "array", "array": "array", "tuple": "array", "set": "array", "sequence": "array",
    "dict": "object", "object": "object", "mapping": "object",
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

    Accepts a JSON-Schema-like list (``["string", "null"]``), a base name (``str``, ``float``, ``dict``), a typing
    generic (``List[int]``, ``Dict[str, int]``, ``Tuple[float, float]``, ``Union[int, float]``, ``Optional[str]``)
    and the xLAM suffix ``", optional"``. Anything it cannot read becomes ``{}`` (no constraint): a wrong type
    would reject valid gold values, a missing one only loses a hint.
    """
    if isinstance(type_str, list):
        subs = [type_schema(t) for t in type_str]
        types = [s["type"] for s in subs if set(s) == {"type"} and isinstance(s["type"], str)]
        return {"type": sorted(set(types), key=types.index)} if len(types) == len(subs) and types else {}
    if not isinstance(type_str, str):
        return {}
    s = re.sub(r",\s*optional\s*$", "", type_str.strip(), flags=re.IGNORECASE).strip()
    m = re.fullmatch(r"([A-Za-z_.]+)\s*\[(.*)\]", s, re.DOTALL)
    if m is None:
        base = s.lower().split(".")[-1]
        return {"type": _BASE[base]} if base in _BASE else {}
    head, args = m.group(1).lower().split(".")[-1], split_top_level(m.group(2))
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


_INT_RE = re.compile(r"[+-]?\d+")
_NUM_RE = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def coerce_value(value: Any, schema: dict) -> tuple[Any, bool]:
    """Coerce a scalar gold value to a schema's single scalar type when the intent is unambiguous.

    Returns ``(value, changed)``. Only these conversions are made (everything else is returned unchanged, and
    the schema check downstream decides):

    ======================  ==========================  ================
    schema type             value                       result
    ======================  ==========================  ================
    integer                 ``"63"``                    ``63``
    number                  ``"19.0"`` / ``"37"``       ``19.0`` / ``37``
    boolean                 ``"true"`` / ``"False"``    ``True`` / ``False``
    string                  ``0.92`` / ``7``            ``"0.92"`` / ``"7"``
    ======================  ==========================  ================

    Strings naming an earlier call's output (Seal-Tools ``"API_call_0"``) are never numbers, so they stay strings.
    """
    t = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(value, bool) or value is None:
        if t == "string" and isinstance(value, bool):
            return ("true" if value else "false"), True
        return value, False
    if t == "integer" and isinstance(value, str) and _INT_RE.fullmatch(value.strip()):
        return int(value.strip()), True
    if t == "integer" and isinstance(value, float) and value.is_integer():
        return value, False  # JSON Schema accepts 5.0 as an integer already
    if t == "number" and isinstance(value, str) and _NUM_RE.fullmatch(value.strip()):
        v = value.strip()
        return (int(v) if _INT_RE.fullmatch(v) else float(v)), True
    if t == "boolean" and isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true", True
    if t == "string" and isinstance(value, (int, float)):
        return repr(value) if isinstance(value, float) else str(value), True
    return value, False


def coerce_arguments(arguments: dict, parameters: dict) -> tuple[dict, list[str]]:
    """Apply :func:`coerce_value` to each top-level argument; returns ``(new_args, coerced_param_names)``."""
    props = parameters.get("properties", {}) if isinstance(parameters, dict) else {}
    out, changed = {}, []
    for k, v in arguments.items():
        nv, did = coerce_value(v, props.get(k, {}))
        out[k] = nv
        if did:
            changed.append(k)
    return out, changed
