"""The source parsers' one schema/coercion module: type strings -> JSON Schema, and each parser's coercion rules.

Every source parser reads its type strings with ``type_schema`` and coerces its gold arguments with
``coerce_value`` / ``coerce_arguments`` and its own rules; the tests below pin what each rule set does, including
where the sources differ (``apibank.COERCIONS``, ``toolalpaca.COERCIONS``, the default ``SCALAR_RULES`` of
Seal-Tools and ToolRL).
"""

import pytest

from ooospec.pipelines.sources import apibank, toolalpaca
from ooospec.pipelines.sources import pytypes as P

# ---------------------------------------------------------------- type strings


def test_python_type_strings_to_json_schema():
    assert P.type_schema("str") == {"type": "string"}
    assert P.type_schema("str, optional") == {"type": "string"} and P.is_optional("int, optional")
    assert P.type_schema("List[str]") == {"type": "array", "items": {"type": "string"}}
    assert P.type_schema("List[List[float]]") == {"type": "array", "items": {"type": "array",
                                                                             "items": {"type": "number"}}}
    assert P.type_schema("List[Union[int, float]]") == {"type": "array", "items": {"type": "number"}}
    assert P.type_schema("Tuple[float, float]") == {"type": "array", "minItems": 2, "maxItems": 2,
                                                    "items": {"type": "number"}}
    assert P.type_schema("Dict") == {"type": "object"} and P.type_schema("List") == {"type": "array"}
    assert P.type_schema(["string", "null"]) == {"type": ["string", "null"]}
    assert P.type_schema("Callable[[float], float]") == {} and P.type_schema(None) == {}


@pytest.mark.parametrize("type_str, schema", [    # API-Bank's spellings
    ("str", {"type": "string"}), ("int", {"type": "integer"}), ("float", {"type": "number"}),
    ("bool", {"type": "boolean"}), ("dict", {"type": "object"}), ("json", {"type": "object"}),
    ("list", {"type": "array"}), ("datetime", {"type": "string"}), ("date", {"type": "string"}),
    ("time", {"type": "string"}),
    ("list(str)", {"type": "array", "items": {"type": "string"}}),
    ("List[str]", {"type": "array", "items": {"type": "string"}}),
    ("Union[List[dict], dict]",
     {"anyOf": [{"type": "array", "items": {"type": "object"}}, {"type": "object"}]}),
    ("Union[str, whatever]", {}), ("mystery", {}), (None, {}),
])
def test_type_strings_to_json_schema(type_str, schema):
    assert P.type_schema(type_str) == schema


def test_each_call_gets_its_own_schema_dict():
    a, b = P.type_schema("str"), P.type_schema("str")
    a["description"] = "x"
    assert b == {"type": "string"}


# ---------------------------------------------------------------- coercion: the default rules (Seal-Tools, ToolRL)

@pytest.mark.parametrize("value, schema, expected, note", [
    ("63", {"type": "integer"}, 63, "str->integer"),
    ("+5", {"type": "integer"}, 5, "str->integer"),
    ("05", {"type": "integer"}, "05", None),                     # not how an integer is written: a code, maybe
    ("19.0", {"type": "number"}, 19.0, "str->number"),
    ("37", {"type": "number"}, 37, "str->number"),
    ("1e999", {"type": "number"}, "1e999", None),                # not finite
    ("False", {"type": "boolean"}, False, "str->boolean"),
    ("TRUE", {"type": "boolean"}, "TRUE", None),
    (0.92, {"type": "string"}, "0.92", "number->string"),
    (7, {"type": "string"}, "7", "integer->string"),
    (True, {"type": "string"}, "true", "boolean->string"),
    (5.0, {"type": "integer"}, 5.0, None),                       # JSON Schema accepts 5.0 as an integer
    ("API_call_0", {"type": "integer"}, "API_call_0", None),
    ("1.5", {"type": "integer"}, "1.5", None),
    ([1], {"type": "number"}, [1], None),
    ("x", {}, "x", None),
])
def test_default_rules(value, schema, expected, note):
    got = P.coerce_value(value, schema)
    assert got == (expected, note) and type(got[0]) is type(expected)


@pytest.mark.parametrize("value, types", [
    ("5", ["string", "integer"]), (5, ["integer", "null"]), (5, ["number"]), (None, ["string", "null"]),
])
def test_a_value_the_schema_allows_is_left_alone(value, types):
    assert P.coerce_value(value, {"type": types}) == (value, None)


def test_union_and_any_of_types_are_read():
    assert P.schema_types({"anyOf": [{"type": "array"}, {"type": ["object", "null"]}]}) == ["array", "object", "null"]
    assert P.coerce_value("7", {"type": ["integer", "null"]}) == (7, "str->integer")
    assert P.coerce_value(7, {"anyOf": [{"type": "string"}, {"type": "null"}]}) == ("7", "integer->string")


def test_coerce_arguments_touches_declared_parameters_only():
    params = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}}}
    args, notes = P.coerce_arguments({"n": "4", "s": "x", "other": "5"}, params)
    assert args == {"n": 4, "s": "x", "other": "5"} and notes == {"n": "str->integer"}
    assert list(args) == ["n", "s", "other"]


# ---------------------------------------------------------------- coercion: API-Bank and ToolAlpaca

@pytest.mark.parametrize("value, schema, expected, note", [
    ("5", {"type": "integer"}, 5, "str->integer"),
    ("05", {"type": "integer"}, "05", None),                   # not lossless: left for validation to judge
    ("74.0060", {"type": "number"}, 74.006, "str->number"),
    ("12", {"type": "number"}, 12, "str->number"),
    ("True", {"type": "boolean"}, True, "str->boolean"),
    ("['a', 'b']", {"type": "array"}, ["a", "b"], "str->array"),
    ("(1, 2)", {"type": "array"}, [1, 2], "str->array"),
    ('["a"]', {"type": "array"}, ["a"], "str->array"),
    ("{'k': (1, 2)}", {"type": "object"}, {"k": [1, 2]}, "str->object"),
    ("{'k': 1}", {"type": "array"}, "{'k': 1}", None),
    ("EUR", {"type": "array", "items": {"type": "string"}}, ["EUR"], "str->array[1]"),
    ("EUR", {"type": "array"}, "EUR", None),
    (80, {"type": "string"}, "80", "integer->string"),
    (5.0, {"type": "integer"}, 5, "number->integer"),
    (True, {"type": "string"}, True, None),                    # API-Bank has no bool -> string rule
    ("abc", {"type": "integer"}, "abc", None),
    ("x", {}, "x", None),
])
def test_apibank_rules(value, schema, expected, note):
    got = P.coerce_value(value, schema, apibank.COERCIONS)
    assert got == (expected, note) and type(got[0]) is type(expected)


@pytest.mark.parametrize("value, schema, expected, note", [
    ("100", {"type": "integer"}, 100, "str->integer"),
    ("100", {"type": "number"}, 100, "str->number"),
    ("1.5", {"type": "number"}, 1.5, "str->number"),
    (3, {"type": "string"}, "3", "number->string"),            # ToolAlpaca's notes say number for an int too
    (["EUR", "GBP"], {"type": "string"}, "EUR,GBP", "array->comma_string"),
    ([], {"type": "string"}, [], None),
    ("EUR", {"type": "array", "items": {"type": "string"}}, ["EUR"], "str->array[1]"),
    ("['EUR']", {"type": "array", "items": {"type": "string"}}, "['EUR']", None),
    ("true", {"type": "boolean"}, "true", None),               # no boolean rule
])
def test_toolalpaca_rules(value, schema, expected, note):
    assert P.coerce_value(value, schema, toolalpaca.COERCIONS) == (expected, note)
