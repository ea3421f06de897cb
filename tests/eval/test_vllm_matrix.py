"""The vLLM transfer matrix runner: its params set, run order, failed cells listed with their error, the figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ooospec.eval.vllm import headline, matrix
from ooospec.eval.vllm.matrix_plot import speedups

ROOT = Path(__file__).resolve().parents[2]


def summary(mean_s: float, n: int = 3) -> dict:
    return {"n": n, "mean_s": mean_s, "exact_rate": 1.0, "near_ties": 0, "defects": 0}


def cell(target: str, warm: bool, **methods) -> dict:
    return {"target": target, "dataset": "bfcl-simple-python", "order": list(methods),
            "methods": {k.replace("_", "-").replace("llama-cpp", "llama.cpp"): summary(v) for k, v in methods.items()},
            "env": {"cpu": {"model": "Intel(R) Xeon(R) Processor", "flags": ["avx512_bf16", "amx_bf16"]},
                    "threads": 2, "dtype": "bfloat16", "warm_tools": warm}}


def test_the_shipped_full_matrix_is_three_families_thirty_requests_warm_and_cold():
    params = matrix.load_params(ROOT / "eval/vllm/transfer_full.yaml")
    assert {"smollm2-135m", "gemma-3-270m", "qwen2.5-coder-0.5b"} <= set(params["targets"])
    assert params["limit"] == 30 and params["caches"] == ["warm", "cold"]
    # the methods: vLLM's own, toolspec, both REAL deployments, the EMULATED one, the ceiling
    assert set(params["methods"].split(",")) == {"vllm", "vllm-ngram", "vllm-suffix", "toolspec", "ooospec",
                                                 "ooospec-wave-first", "ooospec-dedicated", "ooospec-oracle"}
    order = matrix.runs(params)
    assert len(order) == len(params["benchmarks"]) * 2
    # every family reaches a benchmark before the next benchmark starts; warm before cold
    assert order[0]["BENCHES"] == params["benchmarks"][0] and order[0]["TARGETS"].split() == params["targets"]
    assert [r["CACHE"] for r in order] == ["warm"] * len(params["benchmarks"]) + ["cold"] * len(params["benchmarks"])
    assert all(r["FOREIGN"] == "stop" for r in order)     # a matrix holds one machine's cells


def test_each_cpu_class_fills_its_own_folder(tmp_path, monkeypatch):
    """``{cpu}`` in ``out`` is the machine's CPU class: a Xeon's and a Zen 4's cells never share a table."""
    params = matrix.load_params(ROOT / "eval/vllm/transfer_full.yaml", cpu="xeon-amx")
    assert params["out"] == "eval/reports/transfer/vllm-full/xeon-amx"
    monkeypatch.setattr(matrix, "cpu_tag", lambda: "epyc-avx512bf16")
    assert matrix.load_params(ROOT / "eval/vllm/transfer_full.yaml")["out"].endswith("vllm-full/epyc-avx512bf16")
    # another class's folder is only rendered, never measured here
    path = tmp_path / "p.yaml"
    path.write_text(json.dumps({"transfer_vllm": {k: "x" for k in matrix.KEYS} | {
        "caches": ["warm"], "out": str(tmp_path / "full/{cpu}")}}))
    with pytest.raises(SystemExit):
        matrix.main([str(path), "--cpu", "xeon-amx"])                       # a run, not --report
    with pytest.raises(SystemExit):
        matrix.main([str(path), "--cpu", "xeon-amx", "--report"])           # no such folder
    (tmp_path / "full/xeon-amx").mkdir(parents=True)
    (tmp_path / "full/xeon-amx/smollm2-135m_bfcl-simple-python_warm.json").write_text(json.dumps(
        cell("smollm2-135m", True, vllm=1.0, toolspec=0.5)))
    monkeypatch.setattr(matrix, "bound_cells", lambda *a, **k: pytest.fail("measured on another CPU class"))
    monkeypatch.chdir(tmp_path)
    assert matrix.main([str(path), "--cpu", "xeon-amx", "--report", "--report-to", "none"]) == 0
    assert "| smollm2-135m | bfcl-simple-python |" in (tmp_path / "full/xeon-amx/table.md").read_text()


def test_a_bad_params_file_names_the_key(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("transfer_vllm:\n  targets: a\n  limt: 3\n")
    with pytest.raises(ValueError, match="limt"):
        matrix.load_params(path)
    path.write_text("other: {}\n")
    with pytest.raises(ValueError, match="no transfer_vllm section"):
        matrix.load_params(path)
    good = {k: "x" for k in matrix.KEYS} | {"caches": "warm tepid"}
    path.write_text(json.dumps({"transfer_vllm": good}))
    with pytest.raises(ValueError, match="tepid"):
        matrix.load_params(path)


def test_the_report_lists_finished_cells_and_the_failed_ones_with_their_error(tmp_path):
    out = tmp_path / "cells"
    out.mkdir()
    (out / "smollm2-135m_bfcl-simple-python_warm.json").write_text(json.dumps(
        cell("smollm2-135m", True, vllm=1.0, toolspec=0.5, ooospec_oracle=0.25, llama_cpp=0.8)))
    (out / "qwen2.5-coder-0.5b_bfcl-simple-python_cold.json").write_text(json.dumps(
        cell("qwen2.5-coder-0.5b", False, vllm=3.0, toolspec=1.0, ooospec_wave_first=1.2, ooospec_dedicated=0.8)))
    (out / "gemma-3-270m_bfcl-simple-python_warm.error.txt").write_text(
        "# gemma-3-270m x bfcl-simple-python (warm): failed 2026-12-06T18:00:00Z\nTraceback\n"
        "ValueError: Model architectures ['Gemma3ForCausalLM'] are not supported\n\n")
    # a cell that failed once and then finished is not listed as failed
    (out / "smollm2-135m_bfcl-simple-python_warm.error.txt").write_text("# smollm2 failed\nRuntimeError: x\n")
    (out / "README.md").write_text(f"# cells\n\n{matrix.REPORT_BEGIN}\nold\n{matrix.REPORT_END}\n\nafter\n")
    text = matrix.write_report(out, report_to="none")
    assert (out / "table.md").read_text(encoding="utf-8") == text + "\n"
    block = f"{matrix.REPORT_BEGIN}\n{text}\n{matrix.REPORT_END}"
    assert (out / "README.md").read_text() == f"# cells\n\n{block}\n\nafter\n"
    assert "| smollm2-135m | bfcl-simple-python | 3 | 1.00 | 2.00x | 1.60x |" in text
    assert "| gemma-3-270m x bfcl-simple-python (warm) | ValueError: Model architectures" in text
    assert "smollm2 failed" not in text
    assert (out / "speedup.png").stat().st_size > 1000


def test_speedups_are_over_vllm_plain_on_the_same_cell():
    values = speedups(cell("t", True, vllm=2.0, toolspec=0.5, ooospec_dedicated=0.4, llama_cpp=1.0))
    assert values == {"llama.cpp": 2.0, "toolspec": 4.0, "ooospec-dedicated": 5.0}


def _mismatch_cell(target: str) -> dict:
    """A cell of two requests: toolspec parts from plain on both, at a margin of 0.5 and at one plain's margins
    re-run could not reach (None)."""
    c = cell(target, True, vllm=1.0, toolspec=0.5)
    c["methods"]["toolspec"].update(exact_rate=0.0, near_ties=0, defects=2)
    c["examples"] = [{"method": "vllm", "record_id": r, "tokens": [1, 2, 3]} for r in ("a", "b")] + [
        {"method": "toolspec", "record_id": "a", "tokens": [1, 9], "exact": False,
         "mismatch": {"position": 1, "margin": 0.5, "kind": "defect"}},
        {"method": "toolspec", "record_id": "b", "tokens": [1, 2, 9], "exact": False,
         "mismatch": {"position": 2, "margin": None, "kind": "defect"}}]
    return c


def test_cells_are_counted_against_their_targets_own_bound_and_open_mismatches_probed(tmp_path, monkeypatch):
    out = tmp_path / "cells"
    out.mkdir()
    path = out / "smollm2-135m_bfcl-simple-python_warm.json"
    path.write_text(json.dumps(_mismatch_cell("smollm2-135m")))
    (out / "smollm2-135m_bfcl-simple-python_warm.llamacpp.json").write_text("{}")    # not a cell: left alone
    (out / "numerics_smollm2-135m.json").write_text(json.dumps({"bound": 1.0}))      # measured: not again
    (out / "probe_smollm2-135m_b_2.json").write_text(json.dumps(                     # what the probe found
        {"record": "b", "result": {"position": 2, "method_token": "x", "one_forward_at_pos": {"x": -0.1, "y": -2}}}))
    params = {"out": str(out), "targets": ["smollm2-135m", "gemma-3-270m"], "benchmarks": ["bfcl-simple-python"],
              "limit": 30}
    assert matrix.cells_of(out, "smollm2-135m") == [path]
    real_run, probed = matrix.subprocess.run, []

    def run(cmd, **kw):      # the probe needs vLLM: recorded here; the reclassification runs for real
        if "--probe-cells" in cmd:
            probed.append(cmd)
            return None
        return real_run(cmd, **kw)

    monkeypatch.setattr(matrix.subprocess, "run", run)
    matrix.bound_cells(params, venv=tmp_path / "no-venv")    # gemma has no cells: nothing measured, nothing run
    assert len(probed) == 1 and str(path) in probed[0] and probed[0][0] == str(tmp_path / "no-venv/bin/python")
    got = json.loads(path.read_text())
    assert got["env"]["tie_margin"]["value"] == 1.0
    kinds = [(r["record_id"], r["mismatch"]["kind"], r["mismatch"].get("by"))
             for r in got["examples"] if "mismatch" in r]
    assert kinds == [("a", "near_tie", None), ("b", "near_tie", "probe")]
    assert got["methods"]["toolspec"]["defects"] == 0 and got["methods"]["toolspec"]["near_ties"] == 2


def test_a_mismatch_is_open_when_its_margin_is_above_the_bound_or_unknown():
    from ooospec.eval.vllm.numerics import engine_flip
    from ooospec.eval.vllm.report import unresolved

    c = _mismatch_cell("t")
    assert unresolved(c, 1.0) == [("b", 2, "toolspec")]
    assert unresolved(c, 0.25) == [("a", 1, "toolspec"), ("b", 2, "toolspec")]
    c["examples"][-1]["mismatch"]["kind"] = "unclassified"     # how vllm-bench labels a margin it could not read
    assert unresolved(c, 1.0) == [("b", 2, "toolspec")]
    stored = {"record": "b", "result": {"position": 2, "method_token": "x", "plain_token": "3",
                                        "one_forward_at_pos": {"3": -0.1, "x": -2.0},
                                        "prefill_to_0_then_decode": {"x": -0.2, "3": -0.3}}}
    assert engine_flip(stored) == ("b", 2)
    stored["result"]["prefill_to_0_then_decode"] = {"3": -0.2, "x": -0.3}
    assert engine_flip(stored) is None


def test_a_finished_cell_is_kept_extended_by_the_methods_it_lacks_or_run_again(tmp_path):
    from ooospec.runtime.backends.hardware import cpu_info

    cell = tmp_path / "t_b_warm.json"
    here = {"model": "Intel(R) Xeon(R) Processor", "flags": ["avx2", "amx_bf16"]}
    cell.write_text(json.dumps({"order": ["vllm", "toolspec"], "methods": {"vllm": {"n": 30}},
                                "env": {"cpu": {"model": here["model"], "flags": ["amx_bf16", "avx2"]}}}))
    assert matrix.missing_methods(cell, "vllm,toolspec", 30, here) == ""
    assert matrix.missing_methods(cell, "vllm,vllm-suffix,toolspec,ooospec-oracle", 30, here) == \
        "vllm-suffix,ooospec-oracle"
    assert matrix.missing_methods(cell, "vllm,toolspec", 10, here) == "ALL"
    # measured on another CPU: not a measurement here (the stage runs it again, the matrix stops)
    assert matrix.missing_methods(cell, "vllm,toolspec", 30, {**here, "flags": ["avx2"]}) == "OTHER-MACHINE"
    assert matrix.missing_methods(cell, "vllm,toolspec", 30, {**here, "model": "AMD EPYC 9R14"}) == "OTHER-MACHINE"
    assert matrix.missing_methods(cell, "vllm,toolspec", 30) == ("" if cpu_info()["model"] == here["model"] and
                                                                  set(cpu_info()["flags"]) == set(here["flags"])
                                                                  else "OTHER-MACHINE")


def test_the_findings_are_computed_from_the_cells():
    a = cell("qwen", True, vllm=4.0, vllm_ngram=2.5, toolspec=1.0, ooospec_wave_first=0.8, ooospec_oracle=0.5,
             llama_cpp=2.0)
    a["methods"]["ooospec-wave-first"]["waves_sent"] = 2
    b = cell("smollm2", False, vllm=2.0, vllm_suffix=0.9, toolspec=1.0, ooospec=1.0, ooospec_dedicated=0.8,
             llama_cpp=0.8)
    b["methods"]["ooospec"].update(exact_rate=2 / 3, near_ties=1)
    b["methods"]["ooospec"]["waves_sent"] = 0
    text = headline.findings([a, b])
    assert "`toolspec` x vLLM plain: 2.00-4.00x (median 3.00x) over 2 cells; slower than plain in 0." in text
    assert "behind it in 1 of 2: smollm2 x bfcl-simple-python (cold)." in text
    assert ("faster than vLLM's own best speculation (`ngram` / `suffix`) in 1 of 2 cells; not in "
            "smollm2 x bfcl-simple-python (cold).") in text
    assert "even (no wave) 1; sidecar pays 1 (qwen x bfcl-simple-python (warm))" in text
    assert "waves sent: 2 of 6 timed requests" in text
    assert "  - `ooospec` x `toolspec`: 1.00-1.00x (median 1.00x) over 1 cells (separate engines)." in text
    assert "  - `ooospec-wave-first` x `toolspec`: 1.25-1.25x (median 1.25x) over 1 cells (paired" in text
    assert "EMULATED own device x `toolspec`: 1.25-1.25x" in text and "(the ceiling): 2.00-2.00x" in text
    # ooo-spec's own methods and vLLM's speculation counted apart (a divergence of vLLM's ngram is not ours)
    assert "ooo-spec's drafted answers vs vLLM plain: 17 of 18 identical, 1 near ties, 0 defects." in text
    # one cell of two machines' matrices: its name says which machine it ran on
    c = cell("smollm2", False, vllm=2.0, toolspec=1.0, llama_cpp=0.8)
    c["env"]["cpu"] = {"model": "AMD EPYC", "flags": ["avx512_bf16"]}
    assert ("behind it in 2 of 2: smollm2 x bfcl-simple-python (cold, xeon-amx), "
            "smollm2 x bfcl-simple-python (cold, epyc-avx512bf16).") in headline.findings([b, c])
    assert "`ngram` / `suffix` answers vs vLLM plain: 6 of 6 identical, 0 near ties, 0 beyond" in text


@pytest.mark.parametrize("cpu", ["xeon-amx", "epyc-avx512bf16"])
def test_the_committed_matrix_readme_shows_its_generated_table(cpu):
    out = ROOT / "eval/reports/transfer/vllm-full" / cpu
    readme = (out / "README.md").read_text(encoding="utf-8")
    block = readme.split(matrix.REPORT_BEGIN, 1)[1].split(matrix.REPORT_END, 1)[0].strip("\n")
    assert block + "\n" == (out / "table.md").read_text(encoding="utf-8"), \
        f"stale: python -m ooospec.eval.vllm.matrix eval/vllm/transfer_full.yaml --report --cpu {cpu}"


def test_a_probe_resolves_an_unclassified_mismatch_and_without_one_it_stays_unclassified():
    """vllm-bench labels a mismatch whose margin its re-run could not read ``unclassified``: a probe that shows the
    engine picking the drafted token makes it a near tie; with no probe it is neither a near tie nor a defect."""
    from ooospec.eval.vllm.numerics import reclassify

    c = _mismatch_cell("t")
    c["examples"][-1]["mismatch"]["kind"] = "unclassified"
    got = reclassify(json.loads(json.dumps(c)), 1.0, "n.json", {("b", 2): ("toolspec", "probe")})
    assert [r["mismatch"]["kind"] for r in got["examples"] if "mismatch" in r] == ["near_tie", "near_tie"]
    assert got["methods"]["toolspec"]["near_ties"] == 2 and got["methods"]["toolspec"]["unclassified"] == 0
    got = reclassify(json.loads(json.dumps(c)), 0.25, "n.json")
    assert [r["mismatch"]["kind"] for r in got["examples"] if "mismatch" in r] == ["defect", "unclassified"]
    assert (got["methods"]["toolspec"]["defects"], got["methods"]["toolspec"]["unclassified"]) == (1, 1)
