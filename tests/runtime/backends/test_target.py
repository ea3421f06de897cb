"""The target interface on the transformers backend: what ``as_target`` makes of a model, and that the engine and
sessions give the same output whether they are handed the model or its target."""

from __future__ import annotations

import pytest
import torch

from ooospec.runtime.agent.session import Session
from ooospec.runtime.backends import cost_model
from ooospec.runtime.backends.hf_target import HFTarget
from ooospec.runtime.backends.kv_cache import KVCache
from ooospec.runtime.backends.models import eos_token_ids
from ooospec.runtime.backends.target import as_target
from ooospec.runtime.drafters.pld import PromptLookupDrafter
from ooospec.runtime.engine import SpecEngine


def test_as_target_wraps_a_model_once(make_model):
    model = make_model("qwen2")
    target = as_target(model)
    assert isinstance(target, HFTarget) and target.model is model
    assert as_target(target) is target
    assert target.backend == "hf" and target.vocab_size == 300 and target.device == model.device
    kv = target.new_kv_cache()
    assert isinstance(kv, KVCache) and kv.model is model


@pytest.mark.parametrize(("dtype", "margin"), [(torch.float64, 0.0), (torch.float32, 0.0), (torch.bfloat16, 0.25)])
def test_tie_margin_follows_the_dtype(make_model, dtype, margin):
    assert as_target(make_model("llama", dtype)).tie_margin == margin


class _Tokenizer:
    def __init__(self, eos: int | None):
        self.eos_token_id = eos


@pytest.mark.parametrize(("generation_eos", "expected"), [(None, []), (7, [7]), ([9, 7, 9], [7, 9])])
def test_eos_ids_come_from_the_generation_config(generation_eos, expected):
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=16))
    model.generation_config.eos_token_id = generation_eos
    assert as_target(model).eos_token_ids() == expected
    assert eos_token_ids(model, _Tokenizer(3)) == sorted({3, *expected})
    if not expected:
        with pytest.raises(ValueError, match="defines an EOS token"):
            eos_token_ids(model, _Tokenizer(None))


def test_cost_key_names_dtype_threads_and_context(make_model):
    target = as_target(make_model("qwen2"))
    key = cost_model.calibration_key(target, context=64)
    assert key == f"{target.cost_fingerprint()}|context=64"
    assert "dtype=torch.float64" in key and f"threads={torch.get_num_threads()}" in key and "device=cpu" in key
    assert target.cost_fingerprint() != as_target(make_model("qwen2", torch.float32)).cost_fingerprint()


def test_model_or_target_give_the_same_tokens(make_model):
    model = make_model("llama")
    prompt = [5, 6, 7, 5, 6, 7, 5, 6, 7, 8, 9]
    from_model = SpecEngine(model, [PromptLookupDrafter()]).generate(prompt, 12)
    from_target = SpecEngine(as_target(model), [PromptLookupDrafter()]).generate(prompt, 12)
    assert from_model.tokens == from_target.tokens


def test_a_cache_belongs_to_the_model_not_to_its_wrapper(make_model):
    model, other = make_model("llama"), make_model("qwen2")
    session = Session(model)                     # its cache comes from a target of its own
    engine = SpecEngine(as_target(model))
    first = engine.generate([1, 2, 3, 4], 5, cache=session.kv)
    assert session.kv.tokens == [1, 2, 3, 4] + first.tokens[:-1]
    with pytest.raises(ValueError, match="belongs to another model"):
        SpecEngine(other).generate([1, 2, 3, 4], 5, cache=session.kv)
