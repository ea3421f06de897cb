"""The agent bench with the target in vLLM (eval/agent/in_vllm.py), without vLLM: a stand-in ``vllm`` module whose
``LLM`` decodes greedily with the tiny chat model that knows one tool conversation, and records every request's
``extra_args`` and prefix-cache resets."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch

from ooospec.eval.agent import in_vllm as agent_vllm
from ooospec.eval.agent.replay import Dialogue, summarize
from ooospec.runtime.drafters.hints import HintBank
from ooospec.runtime.formats import hermes
from tests.runtime.chat_tiny import CALL, RESULT, TOOLS, USER, trained_chat_model


class _Params:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class _LLM:
    """Greedy decoding of the tiny model: vLLM's ``generate`` shape, the stop string and ids honoured."""

    def __init__(self, model, tok):
        self.model, self.tok = model, tok
        self.requests: list[dict] = []
        self.resets = 0

    def reset_prefix_cache(self) -> None:
        self.resets += 1

    def generate(self, prompts, sp, use_tqdm=False):
        ids = list(prompts[0]["prompt_token_ids"])
        self.requests.append(dict(getattr(sp, "extra_args", None) or {}))
        out: list[int] = []
        reason = "length"
        with torch.no_grad():
            while len(out) < sp.max_tokens:
                t = int(self.model(torch.tensor([ids + out])).logits[0, -1].argmax())
                out.append(t)
                if t in (getattr(sp, "stop_token_ids", None) or []):
                    reason = "stop"
                    break
                if any(s in self.tok.decode(out) for s in (getattr(sp, "stop", None) or [])):
                    reason = "stop"
                    break
        o = types.SimpleNamespace(token_ids=out, finish_reason=reason)
        return [types.SimpleNamespace(outputs=[o], num_cached_tokens=0)]


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = _Params
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    from ooospec.runtime.sidecar import process as sidecar_process

    monkeypatch.setattr(sidecar_process, "wait_idle", lambda url, *a, **k: 0.0)
    monkeypatch.setattr(sidecar_process, "reset_prefix_cache", lambda url, *a, **k: True)
    model, tok = trained_chat_model()
    return _LLM(model, tok), tok


DIALOGUE = Dialogue("weather", USER, [TOOLS], [CALL], [RESULT])


def _chat(llm, tok, variant: str) -> agent_vllm.VllmChat:
    params = {"temperature": 0.0, "stop": ["</tool_call>"], "stop_token_ids": [tok.eos_token_id],
              "include_stop_str_in_output": True, "skip_special_tokens": False}
    return agent_vllm.VllmChat(llm, tok, hermes, params, history=f"{variant}@1", stateless=variant == "stateless",
                               eos_token_ids=[tok.eos_token_id])


class _Wave:
    """A sidecar wave already answered with ``call`` (what ``ReleasedGuess.after_alone`` polls)."""

    def __init__(self, call):
        self.bank = HintBank.from_calls([call], hermes, trained_chat_model()[1])
        self.done = True

    def poll(self):
        return self.bank


class _Client:
    base_url = "http://sidecar.invalid"

    def __init__(self, call):
        self.call, self.submitted, self.prefilled = call, 0, 0

    def submit(self, messages, tools, **kw):
        self.submitted += 1
        return _Wave(self.call)

    def prefill(self, messages, tools, **kw):
        self.prefilled += 1
        return True


def test_every_variant_gives_the_same_turns_and_a_guessed_call_hides_the_tool(fake_vllm):
    llm, tok = fake_vllm
    client = _Client(CALL)
    rows = {v: agent_vllm.replay_vllm(_chat(llm, tok, v), DIALOGUE, 0.3, v, speculator="gold",
                                      max_new_tokens=24, client=client if v == "dedicated" else None)
            for v in ("stateless", "sessions", "speculative", "dedicated")}
    texts = rows["sessions"]["texts"]
    assert texts[0].startswith("<tool_call>") and json.loads(texts[0].split("\n")[1]) == CALL
    assert all(r["texts"] == texts for r in rows.values())            # a guess changes speed, never text
    assert rows["sessions"]["hits"] == 0 and rows["stateless"]["hits"] == 0
    assert rows["speculative"]["hits"] == 1 and rows["dedicated"]["hits"] == 1   # the tool ran on the guess
    assert rows["speculative"]["waves"] == 0                            # gold: no wave
    assert rows["dedicated"]["waves"] == 2 and client.submitted == 2    # one wave per turn, each run alone
    assert rows["dedicated"]["excluded_s"] > 0
    assert rows["dedicated"]["wall_s"] == pytest.approx(
        sum(t["gen_s"] + t["tool_wait_s"] for t in rows["dedicated"]["turns"]), abs=0.25)


def test_requests_carry_their_history_and_only_a_dedicated_wave_sends_hints(fake_vllm):
    llm, tok = fake_vllm
    agent_vllm.replay_vllm(_chat(llm, tok, "sessions"), DIALOGUE, 0.0, "sessions", speculator="gold",
                           max_new_tokens=24)
    resets_after_sessions = llm.resets
    agent_vllm.replay_vllm(_chat(llm, tok, "dedicated"), DIALOGUE, 0.0, "dedicated", speculator="sidecar",
                           max_new_tokens=24, client=_Client(CALL))
    turns = [r for r in llm.requests if r]              # the untimed toolbox warm-ups carry no extra_args
    sessions, dedicated = turns[:2], turns[-2:]
    assert [r["ooospec_history"] for r in sessions] == ["sessions@1", "sessions@1"]
    assert all(json.loads(r["ooospec_tools"])[0]["function"]["name"] == "get_weather" for r in turns)
    assert not any("ooospec_hint_schedule" in r for r in sessions)
    after_s, calls = json.loads(dedicated[0]["ooospec_hint_schedule"])[0]
    assert calls == [CALL] and after_s == pytest.approx(0.0, abs=0.01)   # answered at once: released at once
    assert resets_after_sessions == 1 and len(llm.requests) == 6   # per dialogue: cache emptied, toolbox cached


def test_stateless_empties_the_prefix_cache_every_turn(fake_vllm):
    llm, tok = fake_vllm
    row = agent_vllm.replay_vllm(_chat(llm, tok, "stateless"), DIALOGUE, 0.0, "stateless", speculator="gold",
                                 max_new_tokens=24)
    assert llm.resets == len(row["turns"]) == 2


def test_hint_schedule_counts_from_now_and_ignores_other_guesses():
    from ooospec.eval.bench.ooospec_method import ReleasedGuess

    bank = HintBank.from_calls([CALL], hermes, trained_chat_model()[1])
    guess = ReleasedGuess(None, [(0.5, bank), (5.0, bank)])
    guess.start -= 1.0                                     # one second into the turn
    schedule = agent_vllm.hint_schedule(guess)
    assert [t for t, _ in schedule] == [0.0, pytest.approx(4.0, abs=0.05)] and schedule[0][1] == [CALL]
    assert agent_vllm.hint_schedule(bank) is None and agent_vllm.hint_schedule(None) is None


def test_variants_are_checked():
    assert agent_vllm.variants_of("sessions,dedicated", "sidecar") == ["sessions", "dedicated"]
    with pytest.raises(SystemExit, match="unknown"):
        agent_vllm.variants_of("sessions,turbo", "sidecar")
    with pytest.raises(SystemExit, match="needs --speculator sidecar"):
        agent_vllm.variants_of("dedicated", "gold")


def test_summary_prices_each_variant_against_sessions():
    def row(variant, wall, hidden=0.0):
        return {"id": "d", "variant": variant, "latency_s": 2.0, "wall_s": wall, "turns": [], "calls": 1, "hits": 1,
                "exact": True, "tool_hidden_s": hidden, "waves": 1}

    summary = {s["variant"]: s for s in summarize([row("stateless", 12.0), row("sessions", 10.0),
                                                    row("dedicated", 8.0, 1.5)])}
    assert summary["dedicated"]["vs_sessions"] == pytest.approx(1.25)
    assert summary["sessions"]["vs_sessions"] == pytest.approx(1.0)
    assert summary["dedicated"]["tool_hidden_s"] == 1.5 and summary["dedicated"]["waves_sent"] == 1


def test_without_stateless_turns_exactness_is_against_sessions():
    from ooospec.eval.agent.replay import mark_exact

    rows = [{"id": "d", "latency_s": 2.0, "variant": v, "texts": t}
            for v, t in (("sessions", ["a", "b"]), ("speculative", ["a", "b"]), ("dedicated", ["a", "c"]))]
    mark_exact(rows)
    assert [r["exact"] for r in rows] == [True, True, False]


def test_first_divergence_finds_the_turn_and_token():
    ref = [([1, 2], [5, 6, 7]), ([1, 2, 5, 6, 7, 9], [8, 8])]
    assert agent_vllm.first_turn_divergence(ref, ref) is None
    assert agent_vllm.first_turn_divergence([ref[0], ([1, 2, 5, 6, 7, 9], [8, 3])], ref) == (1, 1)
    assert agent_vllm.first_turn_divergence([([1, 2], [5, 6])], ref) == (0, 2)       # one ended early


def test_classify_names_a_near_tie_and_a_defect_by_the_reference_margin(fake_vllm):
    class _Margins:
        def __init__(self, gap):
            self.gap = gap

        def generate(self, prompts, sp, use_tqdm=False):
            lp = [{1: types.SimpleNamespace(logprob=-0.1), 2: types.SimpleNamespace(logprob=-0.1 - self.gap)}]
            return [types.SimpleNamespace(outputs=[types.SimpleNamespace(logprobs=lp * sp.max_tokens)])]

    def rows():
        ref = {"id": "d", "latency_s": 0.0, "variant": "sessions", "exact": True, "_trace": [([1], [4, 5])]}
        other = {"id": "d", "latency_s": 0.0, "variant": "dedicated", "exact": False, "_trace": [([1], [4, 6])]}
        return [ref, other]

    for gap, kind in ((0.05, "near_tie"), (3.0, "defect")):
        rs = rows()
        agent_vllm.classify(_Margins(gap), rs, 0.25)
        assert rs[1]["divergence"] == {"turn": 0, "token": 1, "margin": pytest.approx(gap), "kind": kind}
        assert "divergence" not in rs[0]
    summary = {s["variant"]: s for s in summarize([{**r, "wall_s": 1.0, "turns": [], "calls": 0, "hits": 0}
                                                    for r in rs])}
    assert summary["dedicated"]["defects"] == 1 and summary["dedicated"]["near_ties"] == 0


def test_the_speculative_variant_asks_the_gated_client_and_dedicated_the_plain_one(fake_vllm):
    llm, tok = fake_vllm

    class _Gated(_Client):              # what a gated client's submit gives: a guess of the turn's call
        def submit(self, messages, tools, **kw):
            self.submitted += 1
            return HintBank.from_calls([self.call], hermes, tok)

    plain, gated = _Client(CALL), _Gated(CALL)
    for v in ("speculative", "dedicated"):
        agent_vllm.replay_vllm(_chat(llm, tok, v), DIALOGUE, 0.0, v, speculator="sidecar", max_new_tokens=24,
                               client=plain, gated=gated)
    assert gated.submitted == 2 and plain.submitted == 2      # one wave per turn each: the gate's, then all


def test_sidecar_gate_on_is_the_shared_deployments_gate_and_each_latency_gets_its_own():
    from ooospec.runtime.sidecar.client import SidecarClient
    from ooospec.runtime.sidecar.gate import WaveGate

    assert agent_vllm._gate(types.SimpleNamespace(sidecar_gate="off")) is None
    gate = agent_vllm._gate(types.SimpleNamespace(sidecar_gate="on"))
    assert isinstance(gate, WaveGate)
    client = SidecarClient("http://127.0.0.1:9", wave="function-first", top_k=3)
    copy = agent_vllm._client_like(client, gate.fresh())
    assert (copy.base_url, copy.wave, copy.top_k) == (client.base_url, "function-first", 3)
    assert copy.gate is not gate and client.gate is None


def test_the_history_variant_reruns_earlier_calls_and_the_summary_names_hit_sources(fake_vllm):
    """``history``: no sidecar, the loop's earlier calls started at each turn's arrival (here the one call, again
    at the final turn: wasted, text unchanged); it needs ``--speculate-history`` >= 1. The summary counts hits by
    source and the table names them when the history served any."""
    from ooospec.eval.agent.replay import check_history_variants, markdown_table

    llm, tok = fake_vllm
    rows = [agent_vllm.replay_vllm(_chat(llm, tok, v), DIALOGUE, 0.0, v, speculator="gold", max_new_tokens=24,
                                   speculate_history=1) for v in ("sessions", "history")]
    assert rows[0]["texts"] == rows[1]["texts"] and rows[1]["hits"] == 0
    assert rows[0]["speculation"]["started"] == 0 and rows[1]["speculation"]["started"] == 1
    assert agent_vllm.variants_of("sessions,history", "sidecar") == ["sessions", "history"]
    check_history_variants(["sessions", "history"], 1)
    with pytest.raises(SystemExit, match="needs --speculate-history"):
        check_history_variants(["history"], 0)

    def row(variant, sources):
        turns = [{"hit": True, "hit_source": s, "prefilled_tokens": 0, "tool_wait_s": 0.0} for s in sources]
        return {"id": "d", "variant": variant, "latency_s": 2.0, "wall_s": 5.0, "turns": turns, "calls": 4,
                "hits": len(sources), "exact": True, "tool_hidden_s": 0.0, "waves": 0}

    summary = summarize([row("sessions", []), row("dedicated", ["guess", "history", "history"])])
    assert summary[1]["hits_by_source"] == {"guess": 1, "history": 2} and summary[1]["hit_rate"] == 0.75
    assert "75.0% (guess 1, history 2)" in markdown_table(summary)


def test_wave_first_counts_the_wave_in_the_turn_and_starts_the_tool_at_its_end(fake_vllm):
    """``wave-first`` (real, shared cores): each turn's wave is waited for inside the dialogue's time (nothing
    excluded), its call starts the tool before the target runs, and its hints reach vLLM at 0 s."""
    import time

    llm, tok = fake_vllm

    class _Slow(_Client):                       # a wave that takes 0.2 s
        def submit(self, messages, tools, **kw):
            time.sleep(0.2)
            return super().submit(messages, tools, **kw)

    client = _Slow(CALL)
    sessions = agent_vllm.replay_vllm(_chat(llm, tok, "sessions"), DIALOGUE, 0.3, "sessions", speculator="sidecar",
                                      max_new_tokens=24)
    llm.requests.clear()
    row = agent_vllm.replay_vllm(_chat(llm, tok, "wave-first"), DIALOGUE, 0.3, "wave-first", speculator="sidecar",
                                 max_new_tokens=24, client=client)
    assert row["texts"] == sessions["texts"] and row["hits"] == 1 and row["waves"] == 2 == client.submitted
    assert row["excluded_s"] == 0
    assert row["wall_s"] >= sum(t["gen_s"] + t["tool_wait_s"] for t in row["turns"]) + 2 * 0.2 - 0.05
    turns = [r for r in llm.requests if r]
    assert all(json.loads(r["ooospec_hint_schedule"])[0][0] == 0.0 for r in turns)
    assert agent_vllm.variants_of("sessions,wave-first", "sidecar") == ["sessions", "wave-first"]
    with pytest.raises(SystemExit, match="wave-first needs --speculator sidecar"):
        agent_vllm.variants_of("wave-first", "gold")
