"""The forward-cost curve: interpolation, and measuring once per (model, dtype, threads) with a disk cache."""

from __future__ import annotations

import json

import pytest
import torch

from ooospec.runtime.backends import cost_model
from ooospec.runtime.backends.cost_model import ForwardCost
from ooospec.runtime.backends.hf_target import HFTarget


def test_docstring_example():
    cost = ForwardCost((1, 2, 4), (0.10, 0.11, 0.15))
    assert cost.seconds(1) == 0.10 and cost.seconds(3) == pytest.approx(0.13)
    assert cost.seconds(6) == pytest.approx(0.19) and cost.relative(4) == pytest.approx(1.5)
    assert cost.max_size == 4
    with pytest.raises(ValueError, match="at least the root"):
        cost.seconds(0)


def test_measurements_keep_the_fastest_reading_and_never_decrease():
    cost = ForwardCost.from_measurements((1, 2, 4), [[1.0, 0.9], [0.8, 2.0], [1.5, 3.0]])
    assert cost.times == (0.9, 0.9, 1.5)


@pytest.mark.parametrize(("sizes", "times"), [((2, 4), (1.0, 2.0)), ((1, 1), (1.0, 1.0)), ((1, 2), (0.0, 1.0)),
                                              ((1, 2), (1.0,))])
def test_bad_curves_are_rejected(sizes, times):
    with pytest.raises(ValueError):
        ForwardCost(sizes, times)


def test_linear_curve():
    cost = ForwardCost.linear(0.25)
    assert cost.relative(1) == 1.0 and cost.relative(5) == pytest.approx(2.0)
    assert cost.relative(100) == pytest.approx(1 + 0.25 * 99)     # the last slope, continued


def test_measured_on_a_tiny_model(make_model):
    cost = cost_model.measure_forward_cost(HFTarget(make_model("qwen2")), sizes=(1, 2, 8), context=32, repeats=2)
    assert cost.sizes == (1, 2, 8) and all(t > 0 for t in cost.times)
    assert list(cost.times) == sorted(cost.times)
    assert "dtype=torch.float64" in cost.key and "threads=1" in cost.key and "context=32" in cost.key


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """Isolated cache dir and memo; counts real measurements (made small and fast)."""
    monkeypatch.setenv("OOOSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(cost_model, "_MEMO", {})
    calls = []
    real = cost_model.measure_forward_cost

    def measure(target, sizes, **kw):
        calls.append(cost_model.calibration_key(target))
        return real(target, sizes=sizes, context=16, repeats=1)

    monkeypatch.setattr(cost_model, "measure_forward_cost", measure)
    monkeypatch.setattr(cost_model, "QUERY_SIZES", (1, 4))
    return calls


def test_calibration_is_cached_and_invalidated_by_threads_and_dtype(make_model, counted, tmp_path, monkeypatch):
    target = HFTarget(make_model("llama"))
    first = cost_model.forward_cost(target)
    assert len(counted) == 1
    assert cost_model.forward_cost(target) is first                      # memo
    monkeypatch.setattr(cost_model, "_MEMO", {})
    from_disk = cost_model.forward_cost(target)
    assert len(counted) == 1 and from_disk.times == pytest.approx(first.times, rel=1e-3)   # disk
    on_disk = json.loads((tmp_path / "forward_cost.json").read_text())
    assert list(on_disk) == counted

    torch.set_num_threads(2)
    try:
        cost_model.forward_cost(target)
    finally:
        torch.set_num_threads(1)
    assert len(counted) == 2 and "threads=2" in counted[-1]              # threads changed: measured again

    cost_model.forward_cost(HFTarget(make_model("llama", torch.float32)))
    assert len(counted) == 3 and "dtype=torch.float32" in counted[-1]    # dtype changed: measured again

    cost_model.forward_cost(HFTarget(make_model("llama", num_hidden_layers=3)))
    assert len(counted) == 4                                             # another model: measured again
    cost_model.forward_cost(target)
    assert len(counted) == 4                                             # back to the first: cached
    assert len(json.loads((tmp_path / "forward_cost.json").read_text())) == 4


def test_footprint_counts(make_model):
    model = make_model("qwen2", torch.float32)        # vocab 300, hidden 32, 2 layers, 4 heads x 8, 2 kv heads
    fp = HFTarget(model).footprint()
    tied = model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    matrices = sum(p.numel() for p in {p.data_ptr(): p for p in model.parameters()}.values() if p.dim() >= 2)
    assert fp.head_params == 300 * 32
    assert fp.body_params == matrices - 300 * 32 * (1 if tied else 2)
    assert fp.kv_bytes_per_token == 2 * 2 * 2 * 8 * 4
    assert fp.num_layers == 2 and fp.attn_dim == 32
    all_bytes = sum(p.numel() * 4 for p in {p.data_ptr(): p for p in model.parameters()}.values())
    assert fp.weight_bytes == all_bytes - (0 if tied else 300 * 32 * 4)


def test_a_target_names_its_own_sizes_and_other_sizes_measure_again(make_model, counted):
    """A backend with step-shaped T(n) (llama.cpp's grouped kernels) asks for every size; a curve cached at other
    sizes is measured again rather than interpolated."""
    target = HFTarget(make_model("llama"))
    assert cost_model.forward_cost(target).sizes == (1, 4) and len(counted) == 1
    target.cost_sizes = (1, 2, 3, 4)
    cost_model._MEMO.clear()
    assert cost_model.forward_cost(target).sizes == (1, 2, 3, 4) and len(counted) == 2
    cost_model._MEMO.clear()
    assert cost_model.forward_cost(target).sizes == (1, 2, 3, 4) and len(counted) == 2   # now cached at these
