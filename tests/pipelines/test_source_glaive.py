"""Glaive demo parser: one test per quirk (datasets README §9.4), on real excerpts in tests/fixtures/glaive_toolcall.

Fixture (conversation index in the fixture file <- index in the real file):
  en: 0 <- 0 (call after the 2nd human turn), 1 <- 1 (tools "[]": plain chat), 2 <- 3 (three calls),
      3 <- 259 (gold value is a list for a number: a data fault)
  zh: 0 <- 0 (translated values), 1 <- 5 (translated dict keys break the schema: a data fault)
"""

import json
import shutil
from pathlib import Path

import pytest

from ooospec.pipelines import records as R
from ooospec.pipelines.sources import glaive as G

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "glaive_toolcall"
KNOWN_INVALID = {"glaive/en/3-t3", "glaive/zh/1-t1"}


@pytest.fixture(scope="module")
def parsed():
    return list(G.parse(ROOT))


@pytest.fixture(scope="module")
def by_id(parsed):
    return {r["id"]: r for r in parsed if isinstance(r, dict)}


def _convs(split: str) -> list[dict]:
    return json.loads((ROOT / G.SPLITS[split]).read_text(encoding="utf-8"))


# ---------------------------------------------------------------- whole-fixture properties

def test_one_record_per_function_call_turn_and_nothing_else(parsed):
    assert not [r for r in parsed if isinstance(r, R.Reject)]            # chat turns / tool-less chats: no rejects
    for split in G.SPLITS:
        n_calls = sum(t["from"] == "function_call" for c in _convs(split) if json.loads(c["tools"] or "[]")
                      for t in c["conversations"])
        assert sum(r["split"] == split for r in parsed) == n_calls > 0


def test_every_record_validates_except_known_data_faults(parsed):
    invalid = {r["id"]: R.validate_record(r)[0] for r in parsed if R.validate_record(r) is not None}
    assert invalid == {i: R.CALL_SCHEMA_VIOLATION for i in KNOWN_INVALID}


def test_ids_unique_stable_and_output_deterministic(parsed):
    ids = [r["id"] for r in parsed]
    assert len(ids) == len(set(ids))
    assert R.canonical_json(parsed) == R.canonical_json(list(G.parse(ROOT)))


# ---------------------------------------------------------------- quirk 1: double JSON decoding

def test_tools_and_calls_are_decoded_twice(by_id):
    conv = _convs("en")[0]
    rec = by_id["glaive/en/0-t3"]
    assert [t["function"] for t in rec["tools"]] == json.loads(conv["tools"])
    assert rec["calls"] == [json.loads(conv["conversations"][3]["value"])]
    assert isinstance(rec["calls"][0]["arguments"], dict)


def test_arguments_given_as_a_string_are_decoded_again():
    assert G.decode_call('{"name": "f", "arguments": "{\\"x\\": 1}"}') == {"name": "f", "arguments": {"x": 1}}
    with pytest.raises(TypeError):
        G.decode_call('{"name": "f", "arguments": [1]}')


def test_conversation_without_tools_yields_nothing(parsed):
    assert json.loads(_convs("en")[1]["tools"]) == []
    assert not [r for r in parsed if r["id"].startswith("glaive/en/1-")]


# ---------------------------------------------------------------- quirk 2: history = conversation so far

def test_history_holds_earlier_calls_and_observations(by_id):
    conv = _convs("en")[2]["conversations"]
    rec = by_id["glaive/en/2-t9"]
    roles = [m["role"] for m in rec["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant", "user", "assistant", "tool", "assistant", "user"]
    first_call = rec["messages"][1]
    assert first_call["content"] == "" and first_call["tool_calls"] == [
        {"type": "function", "function": json.loads(conv[1]["value"])}]
    assert rec["messages"][2]["content"] == conv[2]["value"]                  # observation text as is
    assert rec["messages"][-1]["content"] == conv[8]["value"]
    assert [r["meta"]["dialogue"] for r in by_id.values() if r["id"].startswith("glaive/en/2-")] == ["glaive/en/2"] * 3


# ---------------------------------------------------------------- quirk 3: zh translation

def test_zh_records_carry_lang(by_id):
    zh = by_id["glaive/zh/0-t1"]
    assert zh["meta"]["lang"] == "zh" and "约翰·多伊" in json.dumps(zh["calls"], ensure_ascii=False)
    assert "lang" not in by_id["glaive/en/0-t3"]["meta"]


# ---------------------------------------------------------------- rejects

def test_unparseable_call_is_rejected_and_stops_the_conversation(tmp_path):
    root = tmp_path / "raw"
    shutil.copytree(ROOT, root)
    convs = _convs("en")
    convs[2]["conversations"][5]["value"] = '{"name": "calculate_area", "arguments": {'
    (root / G.SPLITS["en"]).write_text(json.dumps(convs), encoding="utf-8")
    out = [r for r in G.parse(root) if (r.split if isinstance(r, R.Reject) else r["split"]) == "en"]
    rejects = [r for r in out if isinstance(r, R.Reject)]
    assert [(r.local_id, r.reason) for r in rejects] == [("2-t5", G.UNPARSEABLE_CALL)]
    assert G.SPLITS["en"] in rejects[0].detail
    assert [r["id"] for r in out if isinstance(r, dict) and r["id"].startswith("glaive/en/2-")] == ["glaive/en/2-t1"]
