"""normalize stage: each reject reason from a planted bad teacher output; kept records are valid and compact."""

import json
from pathlib import Path

import pytest

from ooospec.pipelines import normalize, teacher
from ooospec.pipelines.records import read_jsonl, validate_record, write_jsonl

FIXTURE = Path(__file__).parents[1] / "fixtures" / "train_records.jsonl"

# record id -> (planted teacher text, expected reject reason or None when kept)
PLANTED = {
    "apibank/train-lv3/AddAgenda-1#1": ("I'm sorry, I need more information before I can do that.",
                                        normalize.UNPARSEABLE),
    "apibank/train-lv3/Calculator-7#1": (('<tool_call>\n{"name": "WolframAlpha", "arguments": '
                                          '{"q": "(23+19)*3"}}\n</tool_call>'), normalize.UNKNOWN_TOOL),
    "toolalpaca/train/OpenWeather-8": (('<tool_call>\n{"name": "getForecast", "arguments": {"location": "Kyoto", '
                                        '"days": "3"}}\n</tool_call>'), normalize.SCHEMA_VIOLATION),
    "apibank/train-lv3/AddAgenda-1#2": (('<tool_call>\n{"name": "AddAlarm", "arguments": {"token": '
                                         '"a9s8d7f6g5h4j3k2l1", "time": "2023-03-14 10:00:00"}}\n</tool_call>'),
                                        normalize.DISAGREES_WITH_GOLD),
    # kept: untagged JSON with an id and other argument values than the gold (teacher values win)
    "toolalpaca/train/OpenWeather-3": (('{"id": "call_9", "name": "getCurrentWeather", "arguments": '
                                        '{"location": "Lisbon, PT", "units": "imperial"}}'), None),
}


@pytest.fixture
def planted(tmp_path):
    traces = tmp_path / "traces.jsonl"
    teacher.run(teacher.TeacherParams(backend="gold"), FIXTURE, traces, metrics_path=None)
    rows = [dict(r, text=PLANTED[r["id"]][0]) if r["id"] in PLANTED else r for r in read_jsonl(traces)]
    write_jsonl(traces, rows)
    return traces


DEFAULT = normalize.NormalizeParams()


def _run(tmp_path, traces, params=DEFAULT):
    return normalize.run(params, FIXTURE, traces, tmp_path / "calls.jsonl", tmp_path / "rejects.jsonl",
                         metrics_path=tmp_path / "normalize.json", card_path=tmp_path / "normalize.md")


def test_each_reject_reason_from_a_planted_output(tmp_path, planted):
    stats = _run(tmp_path, planted)
    rejects = {r["id"]: r for r in read_jsonl(tmp_path / "rejects.jsonl")}
    assert {i: r["reason"] for i, r in rejects.items()} == {i: why for i, (_, why) in PLANTED.items() if why}
    # uncheckable_schema needs a schema the fixture lacks: tests/pipelines/test_record_validation.py plants it
    assert stats["rejects_by_reason"] == {reason: int(reason != normalize.UNCHECKABLE_SCHEMA)
                                          for reason in normalize.REASONS}
    assert "days" in rejects["toolalpaca/train/OpenWeather-8"]["detail"]
    assert rejects["apibank/train-lv3/AddAgenda-1#1"]["text"].startswith("I'm sorry")
    assert stats["num_kept"] == 8 - 4 and stats["num_calls_kept"] == 5
    assert json.loads((tmp_path / "normalize.json").read_text())["by_source"]["apibank"] == {
        "kept": 0, "unparseable": 1, "unknown_tool": 1, "schema_violation": 0, "uncheckable_schema": 0,
        "disagrees_with_gold": 1}
    card = (tmp_path / "normalize.md").read_text()
    assert "**4** of 8 traces kept (5 calls)" in card and "| `schema_violation` | 1 |" in card


def test_kept_records_carry_compact_teacher_calls(tmp_path, planted):
    _run(tmp_path, planted)
    kept = {r["id"]: r for r in read_jsonl(tmp_path / "calls.jsonl")}
    gold = {r["id"]: r for r in read_jsonl(FIXTURE)}
    assert list(kept) == sorted(kept)
    weather = kept["toolalpaca/train/OpenWeather-3"]
    assert weather["calls"] == [{"name": "getCurrentWeather",
                                 "arguments": {"location": "Lisbon, PT", "units": "imperial"}}]
    assert weather["meta"]["teacher"] == {"backend": "gold", "model": "gold", "format": "hermes",
                                          "args_match_gold": False}
    for rid, rec in kept.items():
        assert validate_record(rec) is None
        assert {k: v for k, v in rec.items() if k not in ("calls", "meta")} == \
            {k: v for k, v in gold[rid].items() if k not in ("calls", "meta")}
        if rid not in PLANTED:
            assert rec["calls"] == gold[rid]["calls"] and rec["meta"]["teacher"]["args_match_gold"]
    line = (tmp_path / "calls.jsonl").read_text().splitlines()[0]
    assert "<tool_call>" not in line and ": " not in line.split('"calls":')[1][:40]


def test_gold_agreement_can_be_switched_off(tmp_path, planted):
    stats = _run(tmp_path, planted, normalize.NormalizeParams(require_gold_agreement=False))
    assert stats["rejects_by_reason"][normalize.DISAGREES_WITH_GOLD] == 0 and stats["num_kept"] == 5


def test_trace_without_record_names_the_id(tmp_path, planted):
    rows = list(read_jsonl(planted)) + [{"id": "nope/x/1", "backend": "gold", "model": "gold",
                                         "format": "hermes", "text": ""}]
    write_jsonl(planted, rows)
    with pytest.raises(ValueError, match="'nope/x/1' has no training record"):
        _run(tmp_path, planted)


def test_undeclared_argument_is_a_schema_violation_unless_allowed():
    record = next(r for r in read_jsonl(FIXTURE) if r["id"] == "apibank/train-lv3/Calculator-7#1")
    trace = {"id": record["id"], "backend": "gold", "model": "gold", "format": "hermes",
             "text": '<tool_call>\n{"name": "Calculator", "arguments": {"formula": "1+1", "precision": 2}}'
                     "\n</tool_call>"}
    with pytest.raises(normalize.Rejected) as e:
        normalize.normalize_one(record, trace, normalize.NormalizeParams())
    assert e.value.reason == normalize.SCHEMA_VIOLATION and "['precision']" in e.value.detail
    kept = normalize.normalize_one(record, trace, normalize.NormalizeParams(allow_undeclared_arguments=True))
    assert kept["calls"] == [{"name": "Calculator", "arguments": {"formula": "1+1", "precision": 2}}]
