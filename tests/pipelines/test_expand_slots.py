"""expand_slots stage: one request row per call, the wave's slots with gold answers, the null cap and the split."""

import dataclasses
import json
from pathlib import Path

import pytest

from ooospec.pipelines import expand_slots, normalize, teacher
from ooospec.pipelines.records import read_jsonl
from ooospec.pipelines.slot_rows import read_request_rows, request_row
from ooospec.runtime.sidecar import prompts as sp

FIXTURE = Path(__file__).parents[1] / "fixtures" / "train_records.jsonl"
RECORDS = {r["id"]: r for r in read_jsonl(FIXTURE)}
NO_CAP = expand_slots.ExpandSlotsParams(max_null_per_request=None, heldout_fraction=0.0)
WEATHER_ID = "toolalpaca/train/OpenWeather-3"


def _rows(record, params=NO_CAP, split="train"):
    rows, _ = expand_slots.record_rows(record, params, split)
    return rows


def test_known_record_row_is_the_wave_with_gold_answers():
    # records are stored as canonical JSON (sorted keys), so schema properties come in alphabetical order
    # layout 2 here; layout 3 is in tests/runtime/sidecar/test_layouts.py
    (row,) = _rows(RECORDS[WEATHER_ID], dataclasses.replace(NO_CAP, layout=2))
    assert row["id"] == f"{WEATHER_ID}#0" and row["function"] == "getCurrentWeather"
    assert row["block"] == (
        "Conversation:\n"
        "system: You are a helpful assistant with access to weather tools.\n"
        "user: How warm is it in Lisbon right now? Use Fahrenheit please.\n"
        "Tools:\n"
        "[0] getCurrentWeather - Get the current weather for a location.\n"
        "  lang (string, optional): Language code of the description.\n"
        "  location (string, required): City name, e.g. London\n"
        '  units ("metric"|"imperial", optional): Units of measurement.\n'
        "[1] getForecast - Get a 5-day weather forecast for a location.\n"
        "  days (integer, optional): Number of days.\n"
        "  location (string, required): City name.\n")
    answers = {(s["form"], s["function"], s["parameter"]): s["answer"] for s in row["slots"]}
    assert answers == {
        ("function_index", None, None): "0",
        ("argument", "getCurrentWeather", "lang"): "null",
        ("argument", "getCurrentWeather", "location"): '"Lisbon"',
        ("argument", "getCurrentWeather", "units"): '"imperial"',
        ("argument", "getForecast", "days"): "null",
        ("argument", "getForecast", "location"): "null",
        ("direct_call", None, None):
            '{"name":"getCurrentWeather","arguments":{"location":"Lisbon","units":"imperial"}}'}
    wave = sp.build_wave(RECORDS[WEATHER_ID]["messages"], RECORDS[WEATHER_ID]["tools"], with_direct_call=True,
                         layout=2)
    assert [s["query"] for s in row["slots"]] == [q.text for q in wave.queries]
    assert row["block"] == wave.block


def test_parallel_calls_see_the_calls_before_them():
    rid = "sealtools/train/12045"
    first, second = _rows(RECORDS[rid])
    index = {r["id"]: next(s["answer"] for s in r["slots"] if s["form"] == "function_index") for r in (first, second)}
    assert index == {f"{rid}#0": "0", f"{rid}#1": "1"}
    assert "call: " not in first["block"]
    prior = [line for line in second["block"].splitlines() if line.startswith("call: ")]
    assert prior == [('call: {"name":"search_flights","arguments":{"cabin":"business","date":"2024-05-02",'
                      '"destination":"HND","origin":"BER","passengers":2}}')]
    answer = {(s["function"], s["parameter"]): s["answer"] for s in second["slots"] if s["form"] == "argument"}
    assert answer[("book_hotel", "amenities")] == '["wifi"]' and answer[("search_flights", "origin")] == "null"


def test_null_cap_drops_only_uncalled_tool_slots_seeded_and_never_on_heldout():
    rec = RECORDS[WEATHER_ID]
    one = dataclasses.replace(NO_CAP, max_null_per_request=1)
    (capped,) = _rows(rec, one)
    uncalled = [s for s in capped["slots"] if s["form"] == "argument" and s["function"] != "getCurrentWeather"]
    assert len(uncalled) == 1
    assert [s["parameter"] for s in capped["slots"] if s["function"] == "getCurrentWeather"] == [
        "lang", "location", "units"]                     # the called tool's omitted 'lang' stays
    assert _rows(rec, one) == _rows(rec, one)
    picks = {json.dumps(_rows(rec, dataclasses.replace(one, seed=s))[0]["slots"]) for s in range(8)}
    assert len(picks) == 2
    _, dropped = expand_slots.record_rows(rec, one, "train")
    assert dropped == 1
    (held,) = _rows(rec, one, "heldout")
    assert held == request_row(rec, 0)


def test_split_by_hash_is_stable_and_near_the_fraction():
    recs = [{"id": f"src/train/{i}"} for i in range(2000)]
    held = [r["id"] for r in recs if expand_slots.split_of(r, 0.1) == "heldout"]
    assert 140 <= len(held) <= 260
    assert held == [r["id"] for r in reversed(recs) if expand_slots.split_of(r, 0.1) == "heldout"][::-1]
    assert all(expand_slots.split_of(r, 0.0) == "train" and expand_slots.split_of(r, 1.0) == "heldout"
               for r in recs[:50])
    same_dialogue = [{"id": f"x/{i}", "meta": {"dialogue": "d"}} for i in range(20)]
    assert len({expand_slots.split_of(r, 0.5) for r in same_dialogue}) == 1


def test_stage_end_to_end_from_gold_teacher(tmp_path):
    traces, calls = tmp_path / "traces.jsonl", tmp_path / "calls.jsonl"
    teacher.run(teacher.TeacherParams(backend="gold"), FIXTURE, traces, metrics_path=None)
    normalize.run(normalize.NormalizeParams(), FIXTURE, traces, calls, tmp_path / "rejects.jsonl",
                  metrics_path=None, card_path=None)
    params = expand_slots.ExpandSlotsParams(heldout_fraction=0.3, max_null_per_request=None)
    out = [tmp_path / "train.jsonl", tmp_path / "heldout.jsonl"]
    stats = expand_slots.run(params, calls, *out, tmp_path / "m.json", tmp_path / "slots.md")
    train, heldout = (read_request_rows(p) for p in out)
    assert train and heldout
    for rows in (train, heldout):
        assert [r["id"] for r in rows] == sorted(r["id"] for r in rows)
    assert not {r["record_id"] for r in train} & {r["record_id"] for r in heldout}
    n_calls = sum(len(r["calls"]) for r in RECORDS.values())
    assert len(train) + len(heldout) == n_calls == sum(stats["requests"].values())
    expected = sum(len(rec["calls"]) * (2 + sum(len(t["function"]["parameters"]["properties"])
                                                for t in rec["tools"])) for rec in RECORDS.values())
    assert sum(len(r["slots"]) for r in train + heldout) == expected
    assert stats["slots"]["train"]["total"] == sum(len(r["slots"]) for r in train)
    assert json.loads((tmp_path / "m.json").read_text())["params"]["heldout_fraction"] == 0.3
    card = (tmp_path / "slots.md").read_text()
    assert f"| requests (packed sequences) | {len(train)} | {len(heldout)} |" in card
    first = out[0].read_bytes()
    expand_slots.run(params, calls, *out, None, None)
    assert out[0].read_bytes() == first


def test_forms_param_filters_and_validates():
    (row,) = _rows(RECORDS[WEATHER_ID], dataclasses.replace(NO_CAP, forms=("direct_call",)))
    assert [s["form"] for s in row["slots"]] == ["direct_call"]
    with pytest.raises(ValueError, match="unknown or empty"):
        expand_slots.ExpandSlotsParams(forms=("argument_value",))


def test_bad_request_rows_are_named(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "r1", "record_id": "r", "function": "f", "tools": [], "block": "b",
                               "slots": [{"form": "argument", "query": "q"}]}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: request row 'r1' slot 0 lacks"):
        read_request_rows(bad)


def test_cli_chain_reads_each_params_section(tmp_path):
    from ooospec import cli

    params = tmp_path / "params.yaml"
    params.write_text("teacher: {backend: gold, limit: 5, seed: 1}\nnormalize: {require_gold_agreement: true}\n"
                      "expand_slots: {heldout_fraction: 0.0, max_null_per_request: 0, forms: [argument]}\n")
    t = tmp_path
    assert cli.main(["teacher", str(FIXTURE), str(t / "traces.jsonl"), "--params", str(params),
                     "--metrics", str(t / "teacher.json")]) == 0
    assert cli.main(["normalize", str(FIXTURE), str(t / "traces.jsonl"), str(t / "calls.jsonl"),
                     str(t / "rejects.jsonl"), "--params", str(params), "--metrics", str(t / "normalize.json"),
                     "--card", str(t / "normalize.md")]) == 0
    assert cli.main(["expand-slots", str(t / "calls.jsonl"), str(t / "train.jsonl"), str(t / "heldout.jsonl"),
                     str(t / "slots.json"), str(t / "slots.md"), "--params", str(params)]) == 0
    rows = read_request_rows(t / "train.jsonl")
    assert len({r["record_id"] for r in rows}) == 5 and (t / "heldout.jsonl").read_text() == ""
    assert all(s["form"] == "argument" and s["function"] == r["function"] for r in rows for s in r["slots"])
    params.write_text("expand_slots: {max_nulls: 3}\n")
    with pytest.raises(ValueError, match="unknown key"):
        cli.main(["expand-slots", str(t / "calls.jsonl"), str(t / "a.jsonl"), str(t / "b.jsonl"),
                  str(t / "m.json"), str(t / "c.md"), "--params", str(params)])
