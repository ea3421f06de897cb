"""Tiny random target models built in code (no downloads), one per supported model family.

Each is 2 layers, hidden 32, vocab 300, float64, ``attn_implementation="sdpa"``; Gemma 3 has one sliding layer
with ``sliding_window=6``, so prompts longer than 6 exercise the sliding mask.
"""

from __future__ import annotations

import functools

import pytest
import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from ooospec.runtime import engine
from ooospec.runtime.backends.cost_model import ForwardCost

VOCAB = 300
SLIDING_WINDOW = 6
_COMMON = {
    "vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 64, "head_dim": 8, "attn_implementation": "sdpa",
}
FAMILIES = {
    "llama": (LlamaForCausalLM, LlamaConfig, {}),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config, {}),
    "qwen3": (Qwen3ForCausalLM, Qwen3Config, {}),
    "gemma3": (Gemma3ForCausalLM, Gemma3TextConfig, {
        "sliding_window": SLIDING_WINDOW,
        "layer_types": ["sliding_attention", "full_attention"],
        "query_pre_attn_scalar": 8,
    }),
}


@functools.cache
def tiny_model(family: str, dtype: torch.dtype = torch.float64, **overrides):
    """A deterministic tiny random model of ``family`` (cached; treat as read-only)."""
    model_cls, config_cls, extra = FAMILIES[family]
    torch.manual_seed(0)
    model = model_cls(config_cls(**{**_COMMON, **extra, **overrides})).to(dtype).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


# The forward cost engines plan with in these tests (unless a test passes its own): a fixed curve like fp32 on AVX2,
# where a 16-node tree costs 2.5 one-token steps, instead of a timing of the tiny model, so the trees the budget
# policy picks (and the tests that count forwards) do not depend on the machine or its load.
# tests/runtime/backends/test_cost_model.py measures real curves.
AVX2_FP32_COST = ForwardCost((1, 2, 4, 8, 16, 32, 64), (1.0, 1.08, 1.2, 1.5, 2.5, 4.5, 8.5))


@pytest.fixture(autouse=True)
def _fixed_forward_cost(monkeypatch):
    monkeypatch.setattr(engine, "forward_cost", lambda model: AVX2_FP32_COST)


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(params=sorted(FAMILIES))
def family(request) -> str:
    return request.param


def _hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])   # explicit mask: HF would otherwise mask prompt tokens equal to pad_token_id
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="session")
def hf_greedy():
    """Reference decoder: HF ``generate(do_sample=False)`` with its own cache and masks."""
    return _hf_greedy


@pytest.fixture(scope="session")
def make_model():
    """``make_model(family, dtype=torch.float64, **config_overrides)`` -> cached tiny model."""
    return tiny_model
