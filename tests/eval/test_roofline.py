"""The substrate table and the many-core model, on synthetic measurements."""

from __future__ import annotations

import json

import pytest

from ooospec.eval.substrate import roofline

SIZES = (1, 2, 4, 8, 16, 32)


def _times(o, m, k, c):
    return {n: roofline.predict({"o": o, "m": m, "k": k}, n, c) for n in SIZES}


def test_fit_recovers_the_model_and_predicts_saturating_memory():
    model = roofline.fit(_times(5.0, 60.0, 8.0, 1), _times(5.0, 60.0, 8.0, 2))
    assert model == pytest.approx({"o": 5.0, "m": 60.0, "k": 8.0})
    # past C_MEM cores only the compute term keeps shrinking
    assert roofline.predict(model, 1, 32) == pytest.approx(5.0 + 60.0 / roofline.C_MEM + 8.0 / 32)
    assert roofline.predict(model, 16, 8) < roofline.predict(model, 16, 2)


def _write(folder, engine, threads, t, extra=None):
    rows = [{"T_ms": {str(n): v for n, v in t.items()}, **(extra or {})}]
    data = {"target": "m", "threads": threads, "cpu": "Test CPU", "rows": rows}
    if engine == "vllm":
        data["roofs"] = {"mem_read_gbs": 10.0, "bf16_gops": 100.0, "int8_gops": 200.0}
    name = f"substrate_{'vllm' if engine == 'vllm' else 'llamacpp'}_m_t{threads}.json"
    (folder / name).write_text(json.dumps(data))


def test_render_joins_engines_and_names_the_roofs(tmp_path):
    vllm_row = {"engine": "vllm", "format": "w8a8", "weight_bytes": 500_000_000, "matmul_params": 1_000_000_000}
    for c in (1, 2):
        _write(tmp_path, "vllm", c, _times(10.0, 40.0, 1.0, c), vllm_row)
        _write(tmp_path, "llama.cpp", c, _times(2.0, 30.0, 6.0, c),
               {"file": "m.gguf", "weights": "Q4_K - Medium", "bytes": 400_000_000})
    text = roofline.render(tmp_path, mat=4.0, n_verified=8)
    assert "Test CPU" in text
    # memory roof 500 MB / 10 GB/s = 50 ms; compute roof 2e9 / 200e9 = 10 ms (int8 for W8A8)
    assert "| m | vllm | w8a8 | 2 | 500 |" in text and "| 50.0 |" in text and "10.00 (int8)" in text
    assert "Predicted for more cores" in text and text.count("| m | llama.cpp |") == 3


def test_empty_folder_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match="no substrate"):
        roofline.render(tmp_path, 4.0, 8)


def test_interpolation_between_measured_sizes():
    t = {1: 10.0, 2: 12.0, 4: 16.0, 8: 24.0, 16: 40.0}
    assert roofline.interp(t, 13) == pytest.approx(34.0) and roofline.interp(t, 1) == 10.0
    assert roofline.interp(t, 0.5) == 10.0 and roofline.interp(t, 64) == 40.0


def _cell(folder, fmt, bench, mat, tokens, drafted):
    (folder / fmt).mkdir(exist_ok=True)
    spec = {"mat": mat, "new_tokens": tokens, "draft_tokens_per_step": drafted}
    (folder / fmt / f"m_{bench}.json").write_text(json.dumps(
        {"target": "/cache/m", "dataset": bench, "env": {}, "methods": {"vllm": {}, "toolspec": spec}}))


def test_drafted_tokens_per_second_use_the_measured_acceptance(tmp_path):
    # two cells: 100 tokens in 25 steps drafting 7 a step, 300 tokens in 50 steps drafting 11 a step
    _cell(tmp_path, "w8a8", "a", 4.0, 100, 7.0)
    _cell(tmp_path, "w8a8", "b", 6.0, 300, 11.0)
    acc = roofline.measured_acceptance(tmp_path)
    assert acc["m"]["mat"] == pytest.approx(400 / 75) and acc["m"]["cells"] == 2
    assert acc["m"]["verified"] == pytest.approx(1 + (7 * 25 + 11 * 50) / 75)
    t = {1: 10.0, 2: 12.0, 4: 16.0, 8: 24.0, 16: 40.0}
    assert roofline.tokens_per_s(t, {"mat": 4.0, "verified": 13}) == "100.0 / 117.6"     # 4000 / 34 ms
    assert roofline.tokens_per_s(t, None) == "100.0 / -"
    vllm_row = {"engine": "vllm", "format": "w8a8", "weight_bytes": 500_000_000, "matmul_params": 1_000_000_000}
    for c in (1, 2):
        _write(tmp_path, "vllm", c, _times(10.0, 40.0, 1.0, c), vllm_row)
    text = roofline.render(tmp_path, mat=2.0, n_verified=4)
    assert "m #MAT 5.33 at 10.7 verified tokens (2 cells)" in text
    t2 = _times(10.0, 40.0, 1.0, 2)
    want = f"| {1000 / t2[1]:.1f} / {1000 * acc['m']['mat'] / roofline.interp(t2, acc['m']['verified']):.1f} |"
    assert next(ln for ln in text.splitlines() if ln.startswith("| m | vllm | w8a8 | 2 |")).endswith(want)
    # the many-core table takes the measured acceptance too, not --mat / --verified
    model = roofline.fit(_times(10.0, 40.0, 1.0, 1), t2)
    drafted_32 = 1000 * acc["m"]["mat"] / roofline.predict(model, acc["m"]["verified"], 32)
    assert f"/ {drafted_32:.0f} |" in text


def test_a_format_the_engine_could_not_run_is_named_not_measured(tmp_path):
    vllm_row = {"engine": "vllm", "format": "w8a8", "weight_bytes": 500_000_000, "matmul_params": 1_000_000_000}
    _write(tmp_path, "vllm", 2, _times(10.0, 40.0, 1.0, 2), vllm_row)
    failed = {"target": "m", "threads": 2, "cpu": "Test CPU", "rows": [
        {"engine": "vllm", "format": "w4a16-rtn", "error": "exit 1: Loading\nValueError: no CPU kernel for WNA16"}]}
    (tmp_path / "substrate_vllm_m_w4a16_t2.json").write_text(json.dumps(failed))
    assert [r["format"] for r in roofline.load(tmp_path)] == ["w8a8"]
    text = roofline.render(tmp_path, 4.0, 8)
    assert "Not measured (the engine failed): m vllm w4a16-rtn (2 threads): exit 1: ValueError: no CPU kernel" in text


def test_a_row_whose_second_thread_does_not_help_is_not_predicted(tmp_path):
    one = {1: 60.0, 2: 61.0, 4: 62.0, 8: 65.0, 16: 70.0, 32: 80.0}               # vLLM bf16 on the KVM Xeon
    two = {1: 140.0, 2: 130.0, 4: 130.0, 8: 60.0, 16: 137.0, 32: 195.0}
    assert roofline.not_sharing(one, two) == [1, 2, 4, 16, 32]
    assert roofline.not_sharing(_times(5.0, 60.0, 8.0, 1), _times(5.0, 60.0, 8.0, 2)) == []
    vllm_row = {"engine": "vllm", "format": "bf16", "weight_bytes": 500_000_000, "matmul_params": 1_000_000_000}
    for c, t in ((1, one), (2, two)):
        _write(tmp_path, "vllm", c, t, vllm_row)
    line = next(ln for ln in roofline.render(tmp_path, 4.0, 8).splitlines() if ln.startswith("| m | vllm | bf16 | - |"))
    assert "not predicted: 2 threads no faster than 1 at n = 1, 2, 4, 16, 32 (T(1) 60.0 ms at 1 thread, 140.0 at 2)" \
        in line


def test_each_row_keeps_the_roofs_its_own_run_measured(tmp_path):
    row = {"engine": "vllm", "format": "bf16", "weight_bytes": 500_000_000, "matmul_params": 1_000_000_000}
    _write(tmp_path, "vllm", 2, _times(10.0, 40.0, 1.0, 2), row)                    # 10 GB/s: roof 50 ms
    later = {"target": "m", "threads": 2, "cpu": "Test CPU", "roofs": {"mem_read_gbs": 20.0},
             "rows": [{**row, "format": "w4a16-rtn", "T_ms": {str(n): 5.0 for n in SIZES}}]}
    (tmp_path / "substrate_vllm_m_w4a16_t2.json").write_text(json.dumps(later))     # another day: 20 GB/s
    _write(tmp_path, "llama.cpp", 2, _times(2.0, 30.0, 6.0, 2), {"weights": "Q4_0", "bytes": 400_000_000})
    by = {r["format"]: r["roofs"]["mem_read_gbs"] for r in roofline.load(tmp_path)}
    assert by == {"bf16": 10.0, "w4a16-rtn": 20.0, "Q4_0": 10.0}      # llama.cpp: its target's and threads' first
    text = roofline.render(tmp_path, 4.0, 8)
    assert "`substrate_vllm_m_t2.json` (2 threads) {'mem_read_gbs': 10.0" in text
    assert "`substrate_vllm_m_w4a16_t2.json` (2 threads) {'mem_read_gbs': 20.0}" in text


def test_a_failed_format_is_named_with_its_exception(tmp_path):
    data = {"target": "m", "threads": 2, "cpu": "Test CPU", "rows": [
        {"engine": "vllm", "format": "w4a16-rtn", "error": "exit 1: trace\n[rank0]: Set TORCHDYNAMO_VERBOSE=1",
         "cause": "AttributeError: no attribute 'cpu_gemm_wna16'"}]}
    (tmp_path / "substrate_vllm_m_t2.json").write_text(json.dumps(data))
    assert roofline.failures(tmp_path) == [
        "m vllm w4a16-rtn (2 threads): exit 1: AttributeError: no attribute 'cpu_gemm_wna16'"]


def test_no_int8_roof_where_torch_int8_is_slower_than_fp32():
    row = {"target": "m", "engine": "llama.cpp", "format": "Q4_K", "threads": 2, "bytes": None,
           "params": 1_000_000_000, "T": {n: 10.0 * n for n in SIZES},
           "roofs": {"fp32_gops": 100.0, "int8_gops": 2.0}}
    assert roofline.roof_row(row)[12] == "20.00 (fp32)"      # 2 x 1e9 / 100e9 s, not the 2 GOPS int8 matmul
