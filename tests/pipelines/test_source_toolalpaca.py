"""ToolAlpaca parser: one test per raw-data quirk (datasets README §4, §7).

Runs on real excerpts in tests/fixtures/toolalpaca/raw (same layout as <datasets>/toolalpaca/raw)."""

import json
import re
from pathlib import Path

import pytest

from ooospec.pipelines import records as R
from ooospec.pipelines.sources import toolalpaca as T

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "toolalpaca" / "raw"


@pytest.fixture(scope="module")
def parsed():
    return list(T.parse(ROOT))


@pytest.fixture(scope="module")
def by_id(parsed):
    return {r["id"]: r for r in parsed if isinstance(r, dict)}


@pytest.fixture(scope="module")
def rejects(parsed):
    return {r.local_id: r for r in parsed if isinstance(r, R.Reject)}


def _raw(fname, api_name):
    return next(a for a in json.loads((ROOT / fname).read_text()) if a["Name"] == api_name)


def _fn(rec, name):
    return next(t["function"] for t in rec["tools"] if t["function"]["name"] == name)


# ---------------------------------------------------------------- whole-fixture properties

def test_every_record_validates(parsed, by_id):
    assert by_id
    assert [(i, R.validate_record(r)) for i, r in by_id.items() if R.validate_record(r) is not None] == []


def test_ids_unique_stable_and_output_deterministic(parsed):
    recs = [r for r in parsed if isinstance(r, dict)]
    again = [r for r in T.parse(ROOT) if isinstance(r, dict)]
    assert len({r["id"] for r in recs}) == len(recs)
    assert [R.canonical_json(r) for r in recs] == [R.canonical_json(r) for r in again]


def test_one_record_or_reject_per_instruction(parsed):
    apis = [a for f in T.SPLIT_FILES.values() for a in json.loads((ROOT / f).read_text())]
    n = sum(len(a["Instructions"]) for a in apis)
    assert len(parsed) == n
    assert {r["split"] for r in parsed if isinstance(r, dict)} == {"eval-real", "eval-sim"}


def test_module_constants():
    assert T.SOURCE == "toolalpaca" and T.LICENSE == "Apache-2.0"
    assert re.fullmatch(r"tangqiaoyu/ToolAlpaca@[0-9a-f]{40}", T.UPSTREAM)


# ---------------------------------------------------------------- tools

@pytest.mark.parametrize("api, action, name", [
    ("Nager.Date", "CountryCountryInfo", "Nager_Date_CountryCountryInfo"),
    ("Améthyste", "generateAvatar", "Amethyste_generateAvatar"),
    ("A Bíblia Digital", "getVerse", "A_Biblia_Digital_getVerse"),
    ("AviationAPI", "preferred-routes_get", "AviationAPI_preferred_routes_get"),
    ("1Forge", "getExchangeRates", "api_1Forge_getExchangeRates"),
])
def test_tool_names_are_sanitized_identifiers(api, action, name):
    assert T.action_function_name(api, action) == name and name.isidentifier() and name.isascii()


def test_tools_cover_function_description_and_keep_original_names(by_id):
    rec = by_id["toolalpaca/eval-real/Nager_Date#0"]
    raw = _raw("eval_real.json", "Nager.Date")
    actions = [k for k in raw["Function_Description"] if k != "components"]
    assert [t["function"]["name"] for t in rec["tools"]] == [T.action_function_name("Nager.Date", a) for a in actions]
    assert rec["meta"]["functions"]["Nager_Date_CountryCountryInfo"] == "Nager.Date.CountryCountryInfo"
    assert rec["meta"]["api"] == "Nager.Date"
    assert rec["messages"] == [{"role": "user", "content": raw["Instructions"][0]}]


def test_required_and_optional_parameters(by_id):
    fn = _fn(by_id["toolalpaca/eval-real/Nager_Date#0"], "Nager_Date_PublicHolidayIsTodayPublicHoliday")
    p = fn["parameters"]
    assert p["required"] == ["countryCode"] and p["additionalProperties"] is False
    assert p["properties"]["offset"] == {"type": "integer", "description": "utc timezone offset."}
    assert p["properties"]["countyCode"] == {"type": "string"}  # "string. " = optional, no description
    assert fn["description"] == "Is today a public holiday"


@pytest.mark.parametrize("text, schema, required", [
    ("Required. string. Two-character code.", {"type": "string", "description": "Two-character code."}, True),
    ("integer. ", {"type": "integer"}, False),
    ("number.", {"type": "number"}, False),
    ("Object.  Filters to apply.", {"type": "object", "description": "Filters to apply."}, False),
    ("Required. Array[string]. The categories.",
     {"type": "array", "items": {"type": "string"}, "description": "The categories."}, True),
])
def test_param_value_to_schema(text, schema, required):
    assert T.param_to_schema(text) == (schema, required)


def test_array_of_object_parameter(by_id):
    rec = next(r for r in by_id.values() if r["meta"]["api"] == "Auth0")
    perms = _fn(rec, "Auth0_createRole")["parameters"]["properties"]["permissions"]
    assert perms["type"] == "array" and perms["description"].startswith("A list of permission objects")
    assert perms["items"]["type"] == "object"
    assert perms["items"]["properties"]["permissionId"] == {
        "type": "string", "description": "The unique identifier for the permission."}


def test_function_without_description_line(by_id):
    raw = _raw("eval_real.json", "airportsapi")
    (action,) = [k for k in raw["Function_Description"] if k != "components"]
    assert raw["Function_Description"][action].startswith("Parameters:")
    rec = next(r for r in by_id.values() if r["meta"]["api"] == "airportsapi")
    path, method = raw["Function_Projection"][action]
    assert _fn(rec, T.action_function_name("airportsapi", action))["description"] == f"{method.upper()} {path}"


def test_bad_parameter_block_raises_named_error():
    with pytest.raises(T.SchemaParseError, match="Parameters"):
        T.parse_function("Does things\nOutput: nothing")
    with pytest.raises(T.SchemaParseError, match="'x'.*unknown type"):
        T.parse_function('D\nParameters: {"x": "Required. Frob. y"}\nOutput: z')


# ---------------------------------------------------------------- gold steps

def test_calls_are_first_step_and_meta_has_all_steps(by_id):
    rec = by_id["toolalpaca/eval-real/Nager_Date#3"]
    assert len(rec["meta"]["steps"]) == 2 and rec["calls"] == [rec["meta"]["steps"][0]]


def test_doubled_key_is_recovered(by_id):
    assert T.parse_action_input('{"base": "USD", "symbols": "symbols": "JPY"}') == (
        {"base": "USD", "symbols": "JPY"}, "doubled_key")
    rec = by_id["toolalpaca/eval-real/CurrencyBeacon#2"]
    assert rec["meta"]["recovered"] == ["0:doubled_key"]
    # ["EUR", "GBP"] for the string parameter "A list of currencies" becomes "EUR,GBP"
    assert rec["calls"][0]["arguments"]["symbols"] == "EUR,GBP"
    assert rec["meta"]["coerced"] == ["0.symbols: array->comma_string"]


def test_number_for_string_parameter_is_coerced(by_id):
    rec = by_id["toolalpaca/eval-real/CurrencyBeacon#1"]
    assert rec["calls"][0]["arguments"]["amount"] == "500"
    assert rec["meta"]["coerced"] == ["0.amount: number->string"]


def test_placeholder_in_first_step_is_rejected(rejects):
    rej = rejects["1Forge#0"]
    assert rej.reason == "unparseable_call" and rej.split == "eval-sim"
    assert "eval_simulated.json" in rej.detail and "'1Forge' instruction 0" in rej.detail


def test_placeholder_in_later_step_is_kept_raw(by_id):
    rec = by_id["toolalpaca/eval-sim/1Forge#1"]
    later = rec["meta"]["steps"][1]
    assert later["error"] == "placeholder" and "${" in later["arguments_raw"] and "arguments" not in later
    assert rec["calls"] == [rec["meta"]["steps"][0]]


def test_optional_step_marker(by_id):
    rec = by_id["toolalpaca/eval-sim/Auth0#0"]
    step = rec["meta"]["steps"][1]
    assert step["name"] == "Auth0_updateUserProfile" and step["optional"] is True
    assert T.split_optional("[Optional]updateUserProfile") == ("updateUserProfile", True)


def test_first_step_asking_the_user_is_rejected(rejects):
    asks = [r for r in rejects.values() if r.reason == T.FIRST_STEP_ASKS_USER]
    assert asks and all(r.local_id.startswith("Amethyste#") for r in asks)


def test_function_missing_from_description_is_rejected(rejects):
    rej = rejects["AviationAPI#1"]
    assert rej.reason == R.CALL_UNKNOWN_TOOL and "preferred-routes_search_get" in rej.detail
