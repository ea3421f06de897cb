"""The vLLM transfer matrix runner: its params set, run order, failed cells listed with their error, the figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ooospec.eval.vllm import matrix
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
    text = matrix.write_report(out, report_to="none")
    assert (out / "table.md").read_text(encoding="utf-8") == text + "\n"
    assert "| smollm2-135m | bfcl-simple-python | 3 | 1.00 | 2.00x | 1.60x |" in text
    assert "| gemma-3-270m x bfcl-simple-python (warm) | ValueError: Model architectures" in text
    assert "smollm2 failed" not in text
    assert (out / "speedup.png").stat().st_size > 1000


def test_speedups_are_over_vllm_plain_on_the_same_cell():
    values = speedups(cell("t", True, vllm=2.0, toolspec=0.5, ooospec_dedicated=0.4, llama_cpp=1.0))
    assert values == {"llama.cpp": 2.0, "toolspec": 4.0, "ooospec-dedicated": 5.0}


def test_cells_are_counted_against_their_targets_own_bound(tmp_path):
    out = tmp_path / "cells"
    out.mkdir()
    src = ROOT / "eval/reports/transfer/vllm-full/smollm2-135m_bfcl-simple-python_warm.json"
    (out / src.name).write_text(src.read_text(encoding="utf-8"))
    (out / "smollm2-135m_bfcl-simple-python_warm.llamacpp.json").write_text("{}")    # not a cell: left alone
    (out / "numerics_smollm2-135m.json").write_text(json.dumps({"bound": 1.0}))      # measured: not again
    params = {"out": str(out), "targets": ["smollm2-135m", "gemma-3-270m"], "benchmarks": ["bfcl-simple-python"],
              "limit": 30}
    assert matrix.cells_of(out, "smollm2-135m") == [out / src.name]
    matrix.bound_cells(params, venv=tmp_path / "no-venv")    # gemma has no cells: nothing measured, nothing run
    cell = json.loads((out / src.name).read_text())
    assert cell["env"]["tie_margin"]["value"] == 1.0
    assert all(s.get("defects", 0) == 0 for s in cell["methods"].values())


def test_a_finished_cell_is_kept_extended_by_the_methods_it_lacks_or_run_again(tmp_path):
    cell = tmp_path / "t_b_warm.json"
    cell.write_text(json.dumps({"order": ["vllm", "toolspec"], "methods": {"vllm": {"n": 30}}}))
    assert matrix.missing_methods(cell, "vllm,toolspec", 30) == ""
    assert matrix.missing_methods(cell, "vllm,vllm-suffix,toolspec,ooospec-oracle", 30) == "vllm-suffix,ooospec-oracle"
    assert matrix.missing_methods(cell, "vllm,toolspec", 10) == "ALL"
