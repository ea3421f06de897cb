"""Sessions on the llama.cpp backend: KV snapshots, parked caches and the session store, against llama.cpp's own
greedy decoding (tiny random GGUFs built in code, :mod:`tests.runtime.tiny_gguf`)."""

from __future__ import annotations

import os
import random

import pytest
import torch

if os.environ.get("CI"):
    import llama_cpp  # noqa: F401 - CI must have the backend
else:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (python -m ooospec.llamacpp_install)")

from ooospec.runtime.agent.session import PrefixCache, SessionStore
from ooospec.runtime.backends.llamacpp import LlamaCppTarget, greedy_reference
from ooospec.runtime.decoding import build_engine
from ooospec.runtime.tree import chain_tree
from tests.runtime.tiny_gguf import make_tiny_gguf

VOCAB = 300


@pytest.fixture(scope="module")
def gguf(tmp_path_factory) -> str:
    return str(make_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", vocab=VOCAB, head_scale=8.0))


@pytest.fixture(scope="module")
def target(gguf):
    t = LlamaCppTarget(gguf, threads=2, n_ctx=1024, max_leaves=32)
    yield t
    t.close()


@pytest.fixture(scope="module")
def reference_target(gguf):
    """A second context on the same file: the references never touch the caches under test."""
    t = LlamaCppTarget(gguf, threads=2, n_ctx=1024, max_leaves=32)
    yield t
    t.close()


def _ids(seed: int, n: int) -> list[int]:
    return random.Random(seed).choices(range(3, VOCAB), k=n)


def _next_logits(kv, token: int) -> torch.Tensor:
    logits = kv.forward_tree(chain_tree([token]))[0].clone()
    kv.commit([])
    return logits


def _fresh_logits(target, tokens: list[int], token: int) -> torch.Tensor:
    kv = target.new_kv_cache()
    kv.reset()
    kv.prefill(tokens)
    return _next_logits(kv, token)


def test_snapshot_and_load_continue_like_a_fresh_prefill(target):
    prompt = _ids(1, 40)
    kv = target.new_kv_cache()
    kv.reset()
    kv.prefill(prompt)
    kv.forward_tree(chain_tree([5, 6, 7]))     # a tree's cells, then a commit: the holes a session leaves
    kv.commit([0, 1])
    whole, prefix = kv.snapshot(), kv.snapshot(25)
    assert whole.tokens == tuple(prompt + [5, 6]) and prefix.tokens == tuple(prompt[:25])
    assert 0 < prefix.nbytes < whole.nbytes    # the prefix alone, through the spare sequence
    for snap, n in [(whole, None), (prefix, None), (whole, 10)]:
        other = target.new_kv_cache()
        other.load(snap, n)
        kept = list(snap.tokens[:n])
        assert other.tokens == kept and other.length == len(kept)
        assert torch.allclose(_next_logits(other, 9), _fresh_logits(target, kept, 9), atol=1e-4)
    with pytest.raises(ValueError, match="cannot snapshot"):
        kv.snapshot(100)


def test_a_persistent_cache_is_parked_while_another_runs(target):
    a, b = target.new_kv_cache(persistent=True), target.new_kv_cache(persistent=True)
    plain = target.new_kv_cache()
    a.reset()
    a.prefill(_ids(2, 30))
    b.reset()
    b.prefill(_ids(3, 20))                     # takes the context: a is parked
    assert a.keep_prefix_of(_ids(2, 30) + [4]) == 30     # a's cells came back
    assert torch.allclose(_next_logits(a, 9), _fresh_logits(target, _ids(2, 30), 9), atol=1e-4)
    assert b.snapshot().tokens == tuple(_ids(3, 20))    # parked by the fresh prefill: copied without the context
    plain.reset()
    plain.prefill(_ids(4, 10))
    assert plain.keep_prefix_of(_ids(4, 10)) == 10
    b.reset()                                  # b starts empty; plain (not persistent) lost its cells
    assert plain.keep_prefix_of(_ids(4, 10)) == 0


def test_session_store_turns_equal_llama_cpp_greedy(target, reference_target):
    """Two conversations that share a system block, interleaved, each continued a turn later: every turn is
    llama.cpp's greedy decoding, and every continued turn reuses its conversation's KV."""
    store = SessionStore(target, max_sessions=4, prefix_cache=PrefixCache(max_bytes=64 << 20))
    engine = build_engine("pld", target)
    shared = _ids(10, 24)
    convs = {"a": shared + _ids(11, 12), "b": shared + _ids(12, 9)}
    origins = []
    for step in range(2):
        for name in ("a", "b"):
            prompt = convs[name]
            session, origin = store.session_for(prompt, shared_len=len(shared))
            out = session.generate(engine, prompt, 12)
            store.remember_prefix(session, len(shared))
            ref, _, _ = greedy_reference(reference_target, prompt, 12, eos_token_ids=[])
            assert out.tokens == ref, (name, step)
            origins.append((origin, out.num_cached))
            convs[name] = prompt + out.tokens + _ids(20 + step, 5)
    assert origins[0] == ("new", 0)
    assert origins[1][0] in ("prefix", "fork") and origins[1][1] >= len(shared)
    for origin, cached in origins[2:]:         # each conversation's second turn: its own KV, parked meanwhile
        assert origin == "session" and cached > len(shared) + 12
