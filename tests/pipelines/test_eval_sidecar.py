"""eval_sidecar: metric definitions on planted predictors, the per-request wave, and an end-to-end tiny run."""

from __future__ import annotations

import json

import pytest
import torch
from sidecar_tiny import FIXTURE, byte_tokenizer, save_tiny_base, tiny_llama, tiny_recipe_dict

from ooospec.pipelines import eval_sidecar as ev
from ooospec.pipelines import train_sidecar as ts

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def rows():
    return ts.read_slot_rows(FIXTURE)


def test_perfect_predictor_scores_one_everywhere(rows):
    m = ev.score(rows, {r["id"]: r["completion"] + "</s> trailing" for r in rows})
    assert m["function_index"]["accuracy"] == 1.0 and m["function_index"]["n"] == 3
    assert m["argument"]["exact_match"] == 1.0 and m["argument"]["n"] == 11
    assert m["argument"]["exact_match_non_null"] == 1.0 and m["argument"]["n_non_null"] == 6
    assert m["direct_call"]["exact_match"] == 1.0
    assert m["null"] == {"tp": 5, "predicted_null": 5, "gold_null": 5, "precision": 1.0, "recall": 1.0}


def test_imperfect_predictor_counts_each_error_once(rows):
    pred = {r["id"]: r["completion"] for r in rows}

    def rid(record, form, fn=None, param=None):
        return next(r["id"] for r in rows if r["record_id"].endswith(record) and r["form"] == form
                    and (param is None or (r["function"], r["parameter"]) == (fn, param)))

    pred[rid("OpenWeather-8", "function_index")] = "0"                        # wrong tool
    pred[rid("OpenWeather-8", "argument", "getForecast", "location")] = "null"  # missed value -> null
    pred[rid("Calculator-7#1", "argument", "AddAlarm", "time")] = '"10:00"'     # spurious value for a null slot
    pred[rid("OpenLibrary-2", "argument", "searchBooks", "limit")] = "five"     # unparseable
    pred[rid("OpenLibrary-2", "argument", "searchBooks", "author")] = ' "Ursula K. Le Guin"\n'  # whitespace ok
    # argument order inside a call does not matter, a different value does
    pred[rid("OpenWeather-8", "direct_call")] = '{"name":"getForecast","arguments":{"location":"Kyoto","days":3}}'
    pred[rid("OpenLibrary-2", "direct_call")] = '{"name":"searchBooks","arguments":{"q":"wizards"}}'
    m = ev.score(rows, pred)
    assert (m["function_index"]["correct"], m["function_index"]["accuracy"]) == (2, round(2 / 3, 6))
    assert m["argument"]["correct"] == 8 and m["argument"]["exact_match"] == round(8 / 11, 6)
    assert m["argument"]["exact_match_non_null"] == round(4 / 6, 6)
    assert m["argument"]["unparseable"] == 1
    assert m["direct_call"]["correct"] == 2
    # gold null = 5; predicted null = 5 gold nulls - 1 (spurious) + 1 (missed) = 5; tp = 4
    assert m["null"] == {"tp": 4, "predicted_null": 5, "gold_null": 5, "precision": 0.8, "recall": 0.8}
    assert {x["id"] for x in m["argument"]["mistakes"]} == {
        rid("OpenWeather-8", "argument", "getForecast", "location"),
        rid("Calculator-7#1", "argument", "AddAlarm", "time"), rid("OpenLibrary-2", "argument", "searchBooks", "limit")}


def test_trivial_baselines_are_constant_answers_scored(rows):
    b = ev.trivial_baselines(rows)
    assert b["argument_always_null"] == ev.score(rows, {r["id"]: "null" for r in rows})["argument"]["exact_match"]
    assert b["function_index_always_0"] == ev.score(rows, {r["id"]: "0" for r in rows})["function_index"]["accuracy"]
    assert b == {"function_index_always_0": round(2 / 3, 6), "argument_always_null": round(5 / 11, 6)}


def test_missing_prediction_is_an_error(rows):
    with pytest.raises(ValueError, match="no prediction for 1 row"):
        ev.score(rows, {r["id"]: r["completion"] for r in rows[1:]})


def test_each_wave_is_one_requests_index_and_argument_rows(rows):
    batches = []

    def answer(prompts):
        batches.append(list(prompts))
        return ["0"] * len(prompts)

    requests = ev.group_requests(rows)
    answers, seconds, sizes = ev.run_waves(requests, answer)
    assert len(seconds) == 3 and len(batches) == 4  # the first wave once more, as warm-up
    assert sizes == [len(b) for b in batches[1:]]
    assert batches[0] == batches[1]
    for batch, (rid, rs) in zip(batches[1:], requests.items()):
        assert batch == [r["prompt"] for r in rs if r["form"] != "direct_call"]
    assert set(answers) == {r["id"] for r in rows if r["form"] != "direct_call"}


def test_full_waves_are_timed_and_score_the_rows_of_the_same_batch(rows):
    requests = ev.group_requests(rows)
    extra = "Task: argument\nan uncapped null query\n"
    full = {rid: [extra] + [r["prompt"] for r in rs if r["form"] != "direct_call"][::-1]
            for rid, rs in requests.items()}
    batches = []

    def answer(prompts):  # each prompt answered by its position: row answers must follow their own prompt
        batches.append(list(prompts))
        return [str(i) for i in range(len(prompts))]

    answers, _, sizes = ev.run_waves(requests, answer, full)
    assert batches[1:] == list(full.values()) and sizes == [len(w) for w in full.values()]
    for rid, rs in requests.items():
        for r in rs:
            if r["form"] != "direct_call":
                assert answers[r["id"]] == str(full[rid].index(r["prompt"]))
    broken = {rid: w[:1] for rid, w in full.items()}
    with pytest.raises(ValueError, match="not in the full wave"):
        ev.run_waves(requests, answer, broken)


def test_read_waves_names_a_missing_request(tmp_path):
    path = tmp_path / "waves.jsonl"
    path.write_text(json.dumps({"request": "r#0", "record_id": "r", "prompts": ["p"]}) + "\n")
    assert ev.read_waves(path, ["r#0"]) == {"r#0": ["p"]}
    with pytest.raises(ValueError, match="no wave for 1 evaluated request"):
        ev.read_waves(path, ["r#0", "s#1"])


def test_request_key_splits_records_by_call():
    row = {"id": "apibank/x#3#1/argument/f/p", "record_id": "apibank/x#3"}
    assert ev.request_key(row) == "apibank/x#3#1"
    assert ev.request_key({"id": "r#0/function_index", "record_id": "r"}) == "r#0"
    assert ev.request_key({"id": "free-form-id", "record_id": "r"}) == "r"


def test_select_requests_bounds_and_is_seeded(rows):
    groups = ev.group_requests(rows)
    two = ev.select_requests(groups, 2, seed=0)
    assert len(two) == 2 and two == ev.select_requests(dict(reversed(groups.items())), 2, seed=0)
    assert len(ev.select_requests(groups, 0, seed=0)) == 3


def test_batched_greedy_answers_equal_one_by_one():
    model, tok = tiny_llama(seed=1), byte_tokenizer()
    prompts = ["Task: argument\nx\n", "Task: function_index\nConversation:\nuser: hello there\n", "a"]
    batched = ev.greedy_answers(model, tok, prompts, max_new_tokens=6)
    single = [ev.greedy_answers(model, tok, [p], max_new_tokens=6)[0] for p in prompts]
    assert batched == single
    assert all(isinstance(a, str) for a in batched)


def test_run_end_to_end_on_a_tiny_sidecar(tmp_path):
    base = save_tiny_base(tmp_path / "base")
    recipe = ts.recipe_from_dict(tiny_recipe_dict(base, max_steps=2, save_steps=10))
    ts.run(ts.TrainSidecarParams(max_train_rows=0, threads=1), FIXTURE, tmp_path / "sidecar",
           tmp_path / "train.json", recipe=recipe)
    params = ev.EvalSidecarParams(max_heldout_requests=2, max_new_tokens=4, threads=1)
    m = ev.run(params, FIXTURE, tmp_path / "sidecar", tmp_path / "metrics" / "eval_sidecar.json")
    assert json.loads((tmp_path / "metrics" / "eval_sidecar.json").read_text()) == m
    assert m["requests"] == 2 and m["requests_available"] == 3
    assert m["rows"] == m["function_index"]["n"] + m["argument"]["n"] + m["direct_call"]["n"]
    assert m["function_index"]["n"] == 2
    assert m["latency"]["waves"] == 2 and m["latency"]["threads"] == 1 and m["latency"]["median_ms"] > 0
    assert m["latency"]["wave"] == "heldout_rows"
    # with the runtime's full waves: same rows scored, bigger timed batches
    requests = ev.group_requests(ts.read_slot_rows(FIXTURE))
    waves = tmp_path / "waves.jsonl"
    waves.write_text("".join(json.dumps({"request": rid, "record_id": rs[0]["record_id"],
                                         "prompts": [r["prompt"] for r in rs if r["form"] != "direct_call"]
                                         + ["Task: argument\nextra null query\n"]}) + "\n"
                             for rid, rs in requests.items()))
    full = ev.run(params, FIXTURE, tmp_path / "sidecar", tmp_path / "full.json", waves_path=waves)
    assert full["latency"]["wave"] == "full" and full["rows"] == m["rows"]
    assert full["latency"]["max_wave_rows"] == m["latency"]["max_wave_rows"] + 1
    assert m["anchor"]["function_index_accuracy"] == 0.963
