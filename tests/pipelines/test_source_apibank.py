"""API-Bank parser: one test per raw-data quirk (datasets README §3, §7).

Runs on real excerpts in tests/fixtures/apibank/raw (same layout as <datasets>/apibank/raw)."""

import json
import shutil
from pathlib import Path

import pytest

from ooospec.pipelines import records as R
from ooospec.pipelines.sources import apibank as A
from ooospec.pipelines.sources import apibank_text as AT
from ooospec.runtime import calls as C

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "apibank" / "raw"


@pytest.fixture(scope="module")
def parsed():
    return list(A.parse(ROOT))


@pytest.fixture(scope="module")
def by_id(parsed):
    return {r["id"]: r for r in parsed if isinstance(r, dict)}


def _records(parsed, split=None):
    return [r for r in parsed if isinstance(r, dict) and (split is None or r["split"] == split)]


def _tool_names(rec):
    return [t["function"]["name"] for t in rec["tools"]]


# ---------------------------------------------------------------- whole-fixture properties

def test_every_record_validates(parsed):
    recs = _records(parsed)
    assert recs, "fixture produced no records"
    bad = [(r["id"], R.validate_record(r)) for r in recs if R.validate_record(r) is not None]
    assert bad == []


def test_no_rejects_on_clean_fixture(parsed):
    assert [r for r in parsed if isinstance(r, R.Reject)] == []


def test_ids_unique_and_stable_across_runs(parsed):
    ids = [r["id"] for r in _records(parsed)]
    assert len(ids) == len(set(ids))
    assert ids == [r["id"] for r in _records(list(A.parse(ROOT)))]


def test_output_deterministic(parsed):
    again = list(A.parse(ROOT))
    assert [C.canonical_json(r) for r in _records(parsed)] == [C.canonical_json(r) for r in _records(again)]


def test_splits_and_skipped_files(parsed):
    """Response-only files, the -icl copy, level-3.json and lv3-train.json yield nothing, not even rejects."""
    counts = {}
    for r in _records(parsed):
        counts[r["split"]] = counts.get(r["split"], 0) + 1
    n_l1 = len(json.loads((ROOT / "test-data/level-1-api.json").read_text()))
    assert set(counts) == {"test-l1", "test-l2", "test-l3", "train-l3", "samples-l1", "samples-l2"}
    assert counts["test-l1"] == n_l1  # level-1-response.json (also in the fixture) adds nothing
    for r in _records(parsed):
        assert r["source"] == "apibank" and r["id"].startswith(f"apibank/{r['split']}/")


def test_module_constants():
    assert A.SOURCE == "apibank" and A.LICENSE == "Apache-2.0"
    assert all("@" in u for u in A.UPSTREAM.split("; "))


# ---------------------------------------------------------------- gold call text (§7.1)

def test_call_parses_with_ast():
    (c,) = AT.parse_request("API-Request: [ModifyRegistration(appointment_id='34567890', "
                           "new_appointment_date='2023-03-26')]")
    assert (c.name, c.arguments, c.recovered) == (
        "ModifyRegistration", {"appointment_id": "34567890", "new_appointment_date": "2023-03-26"}, None)


def test_nested_quotes_use_fallback_split_and_coerce_to_array(by_id):
    (c,) = AT.parse_request("API-Request: [AddMeeting(token='a9', attendees='['John', 'Mary']')]")
    assert c.recovered == "split_args" and c.arguments == {"token": "a9", "attendees": "['John', 'Mary']"}
    rec = by_id["apibank/test-l1/RecordHealthData-level-1-1.jsonl#0"]
    assert rec["meta"]["recovered"] == ["split_args"]
    (gold,) = rec["calls"]
    assert isinstance(gold["arguments"]["health_data"], list)
    assert any(n.startswith("health_data: str->array") for n in rec["meta"]["coerced"])


def test_unquoted_values():
    (c,) = AT.parse_request("API-Request: [GetSurgeryCost(surgery=heart transplant, location=Los Angeles)]")
    assert c.arguments == {"surgery": "heart transplant", "location": "Los Angeles"}
    assert c.recovered == "unquoted_value"
    (c,) = AT.parse_request("API-Request: [X(location=California, n=3)]")
    assert c.arguments == {"location": "California", "n": 3}


def test_missing_brackets(by_id):
    (c,) = AT.parse_request("API-Request: OperatingHoursTool(pharmacy_name='PharmaHealth')")
    assert c.arguments == {"pharmacy_name": "PharmaHealth"} and c.recovered == "no_brackets"
    recs = [r for r in by_id.values() if "no_brackets" in r.get("meta", {}).get("recovered", [])]
    assert recs and all(r["split"] == "train-l3" for r in recs)


def test_several_calls_in_one_bracket(by_id):
    calls = AT.parse_request("API-Request: [RatioCalculator(value1=80, value2=600), "
                            "RatioCalculator(value1=1, value2=2)]")
    assert [c.arguments for c in calls] == [{"value1": 80, "value2": 600}, {"value1": 1, "value2": 2}]
    multi = [r for r in by_id.values() if len(r["calls"]) > 1]
    assert multi and all(len({c["name"] for c in r["calls"]}) == 1 for r in multi)


def test_unparseable_gold_is_rejected_with_file_and_record(tmp_path):
    root = tmp_path / "raw"
    shutil.copytree(ROOT, root)
    path = root / "test-data/level-1-api.json"
    rows = json.loads(path.read_text())
    rows[0]["expected_output"] = "API-Request: [ModifyRegistration(appointment_id='3"
    path.write_text(json.dumps(rows))
    rej = [r for r in A.parse(root) if isinstance(r, R.Reject)]
    assert len(rej) == 1 and rej[0].reason == "unparseable_call" and rej[0].split == "test-l1"
    assert "level-1-api.json[0]" in rej[0].detail and rows[0]["file"] in rej[0].local_id


# ---------------------------------------------------------------- results and schemas (§7.3, §7.4)

def test_python_repr_results():
    assert AT.parse_result(" {'a': None, 'b': (1, 2), 'c': True}") == {"a": None, "b": (1, 2), "c": True}
    assert AT.result_content(AT.parse_result("{'a': None, 'b': (1, 2)}")) == '{"a":null,"b":[1,2]}'
    assert AT.parse_result("success") == "success"
    wrapped = "{'api_name': 'Q', 'input': {'x': 1}, 'output': {'k': 'v'}, 'exception': None}"
    assert AT.parse_result(wrapped) == {"k": "v"}  # level-3 / samples wrapper unwrapped to its output


def test_lenient_literal_repairs_toolsearcher_results(by_id):
    assert AT.lenient_literal("{'type': str, 'description': 'The user's budget.'}") == {
        "type": "str", "description": "The user's budget."}
    # both repairs are needed in lv3-api-train: the retrieved API must become a tool
    names = {n for r in by_id.values() if r["split"] == "train-l3" for n in _tool_names(r)}
    assert {"GetSurgeryCost", "EquipmentRecommendation"} <= names


def test_three_schema_spellings():
    l12 = AT.spec_from_dict({"name": "Q", "description": "d", "input_parameters": {"n": {"type": "int"}}})
    l3 = AT.spec_from_dict({"apiCode": "ToolSearcher", "description": "d",
                           "parameters": {"keywords": {"type": "str", "description": "kw"}}})
    csv_info = "description = \"Get token.\"\ninput_parameters = {\n    'username': {'type': 'str'}\n}\n"
    csv_spec = AT.spec_from_api_info("GetUserToken", csv_info)
    assert l12.parameters["properties"] == {"n": {"type": "integer"}}
    assert l3.name == "ToolSearcher"
    assert l3.parameters["properties"]["keywords"] == {"type": "string", "description": "kw"}
    assert csv_spec.description == "Get token."
    assert csv_spec.parameters["properties"] == {"username": {"type": "string"}}
    for s in (l12, l3, csv_spec):
        assert s.parameters["type"] == "object" and s.parameters["additionalProperties"] is False


def test_catalogue_reads_all_apis_csv():
    cat = A.load_catalogue(ROOT)
    assert {"RegisterUser", "ForgotPassword", "DeleteAccount", "GetUserToken", "ToolSearcher"} <= set(cat)


# ---------------------------------------------------------------- dialogues

def test_level1_tools_from_prompt_and_history_as_tool_messages(by_id):
    rec = by_id["apibank/test-l1/DeleteAccount-ModifyPassword-GetUserToken-level-2-1.jsonl#1"]
    raw = next(r for r in json.loads((ROOT / "test-data/level-1-api.json").read_text())
               if r["file"] == "DeleteAccount-ModifyPassword-GetUserToken-level-2-1.jsonl" and r["id"] == 1)
    block = raw["instruction"].split("API descriptions:")[1]
    described = [json.loads(line)["name"] for line in block.splitlines() if line.startswith("{")]
    assert _tool_names(rec) == described and "GetUserToken" in described
    assert rec["messages"][0] == {"role": "system", "content": A.YEAR_CONTEXT}
    assert rec["meta"]["dialogue"] == f"level-1-given-desc/{raw['file']}"
    roles = [m["role"] for m in rec["messages"]]
    i = next(k for k, m in enumerate(rec["messages"]) if m.get("tool_calls"))
    assert rec["messages"][i]["content"] == "" and roles[i + 1] == "tool"
    json.loads(rec["messages"][i + 1]["content"])  # Python repr result re-serialized as JSON
    assert not any("API descriptions" in m["content"] or "Generate API Request" in m["content"]
                   for m in rec["messages"])


def test_level2_tools_are_toolsearcher_plus_retrieved(by_id):
    first = by_id["apibank/test-l2/QueryStock-level-3-1.jsonl#0"]
    second = by_id["apibank/test-l2/QueryStock-level-3-1.jsonl#1"]
    assert _tool_names(first) == ["ToolSearcher"] and first["calls"][0]["name"] == "ToolSearcher"
    assert _tool_names(second) == ["ToolSearcher", "QueryStock"]
    assert second["calls"] == [
        {"name": "QueryStock", "arguments": {"stock_code": "MSFT", "date": "2022-02-04"}}]


def test_level2_unretrieved_api_comes_from_catalogue(by_id):
    rec = by_id["apibank/test-l2/QueryBalance-level-3-1.jsonl#0"]
    assert rec["calls"][0]["name"] == "GetUserToken"
    assert rec["meta"]["tools_from_catalogue"] == ["GetUserToken"] and "GetUserToken" in _tool_names(rec)


def test_level3_first_line_is_toolsearcher_schema(by_id):
    steps = sorted((r for r in by_id.values() if r["id"].startswith("apibank/test-l3/0#")),
                   key=lambda r: r["meta"]["step"])
    assert len(steps) >= 3
    assert _tool_names(steps[0]) == ["ToolSearcher"]
    assert not any(m["role"] == "system" for r in steps for m in r["messages"])
    first_msg = steps[0]["messages"][0]
    assert first_msg["role"] == "user" and not first_msg["content"].startswith("{")
    retrieved_later = set(_tool_names(steps[-1])) - {"ToolSearcher"}
    assert retrieved_later and steps[-1]["meta"]["sample"] == "level-3/0"


def test_time_quirk(by_id):
    recs = [r for r in by_id.values() if r["split"] == "train-l3"]
    assert recs
    for r in recs:
        user = [m["content"] for m in r["messages"] if m["role"] == "user"]
        assert user and not any("TIME:" in u for u in user)
        if "time" in r.get("meta", {}):
            want = {"role": "system", "content": f"The current time is {r['meta']['time']}."}
            assert r["messages"][0] == want
        else:  # 326 of 907 training steps carry no TIME: then no date context at all
            assert r["messages"][0]["role"] == "user"
        assert "{{time}}" not in json.dumps(r)
    with_time = [r for r in recs if "time" in r.get("meta", {})]
    assert 0 < len(with_time) < len(recs)


def test_samples_one_record_per_api_turn(by_id):
    fname = "ModifyRegistration-QueryHealthData-CancelRegistration-level-2-2.jsonl"
    lines = (ROOT / "lv1-lv2-samples/level-1-given-desc" / fname).read_text().splitlines()
    api_turns = [i for i, line in enumerate(lines) if json.loads(line)["role"] == "API"]
    recs = [by_id[f"apibank/samples-l1/{fname}#{i}"] for i in api_turns]
    names = [r["calls"][0]["name"] for r in recs]
    assert names == ["ModifyRegistration", "QueryHealthData", "CancelRegistration"]
    assert all(r["meta"]["dialogue"] == f"level-1-given-desc/{fname}" for r in recs)
    # the dialogue so far, with earlier API turns as tool_calls + tool result
    assert sum(1 for m in recs[2]["messages"] if m.get("tool_calls")) == 2
    assert sum(1 for m in recs[2]["messages"] if m["role"] == "tool") == 2
    assert len(recs[0]["messages"]) == 1 + api_turns[0]
    # same tools as the level-1 test prompt for that dialogue
    test_rec = by_id[f"apibank/test-l1/{fname}#0"]
    assert recs[0]["tools"] == test_rec["tools"]


def test_empty_sample_file_yields_nothing(parsed):
    assert (ROOT / "lv1-lv2-samples/level-1-given-desc/SearchEngine-level-1-1.jsonl").stat().st_size == 0
    ids = [r["id"] if isinstance(r, dict) else r.local_id for r in parsed]
    assert not any("SearchEngine-level-1-1" in i for i in ids)


def test_calls_embedded_in_ai_text(by_id):
    fname = "RegisterUser-ForgotPassword-DeleteAccount-GetUserToken-level-2-1.jsonl"
    (rec,) = [r for r in by_id.values() if fname in r["id"]]
    assert rec["calls"] == [{"name": "RegisterUser", "arguments": {
        "username": "user4", "password": "password4", "email": "user4@example.com"}}]
    assert rec["meta"]["recovered"] == ["call_in_ai_text"]
    assert rec["messages"][-1] == {"role": "assistant", "content": "Great. Let me register your account now."}
    l2 = sorted((r for r in by_id.values() if "QueryReminder-level-3-3" in r["id"]),
                key=lambda r: r["meta"]["turn"])
    names = [r["calls"][0]["name"] for r in l2]
    assert names == ["ToolSearcher", "GetUserToken", "QueryReminder", "ToolSearcher"]
    # an earlier embedded call stays in the history as an assistant tool call with its text
    assert l2[1]["messages"][-2]["tool_calls"][0]["function"]["name"] == "ToolSearcher"
    assert "[" not in l2[1]["messages"][-2]["content"]
