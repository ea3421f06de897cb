"""Spec-decoding invariants on tiny random models (float64 unless stated): exact output under any drafter."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.cache_utils import DynamicCache

from ooospec.runtime.backends.cost_model import ForwardCost
from ooospec.runtime.backends.kv_cache import KVCache, attention_windows
from ooospec.runtime.budget import AcceptanceStats
from ooospec.runtime.decoding import build_engine, make_engine
from ooospec.runtime.drafters.base import DraftContext, Drafter
from ooospec.runtime.metrics import acceptance_rate, classify_mismatch, mean_accepted_tokens
from ooospec.runtime.tree import build_tree
from tests.runtime.conftest import _COMMON, AVX2_FP32_COST

VOCAB = 300


class FnDrafter(Drafter):
    """A drafter from a function ``ctx -> candidates``."""

    def __init__(self, name, fn):
        self.name, self.fn = name, fn

    def propose(self, ctx: DraftContext) -> list[list[int]]:
        return self.fn(ctx)

    def observe(self, prompt, output) -> None:
        pass


def adversarial_drafter(kind: str, reference: list[int], seed: int, depth: int = 5) -> FnDrafter:
    """``reference`` = prompt + the target's own greedy continuation (long enough to look ahead)."""

    def fn(ctx: DraftContext) -> list[list[int]]:
        n = len(ctx.tokens)
        assert list(ctx.tokens) == reference[:n], "engine committed a non-greedy token"
        rng = random.Random(seed * 1000 + ctx.step)
        oracle = reference[n:n + depth]

        def rand(k):
            return [rng.randrange(VOCAB) for _ in range(k)]

        if kind == "empty":
            return [] if ctx.step % 2 else [[]]
        if kind == "random":
            return [rand(rng.randint(1, 6)) for _ in range(rng.randint(1, 4))]
        if kind == "oracle":
            return [oracle]
        if kind == "shifted":
            return [reference[n + 1:n + 1 + depth]]
        if kind == "long":
            return [rand(300), reference[n:n + 300]]
        if kind == "branches":   # the right branch comes last, so its nodes are not a prefix [0..k] of the tree
            return [rand(2) for _ in range(12)] + [oracle[:k] + rand(1) for k in range(depth)] + [oracle]
        raise ValueError(kind)

    return FnDrafter(kind, fn)


KINDS = ["empty", "random", "oracle", "shifted", "long", "branches"]


def _ar(model, prompt, max_new_tokens, **kw):
    return build_engine("ar", model, **kw).generate(prompt, max_new_tokens)


def _prompt(seed: int, length: int) -> list[int]:
    return random.Random(seed).choices(range(VOCAB), k=length)


def test_ar_matches_hf_generate(family, make_model, hf_greedy):
    model = make_model(family)
    for seed, length in [(0, 1), (1, 5), (2, 17)]:
        prompt = _prompt(seed, length)
        result = _ar(model, prompt, 24)
        assert result.tokens == hf_greedy(model, prompt, 24)
        assert result.n_forwards == 24 and all(s.tree_size == 1 and s.new_tokens == 1 for s in result.steps)


def test_sliding_window_matters(make_model, hf_greedy):
    """Guard: the Gemma 3 fixture's window changes the output, so the exactness tests exercise it."""
    prompt = _prompt(3, 20)
    windowed = _ar(make_model("gemma3"), prompt, 20).tokens
    assert windowed != _ar(make_model("gemma3", sliding_window=4096), prompt, 20).tokens
    assert attention_windows(make_model("gemma3").config) == {"full_attention": None, "sliding_attention": 6}
    assert attention_windows(make_model("llama").config) == {None: None}
    assert attention_windows(make_model("qwen2").config) == {"full_attention": None}


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20),
    kind=st.sampled_from(KINDS),
    seed=st.integers(0, 10**6),
    max_new_tokens=st.integers(1, 20),
    max_draft_nodes=st.sampled_from([0, 3, 16, 40]),
)
def test_spec_equals_greedy(family, make_model, hf_greedy, prompt, kind, seed, max_new_tokens, max_draft_nodes):
    model = make_model(family)
    expected = hf_greedy(model, prompt, max_new_tokens + 8)
    reference = prompt + expected
    engine = make_engine(model, [adversarial_drafter(kind, reference, seed)], max_draft_nodes=max_draft_nodes)
    result = engine.generate(prompt, max_new_tokens)
    assert result.tokens == expected[:max_new_tokens]
    assert result.tokens == _ar(model, prompt, max_new_tokens).tokens
    assert sum(s.new_tokens for s in result.steps) == max_new_tokens == len(result.tokens)
    assert all(s.tree_size <= max_draft_nodes + 1 for s in result.steps)


# Forward-cost curves the budget policy is tested under: free verification (GPU-like), fp32 on AVX2 (a 16-node
# tree costs ~2.5 steps; the default of these tests, see conftest.py), and verification so expensive that a node
# must be likely to pay for half a step.
COSTS = {
    "free": ForwardCost.linear(0.0),
    "avx2_fp32": AVX2_FP32_COST,
    "steep": ForwardCost.linear(0.5),
}


@settings(max_examples=10, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20),
    kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=3),
    cost=st.sampled_from(sorted(COSTS)),
    seed=st.integers(0, 10**6),
    max_new_tokens=st.integers(1, 20),
)
def test_budget_policy_keeps_exactness_under_adversarial_drafters(family, make_model, hf_greedy, prompt, kinds,
                                                                 cost, seed, max_new_tokens):
    """The policy decides only which nodes are verified: several adversarial drafters at once, one shared
    acceptance tracker across two requests, any cost curve -> the greedy output."""
    model = make_model(family)
    expected = hf_greedy(model, prompt, max_new_tokens + 8)
    reference = prompt + expected
    drafters = [adversarial_drafter(kind, reference, seed + i) for i, kind in enumerate(kinds)]
    stats = AcceptanceStats()
    for _ in range(2):
        engine = make_engine(model, drafters, cost=COSTS[cost], acceptance=stats, max_draft_nodes=24)
        result = engine.generate(prompt, max_new_tokens)
        assert result.tokens == expected[:max_new_tokens]
        assert all(s.tree_size <= 25 and s.tree_size - 1 <= s.proposed_nodes for s in result.steps)


def test_budget_policy_starves_a_useless_drafter(make_model):
    """Random drafts under an expensive verification: after a few failures the steps are one-token forwards."""
    model = make_model("llama")
    prompt = _prompt(5, 8)
    reference = prompt + _ar(model, prompt, 60).tokens
    for cost in ("avx2_fp32", "steep"):
        result = make_engine(model, [adversarial_drafter("random", reference, 1)],
                             cost=COSTS[cost]).generate(prompt, 50)
        assert result.tokens == reference[8:58]
        sizes = [s.tree_size for s in result.steps]
        assert sum(size - 1 for size in sizes) <= 50 and set(sizes[20:]) == {1}, (cost, sizes)
        assert all(s.proposed_nodes > 0 for s in result.steps)        # it kept proposing; the policy said no


def test_budget_policy_widens_with_the_cost_curve(make_model):
    """The same mixed drafters: a free forward verifies more nodes per step than an expensive one, and an oracle
    is trusted deep under either."""
    model = make_model("qwen2")
    prompt = _prompt(11, 10)
    reference = prompt + _ar(model, prompt, 60).tokens
    mean_tree = {}
    for name in ("free", "steep"):
        drafters = [adversarial_drafter("oracle", reference, 0, depth=6), adversarial_drafter("random", reference, 2)]
        result = make_engine(model, drafters, cost=COSTS[name]).generate(prompt, 42)
        assert result.tokens == reference[10:52]
        assert result.n_forwards <= 42 / 3                              # the oracle's chains are verified whole
        mean_tree[name] = sum(s.tree_size for s in result.steps) / result.n_forwards
    assert mean_tree["free"] > mean_tree["steep"] + 1


def test_fixed_policy_fills_the_budget(make_model):
    model = make_model("llama")
    prompt = _prompt(5, 8)
    reference = prompt + _ar(model, prompt, 40).tokens
    result = make_engine(model, [adversarial_drafter("random", reference, 1)], policy="fixed",
                         max_draft_nodes=4).generate(prompt, 20)
    assert result.tokens == reference[8:28]
    assert max(s.tree_size for s in result.steps) == 5 and result.n_forwards >= 19
    with pytest.raises(ValueError, match="policy must be"):
        make_engine(model, [], policy="greedy")


def test_oracle_accepts_whole_path(family, make_model):
    model = make_model(family)
    prompt, depth, max_new = _prompt(4, 10), 4, 21
    reference = prompt + _ar(model, prompt, max_new + depth).tokens
    result = make_engine(model, [adversarial_drafter("oracle", reference, 0, depth)]).generate(prompt, max_new)
    assert result.tokens == reference[len(prompt):len(prompt) + max_new]
    assert result.n_forwards == math.ceil(max_new / (depth + 1))
    assert [s.accepted for s in result.steps] == [depth] * result.n_forwards
    assert [s.new_tokens for s in result.steps[:-1]] == [depth + 1] * (result.n_forwards - 1)
    assert acceptance_rate([result]) == 1.0
    assert mean_accepted_tokens([result]) == max_new / result.n_forwards


def test_random_drafter_accepts_almost_nothing(make_model):
    model = make_model("llama")
    prompt = _prompt(5, 8)
    reference = prompt + _ar(model, prompt, 40).tokens
    result = make_engine(model, [adversarial_drafter("random", reference, 1)]).generate(prompt, 30)
    assert result.tokens == reference[8:38]
    assert acceptance_rate([result]) < 0.05 and result.n_forwards >= 29


def _hf_forward(model, tokens: list[int]):
    """Plain HF forward over ``tokens`` with HF's own masks and a fresh cache: (logits [T, V], cache)."""
    cache = DynamicCache()
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([tokens]), cache=cache, use_cache=True)
    return out.logits[0], cache


def _branchy_tree(reference: list[int], n: int):
    """Root = reference[n-1]; the true path of depth 8 (longer than Gemma's window 6) inserted last, after
    decoys that share its first tokens."""
    rng = random.Random(7)
    true = reference[n:n + 8]
    decoys = [true[:k] + [rng.randrange(VOCAB), rng.randrange(VOCAB)] for k in range(0, 6, 2)]
    return build_tree(reference[n - 1], decoys + [true], max_nodes=64)


def test_tree_logits_match_path_forward(family, make_model):
    model = make_model(family)
    prompt = _prompt(6, 12)
    reference = prompt + _ar(model, prompt, 10).tokens
    tree = _branchy_tree(reference, len(prompt))
    kv = KVCache(model)
    kv.prefill(prompt[:-1])
    logits = kv.forward_tree(tree)
    assert logits.shape == (tree.num_nodes, VOCAB) and logits.dtype == torch.float64
    for node in range(tree.num_nodes):
        path_tokens = [tree.tokens[i] for i in tree.path_to(node)]
        expected, _ = _hf_forward(model, prompt[:-1] + path_tokens)
        torch.testing.assert_close(logits[node], expected[-1], rtol=0, atol=1e-10)


def test_commit_equals_fresh_prefill(family, make_model):
    model = make_model(family)
    prompt = _prompt(8, 12)
    reference = prompt + _ar(model, prompt, 10).tokens
    tree = _branchy_tree(reference, len(prompt))
    kv = KVCache(model)
    kv.prefill(prompt[:-1])
    kv.forward_tree(tree)
    deep = max(range(tree.num_nodes), key=lambda i: (tree.depths[i], i))
    path = tree.path_to(deep)
    assert path != list(range(len(path)))                # exercises the gather, not just a crop
    kv.commit(path)
    assert kv.length == len(prompt) - 1 + len(path) == kv.cache.get_seq_length()
    _, fresh = _hf_forward(model, prompt[:-1] + [tree.tokens[i] for i in path])
    assert len(kv.cache.layers) == len(fresh.layers)
    for ours, theirs in zip(kv.cache.layers, fresh.layers):
        torch.testing.assert_close(ours.keys, theirs.keys, rtol=0, atol=1e-10)
        torch.testing.assert_close(ours.values, theirs.values, rtol=0, atol=1e-10)


def test_tie_margin_forces_one_token_forwards(make_model):
    """With an infinite tie margin every drafted step stops at the root; output stays exact."""
    model = make_model("qwen3")
    prompt = _prompt(9, 6)
    reference = prompt + _ar(model, prompt, 20).tokens
    drafter = adversarial_drafter("oracle", reference, 0)
    result = make_engine(model, [drafter], tie_margin=math.inf).generate(prompt, 10)
    assert result.tokens == reference[6:16]
    drafted = [s for s in result.steps if s.tree_size > 1]
    assert drafted and all(s.tie_stop and s.new_tokens == 0 for s in drafted)
    assert all(s.tree_size == 1 and s.new_tokens == 1 for s in result.steps if s not in drafted)
    assert result.n_forwards == 10 + len(drafted)   # each drafted step costs one forward and commits nothing
    # ...which the realized-speed estimate notices: the policy stops drafting before the end (was: every other step)
    assert len(drafted) < 10


def test_stops_like_greedy(make_model):
    model = make_model("qwen2")
    prompt = _prompt(10, 6)
    reference = prompt + _ar(model, prompt, 30).tokens
    drafter = adversarial_drafter("oracle", reference, 0, depth=8)
    generated = reference[6:]
    eos = generated[9]
    first_eos = generated.index(eos)
    by_eos = make_engine(model, [drafter], eos_token_ids=[eos]).generate(prompt, 30)
    assert by_eos.tokens == generated[:first_eos + 1] and by_eos.stop_reason == "eos"
    by_stop = make_engine(model, [drafter]).generate(prompt, 30, stop=lambda g: len(g) == 7)
    assert by_stop.tokens == generated[:7] and by_stop.stop_reason == "stop"
    by_max = make_engine(model, [drafter]).generate(prompt, 3)
    assert by_max.tokens == generated[:3] and by_max.stop_reason == "max_new_tokens"


def test_faulty_drafters_cannot_change_or_stop_output(make_model):
    """Out-of-vocab ids and exceptions cost only those drafts: output equals plain greedy, faults are counted."""
    model = make_model("llama")
    expected = _ar(model, [1, 2, 3], 6).tokens

    def boom(ctx):
        raise RuntimeError("sidecar died")

    engine = make_engine(model, [FnDrafter("bad", lambda ctx: [[1, VOCAB], [2]]), FnDrafter("boom", boom)])
    with pytest.warns(UserWarning, match=r"drafter 'bad' proposed token ids outside \[0, 300\)"):
        result = engine.generate([1, 2, 3], 6)
    assert result.tokens == expected
    assert engine.drafter_faults["bad"] == result.n_forwards and engine.drafter_faults["boom"] == result.n_forwards


def test_pld_union_and_float32_exact(family, make_model, hf_greedy):
    """fp32: PLD + a branching drafter, merged, give exactly the greedy output."""
    model = make_model(family, torch.float32)
    for seed in range(3):
        prompt = _prompt(20 + seed, 15) * 2               # repetition so PLD has something to find
        expected = hf_greedy(model, prompt, 40)
        assert _ar(model, prompt, 32).tokens == expected[:32]
        reference = prompt + expected
        engine = make_engine(model, [build_engine("pld", model).drafters[0],
                                     adversarial_drafter("branches", reference, seed)])
        result = engine.generate(prompt, 32)
        assert result.tokens == expected[:32]
        assert result.n_forwards < 32


class RoundingLikeLlama(LlamaForCausalLM):
    """A Llama whose multi-token forwards are off by up to ``amp`` per logit, as a bf16 tree forward can be off
    from a one-token forward (a fixed pseudo-random pattern, so every run is the same on every machine)."""

    amp = 0.01

    def forward(self, input_ids=None, **kwargs):
        out = super().forward(input_ids=input_ids, **kwargs)
        if input_ids.shape[1] > 1:
            q, v = out.logits.shape[1:]
            out.logits = out.logits + self.amp * torch.sin(torch.arange(q * v, dtype=out.logits.dtype) * 12.9898
                                                           ).reshape(q, v)
        return out


def test_rounding_mismatches_are_near_ties_and_the_tie_guard_removes_them():
    """Without the tie guard, a low-precision tree forward may flip the argmax where the top-2 margin is within
    its error: such divergences happen here (this model is built to produce them) and every one is classified a
    near-tie. With ``tie_margin`` covering the error the output equals plain greedy decoding again."""
    torch.manual_seed(0)
    model = RoundingLikeLlama(LlamaConfig(**_COMMON)).eval()
    tol = 2 * model.amp                                  # two logits each off by <= amp: a flip needs margin < tol
    kinds = []
    for seed in range(6):
        prompt = _prompt(30 + seed, 12) * 2
        ar = _ar(model, prompt, 24, record_margins=True)
        assert len(ar.margins) == 24
        unguarded = build_engine("pld", model, tie_margin=0.0).generate(prompt, 24)
        mismatch = classify_mismatch(ar.tokens, unguarded.tokens, ar.margins, tol=tol)
        if mismatch is not None:
            kinds.append(mismatch["kind"])
        assert build_engine("pld", model, tie_margin=tol).generate(prompt, 24).tokens == ar.tokens
    assert kinds and set(kinds) == {"near_tie"}, kinds


def test_prefill_runs_the_decoder_without_the_head(family, make_model):
    model = make_model(family)
    prompt = _prompt(9, 12)
    calls = []
    hook = model.get_output_embeddings().register_forward_hook(lambda *a: calls.append(1))
    try:
        kv = KVCache(model)
        assert kv.decoder is model.base_model and kv.decoder is not model
        kv.prefill(prompt[:-1])
        assert calls == []                                   # the head never ran
        fallback = KVCache(model)
        fallback.decoder = None                              # a model without a separate decoder: one row of logits
        fallback.prefill(prompt[:-1])
        assert calls == [1]
    finally:
        hook.remove()
    for ours, theirs in zip(kv.cache.layers, fallback.cache.layers):
        torch.testing.assert_close(ours.keys, theirs.keys, rtol=0, atol=0)
        torch.testing.assert_close(ours.values, theirs.values, rtol=0, atol=0)
