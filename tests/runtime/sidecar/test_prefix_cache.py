"""The sidecar's block KV cache: a later wave starts from the longest block prefix an earlier one computed
(a tools-first toolbox), prefills only the rest, and answers exactly as without the cache (tiny float64 models)."""

from __future__ import annotations

import os
import random

import pytest
import torch

from ooospec.runtime.agent.session import PrefixCache
from ooospec.runtime.backends.kv_cache import KVCache
from ooospec.runtime.formats import hermes
from ooospec.runtime.serve.sidecar_app import complete, create_app
from ooospec.runtime.sidecar import prompts as sp
from ooospec.runtime.sidecar.client import SidecarClient
from ooospec.runtime.sidecar.deployments import DEPLOYMENTS
from ooospec.runtime.sidecar.gate import WaveGate
from ooospec.runtime.sidecar.gate_pricing import Option, wave_compute_s
from ooospec.runtime.sidecar.wave import Sidecar, decode_branches, measure_wave_cost
from tests.pipelines.sidecar_tiny import byte_tokenizer
from tests.runtime.conftest import SLIDING_WINDOW, VOCAB, tiny_model
from tests.runtime.serve.test_sidecar_app import LIMITS, RECORDS, get
from tests.runtime.sidecar_servers import running_app


def _snap(model, tokens):
    kv = KVCache(model)
    kv.prefill(tokens)
    return kv.snapshot()


def test_lookup_shared_returns_the_longest_common_prefix(make_model):
    model = make_model("llama")
    cache = PrefixCache(max_tokens=100)
    cache.insert(_snap(model, [1, 2, 3, 4]))
    cache.insert(_snap(model, [1, 2, 5]))
    snap, n = cache.lookup_shared([1, 2, 3, 9, 9])
    assert (snap.tokens, n) == ((1, 2, 3, 4), 3)
    snap, n = cache.lookup_shared([1, 2, 5, 6])
    assert (snap.tokens, n) == ((1, 2, 5), 3)
    assert cache.lookup_shared([7, 1, 2]) is None
    assert cache.lookup_shared([1, 2, 3], min_tokens=4) is None
    assert (cache.stats.hits, cache.stats.misses, cache.stats.hit_tokens) == (2, 2, 6)


def test_load_keeps_the_first_entries_of_a_snapshot(make_model):
    model = make_model("llama")
    snap = _snap(model, [5, 6, 7, 8])
    kv = KVCache(model)
    kv.load(snap, 2)
    assert kv.tokens == [5, 6] and kv.length == 2
    ref = _snap(model, [5, 6])
    for (k, v), (rk, rv) in zip(kv.snapshot().layers, ref.layers):
        assert torch.allclose(k, rk, rtol=0, atol=1e-12) and torch.allclose(v, rv, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="cannot load 5"):
        kv.load(snap, 5)


@pytest.mark.parametrize("seed", [0, 1])
def test_waves_sharing_a_toolbox_reuse_its_kv_and_answer_the_same(make_model, family, seed):
    model = make_model(family)
    rng = random.Random(seed)
    toolbox = [rng.randrange(VOCAB) for _ in range(SLIDING_WINDOW + 3)]
    queries = [[rng.randrange(VOCAB) for _ in range(rng.randint(1, 3))] for _ in range(4)]
    eos = {rng.randrange(VOCAB) for _ in range(30)}
    cache = PrefixCache(max_tokens=1000)
    for turn in range(3):
        block = toolbox + [rng.randrange(VOCAB) for _ in range(5 + turn)]
        cold, cold_stats = decode_branches(model, block, queries, max_new_tokens=7, eos_token_ids=eos)
        warm, warm_stats = decode_branches(model, block, queries, max_new_tokens=7, eos_token_ids=eos,
                                           prefix_cache=cache)
        assert warm == cold
        assert cold_stats["cached_tokens"] == 0
        # the first wave finds nothing; later ones at least the toolbox (and by chance a little more)
        assert warm_stats["cached_tokens"] == 0 if turn == 0 else warm_stats["cached_tokens"] >= len(toolbox)
    assert len(cache) == 3


def test_the_server_reports_cached_tokens_and_health_shows_the_cache():
    model, tok = tiny_model("llama"), byte_tokenizer()
    plain = Sidecar(model, tok, metadata={"layout_version": 3})
    cached = Sidecar(model, tok, metadata={"layout_version": 3}, prefix_cache=PrefixCache(max_tokens=20000))
    tools = RECORDS[0]["tools"][:2]
    toolbox = sp.shared_block([], tools, layout=3).split("Conversation:")[0]
    for i, rec in enumerate(RECORDS[:3]):
        prompts = sp.build_wave(rec["messages"], tools, layout=3).prompts()
        a = complete(plain, prompts, max_tokens=6, add_special_tokens=False, limits=LIMITS)
        b = complete(cached, prompts, max_tokens=6, add_special_tokens=False, limits=LIMITS)
        assert [c["text"] for c in b["choices"]] == [c["text"] for c in a["choices"]]
        assert a["ooospec"]["cached_tokens"] == 0
        if i:
            assert b["ooospec"]["cached_tokens"] >= len(tok(toolbox, add_special_tokens=False)["input_ids"])
        if i == 1:   # record 1's conversation is the start of record 0's: its whole block was computed already
            assert b["ooospec"]["cached_tokens"] == b["ooospec"]["block_tokens"] - 1
    with running_app(create_app(cached, limits=LIMITS)) as url:
        status, health = get(url, "/health")
        # two entries: record 1's block is a prefix of record 0's, nothing new to store
        assert status == 200 and health["prefix_cache"]["entries"] == 2 and health["prefix_cache"]["hits"] == 2
    with running_app(create_app(plain, limits=LIMITS)) as url:
        assert get(url, "/health")[1]["prefix_cache"] is None


def test_reset_prefix_cache_makes_the_next_wave_cold_and_keeps_answers():
    from ooospec.runtime.sidecar.process import reset_prefix_cache

    model, tok = tiny_model("llama"), byte_tokenizer()
    cached = Sidecar(model, tok, metadata={"layout_version": 3}, prefix_cache=PrefixCache(max_tokens=20000))
    prompts = sp.build_wave(RECORDS[0]["messages"], RECORDS[0]["tools"][:2], layout=3).prompts()
    first = complete(cached, prompts, max_tokens=6, add_special_tokens=False, limits=LIMITS)
    again = complete(cached, prompts, max_tokens=6, add_special_tokens=False, limits=LIMITS)
    assert again["ooospec"]["cached_tokens"] > 0
    with running_app(create_app(cached, limits=LIMITS)) as url:
        assert reset_prefix_cache(url)
        assert get(url, "/health")[1]["prefix_cache"]["entries"] == 0
    cold = complete(cached, prompts, max_tokens=6, add_special_tokens=False, limits=LIMITS)
    assert cold["ooospec"]["cached_tokens"] == 0
    assert [c["text"] for c in cold["choices"]] == [c["text"] for c in first["choices"]]
    assert not reset_prefix_cache("http://127.0.0.1:9")     # nobody there: False, logged


def test_a_prefill_makes_the_next_wave_start_from_the_toolbox():
    model, tok = tiny_model("llama"), byte_tokenizer()
    sidecar = Sidecar(model, tok, metadata={"layout_version": 3}, prefix_cache=PrefixCache(max_tokens=20000))
    rec = RECORDS[1]
    toolbox = sp.shared_block([], rec["tools"], layout=3)
    block = sp.shared_block(rec["messages"], rec["tools"], layout=3)
    gate = WaveGate(DEPLOYMENTS["split"].prior)
    with running_app(create_app(sidecar, limits=LIMITS)) as url:
        client = SidecarClient(url, max_tokens=6, gate=gate)
        assert client.prefill([], rec["tools"], wait=True) is True
        assert client.server_layout() == 3 and client.server_prefix_cache and gate.server_prefix_cache
        # the gate expects what the toolbox's block shares with the request's block to be cached
        assert gate.cached_chars(block) == len(os.path.commonprefix([toolbox, block])) > len(toolbox) // 2
        req = SidecarClient(url, max_tokens=6).submit(rec["messages"], rec["tools"], fmt=hermes, tokenizer=tok)
        req.wait(60)
    server = req.stats().server
    shared = len(tok(os.path.commonprefix([toolbox, block]), add_special_tokens=False)["input_ids"])
    assert server["block_tokens"] > server["cached_tokens"] >= shared - 1     # BPE may merge across the cut


def test_the_gate_prices_only_the_uncached_part_of_a_block():
    est = DEPLOYMENTS["shared"].prior
    q = sp.build_wave([{"role": "user", "content": "hi"}], RECORDS[0]["tools"][:1]).queries[:1]
    cold = wave_compute_s(Option("index", q, 2000), est)
    warm = wave_compute_s(Option("index", q, 2000, cached_chars=1500), est)
    assert cold - warm == pytest.approx(est.prefill_per_token * 1500 / est.chars_per_token)
    gate = WaveGate(est)
    gate.remember("Tools:\n[0] f\nConversation:\nuser: a\n")
    assert gate.cached_chars("Tools:\n[0] f\nConversation:\nuser: b\n") == 0      # the server keeps no cache
    gate.server_prefix_cache = True
    assert gate.cached_chars("Tools:\n[0] f\nConversation:\nuser: b\n") == len("Tools:\n[0] f\nConversation:\nuser: ")


def test_the_server_measures_its_wave_cost_and_the_gate_prices_waves_with_it():
    model, tok = tiny_model("llama"), byte_tokenizer()
    sidecar = Sidecar(model, tok, metadata={"layout_version": 3})
    cal = measure_wave_cost(model, vocab_size=model.config.vocab_size, max_draft_nodes=sidecar.max_draft_nodes,
                            block_tokens=64, num_queries=3)
    assert cal["prefill_per_token"] > 0 and cal["decode_forward_s"] > 0 and 1 <= cal["n_forwards"] <= 4
    assert cal["num_queries"] == 3 and cal["block_tokens"] == 64
    sidecar.calibration = cal
    gate = WaveGate(DEPLOYMENTS["shared"].prior)
    with running_app(create_app(sidecar, limits=LIMITS)) as url:
        assert get(url, "/health")[1]["calibration"] == cal
        client = SidecarClient(url, max_tokens=6, gate=gate)
        assert client.server_layout() == 3
    p = gate.prior
    assert gate.calibration is not None and p.prefill_per_token == cal["prefill_per_token"]
    assert p.decode_forward + 3 * p.decode_per_query == pytest.approx(cal["decode_forward_s"])
    assert p.interference == DEPLOYMENTS["shared"].prior.interference        # only the sidecar's compute is measured
    assert gate.fresh().prior == p and gate.summary()["calibration"]["num_queries"] == 3
    with running_app(create_app(Sidecar(model, tok, metadata={"layout_version": 3}), limits=LIMITS)) as url:
        assert get(url, "/health")[1]["calibration"] is None       # not calibrated: clients keep their prior
        other = WaveGate(DEPLOYMENTS["shared"].prior)
        SidecarClient(url, gate=other).server_layout()
    assert other.prior == DEPLOYMENTS["shared"].prior and other.calibration is None
