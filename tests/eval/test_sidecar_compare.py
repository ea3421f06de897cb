"""eval/sidecar/compare.py: the adapter comparison reads two transfer runs and picks by hint tokens accepted."""

import json

import pytest

from ooospec.eval.sidecar import compare as sc

CALL_A = {"name": "f", "arguments": {"x": 1, "y": "b"}}
CALL_A_REORDERED = {"arguments": {"y": "b", "x": 1}, "name": "f"}
CALL_B = {"name": "f", "arguments": {"x": 2, "y": "b"}}


def cell(target, bench, *, real_tokens, real_mat, hint_calls, ar_calls, ceilings=True, speedup=1.5, accepted=None):
    ids = [f"r{i}" for i in range(len(ar_calls))]
    accepted = accepted or [0] * len(ids)
    examples = [{"id": i, "method": "ar", "call": c} for i, c in zip(ids, ar_calls)]
    examples += [{"id": i, "method": "ooospec", "hints": {"call": c, "num_accepted_tokens": a}}
                 for i, c, a in zip(ids, hint_calls, accepted)]
    methods = {"ar": {"mat": 1.0, "exact_rate": 1.0},
               "ooospec": {"mat": real_mat, "speedup": speedup, "exact_rate": 1.0,
                           "hints": {"mean_hint_tokens_accepted": real_tokens, "sidecar_call": {"call": 0.5}}}}
    if ceilings:
        methods["toolspec"] = {"mat": 1.8, "exact_rate": 1.0}
        methods["ooospec-oracle"] = {"mat": 4.0, "exact_rate": 1.0, "hints": {"mean_hint_tokens_accepted": 40.0}}
        methods["ooospec-gold"] = {"mat": 2.0, "exact_rate": 0.5, "near_ties": 1, "defects": 0,
                                   "hints": {"mean_hint_tokens_accepted": 3.0}}
    return {"target": target, "benchmark": bench, "examples": examples, "methods": methods}


def run(*cells):
    return {"cells": list(cells), "machine": {"cpu": "AMD EPYC", "threads": 2, "dtype": "bf16"}}


def test_same_call_ignores_key_order_and_rejects_none():
    assert sc.same_call(CALL_A, CALL_A_REORDERED)
    assert not sc.same_call(CALL_A, CALL_B)
    assert not sc.same_call(None, None) and not sc.same_call(CALL_A, None)


def test_compare_cells_takes_ceilings_from_the_run_that_has_them_and_each_adapter_from_its_own():
    gold = run(cell("t", "b", real_tokens=5.0, real_mat=2.0, hint_calls=[CALL_B, CALL_A], ar_calls=[CALL_A, CALL_A],
                    accepted=[4, 6]))
    teacher = run(cell("t", "b", real_tokens=9.0, real_mat=3.0, hint_calls=[CALL_A_REORDERED, CALL_A],
                       ar_calls=[CALL_A, CALL_A], ceilings=False, speedup=2.0, accepted=[10, 8]))
    [row] = sc.compare_cells({"G": gold, "T": teacher})
    assert row["n"] == 2
    assert row["hint_tokens"] == {"oracle": 40.0, "gold": 3.0, "G": 5.0, "T": 9.0}
    assert row["mat"] == {"toolspec": 1.8, "oracle": 4.0, "gold": 2.0, "G": 2.0, "T": 3.0}
    assert row["agreement"] == {"G": 0.5, "T": 1.0}
    assert row["speedup"] == {"G": 1.5, "T": 2.0}
    assert (row["defects"], row["near_ties"]) == (0, 1)
    assert row["accepted"] == {"G": {"r0": 4, "r1": 6}, "T": {"r0": 10, "r1": 8}}
    diff = sc.paired_difference([row], "G", "T")
    assert diff["pairs"] == 2 and diff["mean"] == 4.0 and 2.0 <= diff["ci95"][0] <= diff["ci95"][1] <= 6.0
    assert diff == sc.paired_difference([row], "G", "T")      # seeded: the same interval every time


def test_compare_cells_refuses_runs_over_different_requests():
    a = run(cell("t", "b", real_tokens=1.0, real_mat=1.0, hint_calls=[CALL_A], ar_calls=[CALL_A]))
    b = run(cell("t", "b", real_tokens=1.0, real_mat=1.0, hint_calls=[CALL_A, CALL_A], ar_calls=[CALL_A, CALL_B]))
    with pytest.raises(ValueError, match="different requests"):
        sc.compare_cells({"G": a, "T": b})


def test_verdict_weights_by_requests_and_breaks_near_ties_on_mat():
    rows = [{"n": 10, "hint_tokens": {"G": 10.0, "T": 4.0}, "mat": {"G": 2.0, "T": 2.5}},
            {"n": 2, "hint_tokens": {"G": 1.0, "T": 20.0}, "mat": {"G": 2.0, "T": 2.5}}]
    v = sc.verdict(rows, ["G", "T"])
    assert v["winner"] == "G" and v["cells_won"] == {"G": 1, "T": 1}
    assert v["hint_tokens_per_request"]["G"] == pytest.approx((100 + 2) / 12)
    tie = [{"n": 4, "hint_tokens": {"G": 10.0, "T": 10.2}, "mat": {"G": 3.0, "T": 2.0}}]
    assert sc.verdict(tie, ["G", "T"])["winner"] == "G"      # 0.2 tokens apart: the higher #MAT wins


def test_cli_writes_markdown_and_json_with_quality(tmp_path):
    gold = run(cell("t", "b", real_tokens=5.0, real_mat=2.0, hint_calls=[CALL_B], ar_calls=[CALL_A]))
    teacher = run(cell("t", "b", real_tokens=9.0, real_mat=3.0, hint_calls=[CALL_A], ar_calls=[CALL_A],
                       ceilings=False))
    (tmp_path / "g.json").write_text(json.dumps(gold))
    (tmp_path / "t.json").write_text(json.dumps(teacher))
    ev = {"requests": 3, "cpu": "AMD EPYC", "dtype": "bf16", "function_index": {"accuracy": 0.5},
          "argument": {"exact_match_non_null": 0.25}, "joined": {"exact_match": 0.75},
          "direct_call": {"exact_match": 1.0},
          "latency": {"threads": 2, "wave": {"median_ms": 830.0}}}
    (tmp_path / "T.heldout.json").write_text(json.dumps(ev))       # the teacher's own heldout
    (tmp_path / "T.gold-heldout.json").write_text(json.dumps({**ev, "requests": 7}))
    (tmp_path / "T.apibank-l1.json").write_text(json.dumps(ev))
    (tmp_path / "T.train.json").write_text("{}")
    out = tmp_path / "cmp.md"
    assert sc.main(["--run", f"G={tmp_path / 'g.json'}", "--run", f"T={tmp_path / 't.json'}",
                    "--quality", f"T={tmp_path / 'T'},teacher", "--out", str(out)]) == 0
    md = out.read_text()
    assert "**Verdict (computed): T**" in md
    assert "| teacher heldout | T | 3 | 50.0% | 25.0% | 75.0% | 100.0% | 0.83 |" in md
    assert "| gold heldout | T | 7 |" in md
    assert "zero-shot apibank-l1" in md and "train" not in md.split("## Quality")[1]
    assert json.loads(out.with_suffix(".json").read_text())["verdict"]["winner"] == "T"
    with pytest.raises(SystemExit, match="LABEL=PATH"):
        sc.main(["--run", "nolabel", "--run", "x=y", "--out", str(out)])
