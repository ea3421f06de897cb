"""The sidecar on llama.cpp (runtime/sidecar/llamacpp.py): waves as sequences, the LoRA as a llama.cpp adapter.

Tiny GGUFs built in code (tests/runtime/tiny_gguf.py; a wide output head keeps top-2 margins far above llama.cpp's
batch-shape rounding, so greedy decoding is reproducible across batch shapes). Every answer of a wave must equal
llama.cpp's own greedy decoding of ``block + query`` alone, whatever the drafts, repeats, passes or kept blocks.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

pytest.importorskip("llama_cpp")

from ooospec.runtime.backends.llamacpp import LlamaCppTarget, greedy_reference
from ooospec.runtime.sidecar.llamacpp import (
    LlamaCppWaves,
    lora_to_gguf,
    permute_rows,
    query_seqs,
)
from ooospec.runtime.sidecar.wave import WaveCancelled
from ooospec.runtime.tree import build_tree
from tests.runtime.tiny_gguf import make_tiny_gguf

VOCAB = 300
EOS = 2


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    return make_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", vocab=VOCAB, head_scale=8.0)


@pytest.fixture(scope="module")
def target(gguf_path):
    t = LlamaCppTarget(gguf_path, threads=2, n_ctx=2048, max_leaves=6)
    yield t
    t.close()


def _ids(rng: random.Random, n: int) -> list[int]:
    return rng.choices(range(3, VOCAB), k=n)


def _reference(target, block, query, max_new_tokens):
    out, _, _ = greedy_reference(target, list(block) + list(query), max_new_tokens, [EOS])
    return out


def test_query_seqs_worked_example():
    tree = build_tree(9, [[5, 6], [5, 7], [5, 6]], max_nodes=6)
    seqs, ends, which = query_seqs(tree, [[5, 6], [5, 7], [5, 6]], first_seq=1)
    assert seqs == [[1, 2], [1, 2], [1], [2]]
    assert ends == [2, 3, 2] and which == [0, 1, 0]


@pytest.mark.parametrize("drafts", ["none", "random", "oracle"])
def test_every_answer_is_greedy_decoding_of_its_prompt_alone(target, drafts):
    rng = random.Random(1)
    block = _ids(rng, 40)
    common = _ids(rng, 3)
    queries = [common + _ids(rng, 2), common + _ids(rng, 3), _ids(rng, 4), common + _ids(rng, 2)]
    queries.append(list(queries[1]))                       # a repeat shares its branch
    queries += [_ids(rng, 2) for _ in range(4)]            # 9 queries > max_leaves - 1 = 5: two passes
    want = [_reference(target, block, q, 12) for q in queries]

    def propose(i, out):
        if drafts == "random":
            return [_ids(rng, rng.randint(1, 6))]
        return [want[i][len(out):len(out) + 5]] if drafts == "oracle" and len(out) < len(want[i]) else []

    waves = LlamaCppWaves(target)
    got, stats = waves.decode(block, queries, max_new_tokens=12, eos_token_ids=[EOS],
                              propose=None if drafts == "none" else propose, max_draft_nodes=5)
    assert got == want
    assert stats["block_tokens"] == 40 and stats["cached_tokens"] == 0
    if drafts == "oracle":
        assert stats["accepted"] > 0 and stats["n_forwards"] < 2 * 12


def test_the_kept_block_is_reused_and_changes_no_answer(target):
    rng = random.Random(2)
    toolbox, conv1, conv2 = _ids(rng, 30), _ids(rng, 10), _ids(rng, 12)
    queries = [_ids(rng, 3), _ids(rng, 3)]
    waves = LlamaCppWaves(target)
    waves.decode(toolbox + conv1, queries, max_new_tokens=8, eos_token_ids=[EOS])
    got, stats = waves.decode(toolbox + conv2, queries, max_new_tokens=8, eos_token_ids=[EOS])
    assert stats["cached_tokens"] == 30                    # the toolbox, not the other conversation
    assert got == [_reference(target, toolbox + conv2, q, 8) for q in queries]
    waves2 = LlamaCppWaves(target)                         # greedy_reference took the context: start over
    _, again = waves2.decode(toolbox + conv2, queries, max_new_tokens=8, eos_token_ids=[EOS])
    assert again["cached_tokens"] == 0


def test_logprobs_are_the_top_k_of_each_answer_token(target):
    rng = random.Random(3)
    block, queries = _ids(rng, 20), [_ids(rng, 2), _ids(rng, 3)]
    got, stats = LlamaCppWaves(target).decode(block, queries, max_new_tokens=5, eos_token_ids=[EOS], logprobs=3)
    for toks, top in zip(got, stats["top_logprobs"]):
        assert len(top) == len(toks)
        for tok, step in zip(toks, top):
            assert len(step) == 3 and max(step, key=step.get) == tok and all(lp <= 0 for lp in step.values())


def test_a_cancelled_wave_leaves_no_branch_behind(target):
    rng = random.Random(4)
    block, queries = _ids(rng, 20), [_ids(rng, 2), _ids(rng, 2)]
    waves = LlamaCppWaves(target)
    calls = []
    with pytest.raises(WaveCancelled):
        waves.decode(block, queries, max_new_tokens=8, eos_token_ids=[EOS],
                     should_stop=lambda: calls.append(1) or len(calls) > 2)
    got, _ = waves.decode(block, queries, max_new_tokens=8, eos_token_ids=[EOS])
    assert got == [_reference(target, block, q, 8) for q in queries]


def test_permute_rows_is_llama_cpps_q_k_order():
    w = np.arange(8 * 2).reshape(8, 2)        # 2 heads of 4 rows: halves (0,1),(2,3) interleave per head
    assert permute_rows(w, 2)[:, 0].tolist() == [0, 4, 2, 6, 8, 12, 10, 14]


def test_the_lora_gguf_gives_the_peft_models_logits(tmp_path, gguf_path):
    """The converted adapter on llama.cpp (float32 tiny Llama) computes what PEFT computes on the same weights:
    a wrong name, scale or q/k row order moves the logits by far more than the tolerance."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                dtype=torch.float32)
    torch.manual_seed(0)
    peft = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                           "up_proj", "down_proj"]))
    for name, p in peft.named_parameters():    # make the delta matter: B is zero-initialized by default
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.2)
    peft.save_pretrained(tmp_path / "adapter")
    out = lora_to_gguf(tmp_path / "adapter", gguf_path, tmp_path / "lora.gguf")
    ids = random.Random(5).choices(range(3, VOCAB), k=12)
    with torch.no_grad():
        want = peft(torch.tensor([ids])).logits[0, -1]
        with peft.disable_adapter():
            want_base = peft(torch.tensor([ids])).logits[0, -1]
    got, got_base = (_last_logits(gguf_path, ids, lora) for lora in (out, None))
    base_gap = (got_base - want_base).abs().max()          # llama.cpp vs transformers, same weights, no adapter
    assert (want - want_base).abs().max() > 0.5             # the adapter moves these logits: the check can fail
    assert (got - want).abs().max() <= 2 * base_gap + 5e-3, ((got - want).abs().max(), base_gap)


def _last_logits(gguf_path, ids, lora) -> torch.Tensor:
    target = LlamaCppTarget(gguf_path, threads=1, n_ctx=256, max_leaves=2, lora=lora)
    try:
        target.decode(ids, range(len(ids)), [[0]] * len(ids), [False] * (len(ids) - 1) + [True])
        return target.logits(1)[0]
    finally:
        target.close()


def test_conversion_errors_name_the_problem(tmp_path, gguf_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "use_dora": True}))
    with pytest.raises(ValueError, match="use_dora"):
        lora_to_gguf(adapter, gguf_path, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()
