"""Tool schemas as real APIs write them, read one way by every consumer (FSM, sidecar views, validators).

Tool JSON Schemas come from users and the web: type lists (``["string", "null"]``), boolean sub-schemas
(``true``), missing or null keywords, ``$ref`` into the tool's own ``$defs``. This module is the one
normalization step for all of that; nothing here raises on a malformed schema -- an unusable part reads as
"anything" (so a drafter drafts nothing for it, a view shows ``any``, a hint is not filtered by it).

    tool_function(tool)        the function dict of an OpenAI-style tool (``{}`` when there is none)
    tool_name(tool)            its non-empty string name, or None
    normalize(schema, root)    a dict schema: ``True``/non-dicts -> ``{}``, ``False`` -> ``{"not": {}}``,
                               wrong-typed keywords dropped, a local ``$ref`` resolved against ``root``
    properties(params_schema)  ``{name: normalized sub-schema}`` (``{}`` when absent or malformed)
    required(params_schema)    the required names that are strings
    type_view(schema)          ``string``, ``integer|null``, ``array[string]``, ``"c"|"f"``, ``any``
    admitted(schema, root)     which JSON values a schema admits, by kind (what the schema FSM drafts from)
    first_error(value, schema) the first validation error, with every regex bounded in time
    value_matches(v, schema)   does ``v`` validate (bounded time; an uncheckable schema accepts)

Patterns (``pattern``, ``patternProperties`` and the ``additionalProperties`` that depend on them) are matched
with the ``regex`` engine under a time budget (:data:`PATTERN_BUDGET_S` per validation, all patterns
together): a catastrophic pattern such as ``^(a|aa)+$`` raises :class:`UncheckableSchema` after the budget
instead of hanging the process. Python's ``re`` (what ``jsonschema`` matches with) cannot be interrupted, so it
never matches a tool's pattern here (the metaschema check only compiles patterns).
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

import jsonschema
import regex
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from ooospec.runtime.calls import compact_json

MAX_REF_HOPS = 16           # a chain of $ref longer than this (or a cycle) reads as "anything"
MAX_VIEW_DEPTH = 8          # anyOf / items nesting a view or `admitted` follows
MAX_JSON_DEPTH = 64         # nesting accepted in schemas and values that get validated
PATTERN_BUDGET_S = 0.2      # regex time per validation (all patterns of one first_error call together)

KINDS = ("string", "number", "boolean", "null", "object", "array")
_TYPE_KIND = {"string": "string", "number": "number", "integer": "number", "boolean": "boolean",
              "null": "null", "object": "object", "array": "array"}
# keywords whose value must have one shape; anything else is dropped by normalize()
_MAPPING_KEYWORDS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LIST_KEYWORDS = ("enum", "required", "anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_KEYWORDS = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
                    "propertyNames", "unevaluatedProperties", "unevaluatedItems")


class UncheckableSchema(ValueError):
    """The schema cannot be checked against this value in bounded time (or with the bounded engine)."""


# ---------------------------------------------------------------- tools


def tool_function(tool: Any) -> dict:
    """``tool["function"]`` for ``{"type": "function", "function": {...}}``, the tool itself for a bare one."""
    if not isinstance(tool, Mapping):
        return {}
    fn = tool.get("function", tool)
    return dict(fn) if isinstance(fn, Mapping) else {}


def tool_name(tool: Any) -> str | None:
    """The tool's function name when it is a non-empty string, else None."""
    name = tool_function(tool).get("name")
    return name if isinstance(name, str) and name else None


# ---------------------------------------------------------------- normalization


def _pointer(root: Mapping, ref: str) -> Any:
    """The value at a local JSON pointer ``#/a/b~1c`` inside ``root``; None when there is none."""
    if ref in ("#", ""):
        return root
    if not ref.startswith("#/"):
        return None
    node: Any = root
    for raw in ref[2:].split("/"):
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
        if node is None:
            return None
    return node


def _clean(schema: Mapping) -> dict:
    """A copy without wrong-typed keywords (``required: null``, ``properties: [...]``, ``enum: "a"``)."""
    out = {}
    for key, value in schema.items():
        if not isinstance(key, str):
            continue
        if key in _MAPPING_KEYWORDS and not isinstance(value, Mapping):
            continue
        if key in _LIST_KEYWORDS and not isinstance(value, (list, tuple)):
            continue
        if key in _SCHEMA_KEYWORDS and not isinstance(value, (Mapping, bool)):
            continue
        if key == "type" and not isinstance(value, (str, list, tuple)):
            continue
        out[key] = value
    return out


def normalize(schema: Any, root: Any = None) -> dict:
    """A dict schema for any JSON Schema value.

    ``True`` / missing / malformed -> ``{}`` (anything); ``False`` -> ``{"not": {}}`` (nothing); wrong-typed
    keywords are dropped; a ``$ref`` to a local pointer (``#/$defs/Unit``, ``#/definitions/Unit``) is resolved
    against ``root`` (default: the schema itself), its target merged under the schema's own keywords. An
    unresolvable, remote or cyclic ``$ref`` constrains nothing.
    """
    if schema is False:
        return {"not": {}}
    if not isinstance(schema, Mapping):
        return {}
    s = _clean(schema)
    base = root if isinstance(root, Mapping) else schema
    for _ in range(MAX_REF_HOPS):
        ref = s.get("$ref")
        if not isinstance(ref, str):
            return s
        target = _pointer(base, ref)
        del s["$ref"]
        if target is False:
            return {"not": {}}
        if not isinstance(target, Mapping):
            return s
        s = {**_clean(target), **s}
    s.pop("$ref", None)
    return s


def _with_defs(schema: dict, root: Mapping) -> dict:
    """``schema`` carrying ``root``'s ``$defs`` / ``definitions`` when it refers to them (so that it can be
    validated or viewed on its own)."""
    defs = {k: root[k] for k in ("$defs", "definitions")
            if isinstance(root.get(k), Mapping) and k not in schema}
    if not defs:
        return schema
    try:
        refers = '"$ref"' in json.dumps(schema, default=str)
    except (ValueError, RecursionError):
        refers = False
    return {**schema, **defs} if refers else schema


def properties(params_schema: Any) -> dict[str, Any]:
    """``{name: sub-schema}`` of an object schema, declaration order kept; non-string names dropped.

    Each sub-schema is normalized (``$ref`` resolved against ``params_schema``, which also lends it its
    ``$defs`` when nested parts refer to them); ``False`` stays ``False`` (the key may not appear).
    """
    root = params_schema if isinstance(params_schema, Mapping) else {}
    props = normalize(params_schema, root).get("properties")
    if not isinstance(props, Mapping):
        return {}
    return {k: (v if v is False else _with_defs(normalize(v, root), root))
            for k, v in props.items() if isinstance(k, str)}


def required(params_schema: Any) -> list[str]:
    """Required names that are strings (duplicates dropped, order kept)."""
    req = normalize(params_schema).get("required")
    if not isinstance(req, (list, tuple)):
        return []
    return list(dict.fromkeys(r for r in req if isinstance(r, str)))


def types(schema: Any) -> list[str]:
    """The ``type`` keyword as a list of strings (``"string"`` -> ``["string"]``; absent -> ``[]``)."""
    t = normalize(schema).get("type")
    if isinstance(t, str):
        return [t]
    if isinstance(t, (list, tuple)):
        return list(dict.fromkeys(x for x in t if isinstance(x, str)))
    return []


# ---------------------------------------------------------------- views


def _compact(value: Any) -> str:
    """:func:`~ooospec.runtime.calls.compact_json`, or ``?`` for what JSON cannot hold."""
    try:
        return compact_json(value)
    except (TypeError, ValueError, RecursionError):
        return "?"


def type_view(schema: Any, max_enum_values: int = 12, root: Any = None, _depth: int = 0) -> str:
    """Compact type: ``string``, ``integer|null``, ``array[string]``, ``"c"|"f"``, ``any``.

    Enums and ``anyOf``/``oneOf`` variants show at most ``max_enum_values`` entries, then ``|...``.
    """
    s = normalize(schema, root)
    root = root if isinstance(root, Mapping) else s
    if _depth > MAX_VIEW_DEPTH:
        return "any"
    enum = s.get("enum")
    if enum:
        values = [_compact(v) for v in enum[:max_enum_values]]
        return "|".join(values) + ("|..." if len(enum) > max_enum_values else "")
    if "const" in s:
        return _compact(s["const"])
    ts = types(s)
    if ts == ["array"] and "items" in s:
        return f"array[{type_view(s['items'], max_enum_values, root, _depth + 1)}]"
    if ts:
        return "|".join(ts)
    variants = s.get("anyOf") or s.get("oneOf")
    if variants:
        shown = [type_view(v, max_enum_values, root, _depth + 1) for v in variants[:max_enum_values]]
        return "|".join(shown) + ("|..." if len(variants) > max_enum_values else "")
    return "any"


def _kind_of(value: Any) -> str | None:
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, (list, tuple)):
        return "array"
    return None


def _add(into: dict[str, list | None], seen: set[tuple], kind: str, values: list | None) -> None:
    """Merge ``values`` of ``kind`` into ``into`` (None = any value of the kind); ``seen`` dedupes by type and
    value (``1`` and ``1.0`` stay apart: both are texts a model may write)."""
    if values is None or into.get(kind, []) is None:
        into[kind] = None
        return
    have = into.setdefault(kind, [])
    for v in values:
        key = (type(v), v) if isinstance(v, (str, int, float, type(None))) else (type(v), _compact(v))
        if key not in seen:
            seen.add(key)
            have.append(v)


def admitted(schema: Any, root: Any = None, _depth: int = 0) -> dict[str, list | None]:
    """Which JSON values ``schema`` admits, by kind (``KINDS``; integers count as ``number``).

    ``{kind: None}``: any value of that kind; ``{kind: [v, ...]}``: only those values; a kind that is absent
    admits nothing. The answer may admit more than the schema but never less: it reads ``enum``, ``const``,
    ``type`` and ``anyOf``/``oneOf`` and ignores keywords that only narrow (``pattern``, ``minimum``,
    ``allOf``, ``not``, ...). An unknown type name, no type at all or an unusable schema admit everything.

    >>> admitted({"type": ["string", "null"]})
    {'string': None, 'null': None}
    >>> admitted({"enum": ["a", 1, None]})
    {'string': ['a'], 'number': [1], 'null': [None]}
    """
    everything: dict[str, list | None] = {k: None for k in KINDS}
    s = normalize(schema, root)
    if s == {"not": {}}:
        return {}
    if _depth > MAX_VIEW_DEPTH:
        return everything
    root = root if isinstance(root, Mapping) else s
    values = s["enum"] if "enum" in s else [s["const"]] if "const" in s else None
    out: dict[str, list | None] = {}
    seen: set[tuple] = set()
    if values is not None:
        for v in values:
            kind = _kind_of(v)
            if kind is not None:
                _add(out, seen, kind, [v])
        return out
    ts = types(s)
    if ts:
        if any(t not in _TYPE_KIND for t in ts):
            return everything
        return {_TYPE_KIND[t]: None for t in ts}
    variants = s.get("anyOf") or s.get("oneOf")
    if variants:
        for v in variants:
            for kind, vs in admitted(v, root, _depth + 1).items():
                _add(out, seen, kind, vs)
        return out
    return everything


# ---------------------------------------------------------------- bounded validation


def within_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when ``value``'s containers nest at most ``limit`` deep (iterative: safe on any depth)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, Mapping):
            children = v.values()
        elif isinstance(v, (list, tuple)):
            children = v
        else:
            continue
        if depth > limit:
            return False
        stack.extend((c, depth + 1) for c in children if isinstance(c, (Mapping, list, tuple)))
    return True


_BUDGET = threading.local()


def _search(pattern: str, text: str) -> bool:
    """``re.search`` semantics, bounded by the current validation's deadline."""
    deadline = getattr(_BUDGET, "deadline", None)
    left = PATTERN_BUDGET_S if deadline is None else deadline - time.monotonic()
    if left <= 0:
        raise UncheckableSchema(f"pattern {pattern[:80]!r}: regex time budget ({PATTERN_BUDGET_S} s) spent")
    try:
        return regex.search(pattern, text, timeout=left) is not None
    except TimeoutError:
        raise UncheckableSchema(
            f"pattern {pattern[:80]!r} took over {PATTERN_BUDGET_S} s on a {len(text)}-character value "
            "(catastrophic backtracking); simplify the pattern") from None
    except (regex.error, TypeError) as e:
        raise UncheckableSchema(f"pattern {str(pattern)[:80]!r} is not a usable regex ({e})") from None


def _pattern(validator, patrn, instance, schema):
    if validator.is_type(instance, "string") and not _search(patrn, instance):
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


def _pattern_properties(validator, pattern_properties, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in pattern_properties.items():
        for k, v in instance.items():
            if _search(pattern, k):
                yield from validator.descend(v, subschema, path=k, schema_path=pattern)


def _additional_properties(validator, aP, instance, schema):
    """jsonschema's ``additionalProperties``, with its patternProperties lookup bounded."""
    if not validator.is_type(instance, "object"):
        return
    props = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [k for k in instance if k not in props and not any(_search(p, k) for p in patterns)]
    if validator.is_type(aP, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], aP, path=extra)
    elif not aP and extras:
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: "
                                  + ", ".join(repr(p) for p in sorted(patterns)))
        else:
            listed = ", ".join(repr(e) for e in sorted(extras, key=str))
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(f"Additional properties are not allowed ({listed} {verb} unexpected)")


def _unchecked_unevaluated(validator, value, instance, schema):
    raise UncheckableSchema("unevaluatedProperties next to patternProperties is not checked (its pattern "
                            "lookups cannot be bounded in time)")


_Bounded = jsonschema.validators.extend(Draft202012Validator, {
    "pattern": _pattern, "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties})
_BoundedNoUnevaluated = jsonschema.validators.extend(
    _Bounded, {"unevaluatedProperties": _unchecked_unevaluated})


def _build_validator(schema: dict | bool, text: str) -> Draft202012Validator:
    """``text``: the schema's JSON ('' when it has none), to see whether unevaluatedProperties may need a
    pattern lookup that this module cannot bound."""
    risky = not text or ('"unevaluatedProperties"' in text and '"patternProperties"' in text)
    return (_BoundedNoUnevaluated if risky else _Bounded)(schema)


@functools.lru_cache(maxsize=4096)
def _cached_validator(schema_json: str) -> Draft202012Validator:
    return _build_validator(json.loads(schema_json), schema_json)


def bounded_validator(schema: Any) -> Draft202012Validator:
    """A Draft 2020-12 validator of ``schema`` whose regexes run under the time budget (cached by content).

    Wrong-typed top-level keywords are dropped; ``$ref`` is left to jsonschema (its meaning is the
    intersection with the sibling keywords, which :func:`normalize`'s merged view only approximates). The
    schema itself is not checked here (``Draft202012Validator.check_schema``).
    """
    s = schema if isinstance(schema, bool) else _clean(schema) if isinstance(schema, Mapping) else {}
    try:
        text = json.dumps(s, sort_keys=True, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return _build_validator(s, "")
    return _cached_validator(text)


def errors(value: Any, schema: Any, budget_s: float = PATTERN_BUDGET_S) -> list[ValidationError]:
    """Every validation error of ``value`` against ``schema``; all regexes together get ``budget_s``.

    Raises:
        UncheckableSchema: a pattern ran out of time or is not a usable regex, or value/schema nest deeper
            than :data:`MAX_JSON_DEPTH`.
    """
    if not within_depth(value) or not within_depth(schema):
        raise UncheckableSchema(f"value or schema nests deeper than {MAX_JSON_DEPTH} levels")
    outer = getattr(_BUDGET, "deadline", None)
    _BUDGET.deadline = time.monotonic() + budget_s
    try:
        return list(bounded_validator(schema).iter_errors(value))
    except RecursionError:
        raise UncheckableSchema("schema recursion too deep to check") from None
    finally:
        _BUDGET.deadline = outer


def first_error(value: Any, schema: Any, budget_s: float = PATTERN_BUDGET_S) -> ValidationError | None:
    """The most relevant validation error (``jsonschema.exceptions.best_match``), or None when valid.

    Raises:
        UncheckableSchema: see :func:`errors`.
    """
    return jsonschema.exceptions.best_match(errors(value, schema, budget_s))


def value_matches(value: Any, schema: Any) -> bool:
    """True when ``value`` validates against ``schema``; a schema that cannot be checked (malformed, a regex
    out of time, too deep) accepts the value. Bounded in time by :data:`PATTERN_BUDGET_S` for the regexes."""
    try:
        return first_error(value, schema) is None
    except UncheckableSchema:
        return True
    except Exception:  # noqa: BLE001 - a malformed schema (e.g. "minimum": "x") constrains nothing we can check
        return True
