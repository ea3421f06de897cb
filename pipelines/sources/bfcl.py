"""BFCL v4 single-turn AST categories (Berkeley Function Calling Leaderboard) -> records.

Raw layout (``root`` = ``<datasets>/bfcl/raw``; datasets README §5 and §7-BFCL). Only v4 files are read::

    BFCL_v4_simple_python.json       -> split "simple-python"      (+ possible_answer/<same name>)
    BFCL_v4_simple_java.json         -> split "simple-java"
    BFCL_v4_simple_javascript.json   -> split "simple-javascript"
    BFCL_v4_multiple.json            -> split "multiple"
    BFCL_v4_parallel.json            -> split "parallel"

Files named ``.json`` are JSON Lines. A question line is ``{"id", "question": [[{role, content}, ...]], "function":
[...]}``, an answer line ``{"id", "ground_truth": [{func_name: {param: [allowed values]}}, ...]}``.

**Schemas.** BFCL's ``parameters`` are almost JSON Schema; :func:`convert_schema` fixes the types recursively
(``properties``, ``items``): ``dict`` -> ``object``, ``float`` -> ``number``, ``tuple`` -> ``array``, ``any`` (and
``""``) -> no type constraint; the non-standard ``optional`` flag is dropped. Every function description gets
BFCL's language hint (" Note that the provided function is in Python 3 syntax."), as BFCL's harness shows it.

**Java / JavaScript.** BFCL's harness (``bfcl_eval.utils._func_doc_language_specific_pre_processing``) turns every
top-level parameter into ``"type": "string"`` with " This is Java <T> type parameter in string representation."
(or "... can be of any type of Java object ...") appended, drops ``items`` of arrays (naming the element type in
the description) and, for JS, the ``properties`` of dicts (dumped into the description). Models then emit Java/JS
*source strings* that BFCL converts back (``java_type_converter`` / ``js_type_converter``) before comparing with
the typed ``possible_answer``. We reproduce the same tool text, and the gold call holds the source string that
those converters map back to the first allowed value (:func:`java_source`, :func:`js_source`)::

    Java  boolean true -> "true"   long 5 -> "5L"   float 2.5 -> "2.5f"   double 2 -> "2.0"
          ArrayList ["a","b"] -> 'new ArrayList<>(Arrays.asList("a", "b"))'   Array<int> [1,2] -> "new int[]{1, 2}"
          HashMap {"limit": 50} -> 'new HashMap<String, Object>() {{ put("limit", 50); }}'
    JS    Boolean true -> "true"   array ["a", 1] -> '["a", 1]'   dict {"k": "v"} -> '{"k": "v"}'
    both  String / any "mapController" -> "mapController"   (no quotes, as BFCL expects)

The typed originals stay in ``meta.allowed`` and the unmodified BFCL function docs in ``meta.functions``.
Checked with BFCL's own AST checker (bfcl-eval 2026.3.23): the gold calls of all 950 records pass except 11 Java
ones, where BFCL's converter cannot read valid Java -- it keeps the quotes of ``String[]`` elements and of
``ArrayList<any>`` elements, and one answer (``simple_java_64``) is not a ``{key: [allowed]}`` map.

**Gold call.** For each parameter of each ``ground_truth`` entry (:func:`pick_value`): take the first allowed value
that is not ``""`` *and validates against the converted parameter schema* (allowed values sometimes break the
declared type, e.g. a string for an integer); if none validates, omit the parameter when ``""`` is allowed, else
keep the first non-empty value (the ingest validation then rejects the record). If the only allowed value is
``""`` the parameter is omitted. Allowed lists hold one value per entry, so a list-typed value arrives "wrapped
once more" (``[[60, 30]]`` = the single value ``[60, 30]``) and taking an entry unwraps it; dict-typed values are
themselves ``{key: [allowed]}`` and are resolved recursively (also inside lists). Parallel categories give several
calls, in ``ground_truth`` order (BFCL checks them order-insensitively).

``meta.allowed`` is ``ground_truth`` verbatim (list of ``{func: {param: [allowed]}}``, one per call), which is
what BFCL's AST checker compares against.

**Names with dots** (``spotify.play``, ``GeometryPresentation.createPresentation``) are kept as they are, in
``tools`` and ``calls``. OpenAI-style tool APIs reject ``.``; BFCL maps ``.`` -> ``_`` for those models and back
when checking -- a consumer that needs it must do the same (no mapping is stored because nothing is renamed).

Worked example (``simple_python_0``)::

    question  [[{"role": "user", "content": "Find the area of a triangle with a base of 10 units and ..."}]]
    function  calculate_triangle_area {"type": "dict", "properties": {"base": {"type": "integer"}, ...}}
    answer    {"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}}
    -> record  id "bfcl/simple-python/simple_python_0",  parameters {"type": "object", ...}
               calls [{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5, "unit": "units"}}]
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from ooospec.pipelines.records import MALFORMED_RECORD, Reject, call, make_record, tool

SOURCE = "bfcl"
LICENSE = "Apache-2.0"
UPSTREAM = "ShishirPatil/gorilla@6ea57973c7a6097fd7c5915698c54c17c5b1b6c8"

MISSING_ANSWER = "missing_answer"
UNSUPPORTED_TYPE = "unsupported_type"

# split -> language of the function docs
_LANGUAGES: dict[str, str] = {"simple-python": "python", "simple-java": "java", "simple-javascript": "javascript",
                              "multiple": "python", "parallel": "python"}
# split -> (question file under root, language of the function docs); "simple-java" -> BFCL_v4_simple_java.json
SPLITS: dict[str, tuple[str, str]] = {split: (f"BFCL_v4_{split.replace('-', '_')}.json", language)
                                      for split, language in _LANGUAGES.items()}
ANSWER_DIR = "possible_answer"

# BFCL Python type names -> JSON Schema type (None = no constraint)
PY_TYPES: dict[str, str | None] = {
    "dict": "object", "object": "object", "float": "number", "number": "number", "integer": "integer",
    "string": "string", "boolean": "boolean", "array": "array", "tuple": "array", "any": None, "": None,
}
# Java / JavaScript doc types (used only for nested schemas kept in the description-side of the tool)
JAVA_JS_TYPES: dict[str, str | None] = PY_TYPES | {
    "String": "string", "Boolean": "boolean", "char": "string", "long": "integer", "short": "integer",
    "byte": "integer", "double": "number", "Bigint": "integer", "HashMap": "object", "ArrayList": "array",
    "Array": "array",
}
LANGUAGE_HINT = {
    "python": " Note that the provided function is in Python 3 syntax.",
    "java": " Note that the provided function is in Java 8 SDK syntax.",
    "javascript": " Note that the provided function is in JavaScript syntax.",
}
_DROP_KEYS = ("optional",)


class UnsupportedType(ValueError):
    """A parameter type this parser has no JSON Schema translation for."""


# ---------------------------------------------------------------- schemas

def convert_schema(node: dict, types: dict[str, str | None] = PY_TYPES) -> dict:
    """BFCL parameter schema -> JSON Schema, recursively through ``properties`` and ``items``.

    >>> convert_schema({"type": "dict", "properties": {"x": {"type": "float"}, "p": {"type": "tuple",
    ...                 "items": {"type": "any"}}}, "required": ["x"]})
    {'type': 'object', 'properties': {'x': {'type': 'number'}, 'p': {'type': 'array', 'items': {}}}, 'required': ['x']}
    """
    out: dict[str, Any] = {}
    for key, val in node.items():
        if key == "type":
            if val not in types:
                raise UnsupportedType(f"type {val!r}")
            if types[val] is not None:
                out["type"] = types[val]
        elif key == "properties":
            out["properties"] = {p: convert_schema(s, types) for p, s in val.items()}
        elif key == "items":
            out["items"] = convert_schema(val, types)
        elif key not in _DROP_KEYS:
            out[key] = copy.deepcopy(val)
    return out


def java_js_parameters(params: dict, language: str) -> dict:
    """Top-level parameters as BFCL's harness shows them for Java/JS: every parameter a string.

    Mirrors ``_func_doc_language_specific_pre_processing``: description suffix, ``items`` of arrays removed
    (element type named in the description), JS dict ``properties`` dumped into the description. What BFCL leaves
    in place (a Java ``HashMap``'s ``properties``) is kept but made valid JSON Schema; ``default``/``enum`` values
    are written as source strings so they are strings like the parameter.
    """
    lang = "Java" if language == "java" else "JavaScript"
    props = {}
    for name, spec in params.get("properties", {}).items():
        spec = copy.deepcopy(spec)
        t = spec.get("type", "any")
        desc = spec.get("description", "")
        if t == "any":
            desc += f" This parameter can be of any type of {lang} object in string representation."
        else:
            desc += f" This is {lang} {t} type parameter in string representation."
        if (language == "java" and t in ("ArrayList", "Array")) or (language == "javascript" and t == "array"):
            item_t = spec.get("items", {}).get("type")
            desc += f" The list elements are of type {item_t}; they are not in string representation."
            spec.pop("items", None)
        if language == "javascript" and t == "dict" and "properties" in spec:
            desc += (" The dictionary entries have the following schema; they are not in string representation. "
                     + json.dumps(spec.pop("properties")))
        out = convert_schema({k: v for k, v in spec.items() if k not in ("type", "description", "default", "enum")},
                             JAVA_JS_TYPES)
        out = {"type": "string", "description": desc} | out
        encode = java_source if language == "java" else js_source
        if "default" in spec:
            out["default"] = encode(spec["default"], spec)
        if "enum" in spec:
            out["enum"] = [encode(v, spec) for v in spec["enum"]]
        props[name] = out
    return {"type": "object", "properties": props, "required": list(params.get("required", []))}


def bfcl_tool(fn: dict, language: str) -> dict:
    """One BFCL function doc -> a record tool (JSON Schema parameters, BFCL's language hint on the description)."""
    params = fn["parameters"]
    if language == "python":
        schema = convert_schema(params)
    else:
        schema = java_js_parameters(params, language)
    schema["type"] = "object"
    return tool(fn["name"], fn.get("description", "") + LANGUAGE_HINT[language], schema)


# ---------------------------------------------------------------- Java / JS source strings

def _java_literal(v: Any, elem_type: str | None = None) -> str:
    """A Java literal for one collection element (strings quoted, as ``parse_java_value`` expects)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        if elem_type == "char" and len(v) == 1:
            return "'" + v + "'"
        return json.dumps(v, ensure_ascii=False)
    if elem_type == "long" and isinstance(v, int):
        return f"{v}L"
    if elem_type == "float" and isinstance(v, (int, float)):
        return f"{float(v)!r}f"
    if isinstance(v, float) or elem_type == "double":
        return repr(float(v))
    if isinstance(v, (list, dict)):
        return java_source(v, {"type": "ArrayList" if isinstance(v, list) else "HashMap"})
    return str(v)


_JAVA_ARRAY_ELEM = {"integer": "int", "String": "String", "boolean": "boolean", "long": "long", "double": "double",
                    "float": "float", "char": "char", "byte": "byte", "short": "short"}


def java_source(value: Any, spec: dict) -> str:
    """Typed BFCL answer value -> the Java source string BFCL's ``java_type_converter`` maps back to it.

    >>> java_source(["a", "b"], {"type": "ArrayList", "items": {"type": "String"}})
    'new ArrayList<>(Arrays.asList("a", "b"))'
    >>> java_source(5, {"type": "long"})
    '5L'
    """
    t = spec.get("type", "any")
    elem = spec.get("items", {}).get("type") if isinstance(spec.get("items"), dict) else None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        inner = ", ".join(_java_literal(v, elem) for v in value)
        if t == "Array":
            return f"new {_JAVA_ARRAY_ELEM.get(elem, 'Object')}[]{{{inner}}}"
        return f"new ArrayList<>(Arrays.asList({inner}))" if value else "new ArrayList<>()"
    if isinstance(value, dict):
        puts = " ".join(f"put({json.dumps(str(k), ensure_ascii=False)}, {_java_literal(v)});" for k, v in value.items())
        return f"new HashMap<String, Object>() {{{{ {puts} }}}}" if value else "new HashMap<>()"
    if t == "long" and isinstance(value, int):
        return f"{value}L"
    if t == "float":
        return f"{float(value)!r}f"
    if t == "double" or isinstance(value, float):
        return repr(float(value))
    return str(value)


def js_source(value: Any, spec: dict) -> str:
    """Typed BFCL answer value -> the JavaScript source string BFCL's ``js_type_converter`` maps back to it.

    Strings are passed through unquoted (``String``/``any``); everything else is JSON, which is JS source.

    >>> js_source({"k": "v", "n": 2}, {"type": "dict"})
    '{"k": "v", "n": 2}'
    >>> js_source(True, {"type": "Boolean"})
    'true'
    """
    if isinstance(value, str):
        return value
    if isinstance(value, float) and math.isfinite(value) and spec.get("type") == "integer" and value.is_integer():
        value = int(value)
    return json.dumps(value, ensure_ascii=False)


# ---------------------------------------------------------------- gold values

def resolve_allowed(value: Any) -> Any:
    """Turn one allowed value into a concrete value: dicts are ``{key: [allowed]}`` maps, resolved recursively.

    >>> resolve_allowed({"limit": [50], "filter": ["", "public"], "opt": [""]})
    {'limit': 50, 'filter': 'public'}
    >>> resolve_allowed([{"a": [1]}, {"a": [2, 3]}])
    [{'a': 1}, {'a': 2}]
    """
    if isinstance(value, dict):
        out = {}
        for k, allowed in value.items():
            if not isinstance(allowed, list):
                out[k] = allowed
                continue
            present, v = pick_value(allowed, None)
            if present:
                out[k] = v
        return out
    if isinstance(value, list):
        return [resolve_allowed(v) for v in value]
    return value


def pick_value(allowed: list, schema: dict | None) -> tuple[bool, Any]:
    """Choose the gold value for one parameter from its allowed list; ``(False, None)`` = omit the parameter.

    The first non-``""`` value that validates against ``schema`` (``None`` = no check); else omit if ``""`` is
    allowed; else the first non-``""`` value.

    >>> pick_value(["units", ""], {"type": "string"})
    (True, 'units')
    >>> pick_value(["", 0], {"type": "integer"})
    (True, 0)
    >>> pick_value([""], {"type": "integer"})
    (False, None)
    >>> pick_value(["5", 5], {"type": "integer"})     # first value breaks the type, second fits
    (True, 5)
    """
    candidates = [resolve_allowed(v) for v in allowed if not (isinstance(v, str) and v == "")]
    if schema is not None:
        validator = Draft202012Validator(schema)
        for c in candidates:
            if validator.is_valid(c):
                return True, c
    elif candidates:
        return True, candidates[0]
    if "" in allowed or not candidates:
        return False, None
    return True, candidates[0]


def gold_calls(ground_truth: list[dict], functions: dict[str, dict], language: str) -> list[dict]:
    """``ground_truth`` -> ``[{"name", "arguments"}]`` following :func:`pick_value` (Java/JS: source strings)."""
    calls = []
    for entry in ground_truth:
        (name, params), = entry.items()
        fn = functions.get(name)
        orig_props = fn["parameters"].get("properties", {}) if fn else {}
        args = {}
        for p, allowed in params.items():
            if language == "python":
                schema = convert_schema(orig_props[p]) if p in orig_props else None
                present, v = pick_value(allowed, schema)
            else:
                present, v = pick_value(allowed, None)
                if present:
                    v = (java_source if language == "java" else js_source)(v, orig_props.get(p, {}))
            if present:
                args[p] = v
        calls.append(call(name, args))
    return calls


# ---------------------------------------------------------------- files

def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
    return rows


def parse_split(root: Path, split: str) -> Iterator[dict | Reject]:
    """Yield the records (or rejects) of one split, in file order."""
    fname, language = SPLITS[split]
    questions = _read_jsonl(root / fname)
    answers = {a["id"]: a for a in _read_jsonl(root / ANSWER_DIR / fname)}
    for q in questions:
        qid = q.get("id", "?")
        where = f"{fname} id={qid}"
        ans = answers.get(qid)
        if ans is None:
            yield Reject(SOURCE, split, qid, MISSING_ANSWER, f"{where}: no line in {ANSWER_DIR}/{fname}")
            continue
        try:
            functions = {fn["name"]: fn for fn in q["function"]}
            tools = [bfcl_tool(fn, language) for fn in q["function"]]
            messages = [{"role": m["role"], "content": m["content"]} for turn in q["question"] for m in turn]
            calls = gold_calls(ans["ground_truth"], functions, language)
        except UnsupportedType as e:
            yield Reject(SOURCE, split, qid, UNSUPPORTED_TYPE, f"{where}: {e}", raw=q)
            continue
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            yield Reject(SOURCE, split, qid, MALFORMED_RECORD, f"{where}: {type(e).__name__}: {e}", raw=q)
            continue
        meta = {"bfcl_id": qid, "language": language, "allowed": ans["ground_truth"], "functions": q["function"]}
        yield make_record(SOURCE, split, qid, tools, messages, calls, meta)


def parse(root: Path) -> Iterator[dict | Reject]:
    """All v4 single-turn splits of :data:`SPLITS`, in that order."""
    root = Path(root)
    for split in SPLITS:
        yield from parse_split(root, split)
