"""eval/bench/report.py on a hand-made results dict: the markdown table, the PNG and the module CLI."""

from __future__ import annotations

import json

from ooospec.eval.bench import report as bench_report


def hand_results() -> dict:
    def summary(mean_s, speedup, exact, defects=0, exact_hf=1.0):
        return {"n": 2, "mean_s": mean_s, "median_s": mean_s, "speedup": speedup, "speedup_median": speedup,
                "decode_speedup": speedup * 1.1, "mat": speedup, "mean_tree_size": 3.0, "exact_rate": exact,
                "exact_hf_rate": exact_hf, "near_ties": 0, "defects": defects}

    examples = []
    for id_, t in (("a", 1.0), ("b", 3.0)):
        examples += [{"id": id_, "method": "ar", "time_s": t}, {"id": id_, "method": "pld", "time_s": t / 2},
                     {"id": id_, "method": "hf-pld", "time_s": t * 0.8,
                      "mismatch": {"position": 7, "margin": 1.5, "kind": "defect"} if id_ == "b" else None}]
    return {
        "methods": {"hf-pld": summary(1.6, 1.25, 0.5, defects=1, exact_hf=None), "ar": summary(2.0, 1.0, 1.0),
                    "pld": summary(1.0, 2.0, 1.0)},
        "examples": examples,
        "config": {"methods": ["ar", "pld", "hf-pld"], "target": "tiny", "dataset": "toy"},
        "env": {"dtype": "bf16", "threads": 2, "cpu": "Test CPU", "torch": "2.13.0", "commit": "0123456789abcdef",
                "commit_dirty": True, "loadavg_start": [1.0, 1.0, 1.0], "loadavg_end": [2.5, 1.0, 1.0]},
        "notes": ["hf-assisted: fell back"],
    }


def test_table_rows_in_run_order_with_values():
    table = bench_report.markdown_table(hand_results())
    lines = table.splitlines()
    assert lines[0].startswith("| method | n | mean s")
    body = [line for line in lines[2:] if line.startswith("| ")]
    assert [line.split("|")[1].strip() for line in body] == ["ar", "pld", "hf-pld"]
    pld = body[1]
    assert "| 2.00x |" in pld and "| 1.000 |" in pld and "| 100% |" in pld
    hf = body[2]
    assert "| 50% |" in hf and "| - |" in hf and hf.rstrip().endswith("| 1 |")  # exact_hf None -> "-"; 1 defect
    assert "threads 2" in table and "commit 0123456789+dirty" in table and "load avg 1.0 -> 2.5" in table
    assert "note: hf-assisted: fell back" in table
    assert "mismatch vs ar: hf-pld b at token 7, AR top-2 margin 1.500 -> defect" in table


def test_times_vs_baseline_pairs_by_id():
    assert bench_report.times_vs_baseline(hand_results(), "pld") == ([1.0, 3.0], [0.5, 1.5])


def test_plot_writes_png(tmp_path):
    path = bench_report.plot(hand_results(), tmp_path / "sub" / "bench.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_module_cli(tmp_path, capsys):
    src = tmp_path / "results.json"
    src.write_text(json.dumps(hand_results()))
    assert bench_report.main([str(src), "--out-dir", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "bench.png").is_file()
    assert (tmp_path / "out" / "table.md").read_text().startswith("| method |")
    assert "| pld |" in capsys.readouterr().out


def test_hint_table_only_for_methods_with_hints():
    from ooospec.eval.bench import report as bench_report

    res = {"methods": {"ar": {"n": 2}, "ooospec": {"n": 2, "hints": {
        "n": 2, "ready_before_first_tree": 0.5, "ready_before_end": 1.0, "used": 0.5,
        "mean_hint_tokens_accepted": 3.0, "median_ready_s": 0.25, "median_wave_s": 0.2, "p90_wave_s": 0.3,
        "median_server_prefill_s": 0.12, "median_server_decode_s": 0.07, "median_payload_bytes": 120,
        "mean_target_sidecar_s": 0.002, "errors": {"timeout": 1}}}}, "examples": []}
    text = bench_report.markdown_table(res)
    assert ("| ooospec | 2 | 50% | 100% | 50% | 3.0 | 0.250 | 0.200 | 0.300 | 0.120 | 0.070 | 120 | 2.0 "
            "| timeout 1 |") in text
    assert "median wave" not in text          # no toolspec row in this run: nothing to compare the wave with
    assert "| ar |" not in text.split("| hints of |")[1]
    assert bench_report.hint_table({"methods": {"ar": {"n": 1}}, "examples": []}) == []


def test_hint_sources_table_puts_oracle_gold_and_real_side_by_side():
    from ooospec.eval.bench import report as bench_report

    def hinted(source, accepted, mat):
        return {"n": 3, "mat": mat, "hints": {"n": 3, "source": source, "mean_hint_tokens_accepted": accepted}}

    res = {"config": {"dataset": "data/dedupe/eval/apibank-l1.jsonl", "hints": "sidecar",
                      "methods": ["ar", "toolspec", "ooospec", "ooospec-gold", "ooospec-oracle"]},
           "methods": {"ar": {"n": 3, "mat": 1.0}, "toolspec": {"n": 3, "mat": 2.5},
                       "ooospec": hinted("sidecar", 4.0, 3.1), "ooospec-gold": hinted("gold", 9.5, 4.0),
                       "ooospec-oracle": hinted("oracle", 12.4, 4.5)}, "examples": []}
    lines = bench_report.hint_sources_table(res)
    assert lines[1] == "hints: oracle / gold / real"
    assert lines[3].splitlines()[2:] == ["| apibank-l1 | oracle | ooospec-oracle | 3 | 12.4 | 4.50 |",
                                         "| apibank-l1 | gold | ooospec-gold | 3 | 9.5 | 4.00 |",
                                         "| apibank-l1 | real | ooospec | 3 | 4.0 | 3.10 |"]
    assert "\n".join(lines) in bench_report.markdown_table(res)
    # a summary from before hints.source: the method's name (or the run's --hints) says where its hints came from
    del res["methods"]["ooospec-gold"]["hints"]["source"], res["methods"]["ooospec"]["hints"]["source"]
    res["config"]["hints"] = "oracle"
    rows = bench_report.hint_sources_table(res)[3].splitlines()[2:]
    assert [r.split(" | ")[1:3] for r in rows] == [["oracle", "ooospec"], ["oracle", "ooospec-oracle"],
                                                   ["gold", "ooospec-gold"]]
    assert bench_report.hint_sources_table({"methods": {"ar": {"n": 1}, "toolspec": {"n": 1}}, "examples": []}) == []


def test_the_report_names_the_sidecar_adapter():
    from ooospec.eval.bench import report as bench_report

    res = {"methods": {}, "examples": [], "env": {"sidecar_adapter": {
        "path": "/a/sidecar", "sha256": "ab" * 32, "layout_version": 2, "url": None}}}
    assert bench_report.adapter_line(res) == f"sidecar adapter /a/sidecar (weights sha256 {'ab' * 6}, layout 2)"
    res["env"]["sidecar_adapter"] = {"path": None, "sha256": None, "layout_version": None, "url": "http://h:1"}
    assert bench_report.adapter_line(res) == "sidecar hints from the server http://h:1 (adapter not named)"
    assert bench_report.adapter_line({"env": {"sidecar_adapter": None}}) is None
    assert bench_report.adapter_line({}) is None


def test_wave_is_compared_with_the_median_toolspec_call_of_the_same_run():
    from ooospec.eval.bench import report as bench_report
    from ooospec.eval.bench.ooospec_method import summarize_hints

    rows = [{"hints": {"wave_s": w, "ready_s": w + 0.01, "ready_step": 0, "num_accepted_tokens": 1,
                       "server": {"prefill_s": w / 2, "decode_s": w / 4}}} for w in (0.4, 0.1, 0.3, 0.2, 1.0)]
    h = summarize_hints(rows)
    assert h["median_wave_s"] == 0.3 and h["p90_wave_s"] == 1.0      # nearest rank of 5: the 5th
    assert h["median_server_prefill_s"] == 0.15 and h["median_server_decode_s"] == 0.075
    res = {"methods": {"ar": {"n": 5}, "toolspec": {"n": 5, "median_s": 1.2}, "ooospec": {"n": 5, "hints": h}},
           "examples": []}
    assert ("ooospec: median wave 0.300 s = 0.25 x and p90 wave 1.000 s = 0.83 x the median toolspec call "
            "(1.200 s) of this run") in bench_report.markdown_table(res)


def test_vs_llamacpp_summary_rows():
    def s(mean, n=2, vs=None, exact=1.0, ties=0, defects=0, mat=1.0):
        return {"n": n, "mean_s": mean, "vs_llamacpp": vs, "exact_rate": exact, "near_ties": ties,
                "defects": defects, "mat": mat}

    run = {"config": {"target": "t", "dataset": "d", "warm_tools": True},
           "methods": {"ar": s(2.0, vs=1.5), "llama.cpp": s(3.0, vs=1.0, exact=0.5, ties=1),
                       "toolspec": s(1.0, vs=3.0, exact=0.5, ties=1, mat=4.2)}}
    no_peer = {"config": {}, "methods": {"ar": s(1.0)}}
    lines = bench_report.vs_llamacpp_table([run, no_peer]).splitlines()
    assert len(lines) == 3   # header, rule, one row: the run without the peer is left out
    assert lines[2] == "| t | d | warm | 2 | 3.00 | 2.00 | **1.50x** | 1.00 | **3.00x** | 4.20 | 50% | 1 | 0 |"


def test_gate_table_ratio_decisions_and_hint_tokens():
    def s(mean, exact=1.0, ties=0):
        return {"n": 2, "mean_s": mean, "exact_rate": exact, "near_ties": ties, "defects": 0}

    def ex(decision, accepted):
        return {"method": "ooospec", "hints": {"wave": {"decision": decision}, "num_accepted_tokens": accepted}}
    run = {"config": {"target": "t", "dataset": "d", "warm_tools": True},
           "methods": {"ar": s(3.0), "toolspec": s(2.0), "ooospec": s(1.6, exact=0.5, ties=1)},
           "examples": [ex("skip", 0), ex("slots", 12), {"method": "toolspec", "hints": None}]}
    ungated = {**run, "config": {"target": "t", "dataset": "d"},
               "examples": [{"method": "ooospec", "hints": {"num_accepted_tokens": 3}}]}
    no_ooospec = {"config": {}, "methods": {"ar": s(1.0), "toolspec": s(1.0)}, "examples": []}
    lines = bench_report.gate_table([run, ungated, no_ooospec]).splitlines()
    assert len(lines) == 4                                   # header, rule, two rows: the run without ooospec left out
    assert lines[2] == "| t | d | warm | 2 | 2.00 | 1.60 | **1.25x** | 1 / 0 / 1 | 6.0 | 50% | 1 | 0 |"
    assert lines[3] == "| t | d | cold | 2 | 2.00 | 1.60 | **1.25x** | no gate | 3.0 | 50% | 1 | 0 |"
