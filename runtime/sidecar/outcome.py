"""What one finished request tells the wave gate: a :class:`WaveOutcome` (:func:`outcome_of`), built from the
engine's result, the hint drafter's stats and the sidecar client's timings.

Two measurements go into it: the target's slowdown while the wave ran (:func:`interference_sample`: the target's
steps against its idle step time, over the window the wave was in flight) and, per argument of the calls the
target wrote, whether its value was in the request verbatim (:func:`verbatim_slots`: prompt lookup drafts those,
so the gate stops asking the sidecar for them). :meth:`~ooospec.runtime.sidecar.gate.WaveGate.observe` learns from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ooospec.runtime.calls import compact_json
from ooospec.runtime.sidecar.gate_decision import WaveDecision
from ooospec.runtime.sidecar.gate_pricing import Kind


@dataclass(frozen=True)
class WaveOutcome:
    """What one finished request tells the gate (see :func:`outcome_of`)."""

    key: str
    kind: Kind
    call_tokens: int                 # tokens the target generated
    tokens_after_ready: int          # of which committed at or after the step that found the bank (0: never)
    accepted_hint_tokens: int
    target_prefill_s: float
    target_decode_s: float
    idle_step_s: tuple[float, ...]   # seconds of the decode steps that ran with no wave in flight
    client_s: float = 0.0            # the target process's sidecar work
    server: Mapping[str, Any] = field(default_factory=dict)   # the server's wave timings ({} when none came)
    wave_s: float | None = None      # client-seen latency of the wave
    num_queries: int = 0
    block_chars: int = 0
    query_chars: int = 0
    interference: tuple[float, float] | None = None   # (target seconds lost, sidecar compute seconds overlapped)
    verbatim: tuple[tuple[str, str, bool], ...] = ()  # (tool, parameter, value in the request verbatim)
    values: tuple[tuple[str, str, int], ...] = ()     # (tool, parameter, characters of the value the target wrote)
    model_latency_s: float = 0.0     # the sent wave's latency as the gate's model priced it (WaveDecision's)


def verbatim_slots(calls: Sequence[Mapping], messages: Sequence[Any]) -> tuple[tuple[str, str, bool], ...]:
    """For each argument of ``calls`` (what the target wrote): whether its value's text occurs in the request.

    A string value is looked up as is, any other as compact JSON: ``{"city": "Paris"}`` after "Weather in Paris?"
    gives ``(("get_weather", "city", True),)``.
    """
    text = "\n".join(str(m.get("content") or "") for m in messages if isinstance(m, Mapping))
    return tuple((fn, p, bool(value) and value in text) for fn, p, value in argument_texts(calls))


def value_chars(calls: Sequence[Mapping]) -> tuple[tuple[str, str, int], ...]:
    """For each argument of ``calls``: its value's length in characters, what a sidecar decodes to answer that slot
    (the gate prices a slot query's decode forwards by it). ``{"city": "Paris"}`` of ``get_weather`` ->
    ``(("get_weather", "city", 5),)``."""
    return tuple((fn, p, len(value)) for fn, p, value in argument_texts(calls))


def argument_texts(calls: Sequence[Mapping]) -> list[tuple[str, str, str]]:
    """``(tool, parameter, the value's text)`` per argument of ``calls``: a string as is, any other value as compact
    JSON, ``null`` as the empty text."""
    out = []
    for call in calls:
        args = call.get("arguments")
        if not isinstance(args, Mapping):
            continue
        for p, v in args.items():
            out.append((str(call.get("name")), str(p), v if isinstance(v, str) else compact_json(v) if v is not None
                        else ""))
    return out


def interference_sample(segments: Sequence[tuple[float, float, float]], window: tuple[float, float],
                        compute_s: float) -> tuple[float, float] | None:
    """``(target seconds lost, sidecar compute seconds overlapped)`` while a wave was in flight, or None.

    Args:
        segments: the target's work as ``(start, actual seconds, expected idle seconds)`` from arrival (its
            prefill and decode steps; an expected value < 0 = unknown, skipped).
        window: ``(sent, response)`` of the wave, seconds from arrival.
        compute_s: the server's compute for the wave (prefill + decode), spread evenly over the window.

    Each segment counts with the fraction of it inside the window: ``lost = sum f * (actual - expected)``,
    ``overlapped = compute_s * (covered time / window length)``. ``[(0, 1.5, 1.0)]`` under a wave ``(0, 1)``
    that computed 0.8 s: f = 2/3, lost 1/3 s, overlapped 0.8 s.
    """
    lo, hi = window
    if hi <= lo or compute_s <= 0:
        return None
    lost = covered = 0.0
    for start, actual, expected in segments:
        if expected < 0 or actual <= 0:
            continue
        inside = max(0.0, min(hi, start + actual) - max(lo, start))
        if inside > 0:
            lost += inside / actual * (actual - expected)
            covered += inside
    if covered <= 0:
        return None
    return lost, compute_s * min(1.0, covered / (hi - lo))


def outcome_of(decision: WaveDecision, result, hint_stats, request_stats, calls: Sequence[Mapping],
               messages: Sequence[Any]) -> WaveOutcome:
    """A :class:`WaveOutcome` from one request's engine result, HintDrafter stats and sidecar request stats.

    Args:
        decision: what the gate decided for the request.
        result: the engine's :class:`~ooospec.runtime.engine.GenerationResult`.
        hint_stats: :meth:`~ooospec.runtime.drafters.hints.HintDrafter.stats` of the request (with the result).
        request_stats: the client's :class:`~ooospec.runtime.sidecar.client.RequestStats`.
        calls: the calls the target wrote (``{"name", "arguments"}``), for the verbatim rates.
        messages: the request's messages.
    """
    st = request_stats
    steps = list(result.steps)
    ready = hint_stats.ready_step if hint_stats is not None else None
    after = 0 if ready is None else sum(s.new_tokens for s in steps[ready:])
    # the target's timeline from arrival: prefill, then the steps one after the other
    wave_lo = None if st.sent_t is None else st.sent_t - st.arrival_t
    wave_hi = None if st.response_t is None else st.response_t - st.arrival_t
    t = result.prefill_s
    timeline = []
    for s in steps:
        d = s.t_draft + s.t_forward
        timeline.append((t, d))
        t += d
    if wave_lo is None:          # no wave went out: every step ran alone
        idle = tuple(d for _, d in timeline)
    else:                        # a wave with no response may have run to the end
        end = float("inf") if wave_hi is None else wave_hi
        idle = tuple(d for start, d in timeline if start >= end or start + d <= wave_lo)
    sample = None
    sv = st.server or {}
    if wave_lo is not None and wave_hi is not None and idle:
        expected = sum(idle) / len(idle)
        segments = [(start, d, expected) for start, d in timeline]
        sample = interference_sample(segments, (wave_lo, wave_hi),
                                     (sv.get("prefill_s") or 0.0) + (sv.get("decode_s") or 0.0))
    wave = decision.wave
    return WaveOutcome(
        key=decision.key, kind=decision.kind, call_tokens=len(result.tokens), tokens_after_ready=after,
        accepted_hint_tokens=(hint_stats.num_accepted_tokens or 0) if hint_stats is not None else 0,
        target_prefill_s=result.prefill_s, target_decode_s=result.decode_s, idle_step_s=idle,
        client_s=st.build_s + (hint_stats.match_s if hint_stats is not None else 0.0), server=sv,
        wave_s=st.wave_s, num_queries=st.n_queries,
        block_chars=len(wave.block) if wave is not None else 0,
        query_chars=sum(len(q.text) for q in wave.queries) if wave is not None else 0,
        interference=sample, verbatim=verbatim_slots(calls, messages), values=value_chars(calls),
        model_latency_s=decision.model_latency_s)
