"""eval/sidecar/report.py on hand-made metrics: run specs, the table's values and the PNG."""

from __future__ import annotations

import json

import pytest

from ooospec.eval.sidecar import report as sr


def metrics(base: str, fn_acc: float, median_ms: float) -> tuple[dict, dict]:
    train = {"base": base, "requests": {"trained": 100}, "train_seconds": 300.0, "train_cpu_seconds": 250.0,
             "threads": 1, "final_loss": 0.5}
    ev = {"base": base, "requests": 24, "dtype": "bf16",
          "function_index": {"accuracy": fn_acc}, "baselines": {"function_index_always_0": 0.5},
          "argument": {"exact_match": 0.75, "exact_match_non_null": None}, "joined": {"exact_match": 0.4},
          "null": {"precision": 0.9, "recall": None}, "direct_call": {"exact_match": 0.25},
          "latency": {"threads": 2, "median_queries": 9, "prefill": {"median_ms": 100.0},
                      "decode": {"median_ms": median_ms - 100},
                      "wave": {"median_ms": median_ms, "p90_ms": 2 * median_ms}}}
    return train, ev


def test_parse_run_names_a_malformed_spec():
    assert sr.parse_run("a=t.json,e.json") == ("a", sr.Path("t.json"), sr.Path("e.json"))
    assert sr.parse_run("a=e.json") == ("a", None, sr.Path("e.json"))
    for bad in ("a", "=t.json,e.json", "a=t.json,", "a=x,y,z"):
        with pytest.raises(ValueError, match="LABEL=TRAIN"):
            sr.parse_run(bad)


def test_table_one_row_per_run_with_formatted_values():
    text = sr.table([("small", *metrics("smollm2-135m", 0.625, 1500.0)), ("big", *metrics("qwen", 1.0, 4000.0))])
    lines = text.splitlines()
    assert lines[0].startswith("| run | base | requests trained")
    small, big = lines[2], lines[3]
    assert small.startswith("| small | smollm2-135m | 100 | 300 | 1 | 2.50 | 0.500 | 62.5% | 50.0% | 75.0% | - | - |")
    assert "| 40.0% | 25.0% |" in small  # joined, direct
    assert small.endswith("| 24 | 9 | 0.100 | 1.400 | 1.500 | 3.000 | 2 / bf16 |")
    assert big.endswith("| 24 | 9 | 0.100 | 3.900 | 4.000 | 8.000 | 2 / bf16 |")
    untrained = sr.table([("base", {}, metrics("smollm2-135m", 0.1, 900.0)[1])]).splitlines()[2]
    assert untrained.startswith("| base | smollm2-135m | - | - | - | - | - | 10.0% |")


def test_cli_writes_table_and_png(tmp_path):
    specs = []
    for label, fn_acc, ms in (("a", 0.5, 1000.0), ("b", 0.9, 3000.0)):
        train, ev = metrics(label, fn_acc, ms)
        (tmp_path / f"{label}.train.json").write_text(json.dumps(train))
        (tmp_path / f"{label}.eval.json").write_text(json.dumps(ev))
        specs.append(f"{label}={tmp_path / f'{label}.train.json'},{tmp_path / f'{label}.eval.json'}")
    assert sr.main([*specs, "--out-dir", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "table.md").read_text().count("\n") == 4
    assert (tmp_path / "out" / "sidecar.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_resumed_run_says_which_steps_its_time_covers():
    train, ev = metrics("smollm2-135m", 0.5, 500.0)
    train.update(steps=400, steps_this_run=100)
    row = sr.table([("resumed", train, ev)]).splitlines()[2]
    # 300 s over the last 100 of 400 steps; CPU-s per request from those steps: 250 / (100 requests * 1/4)
    assert row.startswith("| resumed | smollm2-135m | 100 | 300 (100 of 400 steps) | 1 | 10.00 |")


def test_per_source_table_only_for_runs_that_have_it():
    train, ev = metrics("smollm2-135m", 0.5, 500.0)
    assert sr.source_table([("old", train, ev)]) == ""
    ev = {**ev, "by_source": {"sealtools": {"requests": 3, "function_acc": 0.25, "function_always_0": 0.5,
                                            "argument_exact_match_non_null": None, "joined_exact_match": 0.0}}}
    text = sr.source_table([("old", train, metrics("x", 0.5, 1.0)[1]), ("new", train, ev)])
    assert text.splitlines()[2] == "| new | sealtools | 3 | 25.0% | 50.0% | - | 0.0% |" and len(text.splitlines()) == 3
