"""ooo-spec inside vLLM, without vLLM: the chain choice (pure), the proposer's request life cycle, and exactness of
greedy chain verification (what vLLM's rejection sampler does at temperature 0) driven by the proposer on tiny
models with adversarial hints."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch

from ooospec.runtime.budget import AcceptanceStats, Proposal
from ooospec.runtime.drafters.base import Drafter
from ooospec.runtime.formats import hermes
from ooospec.runtime.tree import build_tree
from ooospec.runtime.vllm import plugin
from ooospec.runtime.vllm.chain import (
    ChainCost,
    accepted_of,
    best_chain,
    chain_outcomes,
    choose_chain,
    label_outcomes,
    record_chain,
)
from ooospec.runtime.vllm.proposer import ChainProposer, OoOSpecProposer, ProposerConfig
from tests.runtime.chat_tiny import CALL_TEXT, TOOLS, USER, trained_chat_model
from tests.runtime.conftest import VOCAB, tiny_model

# ------------------------------------------------------------------------------------------ the chain (pure)


def test_best_chain_follows_the_docstring_example():
    tree = build_tree(9, [[7, 3, 5], [4]], 8)
    probs = [1.0, 0.8, 0.72, 0.5, 0.3]
    assert best_chain(tree, probs, ChainCost(0.0), 16) == (7, 3, 5)
    assert best_chain(tree, probs, ChainCost(0.5), 16) == (7, 3)
    assert best_chain(tree, probs, ChainCost(0.0), 2) == (7, 3)          # never longer than max_len
    assert best_chain(tree, [1.0, 0.0, 0.0, 0.0, 0.0], ChainCost(0.0), 16) == ()   # nothing expected: no draft


def test_best_chain_takes_the_more_probable_branch():
    tree = build_tree(9, [[7, 3], [5, 6, 8]], 8)      # nodes: 7, 3, 5, 6, 8
    assert best_chain(tree, [1.0, 0.2, 0.1, 0.9, 0.8, 0.7], ChainCost(0.0), 16) == (5, 6, 8)
    assert best_chain(tree, [1.0, 0.9, 0.9, 0.5, 0.1, 0.05], ChainCost(0.0), 16) == (7, 3)


def test_choose_chain_uses_the_acceptance_estimates():
    stats = AcceptanceStats()
    good, bad = Proposal("good", 0, (1, 2, 3)), Proposal("bad", 0, (4, 5, 6))
    for _ in range(50):
        stats.record("good", 0, 3, 3)
        stats.record("bad", 0, 1, 0)
    assert choose_chain(0, [bad, good], stats, ChainCost(0.0), 16) == (1, 2, 3)
    assert choose_chain(0, [], stats, ChainCost(0.0), 16) == ()
    assert choose_chain(0, [good], stats, ChainCost(0.0), 0) == ()


def test_accepted_of_reads_vllms_sampled_tokens():
    assert accepted_of((7, 3, 5), [7, 3, 5, 11]) == 3          # all accepted + the bonus
    assert accepted_of((7, 3, 5), [7, 4]) == 1                 # one accepted, then the target's own token
    assert accepted_of((7, 3, 5), [9]) == 0
    assert accepted_of((), [9]) == 0


def test_chain_outcomes_count_only_judged_positions():
    chain = (7, 3, 5)
    out = {p.tokens: (t, a) for p, t, a in chain_outcomes(chain, [Proposal("a", 0, (7, 3, 5)),
                                                                  Proposal("b", 0, (7, 4)),
                                                                  Proposal("c", 0, (8,))], 2)}
    assert out == {(7, 3, 5): (3, 2), (7, 4): (1, 1)}
    stats = AcceptanceStats()
    record_chain(stats, chain, [Proposal("a", 0, (7, 3, 5))], 2)
    assert stats.summary()["a"]["trials"] == 3 and stats.summary()["a"]["accepted"] == 2


def test_label_outcomes_follow_the_docstring_example():
    proposals = [Proposal("fsm", 0, (7, 3, 5)), Proposal("pld", 0, (7, 4)), Proposal("pld", 1, (8,))]
    assert label_outcomes((7, 3, 5), proposals, 2) == {"fsm": (3, 2), "pld": (1, 1)}
    assert label_outcomes((), proposals, 0) == {}


def test_chain_cost_rejects_a_negative_slope():
    assert ChainCost(0.05).seconds(17) == pytest.approx(1.8)
    with pytest.raises(ValueError):
        ChainCost(-0.1)


# ------------------------------------------------------------------------------------------ config and inputs


def test_config_names_unknown_keys_and_methods():
    assert ProposerConfig.from_mapping({"method": "ooospec"}).method == "ooospec"
    with pytest.raises(ValueError, match="unknown ooospec option"):
        ProposerConfig.from_mapping({"methd": "ooospec"})
    with pytest.raises(ValueError, match="does not run in vLLM"):
        ProposerConfig(method="ar")


def test_config_checks_the_log_interval():
    assert ProposerConfig().log_interval_s == 30.0
    assert ProposerConfig.from_mapping({"log_interval_s": 0}).log_interval_s == 0
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="log_interval_s"):
            ProposerConfig(log_interval_s=bad)


def test_the_proposer_refuses_to_start_without_its_plugin(monkeypatch):
    monkeypatch.setitem(plugin._state, "runner", False)
    with pytest.raises(RuntimeError, match="plugin is not active"):
        OoOSpecProposer(object())


# ------------------------------------------------------------------------------------------ exactness


def greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def chain_decode(model, prompt: list[int], n: int, proposer: ChainProposer, req_id: str,
                 extra: dict | None = None, draft=lambda step: True) -> tuple[list[int], int]:
    """Greedy decoding with one draft chain per step, verified as vLLM does at temperature 0: drafts are kept while
    they equal the target's argmax, then the target's own token; ``draft(step)`` False: the draft switch withholds
    that step's chain. Returns (output, forwards)."""
    proposer.start(req_id, len(prompt), extra)
    tokens = list(prompt)
    with torch.no_grad():
        tokens.append(int(model(torch.tensor([tokens])).logits[0, -1].argmax()))     # the prefill's token
        sampled, forwards = [tokens[-1]], 1
        while len(tokens) - len(prompt) < n:
            chain = proposer.step(req_id, tokens, sampled, room=64, draft=draft(forwards))
            assert len(chain) <= proposer.max_len and (draft(forwards) or chain == [])
            logits = model(torch.tensor([tokens + chain])).logits[0, len(tokens) - 1:]
            accepted = []
            for j, d in enumerate(chain):
                if int(logits[j].argmax()) != d:
                    break
                accepted.append(d)
            sampled = accepted + [int(logits[len(accepted)].argmax())]
            tokens += sampled
            forwards += 1
    proposer.finish(req_id)
    return tokens[len(prompt):len(prompt) + n], forwards


class _Tok:
    """Enough of a tokenizer for the request-independent drafters (no FSM: no tools)."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % VOCAB for c in text]}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


@pytest.mark.parametrize("hint", ["random", "oracle", "shifted", "none"])
def test_chains_from_any_hint_keep_greedy_output_float64(hint):
    model = tiny_model("qwen2")
    rng = random.Random(7)
    proposer = ChainProposer(_Tok(), vocab_size=VOCAB, max_len=8, fmt=hermes,
                             config=ProposerConfig(method="ooospec", chain_cost_slope=0.0))
    for r in range(3):
        prompt = [rng.randrange(VOCAB) for _ in range(12)] + [5, 6, 7, 5, 6]
        ref = greedy(model, prompt, 24)
        text = {"random": "".join(chr(rng.randrange(32, 120)) for _ in range(40)),
                "oracle": _Tok().decode(ref), "shifted": _Tok().decode(ref[3:]), "none": None}[hint]
        out, forwards = chain_decode(model, prompt, 24, proposer, f"r{r}", {"ooospec_hint": text} if text else None)
        assert out == ref
        if hint == "oracle":
            assert forwards < 12      # the target's own continuation as hints: long chains accepted
    assert not proposer.requests    # finished requests are dropped


def test_toolspec_and_oracle_hints_on_a_real_call_keep_greedy_output():
    model, tok = trained_chat_model()
    prompt = tok(tok.apply_chat_template(USER, tools=TOOLS, add_generation_prompt=True, tokenize=False),
                 add_special_tokens=False)["input_ids"]
    ref = greedy(model, prompt, 30)
    assert tok.decode(ref).startswith(CALL_TEXT)
    runs = {}
    for method, extra in (("toolspec", {"ooospec_tools": json.dumps(TOOLS)}),
                          ("ooospec", {"ooospec_tools": json.dumps(TOOLS), "ooospec_hint": CALL_TEXT}),
                          ("ooospec", {"ooospec_tools": json.dumps(TOOLS), "ooospec_hint": "<tool_call>\n{\"nam"})):
        proposer = ChainProposer(tok, vocab_size=len(tok), max_len=16, config=ProposerConfig(method=method))
        out, forwards = chain_decode(model, prompt, 30, proposer, "a", extra)
        assert out == ref, (method, extra)
        runs[method, extra.get("ooospec_hint")] = (forwards, proposer.totals["accepted"])
    plain_forwards = 30
    assert runs["toolspec", None][0] < plain_forwards            # the FSM's forced pieces were accepted
    assert runs["ooospec", CALL_TEXT][0] < runs["toolspec", None][0]   # the whole call as hints: fewer forwards


def test_a_second_request_learns_from_the_first():
    model, tok = trained_chat_model()
    prompt = tok(tok.apply_chat_template(USER, tools=TOOLS, add_generation_prompt=True, tokenize=False),
                 add_special_tokens=False)["input_ids"]
    proposer = ChainProposer(tok, vocab_size=len(tok), max_len=16, config=ProposerConfig(method="toolspec"))
    _, first = chain_decode(model, prompt, 30, proposer, "a", {"ooospec_tools": json.dumps(TOOLS)})
    _, second = chain_decode(model, prompt, 30, proposer, "b", {"ooospec_tools": json.dumps(TOOLS)})
    assert second < first        # retrieval of the first call (observed at finish) drafts the second


def test_histories_keep_requests_apart_and_stay_bounded(monkeypatch, caplog):
    from ooospec.runtime.vllm import proposer as mod

    model, tok = trained_chat_model()
    prompt = tok(tok.apply_chat_template(USER, tools=TOOLS, add_generation_prompt=True, tokenize=False),
                 add_special_tokens=False)["input_ids"]
    ref = greedy(model, prompt, 30)
    proposer = ChainProposer(tok, vocab_size=len(tok), max_len=16, config=ProposerConfig(method="toolspec"))
    xargs = {"ooospec_tools": json.dumps(TOOLS)}
    runs = {}
    for req, history in (("a", "tenant-1"), ("b", "tenant-2"), ("c", "tenant-1")):
        out, runs[req] = chain_decode(model, prompt, 30, proposer, req, {**xargs, "ooospec_history": history})
        assert out == ref
    assert runs["b"] == runs["a"]     # tenant-2 starts from nothing: tenant-1's call is not retrieved
    assert runs["c"] < runs["a"]      # tenant-1's own earlier call is
    # a malformed name falls back to the default history (logged), the output unchanged
    out, _ = chain_decode(model, prompt, 30, proposer, "d", {**xargs, "ooospec_history": "x" * 10_000})
    assert out == ref and proposer.faults["ooospec_history"] == 1
    out, _ = chain_decode(model, prompt, 30, proposer, "e", {**xargs, "ooospec_history": 7})
    assert out == ref and proposer.faults["ooospec_history"] == 2
    monkeypatch.setattr(mod, "MAX_HISTORIES", 3)
    for i in range(5):
        proposer.start(f"n{i}", len(prompt), {"ooospec_history": f"h{i}"})
    assert list(proposer.histories) == ["", "h3", "h4"]    # the default is never dropped


def test_a_raising_drafter_loses_its_drafts_not_the_output():
    model = tiny_model("llama")
    proposer = ChainProposer(_Tok(), vocab_size=VOCAB, max_len=8, fmt=hermes)

    class Boom(Drafter):
        name = "boom"

        def propose(self, ctx):
            raise RuntimeError("no")

        def observe(self, prompt, output):
            raise RuntimeError("no")

    class Wild(Drafter):
        name = "wild"

        def propose(self, ctx):
            return [[VOCAB + 5, 1], [-1]]

        def observe(self, prompt, output):
            pass

    prompt = list(range(10, 30))
    state = proposer.start("x", len(prompt))
    state.drafters[:0] = [Boom(), Wild()]
    proposer.requests.pop("x")
    orig_start = proposer.start
    proposer.start = lambda *a, **k: proposer.requests.setdefault("x", state)
    out, _ = chain_decode(model, prompt, 12, proposer, "x")
    proposer.start = orig_start
    assert out == greedy(model, prompt, 12)
    assert proposer.faults["boom"] >= 1 and proposer.faults["wild"] >= 1


def test_a_dead_sidecar_changes_nothing():
    model, tok = trained_chat_model()
    from ooospec.runtime.sidecar.client import SidecarClient

    prompt = tok(tok.apply_chat_template(USER, tools=TOOLS, add_generation_prompt=True, tokenize=False),
                 add_special_tokens=False)["input_ids"]
    dead = SidecarClient("http://127.0.0.1:9", connect_timeout=0.2, timeout=0.5, layout=3)   # nothing listens
    proposer = ChainProposer(tok, vocab_size=len(tok), max_len=16, sidecar=dead,
                             config=ProposerConfig(method="ooospec"))
    extra = {"ooospec_tools": json.dumps(TOOLS), "ooospec_messages": json.dumps(USER)}
    out, _ = chain_decode(model, prompt, 30, proposer, "a", extra)
    assert out == greedy(model, prompt, 30)


def test_a_vllm_served_sidecar_gets_waves_in_the_shipped_adapters_layout():
    """vLLM's /health reports no layout: the proposer's client builds waves the shipped adapter reads."""
    from ooospec.runtime.sidecar.client import adapter_layout
    from tests.runtime.sidecar_servers import MESSAGES as WAVE_MESSAGES
    from tests.runtime.sidecar_servers import TOOLS as WAVE_TOOLS
    from tests.runtime.sidecar_servers import StandIn

    _, tok = trained_chat_model()
    with StandIn("by_query") as server:
        proposer = ChainProposer(tok, vocab_size=len(tok), max_len=16,
                                 config=ProposerConfig(method="ooospec", sidecar_url=server.url))
        state = proposer.start("a", 5, {"ooospec_tools": json.dumps(WAVE_TOOLS),
                                        "ooospec_messages": json.dumps(WAVE_MESSAGES)})
        bank = state.hints.source.wait(30)
        assert bank is not None and bank.num_tokens > 0          # the wave's answers became hints
        assert server.received                                   # the wave was sent
    assert proposer.sidecar.layout == adapter_layout() == 3


def test_a_gated_proposer_skips_the_waves_its_deployment_cannot_pay_for():
    """``sidecar_gate``: the shared deployment's prior prices a wave on the target's own cores above its hints,
    so no wave is sent (the request drafts as toolspec); off sends every wave; an unknown deployment is refused."""
    from tests.runtime.sidecar_servers import MESSAGES as WAVE_MESSAGES
    from tests.runtime.sidecar_servers import TOOLS as WAVE_TOOLS
    from tests.runtime.sidecar_servers import StandIn

    _, tok = trained_chat_model()
    extra = {"ooospec_tools": json.dumps(WAVE_TOOLS), "ooospec_messages": json.dumps(WAVE_MESSAGES)}
    with StandIn("by_query") as server:
        gated = ChainProposer(tok, vocab_size=len(tok), max_len=16,
                              config=ProposerConfig(method="ooospec", sidecar_url=server.url, sidecar_gate="shared"))
        state = gated.start("a", 5, extra)
        assert state.hints is not None and state.hints.source.wait(30) is None   # decided: skip
        assert state.hints.source.decision.kind == "skip" and not server.received
        plain = ChainProposer(tok, vocab_size=len(tok), max_len=16,
                              config=ProposerConfig(method="ooospec", sidecar_url=server.url))
        assert plain.sidecar.gate is None and plain.start("b", 5, extra).hints.source.wait(30) is not None
    with pytest.raises(ValueError, match="sidecar_gate"):
        ProposerConfig(method="ooospec", sidecar_gate="dedicated")


def test_a_hint_schedule_releases_its_calls_late_and_keeps_greedy_output():
    """``ooospec_hint_schedule`` (the ooospec-dedicated emulation): the calls become hints only ``after_s`` after
    the request started; before that the request drafts as toolspec; a malformed schedule only costs the hints."""
    model, tok = trained_chat_model()
    prompt = tok(tok.apply_chat_template(USER, tools=TOOLS, add_generation_prompt=True, tokenize=False),
                 add_special_tokens=False)["input_ids"]
    ref = greedy(model, prompt, 30)
    call = hermes.parse_calls(CALL_TEXT)
    runs = {}
    for name, schedule in (("now", [[0.0, call]]), ("never", [[3000.0, call]]), ("bad", [[-1, call]]),
                           ("garbage", "not json"), ("huge", [[0.0, call]] * 100), ("wide", [[0.0, call * 50]])):
        proposer = ChainProposer(tok, vocab_size=len(tok), max_len=16, config=ProposerConfig(method="ooospec"))
        extra = {"ooospec_tools": json.dumps(TOOLS),
                 "ooospec_hint_schedule": schedule if isinstance(schedule, str) else json.dumps(schedule)}
        out, forwards = chain_decode(model, prompt, 30, proposer, "a", extra)
        assert out == ref, name
        runs[name] = forwards
    assert runs["now"] < runs["never"] == runs["bad"] == runs["garbage"] == runs["huge"] == runs["wide"]


# ------------------------------------------------------------------------------------------ opting out, bounds


class _RecordingSidecar:
    """Stands in for a SidecarClient: records the waves asked for and starts none."""

    def __init__(self):
        self.waves = 0

    def submit(self, messages, tools, **kwargs):
        self.waves += 1


def test_a_request_that_opts_out_gets_no_drafts_and_no_wave():
    model, tok = trained_chat_model()
    prompt = tok(tok.apply_chat_template(USER, tools=TOOLS, add_generation_prompt=True, tokenize=False),
                 add_special_tokens=False)["input_ids"]
    ref = greedy(model, prompt, 30)
    sidecar = _RecordingSidecar()
    proposer = ChainProposer(tok, vocab_size=len(tok), max_len=16, sidecar=sidecar,
                             config=ProposerConfig(method="ooospec"))
    full = {"ooospec_tools": json.dumps(TOOLS), "ooospec_messages": json.dumps(USER)}
    chain_decode(model, prompt, 30, proposer, "teach", full)        # the default history learns the call
    assert sidecar.waves == 1
    out, forwards = chain_decode(model, prompt, 30, proposer, "off", {**full, "ooospec_hint": CALL_TEXT,
                                                                      "ooospec": "off"})
    assert out == ref
    assert forwards == 30                     # one forward per token: nothing was drafted
    assert sidecar.waves == 1                 # no wave for it
    assert proposer.totals["off"] == 1 and not proposer.faults
    # any other value of the switch is ignored (a fault): the request drafts as usual
    out, forwards = chain_decode(model, prompt, 30, proposer, "on", {**full, "ooospec_hint": CALL_TEXT,
                                                                     "ooospec": "on"})
    assert out == ref and forwards < 30 and proposer.faults["ooospec"] == 1


def test_requests_never_finished_leave_at_most_max_requests_states():
    """Clients that disconnect: vLLM may never call finish for their requests."""
    model = tiny_model("llama")
    proposer = ChainProposer(_Tok(), vocab_size=VOCAB, max_len=8, fmt=hermes,
                             config=ProposerConfig(method="ooospec", max_requests=16))
    rng = random.Random(3)
    for i in range(2000):
        extra = [None, {"ooospec_hint": "abcabc"}, {"ooospec": "off"}, {"ooospec_history": f"h{i}"}][i % 4]
        proposer.start(f"gone{i}", 5, extra)
        proposer.step(f"gone{i}", [rng.randrange(VOCAB) for _ in range(6)], [1], room=64)
        assert len(proposer.requests) <= 16
    assert proposer.totals["requests"] == 2000 and len(proposer.histories) <= 64
    prompt = list(range(10, 30))
    out, _ = chain_decode(model, prompt, 12, proposer, "next")     # still serving
    assert out == greedy(model, prompt, 12)


# ------------------------------------------------------------------------------------------ metrics


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_metrics_count_drafters_and_chains_and_are_logged_on_an_interval(caplog):
    model, tok = trained_chat_model()
    prompt = tok(tok.apply_chat_template(USER, tools=TOOLS, add_generation_prompt=True, tokenize=False),
                 add_special_tokens=False)["input_ids"]
    clock = _Clock()
    proposer = ChainProposer(tok, vocab_size=len(tok), max_len=16, clock=clock,
                             config=ProposerConfig(method="ooospec", log_interval_s=10.0))
    extra = {"ooospec_tools": json.dumps(TOOLS), "ooospec_hint": CALL_TEXT, "ooospec_hint_schedule": 5}
    caplog.set_level("INFO", logger="ooospec.runtime.vllm.proposer")
    chain_decode(model, prompt, 30, proposer, "a", extra)
    assert "proposer metrics" not in caplog.text                  # the interval has not passed
    m = proposer.metrics()
    assert m["totals"]["requests"] == 1 and m["totals"]["steps"] == m["window"]["steps"] > 0
    assert m["totals"]["accepted"] > 0
    assert m["totals"]["accepted"] == pytest.approx(m["window"]["mean_accepted"] * m["window"]["steps"])
    assert sum(m["window"]["chain_lengths"].values()) == m["window"]["steps"]
    assert m["window"]["mean_chain"] * m["window"]["steps"] == pytest.approx(m["totals"]["drafted"])
    assert (m["window"]["mean_batch"], m["window"]["max_batch"]) == (1.0, 1)      # one request decoding alone
    assert m["faults"] == {"ooospec_hint_schedule": 1}
    drafters = m["drafters"]
    assert any(k.startswith("schema_fsm/") for k in drafters) and any(k.startswith("hints") for k in drafters)
    for d in drafters.values():
        assert 0 <= d["accepted"] <= d["proposed"] and d["accepted"] <= m["totals"]["accepted"]
    assert sum(d["accepted"] for d in drafters.values()) >= m["totals"]["accepted"]   # a token may be several's
    clock.now += 10.0
    chain_decode(model, prompt, 30, proposer, "b", {"ooospec_tools": json.dumps(TOOLS)})
    logged = [r.getMessage() for r in caplog.records if "proposer metrics" in r.getMessage()]
    assert len(logged) == 1                                        # once per interval, at the first step past it
    assert json.loads(logged[0].split("metrics ", 1)[1])["totals"]["requests"] == 2
    assert proposer.metrics()["window"]["steps"] < proposer.metrics()["totals"]["steps"]   # a new window began
    proposer.batch = 6                  # as OoOSpecProposer sets it: the engine step decodes 6 requests
    chain_decode(model, prompt, 10, proposer, "c", {"ooospec_tools": json.dumps(TOOLS)})
    window = proposer.metrics()["window"]
    assert window["max_batch"] == 6 and 1.0 < window["mean_batch"] < 6.0   # the level's batch, not the last step's


def test_hint_tokens_only_the_hints_proposed_are_counted_and_exported(monkeypatch):
    """The proposer counts the accepted tokens a hint proposal covered and those no other drafter had proposed
    (what the wave was worth), and adds both to Prometheus counters a client reads around a request."""
    import sys
    import types

    from ooospec.runtime.vllm import proposer as proposer_mod

    exported: dict[str, float] = {}

    class FakeCounter:
        def __init__(self, name, doc):
            self.name = name
            exported[name] = 0.0

        def inc(self, value):
            exported[self.name] += value

    monkeypatch.setitem(sys.modules, "prometheus_client", types.SimpleNamespace(Counter=FakeCounter))
    monkeypatch.setattr(proposer_mod, "_exported", {})
    model, tok = trained_chat_model()
    prompt = tok(tok.apply_chat_template(USER, tools=TOOLS, add_generation_prompt=True, tokenize=False),
                 add_special_tokens=False)["input_ids"]
    totals = {}
    for hint in (None, "<tool_call>", CALL_TEXT):
        proposer = ChainProposer(tok, vocab_size=len(tok), max_len=16, config=ProposerConfig(method="ooospec"))
        extra = {"ooospec_tools": json.dumps(TOOLS)} | ({"ooospec_hint": hint} if hint else {})
        chain_decode(model, prompt, 30, proposer, "a", extra)
        totals[hint] = dict(proposer.totals)
    assert totals[None]["hint_accepted"] == totals[None]["hint_only_accepted"] == 0
    # the call's opening tag alone: the schema FSM proposes it as well, so the hints add nothing of their own
    assert totals["<tool_call>"]["hint_only_accepted"] == 0
    full = totals[CALL_TEXT]      # the whole call: its argument values are the hints' own
    assert 0 < full["hint_only_accepted"] <= full["hint_accepted"] <= full["accepted"]
    assert exported[proposer_mod.HINT_COUNTERS[1]] == sum(t["hint_only_accepted"] for t in totals.values())
    assert exported[proposer_mod.HINT_COUNTERS[0]] == sum(t["hint_accepted"] for t in totals.values())


def test_metrics_are_never_logged_with_interval_zero(caplog):
    model = tiny_model("llama")
    clock = _Clock()
    proposer = ChainProposer(_Tok(), vocab_size=VOCAB, max_len=8, fmt=hermes, clock=clock,
                             config=ProposerConfig(log_interval_s=0))
    caplog.set_level("INFO", logger="ooospec.runtime.vllm.proposer")
    for i in range(3):
        clock.now += 1e6
        chain_decode(model, list(range(10, 30)), 8, proposer, f"r{i}")
    assert "proposer metrics" not in caplog.text
    assert proposer.metrics()["window"]["steps"] == proposer.metrics()["totals"]["steps"] > 0


# ------------------------------------------------------------------------------------------ the plugin's edges


def test_route_logs_sends_ooospec_lines_through_vllms_handlers():
    import logging

    ours, theirs = logging.getLogger("test-route.ours"), logging.getLogger("test-route.theirs")
    handler = logging.Handler()
    theirs.addHandler(handler)
    theirs.setLevel(logging.INFO)
    try:
        assert plugin.route_logs(ours, theirs)
        assert ours.handlers == [handler] and ours.getEffectiveLevel() == logging.INFO and not ours.propagate
        assert not plugin.route_logs(ours, theirs)                 # configured already: left alone
    finally:
        theirs.removeHandler(handler)
        ours.removeHandler(handler)


def test_chat_xargs_survive_a_request_too_deep_to_serialize(caplog):

    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    request = SimpleNamespace(vllm_xargs=None, tools=TOOLS, messages=[{"role": "user", "content": deep}])
    assert plugin.chat_xargs(request) == {}
    assert "RecursionError" in caplog.text
    assert json.loads(plugin.chat_xargs(SimpleNamespace(vllm_xargs=None, tools=TOOLS, messages=USER))[
        "ooospec_tools"]) == TOOLS


def test_finished_requests_reach_the_drafter_even_on_an_empty_step():
    """vLLM's runner returns before any proposer runs on a step with nothing to compute; the plugin hands finished
    (or aborted) request ids over in ``_update_states``, which runs at every step, so their states never linger."""
    calls = []

    class Drafter:
        def bind_batch(self, req_ids, lookup):
            calls.append(("bind", list(req_ids)))

        def finish_requests(self, req_ids):
            calls.append(("finish", list(req_ids)))

    class Runner:
        drafter = Drafter()
        input_batch = SimpleNamespace(req_ids=["b"])
        requests: ClassVar[dict] = {}

        def _update_states(self, scheduler_output):
            calls.append(("update", None))

        def propose_draft_token_ids(self, scheduler_output):
            return "drafts"

    update = plugin.wrap_update_states(Runner._update_states)
    propose = plugin.wrap_propose(Runner.propose_draft_token_ids)
    runner = Runner()
    update(runner, SimpleNamespace(finished_req_ids={"x", "a"}))             # an empty step: no propose after it
    update(runner, SimpleNamespace(finished_req_ids=set()))
    assert propose(runner, SimpleNamespace()) == "drafts"
    assert calls == [("finish", ["a", "x"]), ("update", None), ("finish", []), ("update", None), ("bind", ["b"])]
    assert update.__ooospec__ and propose.__ooospec__
    plain = SimpleNamespace(drafter=object(), input_batch=SimpleNamespace(req_ids=[]))   # another proposer
    update(plain, SimpleNamespace(finished_req_ids={"y"}))
    assert calls[-1] == ("update", None)


def test_steps_the_switch_skips_keep_greedy_output_and_learning_float64():
    """Every other step without a chain (the draft switch's plain steps): the same output, the drafted steps'
    acceptance still learnt."""
    model = tiny_model("qwen2")
    proposer = ChainProposer(_Tok(), vocab_size=VOCAB, max_len=8, fmt=hermes,
                             config=ProposerConfig(method="ooospec", chain_cost_slope=0.0))
    prompt = [3, 9, 4, 5, 6, 7, 5, 6, 7, 5, 6]
    ref = greedy(model, prompt, 20)
    out, forwards = chain_decode(model, prompt, 20, proposer, "a", {"ooospec_hint": _Tok().decode(ref)},
                                 draft=lambda step: step % 2 == 0)
    assert out == ref
    assert proposer.totals["accepted"] > 0 and forwards < 20
