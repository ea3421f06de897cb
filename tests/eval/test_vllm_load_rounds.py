"""``ooospec vllm-load --rounds``: the interleaved schedule, each drafting run against the plain runs around it, the
rounds table, and resuming a bench of several rounds -- without vLLM (fake runs)."""

from __future__ import annotations

import argparse

import pytest

from ooospec.eval.vllm import load as vl
from ooospec.eval.vllm import load_rounds as lr


def level(c: int, wall: float, texts: list[str], stream: bool = False) -> dict:
    rows = [{"id": f"r{i}", "latency_s": wall, "ttft_s": wall, "completion_tokens": 4, "content": t,
             "tool_calls": []} for i, t in enumerate(texts)]
    return {"concurrency": c, "stream": stream, "wall_s": wall, "rows": rows, "proposer": None}


def validated(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    vl.add_arguments(p)
    args = p.parse_args(["--target", "m", "--out", "out/x.json", "--concurrency", "1", "--stream", "off", *argv])
    vl.validate(args)
    args.model_dir = "/models/m"
    return args


def test_one_round_is_the_classic_order_and_keys():
    assert lr.schedule(["vllm", "toolspec", "vllm-ngram"], 1) == [
        ("vllm", "vllm"), ("toolspec", "toolspec"), ("vllm-ngram", "vllm-ngram")]


def test_several_rounds_put_plain_around_every_drafting_run():
    keys = lr.schedule(["vllm", "toolspec", "vllm-ngram"], 2)
    assert [k for k, _ in keys] == ["vllm", "toolspec", "vllm-ngram", "vllm@1", "toolspec@1", "vllm-ngram@1",
                                    "vllm@2"]
    assert [m for _, m in keys] == ["vllm", "toolspec", "vllm-ngram", "vllm", "toolspec", "vllm-ngram", "vllm"]
    names = [k for k, _ in keys]
    assert lr.bracket("toolspec", names) == ["vllm", "vllm@1"]
    assert lr.bracket("vllm-ngram@1", names) == ["vllm@1", "vllm@2"]
    assert lr.bracket("vllm@2", names) == ["vllm"]
    assert lr.bracket("toolspec", ["vllm", "toolspec"]) == ["vllm"]          # one round: plain's one run
    assert lr.parse_key("toolspec@1") == ("toolspec", 1) and lr.parse_key("vllm") == ("vllm", 0)
    with pytest.raises(ValueError, match="rounds"):
        lr.schedule(["vllm"], 0)


def test_rounds_below_one_stop_with_a_message():
    with pytest.raises(SystemExit, match="--rounds"):
        validated("--rounds", "0")


def test_a_drafting_run_is_compared_with_the_mean_of_the_plain_runs_around_it():
    # the box slows down: plain 4 s, then 6 s, then 8 s; toolspec 4 s after the first, 5 s after the second
    runs = {"vllm": {"levels": [level(1, 4.0, ["a", "b"])]},
            "toolspec": {"levels": [level(1, 4.0, ["a", "b"])]},
            "vllm@1": {"levels": [level(1, 6.0, ["a", "b"])]},
            "toolspec@1": {"levels": [level(1, 5.0, ["a", "x"])]},
            "vllm@2": {"levels": [level(1, 8.0, ["a", "b"])]}}
    table = {lv["method"]: lv for lv in vl.level_table(runs)}
    assert table["toolspec"]["throughput_x"] == pytest.approx(5.0 / 4.0)         # (4 + 6) / 2 over 4
    assert table["toolspec@1"]["throughput_x"] == pytest.approx(7.0 / 5.0)       # (6 + 8) / 2 over 5
    assert table["toolspec@1"]["against"] == ["vllm@1", "vllm@2"]
    assert table["vllm@2"]["throughput_x"] == pytest.approx(0.5)                  # plain moved: 4 s -> 8 s
    assert table["toolspec@1"]["differ"] == ["r1"] and table["vllm@1"]["identical"] == 1.0
    summary = {s["method"]: s for s in lr.round_summary(list(table.values()))}
    assert summary["toolspec"]["thru_x"] == pytest.approx([1.25, 1.4])
    assert summary["toolspec"]["median_x"] == pytest.approx(1.325)
    assert (summary["toolspec"]["min_x"], summary["toolspec"]["max_x"]) == pytest.approx((1.25, 1.4))
    assert summary["vllm"]["runs"] == 2 and summary["vllm"]["thru_x"] == pytest.approx([4 / 6, 0.5])
    assert summary["toolspec"]["plain_req_s"] == pytest.approx((2 / 8, 2 / 4))
    md = lr.render_rounds(lr.round_summary(list(table.values())))
    row = next(ln for ln in md.splitlines() if ln.startswith("| toolspec |"))
    assert [c.strip() for c in row.strip("|").split("|")] == [
        "toolspec", "1", "off", "2", "1.25 1.40", "1.32x", "1.25x", "1.40x", "0.25-0.50"]


def test_one_round_has_no_rounds_table():
    runs = {"vllm": {"levels": [level(1, 4.0, ["a"])]}, "toolspec": {"levels": [level(1, 2.0, ["a"])]}}
    assert lr.round_summary(vl.level_table(runs)) == [] and lr.render_rounds([]) == ""


def test_a_bench_of_rounds_resumes_run_by_run(tmp_path, monkeypatch):
    ran = []

    def fake_run(args, method, records, key=None):
        ran.append(key)
        return {"load_s": 1.0, "levels": [level(1, 1.0, ["a"])]}

    monkeypatch.setattr(vl, "run_method", fake_run)
    args = validated("--methods", "vllm,toolspec", "--rounds", "2")
    runs = vl.measure(args, [{"id": "r0"}], tmp_path / "x.rows")
    assert ran == ["vllm", "toolspec", "vllm@1", "toolspec@1", "vllm@2"] and list(runs) == ran
    (tmp_path / "x.rows" / "toolspec@1.json").unlink()           # stopped there
    (tmp_path / "x.rows" / "vllm@2.json").unlink()
    vl.measure(args, [{"id": "r0"}], tmp_path / "x.rows")
    assert ran[5:] == ["toolspec@1", "vllm@2"]
