"""Which engine answers a sidecar's waves, and loading a sidecar on it: transformers
(:class:`~ooospec.runtime.sidecar.wave.Sidecar`), llama.cpp
(:class:`~ooospec.runtime.sidecar.llamacpp.LlamaCppSidecar`), vLLM (:class:`~ooospec.runtime.sidecar.vllm_engine.
VllmSidecar`), or ``auto``: the fastest installed one on this machine, measured once and cached. Torch-free at
import (the CLI reads :data:`ENGINE_CHOICES` here)::

    sidecar = load_sidecar("adapters/sidecar", engine="auto", threads=2)
"""

from __future__ import annotations

import logging
import math
import os

from ooospec.runtime.paths import sidecar_adapter_dir
from ooospec.runtime.sidecar import prompts as sp

logger = logging.getLogger(__name__)

ENGINES = ("transformers", "llama.cpp", "vllm")   # what answers a sidecar's waves (``--engine``)
ENGINE_CHOICES = ("auto", *ENGINES)
AUTO_WAVE = {"block_tokens": 320, "num_queries": 3}   # the wave ``auto`` times: a function-first wave's second stage


def resolve_engine(engine: str, adapter_dir: str | os.PathLike | None = None, *, threads: int | None = None,
                   dtype: str = "auto") -> tuple[str, str]:
    """``(engine, why)``. ``auto`` measures: once per engine, adapter base, threads and CPU, transformers and each
    other installed engine answer the same synthetic wave (:data:`AUTO_WAVE`,
    :func:`~ooospec.runtime.sidecar.wave.measure_wave_cost`) and the fastest wins; each engine's seconds are cached in
    ``$OOOSPEC_CACHE/hardware.json`` (section ``sidecar_engine``), so later starts load one engine. llama.cpp counts
    only with its bindings and a base that is a registry GGUF, vLLM only where it is installed; an engine that fails
    to load or run here is skipped (logged). Without another engine, ``auto`` is transformers."""
    if engine not in ENGINE_CHOICES:
        raise ValueError(f"unknown sidecar engine {engine!r}; known: {', '.join(ENGINE_CHOICES)}")
    if engine != "auto":
        return engine, "given"
    from ooospec.runtime.backends.hardware import available_cores, cached_probe, cpu_info

    base = sp.read_metadata(sidecar_adapter_dir(adapter_dir)).get("base")
    candidates, why_not = _candidates(base)
    if not candidates:
        return "transformers", f"auto: {why_not}"
    info = cpu_info()
    threads = threads or available_cores()
    key = f"{base}|dtype={dtype}|threads={threads}|{info['model']}|{','.join(info['flags'])}"
    seconds = {e: cached_probe("sidecar_engine", f"{e}|{key}", lambda e=e: _wave_seconds(adapter_dir, threads,
                                                                                         dtype, e))
               for e in ("transformers", *candidates)}
    chosen = min(seconds, key=seconds.get)
    if not math.isfinite(seconds[chosen]):
        chosen = "transformers"
    said = ", ".join(f"{e} {s:.3f} s" if math.isfinite(s) else f"{e} failed" for e, s in seconds.items())
    return chosen, f"auto: a synthetic wave takes {said} here ({threads} threads)"


def _candidates(base: str | None) -> tuple[list[str], str]:
    """The engines besides transformers that ``auto`` may time for ``base``, and why none when none."""
    from ooospec.runtime.backends.llamacpp import available
    from ooospec.runtime.backends.models import REGISTRY

    ok, why = available()
    out = ["llama.cpp"] if ok and base in REGISTRY else []
    if vllm_installed():
        out.append("vllm")
    return out, why if not ok else f"base {base!r} has no registry GGUF and vLLM is not installed"


def vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def _wave_seconds(adapter_dir, threads: int, dtype: str, engine: str) -> float:
    """Seconds of :data:`AUTO_WAVE` on ``engine`` (loads it; a few seconds); ``inf`` when it fails here."""
    try:
        sidecar = load_sidecar(adapter_dir, threads=threads, engine=engine,
                               dtype=dtype if engine != "llama.cpp" else "auto")
        seconds = sidecar.calibrate(**AUTO_WAVE)["seconds_per_wave"]
    except Exception as e:  # noqa: BLE001 - an engine that cannot run here is not chosen, whatever the reason
        logger.warning("sidecar engine %s skipped by auto: %s: %s", engine, type(e).__name__, e)
        return math.inf
    logger.info("sidecar engine %s: %.3f s per synthetic wave", engine, seconds)
    return seconds


def load_sidecar(adapter_dir: str | os.PathLike | None = None, *, engine: str = "transformers",
                 threads: int | None = None, dtype: str = "fp32", max_new_tokens: int = 48, merge: bool = True,
                 max_draft_nodes: int = 6, ngram_tokens: int | None = None, gpu_memory: float | None = None):
    """The sidecar of ``adapter_dir`` on ``engine`` (:data:`ENGINE_CHOICES`; ``auto``: :func:`resolve_engine`).
    llama.cpp runs the base's registry GGUF with the adapter as a llama.cpp LoRA and takes ``dtype="auto"`` only:
    a ``dtype`` given for ``auto`` is the transformers and vLLM engines'. vLLM runs the adapter merged into its
    base (made once in the cache); ``ngram_tokens`` is its n-gram drafts per query and step (None: its default),
    ``gpu_memory`` the share of a GPU's memory its engine takes (None: vLLM's default; other engines: unused)."""
    if gpu_memory is not None and not 0 < gpu_memory <= 1:
        raise ValueError(f"gpu_memory must be in (0, 1], got {gpu_memory}")
    requested = engine
    engine, why = resolve_engine(engine, adapter_dir, threads=threads, dtype=dtype)
    if why != "given":
        logger.info("sidecar engine %s (%s)", engine, why)
    if engine == "llama.cpp":
        from ooospec.runtime.sidecar.llamacpp import LlamaCppSidecar

        return LlamaCppSidecar.from_adapter(adapter_dir, threads=threads,
                                            dtype=dtype if requested == engine else "auto",
                                            max_new_tokens=max_new_tokens, max_draft_nodes=max_draft_nodes)
    if engine == "vllm":
        from ooospec.runtime.sidecar.vllm_engine import VllmSidecar

        ngram = {} if ngram_tokens is None else {"ngram_tokens": ngram_tokens}
        return VllmSidecar.from_adapter(adapter_dir, threads=threads, dtype=dtype, max_new_tokens=max_new_tokens,
                                        gpu_memory=gpu_memory, **ngram)
    from ooospec.runtime.sidecar.wave import Sidecar

    return Sidecar.from_adapter(adapter_dir, threads=threads, dtype=dtype, max_new_tokens=max_new_tokens,
                                merge=merge, max_draft_nodes=max_draft_nodes)
