"""A request's ``extra_args`` for the vLLM proposer, checked before anything is built from them (pure, no vLLM).

The keys and what they carry are listed in :mod:`ooospec.runtime.vllm.proposer`. They come from whoever sends the
request, so every value is read on its own and checked in bounded time and memory: a value that is malformed,
of the wrong type or over a bound reads as absent and is named in :attr:`RequestArgs.faults`. A request then
loses at most the drafts that value would have fed; its output is vLLM's greedy output either way::

    args = parse({"ooospec_tools": "[{...}]", "ooospec_hint": 3})
    args.tools       # the decoded tool list
    args.hint        # None
    args.faults      # [("ooospec_hint", "expected a string, got int")]

Bounds, checked before decoding where they can be:

    MAX_XARG_CHARS   JSON text (tools, messages); a longer value is refused unread (1 MiB)
    MAX_HINT_CHARS   hint text and a hint schedule's JSON: a hint bank indexes every n-gram of 7 views of each call
    MAX_XARG_DEPTH   nesting of a decoded value (64, as for validated schemas; deeper JSON fails without recursing)
    MAX_TOOLS        functions in a toolbox
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ooospec.runtime.schemas import MAX_JSON_DEPTH, within_depth

XARG_SWITCH, XARG_TOOLS, XARG_MESSAGES, XARG_HINT = "ooospec", "ooospec_tools", "ooospec_messages", "ooospec_hint"
XARG_SCHEDULE, XARG_HISTORY = "ooospec_hint_schedule", "ooospec_history"
KNOWN_XARGS = (XARG_SWITCH, XARG_TOOLS, XARG_MESSAGES, XARG_HINT, XARG_SCHEDULE, XARG_HISTORY)
OFF = "off"                       # ``ooospec: "off"``: the request is decoded without drafts

MAX_XARG_CHARS = 1 << 20          # characters of a JSON value (tools, messages)
MAX_HINT_CHARS = 1 << 14          # characters of a hint text or a hint schedule (a call is rarely over 2 KiB)
MAX_XARG_DEPTH = MAX_JSON_DEPTH   # nesting of a decoded value
MAX_TOOLS = 512                   # functions in a toolbox (the schema FSM and the sidecar wave take them all)
MAX_HISTORY_NAME = 128            # characters of an ``ooospec_history`` name
MAX_SCHEDULED_BANKS, MAX_SCHEDULED_CALLS = 8, 4   # a schedule's bound (a function-first wave has 2 banks of <= 3)
MAX_RELEASE_S = 3600.0            # the latest release time in a schedule


@dataclass
class RequestArgs:
    """One request's checked ``extra_args``; a refused value reads as absent.

    Attributes:
        off: the request opted out (``ooospec: "off"``): no drafters, no sidecar wave; nothing else is read.
        tools: its tool schemas (``[]``: none).
        messages: its conversation, for the sidecar wave.
        hint: a predicted call as text.
        schedule: ``[(after_s, [{"name", "arguments"}, ...]), ...]``, hints released late.
        history: the drafter history it reads and feeds (``""``: the default one).
        faults: ``[(key, why)]`` for each value refused.
    """

    off: bool = False
    tools: list = field(default_factory=list)
    messages: list | None = None
    hint: str | None = None
    schedule: list[tuple[float, list[dict]]] | None = None
    history: str = ""
    faults: list[tuple[str, str]] = field(default_factory=list)


def parse(extra: object) -> RequestArgs:
    """``extra`` (vLLM's ``SamplingParams.extra_args``) as :class:`RequestArgs`; never raises."""
    if extra is None:
        return RequestArgs()
    if not isinstance(extra, Mapping):
        return RequestArgs(faults=[("extra_args", f"expected a mapping, got {type(extra).__name__}")])
    faults: list[tuple[str, str]] = []

    def read(key: str, reader: Callable[[object], object]):
        value = extra.get(key)
        if value is None:
            return None
        try:
            return reader(value)
        except (TypeError, ValueError) as e:
            faults.append((key, str(e)))
            return None

    if read(XARG_SWITCH, _switch) == OFF:
        return RequestArgs(off=True, faults=faults)
    unknown = sorted(str(k)[:40] for k in extra if str(k).startswith("ooospec") and k not in KNOWN_XARGS)
    if unknown:
        faults.append(("unknown", f"unknown ooospec extra args {unknown[:8]} (known: {list(KNOWN_XARGS)})"))
    return RequestArgs(tools=read(XARG_TOOLS, _tools) or [], messages=read(XARG_MESSAGES, json_list),
                       hint=read(XARG_HINT, _hint), schedule=read(XARG_SCHEDULE, _schedule),
                       history=read(XARG_HISTORY, _history) or "", faults=faults)


def json_list(value: object, max_chars: int = MAX_XARG_CHARS) -> list:
    """``value`` as a list: JSON text (at most ``max_chars`` characters, refused before decoding) or a list
    already (vLLM's Python API), nesting at most :data:`MAX_XARG_DEPTH` deep.

    Raises:
        ValueError: too long, not JSON, or too deep. TypeError: not text or a list, or JSON of another type.
    """
    if isinstance(value, str):
        if len(value) > max_chars:
            raise ValueError(f"{len(value)} characters of JSON, more than {max_chars}")
        try:
            value = json.loads(value)
        except RecursionError:
            raise ValueError(f"JSON nests deeper than {MAX_XARG_DEPTH}") from None
    if not isinstance(value, list):
        raise TypeError(f"expected a JSON list, got {type(value).__name__}")
    if not within_depth(value, MAX_XARG_DEPTH):
        raise ValueError(f"JSON nests deeper than {MAX_XARG_DEPTH}")
    return value


def _switch(value: object) -> str:
    if not isinstance(value, str) or value != OFF:
        raise ValueError(f"expected {OFF!r} (the only value), got {_short(value)}")
    return OFF


def _tools(value: object) -> list:
    tools = json_list(value)
    if len(tools) > MAX_TOOLS:
        raise ValueError(f"{len(tools)} tools, more than {MAX_TOOLS}: no schema FSM or sidecar wave for them")
    return tools


def _hint(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    if len(value) > MAX_HINT_CHARS:
        raise ValueError(f"{len(value)} characters of hint, more than {MAX_HINT_CHARS}")
    return value


def _history(value: object) -> str:
    if not isinstance(value, str) or len(value) > MAX_HISTORY_NAME:
        raise ValueError(f"expected a string of at most {MAX_HISTORY_NAME} characters, got {_short(value)}")
    return value


def _schedule(value: object) -> list[tuple[float, list[dict]]]:
    """``[[after_s, calls], ...]`` with ``0 <= after_s <`` :data:`MAX_RELEASE_S` and calls ``{"name",
    "arguments"}``, at most :data:`MAX_SCHEDULED_BANKS` banks of :data:`MAX_SCHEDULED_CALLS` calls."""
    schedule = json_list(value, MAX_HINT_CHARS)
    if len(schedule) > MAX_SCHEDULED_BANKS:
        raise ValueError(f"{len(schedule)} banks, more than {MAX_SCHEDULED_BANKS}")
    pairs = []
    for entry in schedule:
        if not isinstance(entry, (list, tuple)) or len(entry) != 2 or not isinstance(entry[1], (list, tuple)):
            raise TypeError(f"expected [after_s, [call, ...]], got {_short(entry)}")
        t, calls = float(entry[0]), entry[1]
        if not 0 <= t < MAX_RELEASE_S:
            raise ValueError(f"release time {t} outside [0, {MAX_RELEASE_S}) s")
        if len(calls) > MAX_SCHEDULED_CALLS:
            raise ValueError(f"{len(calls)} calls in a bank, more than {MAX_SCHEDULED_CALLS}")
        if not all(isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("arguments"), dict)
                   for c in calls):
            raise TypeError('expected calls {"name": str, "arguments": object}')
        pairs.append((t, [{"name": c["name"], "arguments": c["arguments"]} for c in calls]))
    return pairs


def _short(value: object) -> str:
    """A value for a log line: its type and at most 40 characters of it."""
    text = repr(value[:41]) if isinstance(value, str) else repr(value) if isinstance(value, (int, float)) \
        else type(value).__name__
    return text[:40] + ("..." if len(text) > 40 else "")
