"""The agent loop on a tiny target that knows one tool conversation: sessions, speculation, stateful tools."""

from __future__ import annotations

import threading

import pytest

from ooospec.runtime.agent.chat import ChatModel
from ooospec.runtime.agent.loop import run_agent
from ooospec.runtime.agent.session import PrefixCache, SessionStore
from ooospec.runtime.agent.tools import SpeculativeTools, ToolRegistry
from ooospec.runtime.drafters.hints import HintBank
from tests.runtime.agent.test_tools import Counter
from tests.runtime.chat_tiny import ANSWER, CALL, RESULT, TOOLS, USER, trained_chat_model


def _chat(sessions: bool, method: str = "toolspec") -> ChatModel:
    model, tok = trained_chat_model()
    store = SessionStore(model, prefix_cache=PrefixCache()) if sessions else None
    return ChatModel(model, tok, method=method, sessions=store)


def _tools(side_effect_free: bool) -> tuple[SpeculativeTools, Counter]:
    impl = Counter(result={"temp_c": 21})
    reg = ToolRegistry()
    reg.register("get_weather", impl, parameters=TOOLS[0]["function"]["parameters"],
                 side_effect_free=side_effect_free)
    return SpeculativeTools(reg), impl


def _join_tool_runs() -> None:
    """Wait for the tool runs still in flight: a wasted speculative run may end after the turn that ignored it."""
    for thread in threading.enumerate():
        if thread.name.startswith("tool-"):
            thread.join(30)


def _guess(call):
    def guess(messages, tools, turn):
        tok = trained_chat_model()[1]
        return HintBank.from_calls([call], _chat(False).fmt, tok) if turn == 0 else None
    return guess


@pytest.mark.parametrize("method", ["ar", "ooospec"])
def test_sessions_and_speculation_change_nothing_but_time(method):
    """Stateless, sessions, sessions + a right guess: the same two turns; the guess is a hit (the tool ran
    once, speculatively) and the second turn reuses the first turn's KV."""
    runs = {}
    for name, sessions, guess in [("stateless", False, None), ("sessions", True, None),
                                  ("speculative", True, _guess(CALL))]:
        executor, impl = _tools(side_effect_free=True)
        runs[name] = (run_agent(_chat(sessions, method), USER, TOOLS, executor, max_turns=4, max_new_tokens=40,
                                guess=guess), executor, impl)
    for name, (run, executor, impl) in runs.items():
        assert [s.text for s in run.steps] == [runs["stateless"][0].steps[0].text, ANSWER], name
        assert run.steps[0].call == CALL and run.steps[0].result == RESULT and run.steps[1].call is None
        assert len(impl.calls) == 1, name
    spec_run, spec_exec, _ = runs["speculative"]
    assert spec_run.steps[0].hit and spec_run.steps[0].guess == CALL and spec_exec.stats.hits == 1
    assert not runs["sessions"][0].steps[0].hit
    assert runs["stateless"][0].steps[1].cached_tokens == 0
    assert runs["sessions"][0].steps[1].cached_tokens > 0 and runs["sessions"][0].steps[1].origin == "session"
    assert spec_run.messages[-1] == {"role": "tool", "content": RESULT}


def test_a_stateful_tool_is_called_exactly_as_often_as_the_target_calls_it():
    """A tool that is not side-effect free never runs on a guess, right or wrong."""
    for guessed in (CALL, {"name": "get_weather", "arguments": {"city": "Rome"}}):
        executor, impl = _tools(side_effect_free=False)
        run = run_agent(_chat(True), USER, TOOLS, executor, max_turns=4, max_new_tokens=40, guess=_guess(guessed))
        target_calls = [s.call for s in run.steps if s.call is not None]
        assert impl.calls == [c["arguments"] for c in target_calls] == [{"city": "Paris"}]
        assert executor.stats.refused_side_effects == 1 and executor.stats.started == 0
        assert not run.steps[0].hit


def test_a_wrong_guess_costs_a_wasted_run_and_a_real_call():
    executor, impl = _tools(side_effect_free=True)
    run = run_agent(_chat(True), USER, TOOLS, executor, max_turns=4, max_new_tokens=40,
                    guess=_guess({"name": "get_weather", "arguments": {"city": "Rome"}}))
    _join_tool_runs()
    assert not run.steps[0].hit and run.steps[0].result == RESULT and [s.text for s in run.steps][1] == ANSWER
    assert sorted(c["city"] for c in impl.calls) == ["Paris", "Rome"] and executor.stats.misses == 1


def test_the_second_candidate_of_a_guess_runs_too_when_asked_and_hits():
    """A function-first bank's candidates: the likeliest call wrong, the next right. With ``speculate_top_k=2`` both
    run early and the target's call is a hit; with 1 only the wrong one runs. Text unchanged either way."""
    wrong = {"name": "get_weather", "arguments": {"city": "Rome"}}

    def guess(messages, tools, turn):
        return HintBank.from_calls([wrong, CALL], _chat(False).fmt, trained_chat_model()[1]) if turn == 0 else None

    for top_k, hit in ((1, False), (2, True)):
        executor, impl = _tools(side_effect_free=True)
        run = run_agent(_chat(True), USER, TOOLS, executor, max_turns=4, max_new_tokens=40, guess=guess,
                        speculate_top_k=top_k)
        _join_tool_runs()
        assert [s.text for s in run.steps][1] == ANSWER and run.steps[0].guess == wrong
        assert run.steps[0].hit is hit and executor.stats.started == top_k
        assert sorted(c["city"] for c in impl.calls) == ["Paris", "Rome"]   # a miss runs the real call after


def test_a_sidecar_guess_drafts_and_speculates():
    """Method ooospec with a (stand-in) sidecar: the wave's joined call drafts tokens and runs the tool early;
    the output is the same as without it."""
    from ooospec.runtime.sidecar.client import SidecarClient
    from tests.runtime.sidecar_servers import StandIn

    with StandIn("good", answers=["0", '"Paris"']) as sidecar:      # the index query, then get_weather.city
        client = SidecarClient(sidecar.url, timeout=60)
        chat = _chat(True, method="ooospec")
        executor, impl = _tools(side_effect_free=True)

        def guess(messages, tools, turn):
            req = client.submit(messages, tools, fmt=chat.fmt, tokenizer=chat.tokenizer)
            assert req.wait(60) is not None  # ready before the turn starts, however loaded the machine (no race)
            return req

        run = run_agent(chat, USER, TOOLS, executor, max_turns=4, max_new_tokens=40, guess=guess)
    assert [s.text for s in run.steps] == [_chat(False).complete(USER, TOOLS, max_new_tokens=40).text, ANSWER]
    # the sidecar guesses at both turns (the second guess runs the tool for nothing: a wasted speculation)
    _join_tool_runs()
    assert run.steps[0].guess == CALL and run.steps[0].hit
    assert (executor.stats.started, executor.stats.hits, executor.stats.misses) == (2, 1, 0) and len(impl.calls) == 2


def test_the_wave_gate_hears_each_turn_and_its_tool():
    """With a gated client and method toolspec (the guess only runs tools), the loop still reports every turn to the
    gate (``report``) and tells it how the tool went (``observe_tool``): latency and hit; each step keeps the
    gate's decision. The output is the same as without the sidecar."""
    from ooospec.runtime.sidecar.client import SidecarClient
    from ooospec.runtime.sidecar.deployments import SPLIT
    from ooospec.runtime.sidecar.gate import WaveGate
    from ooospec.runtime.sidecar.gate_decision import tools_key
    from tests.runtime.sidecar_servers import StandIn

    prior = SPLIT.prior                                              # sends: the stand-in answers the wave
    with StandIn("by_query") as sidecar:
        gate = WaveGate(prior)
        client = SidecarClient(sidecar.url, timeout=60, gate=gate)
        chat = _chat(True)
        executor, impl = _tools(side_effect_free=True)

        def guess(messages, tools, turn):
            req = client.submit(messages, tools, fmt=chat.fmt, tokenizer=chat.tokenizer)
            assert (req.wait(60) is not None) == (req.decision.kind != "skip")
            return req

        run = run_agent(chat, USER, TOOLS, executor, max_turns=4, max_new_tokens=40, guess=guess)
    _join_tool_runs()
    assert [s.text for s in run.steps] == [_chat(False).complete(USER, TOOLS, max_new_tokens=40).text, ANSWER]
    # turn 2 sends nothing: turn 1 showed the city verbatim in the request (prompt lookup copies it), and an index
    # wave over one tool would only name the tool the schema FSM drafts
    assert [s.wave["decision"] for s in run.steps] == ["slots", "skip"] and run.steps[0].hit
    est = gate.estimates(tools_key(TOOLS))
    assert est.tool_s > 0.0 and est.hit_rate == pytest.approx((1 + 4 * prior.hit_rate) / 5)   # one tool, a hit
    assert est.call_tokens != prior.call_tokens                      # report reached the gate for both waves
    assert gate.num_requests == 2 and len(impl.calls) == 1           # the hit served the one call


def test_the_idle_window_hook_sees_the_call_before_its_tool_runs():
    """``on_tool_start`` gets the conversation ending in the call, once per call, before the tool runs; the
    turns are the same as without it."""
    executor, impl = _tools(side_effect_free=False)
    seen = []

    def idle(messages, tools):
        seen.append((messages, tools, len(impl.calls)))

    run = run_agent(_chat(True), USER, TOOLS, executor, max_turns=4, max_new_tokens=40, on_tool_start=idle)
    plain = run_agent(_chat(True), USER, TOOLS, _tools(side_effect_free=False)[0], max_turns=4, max_new_tokens=40)
    assert [s.text for s in run.steps] == [s.text for s in plain.steps]
    assert len(seen) == 1
    messages, tools, calls_before = seen[0]
    assert calls_before == 0 and tools == TOOLS
    assert messages == [*USER, {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                                                                                    "function": CALL}]}]


class _ScriptedChat:
    """A target that makes the scripted call at each turn (None: the final answer), nothing else."""

    takes_hints = False

    def __init__(self, calls):
        self.calls = list(calls)

    def complete(self, messages, tools, *, max_new_tokens, hints=None):
        from ooospec.runtime.agent.chat import ChatTurn

        turn = sum(m["role"] == "assistant" for m in messages)
        call = self.calls[turn]
        return ChatTurn(text="call" if call else "done", calls=[call] if call else [],
                        finish_reason="tool_calls" if call else "stop", prompt_tokens=1, completion_tokens=1,
                        cached_tokens=0, origin="new", result=None)


PARIS, ROME = CALL, {"name": "get_weather", "arguments": {"city": "Rome"}}


@pytest.mark.parametrize("history", [0, 1, 2])
def test_earlier_calls_run_again_at_arrival_with_speculate_history(history):
    """Calls Paris, Rome, Paris, Rome: with ``speculate_history`` N the last N distinct earlier calls start at
    each turn's arrival, so turn 3 (Paris again) hits from N = 2 and turn 4 (Rome again) from N = 2; with N = 1
    only the last call runs again (no repeat of it here: every run wasted). The source of each hit is named; the
    transcript is the same."""
    script = [PARIS, ROME, PARIS, ROME, None]
    executor, impl = _tools(side_effect_free=True)
    run = run_agent(_ScriptedChat(script), USER, TOOLS, executor, max_turns=6, speculate_history=history)
    _join_tool_runs()
    assert [s.call for s in run.steps] == script
    hits = [s.hit for s in run.steps if s.call is not None]
    assert hits == ([False, False, True, True] if history >= 2 else [False] * 4)
    assert [s.hit_source for s in run.steps if s.hit] == ["history"] * sum(hits)
    assert executor.stats.hits_by_source == ({"history": 2} if history >= 2 else {})
    # each turn after the first starts min(N, distinct earlier calls) runs; misses run the real call after
    started = sum(min(history, len({c["arguments"]["city"] for c in script[:t]})) for t in range(1, 5))
    assert executor.stats.started == started
    assert len(impl.calls) == started + 4 - sum(hits)


def test_a_history_hit_is_not_the_guess_s_and_a_stateful_tool_never_repeats_early():
    """The same call guessed by the history (at arrival) and by the turn's guess: the history's run serves it
    and the guess's source is not credited; a tool that is not side-effect free is never run from the history."""
    def guess(messages, tools, turn):
        return HintBank.from_calls([PARIS], _chat(False).fmt, trained_chat_model()[1]) if turn == 1 else None

    executor, impl = _tools(side_effect_free=True)
    run = run_agent(_ScriptedChat([PARIS, PARIS, None]), USER, TOOLS, executor, max_turns=4, guess=guess,
                    speculate_history=1)
    _join_tool_runs()
    assert [s.hit for s in run.steps[:2]] == [False, True] and run.steps[1].hit_source == "history"
    # the real first call, the history's run at turn 1 (the hit), and again at turn 2 (the answer: wasted)
    assert executor.stats.hits_by_source == {"history": 1} and len(impl.calls) == 3
    executor, impl = _tools(side_effect_free=False)
    run = run_agent(_ScriptedChat([PARIS, PARIS, None]), USER, TOOLS, executor, max_turns=4, speculate_history=3)
    assert not any(s.hit for s in run.steps) and impl.calls == [PARIS["arguments"]] * 2
    assert executor.stats.refused_side_effects == 2 and executor.stats.started == 0    # turns 1 and 2
    with pytest.raises(ValueError, match="speculate_history"):
        run_agent(_ScriptedChat([None]), USER, TOOLS, executor, speculate_history=-1)
