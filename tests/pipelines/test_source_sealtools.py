"""Seal-Tools parser: one test per quirk (datasets README §9.3), on real excerpts in tests/fixtures/sealtools."""

import ast
import json
import shutil
from pathlib import Path

import pytest

from ooospec.pipelines import records as R
from ooospec.pipelines.sources import sealtools as S
from ooospec.runtime import calls as C

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "sealtools"
# dev-difficult-325: gold "position2": [10, 5, -3] for a parameter declared float -- a data fault that the
# ingest validation must reject (nothing coerces a list to a number)
KNOWN_INVALID = {"sealtools/dev/dev-difficult-325"}


@pytest.fixture(scope="module")
def parsed():
    return list(S.parse(ROOT))


@pytest.fixture(scope="module")
def by_id(parsed):
    return {r["id"]: r for r in parsed if isinstance(r, dict)}


def _items(stem: str) -> list[dict]:
    return json.loads((ROOT / S.FINETUNE_DIR / f"{stem}.json").read_text(encoding="utf-8"))


def _gold(item: dict) -> list[dict]:
    return ast.literal_eval(item["conversations"][1]["value"])


# ---------------------------------------------------------------- whole-fixture properties

def test_one_record_per_item_and_all_but_known_faults_validate(parsed):
    assert not [r for r in parsed if isinstance(r, R.Reject)]
    for split, stem in S.SPLITS.items():
        expected = [f"sealtools/{split}/{i['id']}" for i in _items(stem)]
        assert [r["id"] for r in parsed if r["split"] == split] == expected
    invalid = {r["id"]: R.validate_record(r) for r in parsed if R.validate_record(r) is not None}
    assert set(invalid) == KNOWN_INVALID
    assert all(reason == R.CALL_SCHEMA_VIOLATION for reason, _ in invalid.values())


def test_ids_unique_stable_and_output_deterministic(parsed):
    ids = [r["id"] for r in parsed]
    assert len(ids) == len(set(ids))
    assert C.canonical_json(parsed) == C.canonical_json(list(S.parse(ROOT)))


# ---------------------------------------------------------------- quirk 1: Python literals, unescaped quotes

def test_prompt_split_with_python_literals_and_inner_quotes():
    prompt = ("Please chooose ...\nInput:\napi_list = [{'api_name': 'getFilm', 'api_description': \"it's\", "
              "'parameters': {}, 'required': []}]\n"
              'task_instruction = "Tell me about the film "Pulp Fiction"."\nOutput:')
    api_list, instruction = S.split_prompt(prompt)
    assert api_list[0]["api_description"] == "it's"
    assert instruction == 'Tell me about the film "Pulp Fiction".'
    with pytest.raises(ValueError):
        S.split_prompt("api_list = []\nno instruction here")


def test_tools_are_the_five_candidates_and_gold_is_the_literal(by_id):
    item = _items("test_out_domain")[0]
    rec = by_id[f"sealtools/test-out/{item['id']}"]
    prompt = item["conversations"][0]["value"]
    query = prompt[prompt.index('task_instruction = "') + 20:prompt.rindex('"\nOutput:')]
    assert '"' in query                                   # this excerpt has inner double quotes
    assert rec["messages"] == [{"role": "user", "content": query}]
    assert len(rec["tools"]) == 5
    assert [(c["name"], c["arguments"]) for c in rec["calls"]] == [(g["api"], g["parameters"]) for g in _gold(item)]
    assert rec["meta"]["responses"] == [g["responses"] for g in _gold(item)]


def test_python_types_and_required_become_json_schema(by_id):
    params = {t["function"]["name"]: t["function"]["parameters"]
              for t in by_id["sealtools/dev/dev-easy-0"]["tools"]}
    wf = params["getHealthWorkforce"]
    assert wf["properties"]["location"]["type"] == "string" and wf["required"] == ["location"]
    assert params["calculateNursingHours"]["properties"]["number_of_patients"]["type"] == "integer"


# ---------------------------------------------------------------- quirk 2: gold API missing from api_list

def test_missing_gold_api_added_from_catalogue(by_id):
    rec = by_id["sealtools/dev/dev-difficult-228"]
    names = [t["function"]["name"] for t in rec["tools"]]
    assert rec["meta"]["added_tools"] == ["getEthicsInDemocracy"] and names[-1] == "getEthicsInDemocracy"
    assert len(names) == 6 and R.validate_record(rec) is None
    assert "added_tools" not in by_id["sealtools/dev/dev-easy-0"]["meta"]


def test_missing_gold_api_not_in_catalogue_is_left_to_validation(tmp_path):
    root = tmp_path / "raw"
    shutil.copytree(ROOT, root)
    lines = (root / "tool.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (root / "tool.jsonl").write_text("".join(l for l in lines if "getEthicsInDemocracy" not in l), encoding="utf-8")
    rec = next(r for r in S.parse(root) if r["id"] == "sealtools/dev/dev-difficult-228")
    assert R.validate_record(rec)[0] == R.CALL_UNKNOWN_TOOL


# ---------------------------------------------------------------- quirk 3: nested API_call_k references

def test_references_kept_as_strings_and_recorded(by_id):
    rec = by_id["sealtools/dev/dev-difficult-207"]
    assert rec["calls"][1]["arguments"]["text"] == "API_call_0 response"          # reference inside text
    assert {"call": 1, "param": "text", "ref": "API_call_0"} in rec["meta"]["references"]


def test_reference_in_non_string_parameter_widens_that_records_tool(by_id):
    rec = by_id["sealtools/dev/dev-difficult-300"]
    assert rec["meta"]["widened"] == ["getEyeExamData.patient_id"]
    tool = next(t for t in rec["tools"] if t["function"]["name"] == "getEyeExamData")
    assert tool["function"]["parameters"]["properties"]["patient_id"]["type"] == ["integer", "string"]
    assert rec["calls"][1]["arguments"]["patient_id"] == "API_call_0"
    assert R.validate_record(rec) is None


# ---------------------------------------------------------------- quirk 4: numbers given as strings

def test_numeric_strings_coerced_to_declared_type(by_id):
    rec = by_id["sealtools/dev/dev-easy-14"]
    raw = _gold(next(i for i in _items("dev") if i["id"] == "dev-easy-14"))[0]["parameters"]
    assert raw["age"] == "63"
    assert rec["calls"][0]["arguments"]["age"] == 63 and rec["meta"]["coerced"] == ["0.age"]


# ---------------------------------------------------------------- rejects

def test_unparseable_prompt_and_gold_are_rejected(tmp_path):
    root = tmp_path / "raw"
    shutil.copytree(ROOT, root)
    items = _items("test_in_domain")
    items[0]["conversations"][0]["value"] = "no api list"
    items[1]["conversations"][1]["value"] = "[{'api': 'x', 'parameters': {"
    (root / S.FINETUNE_DIR / "test_in_domain.json").write_text(json.dumps(items), encoding="utf-8")
    rejects = [r for r in S.parse(root) if isinstance(r, R.Reject)]
    assert [(r.local_id, r.reason) for r in rejects] == [(items[0]["id"], S.UNPARSEABLE_PROMPT),
                                                        (items[1]["id"], S.UNPARSEABLE_CALL)]
    assert all("test_in_domain.json" in r.detail for r in rejects)
