"""eval_sidecar: metric definitions on planted answers, request selection, and an end-to-end tiny run."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from sidecar_tiny import FIXTURE, save_tiny_base, tiny_recipe_dict

from ooospec.pipelines import eval_sidecar as ev
from ooospec.pipelines import train_sidecar as ts
from ooospec.pipelines.recipe import recipe_from_dict
from ooospec.pipelines.slot_rows import read_request_rows

torch.set_num_threads(1)
RECORDS = FIXTURE.parent / "train_records.jsonl"


@pytest.fixture(scope="module")
def rows():
    return read_request_rows(FIXTURE)


def _slots(rows):
    return [s for r in rows for s in r["slots"]]


def test_perfect_answers_score_one_everywhere(rows):
    slots = _slots(rows)
    m = ev.score(slots, [s["answer"] + "</s> trailing" for s in slots])
    assert m["function_index"]["accuracy"] == 1.0 and m["function_index"]["n"] == 9
    assert m["argument"]["exact_match"] == 1.0 and m["argument"]["n"] == 59
    assert m["argument"]["exact_match_non_null"] == 1.0 and m["argument"]["n_non_null"] == 26
    assert m["direct_call"]["exact_match"] == 1.0
    assert m["null"] == {"tp": 33, "predicted_null": 33, "gold_null": 33, "precision": 1.0, "recall": 1.0}


def test_each_error_is_counted_once(rows):
    weather8 = next(r for r in rows if r["id"].endswith("OpenWeather-8#0"))
    slots = weather8["slots"]
    answers = [s["answer"] for s in slots]
    where = {(s["form"], s["function"], s["parameter"]): i for i, s in enumerate(slots)}
    answers[where[("function_index", None, None)]] = "0"                              # wrong tool
    answers[where[("argument", "getForecast", "location")]] = "null"                  # missed value
    answers[where[("argument", "getCurrentWeather", "units")]] = '"metric"'           # spurious value
    answers[where[("argument", "getForecast", "days")]] = "three"                      # unparseable
    answers[where[("direct_call", None, None)]] = '{"arguments":{"days":3,"location":"Kyoto"},"name":"getForecast"}'
    m = ev.score(slots, answers)
    assert m["function_index"]["correct"] == 0 and m["direct_call"]["correct"] == 1   # key order is free
    assert (m["argument"]["n"], m["argument"]["correct"], m["argument"]["unparseable"]) == (5, 2, 1)
    assert m["argument"]["exact_match_non_null"] == 0.0
    # gold null 3 (lang, location, units of getCurrentWeather); predicted null: lang, location + the missed one
    assert m["null"] == {"tp": 2, "predicted_null": 3, "gold_null": 3, "precision": round(2 / 3, 6),
                         "recall": round(2 / 3, 6)}
    assert {x["query"] for x in m["argument"]["mistakes"]} == {
        "Query: getForecast.location", "Query: getCurrentWeather.units", "Query: getForecast.days"}


def test_in_block_counts_the_non_null_values_written_in_the_block():
    block = 'user: weather in Kyoto for 3 days, {"unit":"C"}'
    arg = {"form": "argument", "function": "f", "parameter": "p", "query": "Query: f.p\n"}
    assert ev.in_block({**arg, "answer": '"Kyoto"'}, block)
    assert ev.in_block({**arg, "answer": "3"}, block)
    assert ev.in_block({**arg, "answer": '{"unit": "C"}'}, block)            # compared as compact JSON
    assert not ev.in_block({**arg, "answer": '"Osaka"'}, block)
    assert not ev.in_block({**arg, "answer": "null"}, block)
    assert not ev.in_block({"form": "function_index", "answer": "3", "query": "Query: tool index\n"}, block)
    slots = [{**arg, "answer": '"Kyoto"', "in_block": True}, {**arg, "answer": '"Osaka"', "in_block": False},
             {**arg, "answer": "null", "in_block": False}]
    m = ev.score(slots, ['"Kyoto"', "null", "null"])["argument"]
    assert (m["n_non_null"], m["exact_match_non_null"], m["n_in_block"], m["exact_match_in_block"]) == (2, 0.5, 1, 1.0)
    assert "n_in_block" not in ev.score([{k: v for k, v in s.items() if k != "in_block"} for s in slots],
                                        ['"Kyoto"', "null", "null"])["argument"]


def test_trivial_baselines_are_constant_answers_scored(rows):
    slots = _slots(rows)
    b = ev.trivial_baselines(slots)
    assert b["argument_always_null"] == ev.score(slots, ["null"] * len(slots))["argument"]["exact_match"]
    assert b["function_index_always_0"] == ev.score(slots, ["0"] * len(slots))["function_index"]["accuracy"]
    assert b == {"function_index_always_0": round(5 / 9, 6), "argument_always_null": round(33 / 59, 6)}


def test_joined_score_compares_whole_calls():
    gold = [{"name": "f", "arguments": {"a": 1, "b": 2}}, {"name": "g", "arguments": {}}]
    joined = [{"name": "f", "arguments": {"b": 2, "a": 1}}, None]
    assert ev.joined_score(joined, gold) == {"n": 2, "exact_match": 0.5, "name_accuracy": 0.5, "none": 1}


def test_by_source_scores_each_dataset_on_its_own_rows(rows):
    # perfect answers everywhere, except every index answer of the sealtools rows is wrong
    per_row = []
    for r in rows:
        answers = [("7" if s["form"] == "function_index" and r["id"].startswith("sealtools") else s["answer"])
                   for s in r["slots"]]
        gold = json.loads(next(s["answer"] for s in r["slots"] if s["form"] == "direct_call"))
        per_row.append((ev.source_of(r), r["slots"], answers, gold, gold))
    got = ev.by_source(per_row)
    assert list(got) == ["apibank", "sealtools", "toolalpaca"]
    assert got["apibank"]["requests"] == 3 and got["apibank"]["function_acc"] == 1.0
    assert got["sealtools"] == {"requests": 3, "function_acc": 0.0, "function_always_0": 0.333333,
                                "argument_exact_match_non_null": 1.0, "joined_exact_match": 1.0}
    assert got["toolalpaca"]["function_always_0"] == 0.666667


def test_select_requests_bounds_and_is_seeded(rows):
    two = ev.select_requests(rows, 2, seed=0)
    assert len(two) == 2 and two == ev.select_requests(rows[::-1], 2, seed=0)
    assert [r["id"] for r in two] == sorted(r["id"] for r in two)
    assert len(ev.select_requests(rows, 0, seed=0)) == len(rows)
    with pytest.raises(ValueError, match="max_requests"):
        ev.select_requests(rows, -1, seed=0)


def test_records_become_rows_and_broken_records_are_skipped(tmp_path):
    recs = tmp_path / "recs.jsonl"
    lines = RECORDS.read_text().splitlines()
    broken = json.loads(lines[0])
    broken["calls"] = [{"name": "not_a_tool", "arguments": {}}]
    recs.write_text("\n".join(lines[1:] + [json.dumps(broken)]) + "\n")
    rows, skipped = ev.rows_from_records(recs)
    assert skipped == 1 and len(rows) == 8
    with pytest.raises(FileNotFoundError, match="neither a file nor a benchmark"):
        ev.resolve_records("no-such-benchmark")


def test_run_end_to_end_on_a_tiny_sidecar(tmp_path, rows):
    base = save_tiny_base(tmp_path / "base")
    recipe = recipe_from_dict(tiny_recipe_dict(base, max_steps=2, save_steps=10))
    ts.run(ts.TrainSidecarParams(max_train_requests=0, threads=1), FIXTURE, tmp_path / "sidecar",
           tmp_path / "train.json", recipe=recipe)
    params = ev.EvalSidecarParams(max_requests=3, max_new_tokens=4, threads=1, dtype="fp32")
    out = tmp_path / "metrics" / "eval_sidecar.json"
    m = ev.run(params, rows, tmp_path / "sidecar" / "adapter", out, source=str(FIXTURE))
    assert json.loads(out.read_text()) == m
    assert m["requests"] == 3 and m["requests_available"] == 9 and m["dtype"] == "fp32"
    assert m["function_index"]["n"] == 3 and m["direct_call"]["n"] == 3 and m["joined"]["n"] == 3
    assert m["argument"]["n"] == sum(len(r["slots"]) - 2 for r in ev.select_requests(rows, 3, 0))
    lat = m["latency"]
    assert lat["threads"] == 1 and lat["wave"]["median_ms"] > 0 and lat["prefill"]["median_ms"] > 0
    assert lat["median_forwards"] <= params.max_new_tokens
    assert sum(v["requests"] for v in m["by_source"].values()) == 3
    floor = ev.run(params, rows, None, tmp_path / "base.json", base=str(base))
    assert floor["adapter"] is None and floor["requests"] == 3
    # a forward budget stops taking requests once spent; the ones it took are the first of the seeded order
    first = ev.select_requests(rows, 3, 0)[0]
    bounded = ev.run(dataclasses.replace(params, max_forwards=1), rows, tmp_path / "sidecar" / "adapter",
                     tmp_path / "bounded.json")
    assert bounded["requests"] == 1 and bounded["requests_chosen"] == 3 and bounded["num_forwards"] >= 1
    assert bounded["function_index"]["n"] == 1 and next(iter(bounded["by_source"])) == ev.source_of(first)
    with pytest.raises(ValueError, match="max_forwards"):
        ev.EvalSidecarParams(max_forwards=-1)
