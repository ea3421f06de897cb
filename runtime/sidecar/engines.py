"""Which engine answers a sidecar's waves, and loading a sidecar on it: transformers
(:class:`~ooospec.runtime.sidecar.wave.Sidecar`) or llama.cpp
(:class:`~ooospec.runtime.sidecar.llamacpp.LlamaCppSidecar`), or ``auto``: the faster of the two on this machine,
measured once and cached. Torch-free at import (the CLI reads :data:`ENGINE_CHOICES` here)::

    sidecar = load_sidecar("adapters/sidecar", engine="auto", threads=2)
"""

from __future__ import annotations

import logging
import os

from ooospec.runtime.paths import sidecar_adapter_dir
from ooospec.runtime.sidecar import prompts as sp

logger = logging.getLogger(__name__)

ENGINES = ("transformers", "llama.cpp")   # what answers a sidecar's waves (``--engine``)
ENGINE_CHOICES = ("auto", *ENGINES)
AUTO_WAVE = {"block_tokens": 320, "num_queries": 3}   # the wave ``auto`` times: a function-first wave's second stage


def resolve_engine(engine: str, adapter_dir: str | os.PathLike | None = None, *, threads: int | None = None,
                   dtype: str = "auto") -> tuple[str, str]:
    """``(engine, why)``. ``auto`` measures: once per adapter base, threads and CPU, both engines answer the same
    synthetic wave (:data:`AUTO_WAVE`, :func:`~ooospec.runtime.sidecar.wave.measure_wave_cost`) and the faster
    wins; the ratio is cached in ``$OOOSPEC_CACHE/hardware.json`` (section ``sidecar_engine``), so later starts
    load one engine. Without the llama.cpp bindings, or for a base that is no registry GGUF, ``auto`` is
    transformers."""
    if engine not in ENGINE_CHOICES:
        raise ValueError(f"unknown sidecar engine {engine!r}; known: {', '.join(ENGINE_CHOICES)}")
    if engine != "auto":
        return engine, "given"
    from ooospec.runtime.backends.hardware import available_cores, cached_probe, cpu_info
    from ooospec.runtime.backends.llamacpp import available
    from ooospec.runtime.backends.models import REGISTRY

    ok, why = available()
    base = sp.read_metadata(sidecar_adapter_dir(adapter_dir)).get("base")
    if not ok or base not in REGISTRY:
        return "transformers", f"auto: {why if not ok else f'base {base!r} has no registry GGUF'}"
    info = cpu_info()
    threads = threads or available_cores()
    key = f"{base}|dtype={dtype}|threads={threads}|{info['model']}|{','.join(info['flags'])}"
    ratio = cached_probe("sidecar_engine", key, lambda: _engine_ratio(adapter_dir, threads, dtype))
    chosen = "llama.cpp" if ratio < 1.0 else "transformers"
    return chosen, f"auto: a llama.cpp wave takes {ratio:.2f}x a transformers one here ({threads} threads)"


def _engine_ratio(adapter_dir, threads: int, dtype: str) -> float:
    """Seconds of :data:`AUTO_WAVE` on llama.cpp over the same on transformers (a few seconds each, loads both)."""
    seconds = {}
    for engine in ENGINES:
        sidecar = load_sidecar(adapter_dir, threads=threads, engine=engine,
                               dtype=dtype if engine == "transformers" else "auto")
        seconds[engine] = sidecar.calibrate(**AUTO_WAVE)["seconds_per_wave"]
        del sidecar
    logger.info("sidecar engines, seconds per wave: %s", seconds)
    return seconds["llama.cpp"] / seconds["transformers"]


def load_sidecar(adapter_dir: str | os.PathLike | None = None, *, engine: str = "transformers",
                 threads: int | None = None, dtype: str = "fp32", max_new_tokens: int = 48, merge: bool = True,
                 max_draft_nodes: int = 6):
    """The sidecar of ``adapter_dir`` on ``engine`` (:data:`ENGINE_CHOICES`; ``auto``: :func:`resolve_engine`).
    llama.cpp runs the base's registry GGUF with the adapter as a llama.cpp LoRA and takes ``dtype="auto"`` only:
    a ``dtype`` given for ``auto`` is the transformers engine's."""
    requested = engine
    engine, why = resolve_engine(engine, adapter_dir, threads=threads, dtype=dtype)
    if why != "given":
        logger.info("sidecar engine %s (%s)", engine, why)
    if engine == "llama.cpp":
        from ooospec.runtime.sidecar.llamacpp import LlamaCppSidecar

        return LlamaCppSidecar.from_adapter(adapter_dir, threads=threads,
                                            dtype=dtype if requested == engine else "auto",
                                            max_new_tokens=max_new_tokens, max_draft_nodes=max_draft_nodes)
    from ooospec.runtime.sidecar.wave import Sidecar

    return Sidecar.from_adapter(adapter_dir, threads=threads, dtype=dtype, max_new_tokens=max_new_tokens,
                                merge=merge, max_draft_nodes=max_draft_nodes)
