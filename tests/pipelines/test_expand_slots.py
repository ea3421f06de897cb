"""expand_slots stage: forms and counts on known records, one literal argument row, caps and the split."""

import dataclasses
import json
from pathlib import Path

import pytest

from ooospec.pipelines import expand_slots, normalize, teacher
from ooospec.pipelines.records import read_jsonl
from ooospec.runtime import sidecar_prompts as sp

FIXTURE = Path(__file__).parents[1] / "fixtures" / "train_records.jsonl"
RECORDS = {r["id"]: r for r in read_jsonl(FIXTURE)}
NO_CAP = expand_slots.ExpandSlotsParams(max_null_per_record=None, heldout_fraction=0.0)
WEATHER_ID = "toolalpaca/train/OpenWeather-3"


def _rows(record, params=NO_CAP):
    rows, _ = expand_slots.record_rows(record, params)
    return {r["id"]: r for r in rows}


def test_known_record_forms_and_literal_argument_row():
    # records are stored as canonical JSON (sorted keys), so schema properties come in alphabetical order
    rows = _rows(RECORDS[WEATHER_ID])
    # 1 index + 1 direct call + (3 + 2) parameters of the two candidate functions
    assert sorted(rows) == sorted([
        f"{WEATHER_ID}#0/function_index", f"{WEATHER_ID}#0/direct_call",
        f"{WEATHER_ID}#0/argument/getCurrentWeather/location", f"{WEATHER_ID}#0/argument/getCurrentWeather/units",
        f"{WEATHER_ID}#0/argument/getCurrentWeather/lang", f"{WEATHER_ID}#0/argument/getForecast/location",
        f"{WEATHER_ID}#0/argument/getForecast/days"])
    units = rows[f"{WEATHER_ID}#0/argument/getCurrentWeather/units"]
    assert units == {
        "id": f"{WEATHER_ID}#0/argument/getCurrentWeather/units", "record_id": WEATHER_ID, "form": "argument",
        "function": "getCurrentWeather", "parameter": "units",
        "prompt": ("Task: argument\n"
                   "Conversation:\n"
                   "system: You are a helpful assistant with access to weather tools.\n"
                   "user: How warm is it in Lisbon right now? Use Fahrenheit please.\n"
                   "Function:\n"
                   "getCurrentWeather - Get the current weather for a location.\n"
                   "  lang (string, optional): Language code of the description.\n"
                   "  location (string, required): City name, e.g. London\n"
                   '  units ("metric"|"imperial", optional): Units of measurement.\n'
                   "Parameter: units\n"
                   'Answer: the JSON value of "units" if getCurrentWeather is called next, else null.\n'),
        "completion": '"imperial"'}
    completions = {i.split("#0/")[1]: r["completion"] for i, r in rows.items()}
    assert completions == {
        "function_index": "0",
        "direct_call": '{"name":"getCurrentWeather","arguments":{"location":"Lisbon","units":"imperial"}}',
        "argument/getCurrentWeather/location": '"Lisbon"', "argument/getCurrentWeather/units": '"imperial"',
        "argument/getCurrentWeather/lang": "null", "argument/getForecast/location": "null",
        "argument/getForecast/days": "null"}
    assert rows[f"{WEATHER_ID}#0/direct_call"]["parameter"] is None
    assert rows[f"{WEATHER_ID}#0/function_index"]["function"] == "getCurrentWeather"


def test_prompts_are_the_runtime_queries():
    rec = RECORDS[WEATHER_ID]
    rows = _rows(rec)
    for q in sp.slot_queries(rec["messages"], rec["tools"]):
        key = "function_index" if q.form == "function_index" else f"argument/{q.function}/{q.parameter}"
        assert rows[f"{WEATHER_ID}#0/{key}"]["prompt"] == q.prompt
    assert rows[f"{WEATHER_ID}#0/direct_call"]["prompt"] == sp.direct_call_prompt(rec["messages"], rec["tools"])


def test_parallel_calls_see_the_calls_before_them():
    rid = "sealtools/train/12045"
    rows = _rows(RECORDS[rid])
    assert rows[f"{rid}#0/function_index"]["completion"] == "0"
    assert rows[f"{rid}#1/function_index"]["completion"] == "1"
    assert "call: " not in rows[f"{rid}#0/function_index"]["prompt"]
    prior = [line for line in rows[f"{rid}#1/argument/book_hotel/city"]["prompt"].splitlines()
             if line.startswith("call: ")]
    assert prior == [('call: {"name":"search_flights","arguments":{"cabin":"business","date":"2024-05-02",'
                      '"destination":"HND","origin":"BER","passengers":2}}')]
    assert rows[f"{rid}#1/argument/book_hotel/amenities"]["completion"] == '["wifi"]'
    assert rows[f"{rid}#1/argument/search_flights/origin"]["completion"] == "null"
    assert rows[f"{rid}#0/argument/search_flights/passengers"]["completion"] == "2"


def test_null_cap_keeps_omitted_parameters_first_and_is_seeded():
    rec = RECORDS[WEATHER_ID]
    capped = _rows(rec, dataclasses.replace(NO_CAP, max_null_per_record=1))
    nulls = [i for i, r in capped.items() if r["completion"] == "null"]
    assert nulls == [f"{WEATHER_ID}#0/argument/getCurrentWeather/lang"]
    two = dataclasses.replace(NO_CAP, max_null_per_record=2)
    assert _rows(rec, two) == _rows(rec, two)
    picks = {tuple(sorted(_rows(rec, dataclasses.replace(two, seed=s)))) for s in range(8)}
    assert len(picks) == 2  # one uncalled-function null out of two, chosen by the seed
    _, dropped = expand_slots.record_rows(rec, two)
    assert dropped == 1


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
    params = expand_slots.ExpandSlotsParams(heldout_fraction=0.3, max_null_per_record=None)
    out = [tmp_path / "train.jsonl", tmp_path / "heldout.jsonl"]
    stats = expand_slots.run(params, calls, *out, metrics_path=tmp_path / "m.json",
                             card_path=tmp_path / "slots.md", waves_path=tmp_path / "waves.jsonl")
    train, heldout = (list(read_jsonl(p)) for p in out)
    # one full wave per heldout request: the index query + every function x parameter, holding every
    # heldout function_index / argument row's prompt
    waves = {w["request"]: w["prompts"] for w in read_jsonl(tmp_path / "waves.jsonl")}
    held_records = {rec_id: rec for rec_id, rec in RECORDS.items() if expand_slots.split_of(rec, 0.3) == "heldout"}
    assert held_records and len(waves) == sum(len(rec["calls"]) for rec in held_records.values())
    for rec_id, rec in held_records.items():
        n = 1 + sum(len(t["function"]["parameters"]["properties"]) for t in rec["tools"])
        assert all(len(waves[f"{rec_id}#{k}"]) == n for k in range(len(rec["calls"])))
    for r in heldout:
        if r["form"] != "direct_call":
            assert r["prompt"] in waves[r["id"].split("/" + r["form"])[0]]
    assert stats["heldout_waves"]["requests"] == len(waves)
    assert "Heldout waves" in (tmp_path / "slots.md").read_text()
    for rows in (train, heldout):
        assert [r["id"] for r in rows] == sorted(r["id"] for r in rows)
        assert all(set(r) == {"id", "record_id", "form", "function", "parameter", "prompt", "completion"}
                   for r in rows)
    assert not {r["record_id"] for r in train} & {r["record_id"] for r in heldout}
    expected = sum(len(rec["calls"]) * (2 + sum(len(t["function"]["parameters"]["properties"])
                                                for t in rec["tools"])) for rec in RECORDS.values())
    assert len(train) + len(heldout) == expected
    assert stats["rows"]["train"]["total"] == len(train) and stats["rows"]["heldout"]["total"] == len(heldout)
    n_calls = sum(len(r["calls"]) for r in RECORDS.values())
    assert sum(stats["rows"][s]["function_index"] for s in ("train", "heldout")) == n_calls
    assert json.loads((tmp_path / "m.json").read_text())["params"]["heldout_fraction"] == 0.3
    card = (tmp_path / "slots.md").read_text()
    assert f"| **total** | {len(train)} | {len(heldout)} | | |" in card
    first = out[0].read_bytes()
    expand_slots.run(params, calls, *out, metrics_path=None, card_path=None)
    assert out[0].read_bytes() == first


def test_forms_param_filters_and_validates():
    rows = _rows(RECORDS[WEATHER_ID], dataclasses.replace(NO_CAP, forms=("direct_call",)))
    assert [r["form"] for r in rows.values()] == ["direct_call"]
    with pytest.raises(ValueError, match="unknown or empty"):
        expand_slots.ExpandSlotsParams(forms=("argument_value",))


def test_cli_chain_reads_each_params_section(tmp_path):
    from ooospec import cli

    params = tmp_path / "params.yaml"
    params.write_text("teacher: {backend: gold, limit: 5, seed: 1}\nnormalize: {require_gold_agreement: true}\n"
                      "expand_slots: {heldout_fraction: 0.0, max_null_per_record: 0, forms: [argument]}\n")
    t = tmp_path
    assert cli.main(["teacher", str(FIXTURE), str(t / "traces.jsonl"), "--params", str(params),
                     "--metrics", str(t / "teacher.json")]) == 0
    assert cli.main(["normalize", str(FIXTURE), str(t / "traces.jsonl"), str(t / "calls.jsonl"),
                     str(t / "rejects.jsonl"), "--params", str(params), "--metrics", str(t / "normalize.json"),
                     "--card", str(t / "normalize.md")]) == 0
    assert cli.main(["expand-slots", str(t / "calls.jsonl"), str(t / "train.jsonl"), str(t / "heldout.jsonl"),
                     "--params", str(params), "--metrics", str(t / "slots.json"),
                     "--card", str(t / "slots.md"), "--waves", str(t / "waves.jsonl")]) == 0
    assert (t / "waves.jsonl").read_text() == ""  # heldout_fraction 0: no heldout request
    rows = list(read_jsonl(t / "train.jsonl"))
    assert len({r["record_id"] for r in rows}) == 5 and (t / "heldout.jsonl").read_text() == ""
    assert rows and all(r["form"] == "argument" and r["completion"] != "null" for r in rows)
    params.write_text("expand_slots: {max_nulls: 3}\n")
    with pytest.raises(ValueError, match="unknown key"):
        cli.main(["expand-slots", str(t / "calls.jsonl"), str(t / "a.jsonl"), str(t / "b.jsonl"),
                  "--params", str(params)])
