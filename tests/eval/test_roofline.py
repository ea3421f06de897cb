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
