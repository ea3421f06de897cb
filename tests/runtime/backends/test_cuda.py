"""The HF backend on a CUDA device: the engine's exactness on tiny float64 models (no download).

Skipped without a GPU (CI has none); run on a GPU machine with ``pytest -m gpu tests/runtime/backends/test_cuda.py``.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from ooospec.runtime.decoding import build_engine, make_engine
from tests.runtime.test_engine_exact import KINDS, VOCAB, adversarial_drafter

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def model():
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      attn_implementation="sdpa")
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).to(device="cuda", dtype=torch.float64).eval()


@pytest.mark.parametrize("kind", KINDS)
def test_adversarial_drafts_on_cuda_match_generate(model, kind):
    prompt = torch.randint(0, VOCAB, (1, 24), generator=torch.Generator().manual_seed(1)).tolist()[0]
    ids = torch.tensor([prompt], device="cuda")
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=40,
                         min_new_tokens=40)[0, len(prompt):].tolist()
    assert build_engine("ar", model).generate(prompt, 40).tokens == ref
    engine = make_engine(model, [adversarial_drafter(kind, prompt + ref + [0] * 300, 0)], policy="fixed",
                         max_draft_nodes=16, max_depth=6)
    assert engine.generate(prompt, 40).tokens == ref
