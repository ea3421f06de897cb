"""The substrate report on a tiny GGUF: one row per file, its batch-shape numerics from the runtime's own measure."""

from __future__ import annotations

import os

import pytest

if os.environ.get("CI"):
    import llama_cpp  # noqa: F401 - CI must have the backend
else:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (python -m ooospec.llamacpp_install)")

from ooospec.eval.substrate import cli as substrate
from tests.runtime.tiny_gguf import make_tiny_gguf


def test_a_row_measures_forwards_numerics_and_both_decoders(tmp_path, monkeypatch):
    monkeypatch.setenv("OOOSPEC_CACHE", str(tmp_path / "cache"))
    gguf = make_tiny_gguf(tmp_path / "tiny.gguf", vocab=320, head_scale=8.0, seed=5)
    row = substrate.measure_file(gguf, threads=1, repeats=1)
    assert set(row["T_ms"]) == set(substrate.SIZES) and all(t > 0 for t in row["T_ms"].values())
    assert set(row["batch_vs_single"]) == {"max_abs_logit_diff", "argmax_differs"}
    assert 0 <= row["batch_vs_single"]["max_abs_logit_diff"] < 0.5
    assert row["decode_tok_s"]["ours"] > 0 and row["decode_tok_s"]["llama.cpp"] > 0
    assert row["decode_vs_llamacpp"] == pytest.approx(row["decode_tok_s"]["ours"] / row["decode_tok_s"]["llama.cpp"])
    table = substrate.markdown([row])
    assert "tiny.gguf" in table and "T(32)/T(1)" in table


def test_every_size_and_bad_sizes(tmp_path, monkeypatch):
    """``--sizes every`` times each size the cost model times on llama.cpp; a list without 1 is refused."""
    import argparse

    monkeypatch.setenv("OOOSPEC_CACHE", str(tmp_path / "cache"))
    gguf = make_tiny_gguf(tmp_path / "tiny.gguf", vocab=320, head_scale=8.0, seed=5)
    sizes = substrate.parse_sizes("every")
    assert sizes[:16] == tuple(range(1, 17))
    row = substrate.measure_file(gguf, threads=1, repeats=1, forward_only=True, sizes=(1, 3, 5))
    assert set(row["T_ms"]) == {1, 3, 5}
    assert substrate.parse_sizes("4,1,2") == (1, 2, 4)
    with pytest.raises(argparse.ArgumentTypeError, match="include 1"):
        substrate.parse_sizes("2,4")
    with pytest.raises(argparse.ArgumentTypeError, match="comma-separated"):
        substrate.parse_sizes("1,two")
