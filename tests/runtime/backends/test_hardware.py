"""Machine-dependent choices on faked CPUs: dtype auto, thread count, and the cached probes' invalidation."""

from __future__ import annotations

import json

import pytest
import torch

from ooospec.runtime.backends import hardware

ZEN3 = ["avx2", "fma"]                                           # no native bf16
SAPPHIRE_RAPIDS = ["amx_bf16", "amx_tile", "avx2", "avx512_bf16", "avx512f", "fma"]
ZEN4 = ["avx2", "avx512_bf16", "avx512f", "fma"]


@pytest.fixture
def probe_calls(monkeypatch):
    """Fake bf16 probe: returns the ratio set in ``calls["ratio"]`` and counts the calls."""
    calls = {"n": 0, "ratio": 3.0}

    def fake(threads, use_cache=True):
        calls["n"] += 1
        return calls["ratio"]

    monkeypatch.setattr(hardware, "bf16_speedup", fake)
    return calls


def test_explicit_dtypes_are_kept(probe_calls):
    for dtype in ("bf16", "fp32", "fp16"):
        assert hardware.resolve_dtype(dtype, flags=ZEN3) == (dtype, "given")
    with pytest.raises(ValueError, match="dtype must be one of"):
        hardware.resolve_dtype("int4")
    assert probe_calls["n"] == 0


def test_auto_is_fp32_without_native_bf16_and_never_probes(probe_calls):
    dtype, why = hardware.resolve_dtype("auto", threads=2, device="cpu", flags=ZEN3)
    assert dtype == "fp32" and "no native bf16" in why and "emulated" in why
    assert probe_calls["n"] == 0


@pytest.mark.parametrize("flags", [SAPPHIRE_RAPIDS, ZEN4])
def test_auto_is_bf16_with_native_bf16_when_the_probe_agrees(probe_calls, flags):
    dtype, why = hardware.resolve_dtype("auto", threads=2, device="cpu", flags=flags)
    assert dtype == "bf16" and "3.0x fp32" in why and ("amx_bf16" in why or "avx512_bf16" in why)
    assert probe_calls["n"] == 1


def test_auto_is_fp32_when_native_bf16_is_not_faster(probe_calls):
    probe_calls["ratio"] = 0.95
    dtype, why = hardware.resolve_dtype("auto", threads=2, device="cpu", flags=ZEN4)
    assert dtype == "fp32" and "only 0.95x" in why


def test_auto_on_cuda(monkeypatch, probe_calls):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "FakeGPU")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert hardware.resolve_dtype("auto", device="cuda")[0] == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert hardware.resolve_dtype("auto", device="cuda") == ("fp16", "cuda FakeGPU lacks bf16")
    assert probe_calls["n"] == 0


def test_native_bf16_flags():
    assert hardware.native_bf16(SAPPHIRE_RAPIDS) and hardware.native_bf16(ZEN4) and not hardware.native_bf16(ZEN3)


def test_threads_auto_is_the_affinity_mask(monkeypatch):
    monkeypatch.setattr(hardware.os, "sched_getaffinity", lambda pid: {0, 3, 5})
    assert hardware.resolve_threads("auto") == (3, "sched_getaffinity: 3 core(s)")
    assert hardware.resolve_threads(None)[0] == 3
    assert hardware.resolve_threads("4") == (4, "given") and hardware.resolve_threads(2) == (2, "given")
    with pytest.raises(ValueError, match="'auto' or a positive integer"):
        hardware.resolve_threads("many")
    with pytest.raises(ValueError, match=">= 1"):
        hardware.resolve_threads(-1)


def test_roofline_probes_are_cached_per_threads_dtype_and_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("OOOSPEC_CACHE", str(tmp_path))
    measured = []
    monkeypatch.setattr(hardware, "_time_matmul", lambda dtype, threads, *a, **k: measured.append(
        ("matmul", dtype, threads)) or 0.01)
    monkeypatch.setattr(hardware, "_best_seconds", lambda fn, threads, *a, **k: measured.append(
        ("read", threads)) or 0.1)
    monkeypatch.setattr(hardware, "cpu_info", lambda: {"model": "fake", "flags": ZEN4, "cores": 2})

    roof = hardware.roofline("fp32", threads=1)
    m, k, n = hardware.PEAK_SHAPE
    assert roof["peak_flops"] == pytest.approx(2 * m * k * n / 0.01, rel=1e-3)
    assert roof["peak_bytes_per_s"] == pytest.approx(hardware.BANDWIDTH_BYTES / 0.1, rel=1e-3)
    assert len(measured) == 2
    hardware.roofline("fp32", threads=1)
    assert len(measured) == 2                                   # both from the cache
    hardware.roofline("bf16", threads=1)
    assert measured[2:] == [("matmul", torch.bfloat16, 1)]      # dtype: new FLOP/s probe, same bandwidth
    hardware.roofline("fp32", threads=2)
    assert len(measured) == 5                                   # threads: both again
    monkeypatch.setattr(hardware, "cpu_info", lambda: {"model": "fake", "flags": ZEN3, "cores": 2})
    hardware.roofline("fp32", threads=2)
    assert len(measured) == 7                                   # another CPU: both again
    on_disk = json.loads((tmp_path / "hardware.json").read_text())
    assert len(on_disk["peak_flops"]) == 4 and len(on_disk["read_bytes_per_s"]) == 3


def test_cpu_class_names_vendor_and_widest_matrix_isa():
    from ooospec.runtime.backends.hardware import cpu_class

    assert cpu_class("Intel(R) Xeon(R) Processor", ["avx2", "avx512f", "avx512_bf16", "amx_bf16"]) == "xeon-amx"
    assert cpu_class("AMD EPYC 9R14 96-Core Processor", ["avx2", "avx512f", "avx512_bf16"]) == "epyc-avx512bf16"
    assert cpu_class("AMD EPYC 7R32", ["avx2", "fma"]) == "epyc-avx2"
    assert cpu_class("Apple M2", []) == "cpu-baseline"


def test_vllm_cpu_env_defaults_what_the_user_did_not_set(monkeypatch):
    for key in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING",
                "VLLM_USE_AOT_COMPILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "7")                    # the user's own: kept
    got = hardware.vllm_cpu_env(2, kvcache_gb=2)
    # AOT off: vllm-cpu 0.32 cannot load its own AOT artifacts and compiles again at every start
    assert got == {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_KVCACHE_SPACE": "7",
                   "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_AOT_COMPILE": "0"}
    with pytest.raises(ValueError, match="threads"):
        hardware.vllm_cpu_env(0)


@pytest.mark.parametrize(("flags", "cuda", "expected"), [
    (ZEN3, False, "float32"), (ZEN4, False, "bfloat16"), (SAPPHIRE_RAPIDS, False, "bfloat16"),
    (ZEN3, True, "bfloat16")])
def test_vllm_dtype_auto_follows_native_bf16(flags, cuda, expected, probe_calls):
    assert hardware.vllm_dtype("auto", flags=flags, cuda=cuda) == expected
    assert probe_calls["n"] == 0                      # vLLM's kernels are not torch's: no matmul probe decides


def test_vllm_dtype_names():
    assert [hardware.vllm_dtype(d) for d in ("bf16", "fp32", "fp16", "float32")] == \
        ["bfloat16", "float32", "float16", "float32"]
