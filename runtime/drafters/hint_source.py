"""Where a request's hints come from: one decision, made here for the chat model, the vLLM proposer and the bench.

A request can carry several things a :class:`~ooospec.runtime.drafters.hints.CallGuess` can be made of
(:class:`HintInputs`). The first one present wins, in this order (:data:`SOURCE_KINDS`)::

    given      a guess made elsewhere (a caller's, an agent's)          -> used as it is
    schedule   [(after_s, calls), ...]: banks released late              -> ScheduledBanks (the dedicated emulation)
    calls      calls known at arrival (gold, the target's own: oracle)   -> HintBank of their views ([]: an empty bank)
    text       a predicted call as text (vLLM's ``ooospec_hint``)        -> HintBank of its calls, else of the text
    wave       the conversation and its tools, with a sidecar client    -> the client's wave, started now

A wave needs a sidecar client, tools and a conversation (``messages`` not None); without any of the above, or
when the client's ``submit`` returns None, the request has no hints (None). Only a wave is started here: whoever
resolved it cancels it and reports to it (:attr:`ResolvedHints.started`); the other guesses run nothing in the
background.

The sidecar client is taken, never imported (drafters do not import the sidecar): anything with
``submit(messages, tools, *, fmt, tokenizer[, arrival])`` returning a :class:`CallGuess`, such as
:class:`~ooospec.runtime.sidecar.client.SidecarClient`::

    hints = resolve_hints(HintInputs(text=hint_text, messages=messages, tools=tools), fmt, tokenizer,
                          sidecar=client, on_fault=faults)
    drafter = HintDrafter(hints.guess) if hints is not None else None

With ``on_fault`` a source that cannot be built is a fault (``on_fault(name, what)``: ``"sidecar"`` for a wave
that did not start, ``"hints"`` for the rest) and the request has no hints; without it the error propagates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ooospec.runtime.drafters.hints import CallGuess, HintBank, ScheduledBanks

GIVEN, SCHEDULE, CALLS, TEXT, WAVE = "given", "schedule", "calls", "text", "wave"
SOURCE_KINDS = (GIVEN, SCHEDULE, CALLS, TEXT, WAVE)     # precedence: the first one a request carries wins


@dataclass(frozen=True)
class HintInputs:
    """What one request carries that hints can be made of (see the module docstring; None / empty = absent)."""

    guess: CallGuess | None = None
    schedule: Sequence[tuple[float, Sequence[Mapping]]] | None = None
    calls: Sequence[Mapping] | None = None
    text: str | None = None
    messages: Sequence[Any] | None = None
    tools: Sequence[Any] = ()


@dataclass(frozen=True)
class ResolvedHints:
    """A request's hint source: which kind (:data:`SOURCE_KINDS`) and its guess."""

    kind: str
    guess: CallGuess

    @property
    def started(self) -> bool:
        """A sidecar wave started by :func:`resolve_hints`: the resolver's caller cancels it and reports to it."""
        return self.kind == WAVE


def source_kind(inputs: HintInputs, sidecar: object | None = None) -> str | None:
    """The kind of source ``inputs`` give (the first present, in :data:`SOURCE_KINDS` order); None: no hints."""
    if inputs.guess is not None:
        return GIVEN
    if inputs.schedule is not None:
        return SCHEDULE
    if inputs.calls is not None:
        return CALLS
    if inputs.text:
        return TEXT
    if sidecar is not None and inputs.tools and inputs.messages is not None:
        return WAVE
    return None


def text_bank(text: str, fmt: ModuleType, tokenizer) -> HintBank:
    """A predicted call given as text: the views of the calls ``fmt`` parses from it, else the text's own tokens
    (one view named ``"text"``)."""
    calls = fmt.parse_calls(text)
    if calls:
        return HintBank.from_calls(calls, fmt, tokenizer)
    return HintBank({"text": tokenizer(text, add_special_tokens=False)["input_ids"]})


def start_wave(sidecar, messages: Sequence[Any], tools: Sequence[Any], *, fmt: ModuleType, tokenizer,
               arrival: float | None = None) -> CallGuess:
    """The request's wave on ``sidecar`` (a client with ``submit``), started now; ``arrival`` is passed on only when
    given (the client's default is the moment of submission)."""
    timing = {} if arrival is None else {"arrival": arrival}
    return sidecar.submit(messages, tools, fmt=fmt, tokenizer=tokenizer, **timing)


def build_guess(kind: str, inputs: HintInputs, fmt: ModuleType, tokenizer, sidecar=None,
                arrival: float | None = None) -> CallGuess:
    """The guess of source ``kind`` (one of :data:`SOURCE_KINDS`) from ``inputs``."""
    if kind == GIVEN:
        return inputs.guess
    if kind == SCHEDULE:
        return ScheduledBanks.from_calls(inputs.schedule, fmt, tokenizer)
    if kind == CALLS:
        return HintBank.from_calls(inputs.calls, fmt, tokenizer)
    if kind == TEXT:
        return text_bank(inputs.text, fmt, tokenizer)
    if kind == WAVE:
        return start_wave(sidecar, inputs.messages, inputs.tools, fmt=fmt, tokenizer=tokenizer, arrival=arrival)
    raise ValueError(f"hint source kind {kind!r}: expected one of {list(SOURCE_KINDS)}")


def resolve_hints(inputs: HintInputs, fmt: ModuleType, tokenizer, *, sidecar=None, arrival: float | None = None,
                  on_fault: Callable[[str, str], None] | None = None) -> ResolvedHints | None:
    """The request's hint source (see the module docstring); None: no hints.

    Args:
        inputs: what the request carries.
        fmt, tokenizer: the TARGET's format module and tokenizer (banks are its token views).
        sidecar: a sidecar client (duck-typed, see the module docstring); None: no wave.
        arrival: ``time.perf_counter()`` at the request's arrival, for the wave's stats.
        on_fault: ``on_fault(name, what)`` for a source that cannot be built (then None); None: it raises.
    """
    kind = source_kind(inputs, sidecar)
    if kind is None:
        return None
    try:
        guess = build_guess(kind, inputs, fmt, tokenizer, sidecar, arrival)
    except Exception as e:
        if on_fault is None:
            raise
        name, what = ("sidecar", "wave not started") if kind == WAVE else ("hints", "not built")
        on_fault(name, f"{what}: {type(e).__name__}: {e}")
        return None
    return ResolvedHints(kind, guess) if guess is not None else None   # a client may start no wave: None
