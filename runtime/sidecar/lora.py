"""The sidecar's PEFT LoRA read as plain tensors: pairs by module, PEFT's scale, and the adapter merged into its base.

Engines that do not run PEFT take the adapter from here: llama.cpp as a LoRA GGUF
(:func:`~ooospec.runtime.sidecar.llamacpp.lora_to_gguf`), vLLM as a merged checkpoint (:func:`merge_into`). The
merge is PEFT's ``merge_and_unload`` on the stored weights (PEFT keeps a bf16 base's adapter in float32):
``W + scale * B @ A`` in float32, rounded once to the base's dtype, so a bf16 base merged here holds the weights the
transformers sidecar runs in bf16, bit for bit.

    out = merged_checkpoint("adapters/sidecar")     # $OOOSPEC_CACHE/sidecar-merged/<sha>/, made once
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

logger = logging.getLogger(__name__)

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "vocab.json", "merges.txt")
UNSUPPORTED = ("use_dora", "alpha_pattern", "rank_pattern", "modules_to_save")
MERGE_VERSION = 2           # in the merged checkpoint's cache key: a change to the merge makes a new one


def peft_module(key: str) -> tuple[str, str] | None:
    """``("model.layers.0.self_attn.q_proj", "a")`` of a PEFT key ``base_model.model.<module>.lora_A.weight``."""
    for part, ab in ((".lora_A.weight", "a"), (".lora_B.weight", "b")):
        if key.endswith(part):
            return key.removeprefix("base_model.model.")[: -len(part)], ab
    return None


def lora_alpha(config: Mapping) -> float:
    """The alpha that gives PEFT's factor as ``alpha / r``: ``lora_alpha``, or ``lora_alpha * sqrt(r)`` with rsLoRA
    (whose factor is ``lora_alpha / sqrt(r)``). Raises ValueError on an option these engines do not apply."""
    for key in UNSUPPORTED:
        if config.get(key):
            raise ValueError(f"adapter_config.json: {key}={config[key]!r} is not supported outside PEFT")
    if config.get("fan_in_fan_out"):
        raise ValueError("adapter_config.json: fan_in_fan_out=True is not supported outside PEFT")
    r, alpha = int(config["r"]), float(config["lora_alpha"])
    return alpha * math.sqrt(r) if config.get("use_rslora") else alpha


def lora_scale(config: Mapping) -> float:
    """PEFT's ``scaling``: ``lora_alpha / r`` (``/ sqrt(r)`` with rsLoRA)."""
    return lora_alpha(config) / int(config["r"])


def lora_pairs(adapter_dir: str | os.PathLike) -> tuple[dict[str, dict[str, object]], dict]:
    """``({module: {"a": A, "b": B}}, adapter_config)`` of a PEFT LoRA folder; raises ValueError naming an option
    outside PEFT's plain LoRA (:func:`lora_alpha`), a tensor that is no LoRA A/B weight or a module without its
    pair."""
    from safetensors.torch import load_file

    adapter_dir = Path(adapter_dir)
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    lora_alpha(config)                 # an option outside PEFT fails before any tensor is read
    pairs: dict[str, dict[str, object]] = {}
    for key, value in load_file(str(adapter_dir / "adapter_model.safetensors")).items():
        found = peft_module(key)
        if found is None:
            raise ValueError(f"{adapter_dir}: tensor {key!r} is not a LoRA A/B weight")
        module, ab = found
        pairs.setdefault(module, {})[ab] = value
    for module, pair in pairs.items():
        if set(pair) != {"a", "b"}:
            raise ValueError(f"{adapter_dir}: {module} has lora_{''.join(pair)} without its pair")
    return pairs, config


def merge_weights(weights: dict, pairs: Mapping[str, Mapping[str, object]], scale: float) -> int:
    """Add every pair's ``scale * B @ A`` to ``weights[module + ".weight"]`` in place, as PEFT merges: product and
    sum in float32, rounded once to the weight's dtype. Returns the modules merged (those present)."""
    merged = 0
    for module, pair in pairs.items():
        key = module + ".weight"
        if key not in weights:
            continue
        w = weights[key]
        delta = (pair["b"].float() @ pair["a"].float()) * scale
        if tuple(delta.shape) != tuple(w.shape):
            raise ValueError(f"{module}: LoRA delta {tuple(delta.shape)} does not match the base {tuple(w.shape)}")
        weights[key] = (w.float() + delta).to(w.dtype)
        merged += 1
    return merged


def merge_into(base_dir: str | os.PathLike, adapter_dir: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write ``base_dir``'s checkpoint with ``adapter_dir``'s LoRA merged (every safetensors shard, its config, the
    adapter's tokenizer) to ``out``, atomically. Raises ValueError when a LoRA module has no weight in the base."""
    from safetensors.torch import load_file, save_file

    base_dir, adapter_dir, out = Path(base_dir), Path(adapter_dir), Path(out)
    pairs, config = lora_pairs(adapter_dir)
    scale = lora_scale(config)
    shards = sorted(base_dir.glob("*.safetensors"))
    if not shards:
        raise ValueError(f"{base_dir}: no *.safetensors checkpoint to merge the adapter into")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    merged = 0
    for shard in shards:
        weights = load_file(str(shard))
        merged += merge_weights(weights, pairs, scale)
        save_file(weights, str(tmp / shard.name), metadata={"format": "pt"})
    if merged != len(pairs):
        shutil.rmtree(tmp, ignore_errors=True)
        raise ValueError(f"{adapter_dir}: {len(pairs) - merged} of {len(pairs)} LoRA modules have no weight in "
                         f"{base_dir}")
    for name in os.listdir(base_dir):
        if name.endswith(".json") and not (tmp / name).exists():
            shutil.copy2(base_dir / name, tmp / name)
    for name in TOKENIZER_FILES:       # the adapter's tokenizer is the one its prompts were encoded with
        if (adapter_dir / name).is_file():
            shutil.copy2(adapter_dir / name, tmp / name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out


def base_checkpoint(meta: Mapping, cache: str | os.PathLike | None = None) -> Path:
    """The base's safetensors folder: a registry model (fetched and converted once), a local folder, else its Hub
    id (``base_model_id``) downloaded by ``huggingface_hub``."""
    from ooospec.runtime.backends.fetch import fetch
    from ooospec.runtime.backends.models import REGISTRY

    base = meta.get("base") or ""
    if base in REGISTRY:
        return fetch(base, cache)
    if base and Path(base).is_dir():
        return Path(base)
    hub_id = meta.get("base_model_id") or base
    if not hub_id:
        raise ValueError("sidecar.json names no base model (base / base_model_id)")
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(hub_id, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.jinja"]))


def merged_checkpoint(adapter_dir: str | os.PathLike | None = None, cache: str | os.PathLike | None = None) -> Path:
    """The adapter merged into its base, made once into ``$OOOSPEC_CACHE/sidecar-merged/<sha>/`` (keyed by the
    adapter's files and the base's name), for engines that load a checkpoint (vLLM)."""
    from ooospec.runtime.paths import cache_dir, sidecar_adapter_dir
    from ooospec.runtime.sidecar import prompts as sp

    adapter_dir = sidecar_adapter_dir(adapter_dir)
    meta = sp.read_metadata(adapter_dir)
    h = hashlib.sha256(json.dumps([MERGE_VERSION, meta.get("base"), meta.get("base_model_id")]).encode())
    for name in ADAPTER_FILES:
        h.update((adapter_dir / name).read_bytes())
    out = cache_dir(cache) / "sidecar-merged" / h.hexdigest()[:16]
    if not (out / "config.json").is_file():
        base = base_checkpoint(meta, cache)
        logger.info("merging the LoRA of %s into %s (one-off): %s", adapter_dir, base, out)
        merge_into(base, adapter_dir, out)
    return out
