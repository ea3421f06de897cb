"""The wave gate's pricing model: what a request's sidecar wave is expected to save the target, and to cost it.

A wave (:func:`~ooospec.runtime.sidecar.prompts.build_wave`) is not free: the sidecar prefills a ~350-token block
and decodes ~5 forwards, and when it shares cores with the target every second of that compute slows the target's
own forwards. On two shared CPU cores a full wave costs more than its hints save. So, per request, the gate
weighs three options -- ``skip`` (no wave), ``index`` (the function-index query only; not for a toolbox of one
tool, whose name the schema FSM drafts) and ``slots`` (the index plus
the argument slots whose value the target does not usually copy verbatim from the request, which prompt lookup
drafts anyway) -- and takes the one with the largest expected net saving (``skip``'s is 0; ties go to the cheaper)::

    latency(o)  = wave_scale(o) * latency_factor * compute(o)       when the bank is ready, from arrival
    compute(o)  = prefill_per_token * (block + query tokens)        the sidecar's seconds for option o
                + forwards(o) * (decode_forward + decode_per_query * num_queries)
    forwards(slots) >= 2 + longest value / chars_per_token           where the target's values for its slots were seen
    before(o)   = max(0, latency(o) - target_prefill) / target_token_s      call tokens committed before ready
    saving(o)   = accept_rate(o) * max(0, call_tokens - before(o)) * marginal * step_s
                + [o = slots] hit_rate * min(tool_s, max(0, call_end - latency(o)))        speculative tools
    call_end    = target_prefill + call_tokens * target_token_s
    cost(o)     = interference * wave_scale(o) * compute(o) + client_s
    choose argmax over o of saving(o) - cost(o), with skip = 0

    target_waits (wave-first: the target starts once the bank is ready): before(o) = 0, cost(o) = latency(o) + client_s

``wave_scale(o)``: a tool set's waves of o's kind, their measured latency over what this model priced them at, shrunk
toward 1 (the model's own ratios learn across tool sets): what the model misses for one toolbox (long free-text
values, a second candidate's slots) is learnt from the waves it sent; an ``index`` wave (one forward) says nothing
of a ``slots`` wave's values, so the two are kept apart.
``accept_rate(o)``: hint tokens accepted per call token generated after the bank was ready (HintDrafter stats),
per option kind, per tool set shrunk toward the across-tool-sets estimate; in vLLM the accepted tokens only the
hints had proposed (the proposer's counters, :data:`~ooospec.runtime.vllm.proposer.HINT_COUNTERS`);
``call_tokens``: the expected call length for this tool set; ``step_s``: the target's seconds per decode step on
this machine (``T(1)`` of its :class:`~ooospec.runtime.backends.cost_model.ForwardCost` when given, else measured
steps); ``marginal``: target forwards a hint-accepted token saves (most tokens a hint proposes, the schema FSM and
prompt lookup propose as well);
``interference``: target seconds lost per second of sidecar compute (0 when the sidecar has its own cores or
accelerator, ~1 when it shares them). In an agent loop the joined call of a ``slots`` wave also starts a
side-effect-free tool early (:class:`~ooospec.runtime.agent.tools.SpeculativeTools`): on a hit the tool runs while the
target still decodes, so the wave saves up to the tool's latency ``tool_s`` (learnt per tool set from the tools the
loop ran, :meth:`~ooospec.runtime.sidecar.gate.WaveGate.observe_tool`; 0 outside an agent loop) with probability
``hit_rate`` (learnt from the turns a joined call was ready for). Every quantity but ``marginal`` is learnt online
(:meth:`~ooospec.runtime.sidecar.gate.WaveGate.observe`) from each finished request's
:class:`~ooospec.runtime.sidecar.outcome.WaveOutcome` (the target's timings and its slowdown while the wave ran, the
HintDrafter stats, the server's wave timings) as running sums started from the deployment's calibrated prior
(:data:`~ooospec.runtime.sidecar.deployments.DEPLOYMENTS`, worth ``prior_weight`` requests). The prior's sidecar
compute was measured on another machine; a client replaces it with what the sidecar server measured on this one
(``/health`` ``calibration``, :meth:`~ooospec.runtime.sidecar.gate.WaveGate.calibrate`): a Xeon with AMX prefills bf16
several times faster than a core without it.

Worked example (the ``shared`` prior; a 350-token block, 9 queries, step_s 0.19 s, 55-token calls)::

    compute(slots) = 0.0011 * 380 + 5 * (0.045 + 0.003 * 9) = 0.78 s;  cost = 1.0 * 0.78 + 0.005 = 0.79 s
    saving(slots)  = 0.2 * 55 * 0.1 * 0.19 = 0.21 s   (the bank is ready before the target's 1 s prefill ends)
    -> skip.   With the ``split`` prior (interference 0.05): cost = 0.044 s -> slots.

This module owns the model and nothing else; all of it is pure: :class:`Estimates` (the point estimates one
decision uses), :func:`calibrated` (a prior priced with the sidecar compute measured on this machine),
:class:`Option` (one way to serve a request's hints) and the price of an option (:func:`wave_compute_s`,
:func:`wave_latency_s`, :func:`expected_saving_s`, :func:`expected_cost_s`). Which option a request gets is
:mod:`~ooospec.runtime.sidecar.gate_decision`; the online estimates, :mod:`~ooospec.runtime.sidecar.gate`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ooospec.runtime.sidecar import prompts as sp

Kind = Literal["skip", "index", "slots"]
KINDS: tuple[Kind, ...] = ("skip", "index", "slots")


@dataclass(frozen=True)
class Estimates:
    """The point estimates one decision uses (see the module docstring for each symbol). Seconds unless named."""

    interference: float          # target seconds lost per second of sidecar compute
    latency_factor: float        # wave latency (client-seen) / sidecar compute
    prefill_per_token: float     # sidecar prefill per block + query token
    decode_forward: float        # sidecar decode forward, fixed part
    decode_per_query: float      # + per query branch in that forward
    forwards: Mapping[str, float]     # kind -> sidecar decode forwards of a wave of that kind
    accept_rate: Mapping[str, float]  # kind -> hint tokens accepted per call token after the bank is ready
    marginal: float              # target forwards saved per hint-accepted token
    step_s: float                # target seconds per decode step
    call_tokens: float           # expected tokens in the target's call
    target_prefill: float        # target prefill seconds
    target_token_s: float        # target decode seconds per committed token
    client_s: float              # the target process's own sidecar work (wave texts, join, views, tokenize)
    chars_per_token: float       # sidecar tokens of the block = chars / this
    hit_rate: float              # P(a slots wave's joined call is the call the target commits)
    tool_s: float = 0.0          # latency of the tool a call runs (agent loops; 0: no tool runs on a guess)
    target_waits: bool = False   # the target starts only once the wave is ready (wave-first): no call token is
    #                              committed before the bank, and the whole wave latency is the target's delay
    wave_scale: Mapping[str, float] = field(default_factory=dict)   # kind -> measured wave latency / this
    #                              model's (latency_factor * compute), learnt per tool set (absent: 1)


def calibrated(prior: Estimates, measured: Mapping[str, Any]) -> Estimates:
    """``prior`` with the sidecar's compute measured on this machine by its server
    (:func:`~ooospec.runtime.sidecar.wave.measure_wave_cost`, reported in ``/health`` as ``calibration``): its prefill
    seconds per token, and the decode forward pair scaled so that a forward of ``num_queries`` queries costs what
    was measured. Raises ValueError for a measurement that is not a positive number of seconds under 10.

    >>> from ooospec.runtime.sidecar.deployments import SHARED
    >>> est = calibrated(SHARED.prior, {"prefill_per_token": 0.004, "decode_forward_s": 0.144, "num_queries": 9})
    >>> est.prefill_per_token, round(est.decode_forward + 9 * est.decode_per_query, 3), round(est.decode_forward, 3)
    (0.004, 0.144, 0.09)
    """
    try:
        prefill, forward, q = (float(measured["prefill_per_token"]), float(measured["decode_forward_s"]),
                               int(measured["num_queries"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"calibration needs prefill_per_token, decode_forward_s and num_queries: {e!r}") from None
    if not (0 < prefill < 10 and 0 < forward < 10 and 0 <= q <= 4096):
        raise ValueError(f"calibration out of range: prefill_per_token={prefill}, decode_forward_s={forward}, "
                         f"num_queries={q}")
    scale = forward / (prior.decode_forward + prior.decode_per_query * q)
    return replace(prior, prefill_per_token=prefill, decode_forward=prior.decode_forward * scale,
                   decode_per_query=prior.decode_per_query * scale)


# ------------------------------------------------------------------------------------------ pure estimates


@dataclass(frozen=True)
class Option:
    """One way to serve a request's hints: a wave of these queries (none for ``skip``)."""

    kind: Kind
    queries: tuple[sp.SlotQuery, ...]
    block_chars: int
    cached_chars: int = 0        # of the block, what the server's prefix cache is expected to hold
    forwards: float | None = None   # its decode forwards when known better than ``est.forwards`` (long values)


def wave_compute_s(option: Option, est: Estimates) -> float:
    """The sidecar's seconds for ``option``: prefill of block + query tokens, then its decode forwards."""
    if option.kind == "skip":
        return 0.0
    tokens = (option.block_chars - option.cached_chars + sum(len(q.text) for q in option.queries)) / est.chars_per_token
    forward = est.decode_forward + est.decode_per_query * len(option.queries)
    forwards = est.forwards[option.kind] if option.forwards is None else option.forwards
    return est.prefill_per_token * tokens + forwards * forward


def model_latency_s(option: Option, est: Estimates) -> float:
    """The wave's latency from arrival as the model prices it, before the learnt ``wave_scale``."""
    return est.latency_factor * wave_compute_s(option, est)


def wave_latency_s(option: Option, est: Estimates) -> float:
    """The wave's expected latency from arrival: the model's, scaled by what the waves sent so far measured."""
    return est.wave_scale.get(option.kind, 1.0) * model_latency_s(option, est)


def expected_saving_s(option: Option, est: Estimates) -> float:
    """Target seconds the option's hints are expected to save (0 for ``skip``)."""
    if option.kind == "skip":
        return 0.0
    latency = wave_latency_s(option, est)
    before = 0.0 if est.target_waits else max(0.0, latency - est.target_prefill) / max(est.target_token_s, 1e-6)
    accepted = est.accept_rate[option.kind] * max(0.0, est.call_tokens - before)
    return accepted * est.marginal * est.step_s + expected_tool_saving_s(option, est, latency)


def expected_tool_saving_s(option: Option, est: Estimates, latency: float) -> float:
    """Seconds of tool latency a ``slots`` wave is expected to hide in an agent loop: its joined call starts the
    tool when the wave is ready (``latency`` s after arrival); on a hit the tool ran beside the rest of the call.

    >>> from ooospec.runtime.sidecar.deployments import SHARED
    >>> est = replace(SHARED.prior, tool_s=2.0, hit_rate=0.6)        # call ends at 1.0 + 55 * 0.1 = 6.5 s
    >>> round(expected_tool_saving_s(Option("slots", (), 0), est, latency=1.0), 3)
    1.2
    >>> round(expected_tool_saving_s(Option("slots", (), 0), est, latency=6.0), 3)   # ready 0.5 s before the end
    0.3
    >>> expected_tool_saving_s(Option("index", (), 0), est, latency=1.0)             # no call, no tool run
    0.0
    """
    if option.kind != "slots" or est.tool_s <= 0:
        return 0.0
    call_end = est.target_prefill + est.call_tokens * est.target_token_s
    return est.hit_rate * min(est.tool_s, max(0.0, call_end - latency))


def expected_cost_s(option: Option, est: Estimates) -> float:
    """Target seconds the option costs: the slowdown its compute inflicts, plus the target's own sidecar work."""
    if option.kind == "skip":
        return 0.0
    if est.target_waits:         # the target idles for the wave's whole latency, whatever the cores do meanwhile
        return wave_latency_s(option, est) + est.client_s
    return est.interference * est.wave_scale.get(option.kind, 1.0) * wave_compute_s(option, est) + est.client_s
