"""The transformers backend as a :class:`~ooospec.runtime.backends.target.Target`: :class:`HFTarget`, a causal
LM whose caches are :class:`~ooospec.runtime.backends.kv_cache.KVCache` s, and the facts the engine and the cost
model ask of it (vocabulary, tie margin, EOS ids, cost fingerprint, footprint).

    target = HFTarget(model)               # or as_target(model) (runtime/backends/target.py)
    kv = target.new_kv_cache()             # a KVCache of one sequence
"""

from __future__ import annotations

import hashlib

import torch
from transformers import PreTrainedModel

from ooospec.runtime.backends.cost_model import Footprint
from ooospec.runtime.backends.kv_cache import KVCache
from ooospec.runtime.verify import default_tie_margin


class HFTarget:
    """A transformers causal LM as a :class:`~ooospec.runtime.backends.target.Target`: its caches are
    :class:`~ooospec.runtime.backends.kv_cache.KVCache` s.

    ``model``: loaded with ``attn_implementation`` "sdpa" or "eager", in eval mode (see
    :mod:`ooospec.runtime.backends.kv_cache`).
    """

    backend = "hf"

    def __init__(self, model: PreTrainedModel):
        self.model = model
        self.vocab_size: int = model.config.get_text_config().vocab_size

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def tie_margin(self) -> float:
        """:func:`~ooospec.runtime.verify.default_tie_margin` of the dtype: off in fp32/fp64, on in bf16/fp16."""
        return default_tie_margin(self.model.dtype)

    def new_kv_cache(self, persistent: bool = False) -> KVCache:
        """A cache of one sequence (each holds its own tensors: persistent or not)."""
        return KVCache(self.model)

    def eos_token_ids(self) -> list[int]:
        """``generation_config.eos_token_id`` (an int, a list or None) as a sorted list."""
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            return []
        return sorted({int(t) for t in ([eos] if isinstance(eos, int) else eos)})

    def cost_fingerprint(self) -> str:
        """Name, parameter count and config hash of the model; its dtype, torch's threads, the device (the GPU's
        name, or the CPU's model and flags) and the torch version."""
        from ooospec.runtime.backends.hardware import cpu_info

        info = cpu_info()
        model, cfg = self.model, self.model.config
        digest = hashlib.sha256(cfg.to_json_string(use_diff=False).encode()).hexdigest()[:12]
        num_params = sum(p.numel() for p in model.parameters())
        name = f"{cfg._name_or_path or type(model).__name__}|params={num_params}|config={digest}"
        device = model.device
        cpu = f"{info['model']}|{','.join(info['flags'])}"
        where = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu
        return (f"{name}|dtype={model.dtype}|threads={torch.get_num_threads()}|device={device.type}|{where}"
                f"|torch={torch.__version__}")

    def footprint(self) -> Footprint:
        """Parameter and byte counts of the model (see :class:`~ooospec.runtime.backends.cost_model.Footprint`).

        Worked example (Qwen2.5-0.5B, tied embeddings, fp32): head 151936 x 896 = 136M params, body 358M, weights
        read per forward 1.98 GB (the tied table is read once, as the head), KV 12 KiB per token (24 layers x 2
        heads x 64 x K and V x 4 bytes).
        """
        model, cfg = self.model, self.model.config.get_text_config()
        embed = model.get_input_embeddings().weight
        head = model.get_output_embeddings().weight
        tied = embed.data_ptr() == head.data_ptr()
        params = {p.data_ptr(): p for p in model.parameters()}     # a tied matrix counts once
        all_bytes = sum(p.numel() * p.element_size() for p in params.values())
        matrices = sum(p.numel() for p in params.values() if p.dim() >= 2)
        # the embedding lookup reads one row per token; the LM head (tied or not) reads its whole matrix
        body_params = matrices - head.numel() - (0 if tied else embed.numel())
        weight_bytes = all_bytes - (0 if tied else embed.numel() * embed.element_size())
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        kv_bytes = 2 * cfg.num_hidden_layers * kv_heads * head_dim * embed.element_size()
        return Footprint(body_params, head.numel(), weight_bytes, kv_bytes, cfg.num_hidden_layers,
                         cfg.num_attention_heads * head_dim)
