"""ToolRL SFT parser: one test per quirk (datasets README §9.5), on real
excerpts in tests/fixtures/toolrl.

Fixture (index in the fixture file <- index in the real rlla_sft.json):
  0 <- 0 (one call)          1 <- 2 (response only)              2 <- 4 (truncated JSON value: rejected)
  3 <- 10 (thoughts mention <tool_call>; 4 parallel calls; numeric strings)       4 <- 107 (BFCL distractor)
  5 <- 204 (two tools named "translate")                          6 <- 341 (multi-turn history with a call)
"""

import json
import shutil
from pathlib import Path

import pytest

from ooospec.pipelines import records as R
from ooospec.pipelines.sources import toolrl as T
from ooospec.runtime import calls as C

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "toolrl"


@pytest.fixture(scope="module")
def parsed():
    return list(T.parse(ROOT))


@pytest.fixture(scope="module")
def by_id(parsed):
    return {r["id"]: r for r in parsed if isinstance(r, dict)}


def _items() -> list[dict]:
    return json.loads((ROOT / T.FILE).read_text(encoding="utf-8"))


# ---------------------------------------------------------------- whole-fixture properties

def test_records_rejects_and_validation(parsed):
    assert [r["id"] for r in parsed if isinstance(r, dict)] == \
        ["toolrl/sft/0", "toolrl/sft/3", "toolrl/sft/4", "toolrl/sft/6"]
    rejects = [r for r in parsed if isinstance(r, R.Reject)]
    assert [(r.local_id, r.reason) for r in rejects] == [("2", T.TRUNCATED_JSON_VALUE), ("5", T.DUPLICATE_TOOL_NAME)]
    assert all(T.FILE in r.detail for r in rejects)
    assert "team_members" in rejects[0].detail and "translate" in rejects[1].detail
    assert [r["id"] for r in parsed if isinstance(r, dict) and R.validate_record(r) is not None] == []


def test_truncated_json_value_detection():
    params = {"properties": {"a": {"type": "array"}, "o": {"type": "object"}, "s": {"type": "string"}}}
    assert T.truncated_json_arguments({"a": '["rock"', "o": '{"k": 1}', "s": "[x"}, params) == ["a"]


def test_ids_unique_stable_and_output_deterministic(parsed):
    ids = [r["id"] for r in parsed if isinstance(r, dict)]
    assert len(ids) == len(set(ids))
    assert C.canonical_json([r for r in parsed if isinstance(r, dict)]) == \
        C.canonical_json([r for r in T.parse(ROOT) if isinstance(r, dict)])


def test_response_only_items_are_skipped_not_rejected(by_id):
    item = _items()[1]
    assert T.gold_block(item["output"]) is None and "<response>" in item["output"]
    assert "toolrl/sft/1" not in by_id


# ---------------------------------------------------------------- tools from the numbered text list

def test_tool_list_parsed_in_order_with_types(by_id):
    rec = by_id["toolrl/sft/0"]
    names = [t["function"]["name"] for t in rec["tools"]]
    assert names == ["Search Managers", "Daily Match List-Scheduled", "Tennis Schedules Odds API", "Event Result",
                     "Get Specific Fighter"]                       # spaces and punctuation kept (quirk 3)
    ev = rec["tools"][3]["function"]["parameters"]
    assert ev["properties"]["lang"] == {"type": "string", "description": "The language to return the result in.",
                                        "default": "en"}
    assert ev["properties"]["evt"]["type"] == "number" and "default" not in ev["properties"]["evt"]
    assert all("required" not in t["function"]["parameters"] for r in by_id.values() for t in r["tools"])


# ---------------------------------------------------------------- gold calls (quirk 1)

def test_gold_comes_from_the_block_after_think(by_id):
    item = _items()[3]
    think, tail = item["output"].split("</think>", 1)
    assert "<tool_call>" in think                                       # the thoughts mention the tag
    rec = by_id["toolrl/sft/3"]
    raw = [json.loads(line) for line in tail.split("<tool_call>")[1].split("</tool_call>")[0].strip().splitlines()]
    assert [c["name"] for c in rec["calls"]] == [c["name"] for c in raw] and len(raw) == 4   # parallel calls
    assert rec["calls"][0]["arguments"]["page"] == 1 and raw[0]["parameters"]["page"] == "1"
    assert rec["meta"]["coerced"] == ["0.page", "1.page", "2.page", "3.page"]


def test_decode_calls_reads_one_object_per_line():
    assert T.decode_calls('\n{"name": "a", "parameters": {"x": 1}}\n{"name": "b", "parameters": {}}\n') == \
        [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]
    with pytest.raises(ValueError):
        T.decode_calls('{"name": "a", "parameters": {"x": 1}')


def test_multi_turn_history_becomes_messages(by_id):
    rec = by_id["toolrl/sft/6"]
    assert [m["role"] for m in rec["messages"]] == ["user", "assistant", "tool", "assistant", "user", "assistant",
                                                    "user"]
    call_msg = rec["messages"][1]
    assert call_msg["content"] == "" and call_msg["tool_calls"][0]["function"]["name"] == "GetNews"
    assert rec["messages"][2]["content"].startswith('[{"name": "GetNews"')
    assert not any("<think>" in m["content"] for m in rec["messages"])
    assert rec["calls"] == [{"name": "GetPowerBINews", "arguments": {"page": 1}}]


# ---------------------------------------------------------------- BFCL distractors (quirk 4)

def test_bfcl_distractor_marked_by_content(by_id):
    marked = [i for i, r in by_id.items() if r["meta"].get("bfcl_distractor")]
    assert marked == ["toolrl/sft/4"]
    assert T.BFCL_DISTRACTORS[by_id["toolrl/sft/4"]["meta"]["fingerprint"]] == 107
    assert "calculate_electric_field" in [t["function"]["name"] for t in by_id["toolrl/sft/4"]["tools"]]


def test_unparseable_gold_block_is_rejected(tmp_path):
    root = tmp_path / "raw"
    shutil.copytree(ROOT, root)
    items = _items()
    items[0]["output"] = items[0]["output"].replace('"Alex Ferguson"}}', '"Alex Ferguson"}')
    (root / T.FILE).write_text(json.dumps(items), encoding="utf-8")
    rejects = [r for r in T.parse(root) if isinstance(r, R.Reject)]
    assert next((r.local_id, r.reason) for r in rejects) == ("0", T.UNPARSEABLE_CALL)
