"""Load a target model and its tokenizer: a registry name, a local HF folder, a ``.gguf`` file or an HF hub id.

    model, tok = load_target("qwen2.5-coder-0.5b")        # dtype="auto", fetched into the cache on first use

Registry names are fetched by :mod:`ooospec.runtime.fetch` (``REGISTRY``, ``fetch``); ``dtype="auto"`` is resolved
by :func:`ooospec.runtime.hardware.resolve_dtype` (bf16 only where the hardware multiplies it natively and faster).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Literal

from ooospec.runtime.fetch import REGISTRY, fetch

__all__ = ["REGISTRY", "eos_token_ids", "fetch", "load_target"]

logger = logging.getLogger(__name__)


_DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}


def load_target(
    name_or_path: str,
    dtype: Literal["auto", "bf16", "fp32", "fp16"] = "auto",
    threads: int | None = None,
    cache: str | os.PathLike | None = None,
):
    """Load a target model and its tokenizer (eval mode, sdpa attention).

    Args:
        name_or_path: a registry name (fetched on first use), a local HF folder, a ``*.gguf`` file
            (dequantized on each load), or an HF hub id.
        dtype: ``"auto"`` (bf16 where the hardware multiplies it natively and faster, else fp32; see
            :func:`ooospec.runtime.hardware.resolve_dtype`), ``"bf16"``, ``"fp32"`` or ``"fp16"``.
        threads: ``torch.set_num_threads`` value; None leaves torch's default.
        cache: cache root (default ``$OOOSPEC_CACHE`` or ``~/.cache/ooospec``).
    Returns:
        ``(model, tokenizer)``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ooospec.runtime.hardware import resolve_dtype

    if dtype != "auto" and dtype not in _DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {dtype!r}")
    if threads is not None:
        torch.set_num_threads(threads)
    if dtype == "auto":
        dtype, why = resolve_dtype("auto", threads=threads, device="cpu")   # this loader keeps the model on the CPU
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
    return model.eval(), tok


def eos_token_ids(model, tokenizer) -> list[int]:
    """Sorted union of the tokenizer's EOS and the model's ``generation_config.eos_token_id`` (int or list).

    Raises ValueError when neither defines one (generation would only stop at its token cap).
    """
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(model.generation_config, "eos_token_id", None)
    if gen_eos is not None:
        ids.update(int(t) for t in ([gen_eos] if isinstance(gen_eos, int) else gen_eos))
    if not ids:
        raise ValueError("neither the tokenizer nor the model's generation_config defines an EOS token")
    return sorted(ids)
