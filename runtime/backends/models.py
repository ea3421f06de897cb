"""Load a target model and its tokenizer: a registry name, a local HF folder, a ``.gguf`` file or an HF hub id.

    model, tok = load_target("qwen2.5-coder-0.5b")        # backend/dtype "auto", fetched into the cache on first use

Two backends run the same tree engine (:func:`resolve_backend` picks one and says why):

* ``"llama.cpp"`` -- the GGUF's own quantized weights on llama.cpp's CPU kernels
(:mod:`ooospec.runtime.backends.llamacpp`).
  The default for registry names and ``.gguf`` files on the CPU when the bindings are installed: the registry's
  Q4_K_M weights are ~3.4x fewer bytes than bf16, and decoding is bound by reading them.
* ``"hf"`` -- transformers with dequantized bf16/fp32 weights: HF folders and hub ids, CUDA, training, and the
  fp32 exactness reference.

Registry names are fetched by :mod:`ooospec.runtime.backends.fetch` (``REGISTRY``, ``fetch``); ``dtype="auto"`` is
resolved by :func:`ooospec.runtime.backends.hardware.resolve_dtype` (bf16 only where the hardware multiplies it natively
and faster).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ooospec.runtime.backends import BACKEND_CHOICES
from ooospec.runtime.backends.fetch import REGISTRY, fetch
from ooospec.runtime.backends.target import Target, as_target

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["REGISTRY", "eos_token_ids", "fetch", "load_target"]

logger = logging.getLogger(__name__)


_DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}


def _is_gguf_target(name_or_path: str) -> bool:
    return name_or_path in REGISTRY or (name_or_path.endswith(".gguf") and Path(name_or_path).is_file())


def resolve_backend(backend: str, name_or_path: str, device: str = "cpu", dtype: str = "auto") -> tuple[str, str]:
    """``(backend, reason)``: ``"auto"`` takes llama.cpp for a GGUF target (registry name or ``.gguf`` file) on the
    CPU when its bindings import, else HF; an explicit choice is checked and returned.

    ``dtype`` other than ``"auto"`` asks for HF numerics (e.g. the fp32 exactness runs), so ``auto`` keeps HF then.
    """
    from ooospec.runtime.backends import llamacpp

    if backend not in BACKEND_CHOICES:
        raise ValueError(f"backend must be one of {BACKEND_CHOICES}, got {backend!r}")
    if backend == "hf":
        return "hf", "given"
    ok, why = llamacpp.available()
    if backend == "llama.cpp":
        if not device.startswith("cpu"):
            raise ValueError(f"the llama.cpp backend runs on the CPU here, not {device!r}; use --backend hf")
        if not _is_gguf_target(name_or_path):
            raise ValueError(f"the llama.cpp backend needs a GGUF target (registry name or .gguf file), got "
                             f"{name_or_path!r}")
        if not ok:
            raise RuntimeError(f"{why}; {llamacpp.INSTALL_HINT}")
        return "llama.cpp", "given"
    if not device.startswith("cpu"):
        return "hf", f"device {device}: the HF backend runs on CUDA"
    if not _is_gguf_target(name_or_path):
        return "hf", "not a GGUF target (HF folder or hub id)"
    if dtype != "auto":
        return "hf", f"dtype {dtype} given: HF numerics asked for"
    if not ok:
        return "hf", f"GGUF target, but {why}"
    return "llama.cpp", f"GGUF target on the CPU: llama.cpp {why} runs its quantized weights"


def gguf_path_of(name_or_path: str, cache: str | os.PathLike | None = None) -> Path:
    """The GGUF file of a registry name (fetched, not converted) or a ``.gguf`` path."""
    from ooospec.runtime.backends.fetch import fetch_gguf

    if name_or_path in REGISTRY:
        return fetch_gguf(name_or_path, cache)
    return Path(name_or_path)


def gguf_tokenizer(gguf: Path, cache: str | os.PathLike | None = None):
    """The HF tokenizer of a GGUF: from its converted HF folder when fetched, else read from the GGUF once and
    saved next to it (``<file>.tokenizer/``), so later loads take a second."""
    from transformers import AutoTokenizer

    saved = gguf.with_name(gguf.name + ".tokenizer")
    converted = gguf.parent / "hf"
    if (converted / "DONE").is_file():
        return AutoTokenizer.from_pretrained(converted)
    if (saved / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(saved)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    try:
        tmp = saved.with_name(saved.name + f".{os.getpid()}.partial")
        tok.save_pretrained(tmp)
        tmp.replace(saved)
    except OSError as e:
        logger.warning("could not save the tokenizer next to %s: %s", gguf, e)
    return tok


def load_llamacpp_target(name_or_path: str, threads: int | None = None, cache: str | os.PathLike | None = None,
                         **kwargs):
    """``(LlamaCppTarget, tokenizer)`` for a registry name or ``.gguf`` file (``kwargs``: :class:`LlamaCppTarget`'s)."""
    from ooospec.runtime.backends.llamacpp import LlamaCppTarget

    gguf = gguf_path_of(name_or_path, cache)
    t0 = time.perf_counter()
    target = LlamaCppTarget(gguf, threads=threads, **kwargs)
    tok = gguf_tokenizer(gguf, cache)
    logger.info("loaded %s on llama.cpp (%s, %d threads, tie margin %.2f) in %.1fs", name_or_path,
                target.weight_type, target.threads, target.tie_margin, time.perf_counter() - t0)
    return target, tok


def load_target(
    name_or_path: str,
    dtype: Literal["auto", "bf16", "fp32", "fp16"] = "auto",
    threads: int | None = None,
    cache: str | os.PathLike | None = None,
    backend: str = "hf",
    device: str = "cpu",
):
    """Load a target model and its tokenizer (HF: eval mode, sdpa attention; llama.cpp: see the module docstring).

    Args:
        name_or_path: a registry name (fetched on first use), a local HF folder, a ``*.gguf`` file
            (dequantized on each load), or an HF hub id.
        dtype: ``"auto"`` (bf16 where the hardware multiplies it natively and faster, else fp32; see
            :func:`ooospec.runtime.backends.hardware.resolve_dtype`), ``"bf16"``, ``"fp32"`` or ``"fp16"``.
        threads: ``torch.set_num_threads`` value; None leaves torch's default.
        cache: cache root (default ``$OOOSPEC_CACHE`` or ``~/.cache/ooospec``).
        backend: ``"hf"`` (default), ``"llama.cpp"`` or ``"auto"`` (:func:`resolve_backend`).
        device: where the HF model lives (``"cpu"``, ``"cuda"``, ``"cuda:1"``); llama.cpp runs on the CPU.
    Returns:
        ``(model, tokenizer)``.
    """
    if backend != "hf":
        backend, why = resolve_backend(backend, name_or_path, device, dtype)
        if backend == "llama.cpp":
            logger.info("backend llama.cpp (%s)", why)
            return load_llamacpp_target(name_or_path, threads=threads, cache=cache)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ooospec.runtime.backends.hardware import resolve_dtype

    if dtype != "auto" and dtype not in _DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {dtype!r}")
    if threads is not None:
        torch.set_num_threads(threads)
    if dtype == "auto":
        dtype, why = resolve_dtype("auto", threads=threads, device=device)
        logger.info("dtype auto -> %s (%s)", dtype, why)
    torch_dtype = getattr(torch, _DTYPES[dtype])
    kwargs: dict = {}
    if name_or_path in REGISTRY:
        path = str(fetch(name_or_path, cache))
    elif name_or_path.endswith(".gguf") and Path(name_or_path).is_file():
        path, kwargs["gguf_file"] = str(Path(name_or_path).parent), Path(name_or_path).name
    else:
        path = name_or_path
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch_dtype, attn_implementation="sdpa", **kwargs)
    tok = AutoTokenizer.from_pretrained(path, **kwargs)
    logger.info("loaded %s (%s) in %.1fs", name_or_path, dtype, time.perf_counter() - t0)
    if device != "cpu":
        model = model.to(device)
    return model.eval(), tok


def eos_token_ids(model: Target | PreTrainedModel, tokenizer) -> list[int]:
    """Sorted union of the tokenizer's EOS and the target's own
    (:meth:`~ooospec.runtime.backends.target.Target.eos_token_ids`: a transformers model's
    ``generation_config.eos_token_id``, a GGUF's end-of-generation tokens).

    Raises ValueError when neither defines one (generation would only stop at its token cap).
    """
    ids = set(as_target(model).eos_token_ids())
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if not ids:
        raise ValueError("neither the tokenizer nor the model (a transformers model's generation_config, a GGUF's "
                         "vocabulary) defines an EOS token")
    return sorted(ids)
