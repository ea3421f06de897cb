"""The agent loop on the target: call -> tool -> result -> continue, with KV sessions and speculative tools.

    chat = ChatModel(model, tok, method="toolspec", sessions=SessionStore(model, prefix_cache=PrefixCache()))
    tools = SpeculativeTools(registry)                    # registry: ToolRegistry with the tools' implementations
    run = run_agent(chat, messages, openai_tools, tools, guess=lambda msgs, tls, turn: client.submit(
        msgs, tls, fmt=chat.fmt, tokenizer=chat.tokenizer))
    run.steps[0].hit      # the first call's result came from the speculative run

One turn (the engine-side loop, in process):

1. The turn arrives: ``guess(messages, tools, turn)`` starts an early guess of its call (a
   :class:`~ooospec.runtime.drafters.hints.CallGuess`: the sidecar's wave, or a call known at arrival). The guessed call
   goes to :meth:`~ooospec.runtime.agent.tools.SpeculativeTools.speculate` the moment it is ready (at once when it is
   ready at arrival, else from a watcher thread), so a side-effect-free tool runs while the target is still
   decoding.
2. The target decodes the turn (:meth:`~ooospec.runtime.agent.chat.ChatModel.complete`); with a method that takes hints
   the same guess drafts tokens too (:class:`~ooospec.runtime.drafters.hints.HintDrafter`).
3. No call: the loop ends (the final answer). A call: :meth:`~ooospec.runtime.agent.tools.SpeculativeTools.resolve`
   returns the speculative result when the canonical keys match, and runs the real call otherwise. The guess hears
   how the turn and its tool went (``report`` / ``observe_tool``): a sidecar wave's gate learns from them what a
   wave is worth in tool latency hidden.
4. The call and its result join the conversation and the next turn continues the same session: only the new
   tokens (the call's end, the tool message, the generation prompt) are prefilled -- the tool result goes into
   the resident KV and decoding goes on, with nothing to evict, re-admit or re-prefill. Without sessions
   (``ChatModel(sessions=None)``) every turn prefills the whole conversation (stateless turns).

Speculative entries live for one turn (cleared when the next turn starts). Only the first call of a turn is
executed (the stop rule ends a turn at the end of its first call).

``speculate_history`` (0: off) adds a second source of guesses that needs no model: at each turn's arrival the
loop's own earlier calls (the most recent first, distinct, that many at most) start at once, before the target
decodes a token, since agents repeat calls (a retry, a refresh, the same lookup for another step). A hit says which
source served it (:attr:`AgentStep.hit_source`: ``"guess"`` or ``"history"``); a key both sources guessed is the
first one's (history, started at arrival).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ooospec.runtime.agent.chat import ChatModel, ChatTurn
from ooospec.runtime.agent.tools import HISTORY, SpeculativeTools
from ooospec.runtime.calls import call_key
from ooospec.runtime.drafters.hints import CallGuess

GUESS_TIMEOUT_S = 120.0   # a watcher stops waiting for a guess after this (the turn is long over by then)


@dataclass
class AgentStep:
    """One turn of the loop."""

    turn: int
    text: str
    call: dict | None               # the target's (first) call; None = the final answer
    result: str | None              # the tool message's content
    ok: bool | None                 # the tool run succeeded
    hit: bool | None                # served from a speculative run (None: no call)
    guess: dict | None              # the guessed call, when one was ready before the target's call was complete
    prompt_tokens: int
    cached_tokens: int
    origin: str
    gen_s: float                    # the target's turn (render + decode)
    tool_wait_s: float              # waiting for the tool after the call was complete
    finish_reason: str
    wave: dict | None = None        # the sidecar wave gate's decision for the turn (None: no gate decided)
    hit_source: str | None = None   # a hit: who guessed it ("guess": the turn's guess, "history": an earlier call)


@dataclass
class AgentRun:
    steps: list[AgentStep] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)    # the conversation at the end
    wall_s: float = 0.0


def candidate_calls(guess: CallGuess, call: dict | None, top_k: int) -> list[dict]:
    """The calls to run speculatively once ``guess`` gave ``call``: ``call``, then the other candidates of its
    bank (a function-first wave's next likeliest functions, joined), ``top_k`` at most."""
    if call is None:
        return []
    bank = guess.poll()
    others = [c for c in (getattr(bank, "calls", None) or []) if c != call]
    return ([call] + others)[:max(top_k, 1)]


def earlier_calls(steps: Sequence[AgentStep], limit: int) -> list[dict]:
    """The calls of ``steps`` (earlier turns), most recent first, each distinct call once, ``limit`` at most."""
    out, seen = [], set()
    for step in reversed(steps):
        if len(out) >= limit:
            break
        if step.call is None:
            continue
        try:
            key = call_key(step.call)
        except TypeError:
            continue
        if key not in seen:
            seen.add(key)
            out.append(step.call)
    return out


class _Watcher:
    """Hands a turn's guessed call (and up to ``top_k - 1`` other candidates of its bank) to the speculative cache
    once it is ready, unless the turn is over.

    A call ready at arrival (a :class:`~ooospec.runtime.drafters.hints.HintBank`, a wave already answered) is handed
    over here, before the turn decodes, so its speculative run never races the target; a later one by a watcher thread.
    """

    def __init__(self, guess: CallGuess, tools: SpeculativeTools, top_k: int = 1):
        self.guess, self.tools, self.top_k = guess, tools, top_k
        self.call: dict | None = None
        self._lock = threading.Lock()
        self._over = False
        self.thread: threading.Thread | None = None
        ready = guess.wait_call(0.0)
        if ready is not None:
            self._hand_over(ready)
        else:
            self.thread = threading.Thread(target=self._run, name="guess-watcher", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        self._hand_over(self.guess.wait_call(GUESS_TIMEOUT_S))

    def _hand_over(self, call: dict | None) -> None:
        with self._lock:
            if call is None or self._over:
                return
            self.call = call
            for candidate in candidate_calls(self.guess, call, self.top_k):
                self.tools.speculate(candidate)

    def close(self) -> dict | None:
        """End the turn for speculation; the guessed call if it was ready before this."""
        with self._lock:
            self._over = True
            return self.call


def run_agent(chat: ChatModel, messages: Sequence[Any], tools: Sequence[Any] | Callable[[int], Sequence[Any]],
              executor: SpeculativeTools, *,
              max_turns: int = 8, max_new_tokens: int = 256,
              guess: Callable[[list[dict], list, int], CallGuess | None] | None = None,
              on_turn: Callable[[int], None] | None = None,
              on_tool_start: Callable[[list[dict], list], None] | None = None,
              speculate_top_k: int = 1, speculate_history: int = 0) -> AgentRun:
    """Run the loop from ``messages`` until the target answers without a call, or ``max_turns`` turns.

    Args:
        chat: the target; its ``sessions`` decide whether turns keep the KV.
        tools: the tools shown to the model (OpenAI shape), or ``turn -> tools`` when they change between turns
            (e.g. a tool search that reveals new tools).
        executor: the tools (``executor.registry``) and the speculative cache.
        guess: ``(messages, tools, turn) -> CallGuess | None``, started at each turn's arrival; None = no
            speculation (every call runs after it is complete).
        on_turn: called with the turn index before the turn starts (e.g. a replay moving to its next
            recorded responses).
        on_tool_start: ``(messages, tools)`` when a call is about to run, with the conversation up to and with
            the call: the idle window while the tool runs (e.g. ``SidecarClient.prefill`` computes the sidecar's
            next block then, so the next turn's wave prefills only the tool result). Must not block.
        speculate_top_k: how many candidate calls of a guess run speculatively (the guessed call, then its bank's
            other candidates: a function-first wave's next likeliest functions); each costs a tool run.
        speculate_history: how many of the loop's earlier calls (most recent first, distinct) run speculatively
            at each turn's arrival (0: none); each costs a tool run (side-effect-free tools only, as any guess).
    """
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    if speculate_history < 0:
        raise ValueError(f"speculate_history must be >= 0, got {speculate_history}")
    run = AgentRun(messages=list(messages))
    t_start = time.perf_counter()
    for turn in range(max_turns):
        if on_turn is not None:
            on_turn(turn)
        executor.clear()
        turn_tools = list(tools(turn) if callable(tools) else tools)
        g, watcher = _arrive(run, turn_tools, turn, executor, guess, speculate_top_k, speculate_history)
        ct, guessed, gen_s = _decode_turn(chat, run.messages, turn_tools, g, watcher, max_new_tokens)
        # the guess learns what its wave cost and saved (a chat reports only the waves it sent itself)
        wave = g.report(ct.result, None, ct.calls) if g is not None else None
        call = ct.calls[0] if ct.calls else None
        step = AgentStep(turn, ct.text, call, None, None, None, guessed, ct.prompt_tokens, ct.cached_tokens,
                         ct.origin, gen_s, 0.0, ct.finish_reason, wave)
        run.steps.append(step)
        if call is None:
            break
        _run_call(run, step, turn_tools, executor, g, on_tool_start)
    run.wall_s = time.perf_counter() - t_start
    return run


def _arrive(run: AgentRun, turn_tools: list, turn: int, executor: SpeculativeTools,
            guess: Callable[[list[dict], list, int], CallGuess | None] | None, speculate_top_k: int,
            speculate_history: int) -> tuple[CallGuess | None, _Watcher | None]:
    """A turn's arrival: start its guess, then the loop's earlier calls (``speculate_history``), then the watcher
    that hands the guess's call to the speculative cache. Returns ``(guess, watcher)``, both None without a guess."""
    g = guess(run.messages, turn_tools, turn) if guess is not None else None
    # after the guess starts (an emulated guess may run its wave first, untimed), before it can hand a call over
    for earlier in earlier_calls(run.steps, speculate_history):
        executor.speculate(earlier, source=HISTORY)
    watcher = _Watcher(g, executor, speculate_top_k) if g is not None else None
    return g, watcher


def _decode_turn(chat: ChatModel, messages: list[dict], turn_tools: list, g: CallGuess | None,
                 watcher: _Watcher | None, max_new_tokens: int) -> tuple[ChatTurn, dict | None, float]:
    """The target decodes the turn (drafting from the guess when its method takes hints); the turn is then over
    for speculation and the guess is cancelled, however the decode ended. Returns ``(turn, the guessed call if it
    was ready before the turn ended, the turn's seconds)``."""
    t0 = time.perf_counter()
    try:
        ct = chat.complete(messages, turn_tools, max_new_tokens=max_new_tokens,
                           hints=g if chat.takes_hints else None)
    finally:
        guessed = watcher.close() if watcher is not None else None
        if g is not None:
            g.cancel()
    return ct, guessed, time.perf_counter() - t0


def _run_call(run: AgentRun, step: AgentStep, turn_tools: list, executor: SpeculativeTools, g: CallGuess | None,
              on_tool_start: Callable[[list[dict], list], None] | None) -> None:
    """The turn's call joins the conversation and runs (its speculative result when one matches); ``step`` gets
    the result and the guess hears how the tool went; the tool message joins the conversation."""
    run.messages.append({"role": "assistant", "content": "",
                         "tool_calls": [{"type": "function", "function": step.call}]})
    if on_tool_start is not None:
        on_tool_start(list(run.messages), turn_tools)
    res = executor.resolve(step.call)
    step.result, step.ok, step.hit, step.tool_wait_s = res.result.content, res.result.ok, res.hit, res.wait_s
    step.hit_source = res.source
    if g is not None:
        # the guess's own hit (a call the history already ran was not the wave's to save)
        g.observe_tool(res.result.elapsed_s, (res.hit and res.source != HISTORY) if step.guess is not None else None)
    run.messages.append({"role": "tool", "content": res.result.content})
