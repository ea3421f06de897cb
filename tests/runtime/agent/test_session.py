"""KV sessions and the prefix cache: every turn equals a fresh full-prefill greedy decode (tiny models, fp64)."""

from __future__ import annotations

import random

import pytest
import torch

from ooospec.runtime.agent.chat import ChatModel
from ooospec.runtime.agent.session import PrefixCache, Session, SessionStore
from ooospec.runtime.backends.kv_cache import KVCache
from ooospec.runtime.decoding import build_engine
from tests.runtime.chat_tiny import AFTER_TOOL, TOOLS, USER, trained_chat_model

VOCAB = 300


def _ids(seed: int, n: int) -> list[int]:
    return random.Random(seed).choices(range(VOCAB), k=n)


def _layers(kv: KVCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in kv.cache.layers]


def test_truncate_keep_prefix_and_snapshot(make_model):
    model = make_model("llama")
    a, b = _ids(0, 12), _ids(1, 5)
    kv = KVCache(model)
    kv.prefill(a + b)
    assert kv.tokens == a + b and kv.length == 17
    assert kv.keep_prefix_of(a + [b[0] + 1]) == 12 and kv.length == 12 and kv.tokens == a
    fresh = KVCache(model)
    fresh.prefill(a)
    for (k1, v1), (k2, v2) in zip(_layers(kv), _layers(fresh)):
        torch.testing.assert_close(k1, k2)
        torch.testing.assert_close(v1, v2)
    snap = kv.snapshot(7)
    other = KVCache(model)
    other.load(snap)
    assert other.tokens == a[:7] and other.length == 7 and snap.nbytes == other.nbytes > 0
    other.prefill(a[7:])                         # continuing from a snapshot == prefilling everything
    for (k1, _), (k2, _) in zip(_layers(other), _layers(fresh)):
        torch.testing.assert_close(k1, k2)
    with pytest.raises(ValueError, match="cannot truncate"):
        kv.truncate(13)


@pytest.mark.parametrize("method", ["ar", "pld"])
def test_session_turns_equal_fresh_full_prefill(family, make_model, hf_greedy, method):
    """Agent-shaped turns: each prompt = last prompt + output + new tokens; one turn re-renders an earlier token
    (the fallback). Every turn's output equals a fresh engine's and HF generate's on the whole prompt."""
    model = make_model(family)
    engine = build_engine(method, model)
    session = Session(model)
    prompt = _ids(10, 9)
    rerendered_turn = 3
    for turn in range(5):
        cached_before = session.kv.length
        result = session.generate(engine, prompt, 6)
        fresh = build_engine(method, model).generate(prompt, 6)
        assert result.tokens == fresh.tokens == hf_greedy(model, prompt, 6), f"turn {turn}"
        assert session.kv.tokens == prompt + result.tokens[:-1]        # ready for the next turn
        assert result.num_cached == (4 if turn == rerendered_turn else cached_before)
        prompt = prompt + result.tokens + _ids(20 + turn, 4)           # tool result + generation prompt
        if turn + 1 == rerendered_turn:
            prompt[4] = (prompt[4] + 1) % VOCAB                        # the template rendered a token differently
    assert session.stats.turns == 5 and session.stats.rerenders == 1
    assert session.stats.cached_tokens + session.stats.prefilled_tokens + 5 == session.stats.prompt_tokens


def test_prefix_cache_lru_budget_and_counts(make_model):
    model = make_model("qwen2")
    kv = KVCache(model)
    kv.prefill(_ids(0, 30))
    per_token = kv.nbytes // 30
    cache = PrefixCache(max_tokens=25)
    s10, s12 = kv.snapshot(10), kv.snapshot(12)
    assert cache.insert(s10) and cache.insert(s12)
    assert cache.lookup(kv.tokens) is s12                      # the longest stored prefix
    assert cache.lookup(kv.tokens[:11] + [1]) is s10
    assert cache.lookup([7, 7, 7]) is None
    assert cache.insert(kv.snapshot(5))                        # 27 > 25 tokens: the least recently used goes
    assert s10.tokens in cache and s12.tokens not in cache     # (s10 was looked up last)
    assert not cache.insert(kv.snapshot(26))                   # larger than the whole budget
    assert cache.to_dict() == {"hits": 2, "misses": 1, "inserts": 3, "evictions": 1, "refused": 1,
                               "hit_tokens": 22, "entries": 2, "tokens": 15, "bytes": 15 * per_token}
    by_bytes = PrefixCache(max_bytes=11 * per_token)
    assert by_bytes.insert(s10) and not by_bytes.insert(s12)


def test_store_matches_conversations_and_seeds_new_ones_from_the_prefix_cache(make_model):
    model = make_model("llama")
    engine = build_engine("ar", model)
    store = SessionStore(model, max_sessions=2, prefix_cache=PrefixCache())
    system = _ids(0, 8)                                      # the shared system + tools block
    conv_a, conv_b, conv_c = (system + _ids(s, 5) for s in (1, 2, 3))
    s_a, origin = store.session_for(conv_a, shared_len=8)
    assert origin == "new"
    out_a = s_a.generate(engine, conv_a, 4)
    store.remember_prefix(s_a, 8)
    s_b, origin = store.session_for(conv_b, shared_len=8)   # shares only the block with a: a new session
    assert origin == "prefix" and s_b is not s_a
    out_b = s_b.generate(engine, conv_b, 4)
    assert out_b.num_cached == 8 and out_b.tokens == build_engine("ar", model).generate(conv_b, 4).tokens
    next_a = conv_a + out_a.tokens + _ids(9, 3)
    assert store.session_for(next_a, shared_len=8) == (s_a, "session")
    store.session_for(conv_c, shared_len=8)                  # a third conversation: b (least recent) is dropped
    assert len(store) == 2 and store.stats()["evicted"] == 1
    assert store.stats()["turns"] == 2 and store.stats()["prefix_cache"]["hits"] == 2
    # a tool search added a tool: the block changed after 5 tokens; the new session copies those from a
    grown = system[:5] + _ids(4, 6) + conv_a[8:] + out_a.tokens
    s_d, origin = store.session_for(grown, shared_len=11)
    assert origin == "fork" and s_d is not s_a and s_a.kv.length == len(conv_a) + 3
    assert s_d.generate(engine, grown, 4).num_cached == 5


def test_chat_sessions_equal_stateless_on_a_tool_conversation():
    """The chat layer with sessions vs without, over a real template: same text every turn; the second turn
    reuses the first turn's KV; a new conversation with the same tools starts from the prefix cache."""
    model, tok = trained_chat_model()
    stateless = ChatModel(model, tok, method="toolspec")
    chat = ChatModel(model, tok, method="toolspec", sessions=SessionStore(model, prefix_cache=PrefixCache()))
    first = chat.complete(USER, TOOLS, max_new_tokens=40)
    assert first.calls == [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    assert first.text == stateless.complete(USER, TOOLS, max_new_tokens=40).text
    assert first.origin == "new" and first.cached_tokens == 0
    second = chat.complete(AFTER_TOOL, TOOLS, max_new_tokens=40)
    assert second.text == stateless.complete(AFTER_TOOL, TOOLS, max_new_tokens=40).text == "It is 21 C in Paris."
    # The toy template renders a call as "<|im_start|>assistant<tool_call>..." (no newline after the role, unlike
    # the generation prompt), so turn 2 re-renders turn 1's last prompt token: the session keeps the rest of the
    # prompt, drops the output (a counted rerender) and prefills from there.
    assert second.origin == "session" and second.cached_tokens == first.prompt_tokens - 1
    stats = chat.sessions.stats()
    assert stats["rerenders"] == 1 and stats["dropped_tokens"] == first.completion_tokens
    other = chat.complete([{"role": "user", "content": "Weather in Rome?"}], TOOLS, max_new_tokens=8)
    assert other.origin == "prefix" and 0 < other.cached_tokens < other.prompt_tokens
    assert other.text == stateless.complete([{"role": "user", "content": "Weather in Rome?"}], TOOLS,
                                            max_new_tokens=8).text
