"""The wave gate: send a request's sidecar wave only when the target time its hints save exceeds what it costs.

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
loop ran, :meth:`WaveGate.observe_tool`; 0 outside an agent loop) with probability ``hit_rate`` (learnt from the
turns a joined call was ready for). Every quantity but ``marginal`` is learnt online (:meth:`WaveGate.observe`)
from each finished request's :class:`~ooospec.runtime.sidecar.outcome.WaveOutcome` (the target's timings and its
slowdown while the wave ran, the HintDrafter stats, the server's wave timings) as running sums started from the
deployment's calibrated prior (:data:`~ooospec.runtime.sidecar.deployments.DEPLOYMENTS`, worth ``prior_weight``
requests). The prior's sidecar compute was measured on another machine; a client replaces it with what the sidecar
server measured on this one (``/health`` ``calibration``, :meth:`WaveGate.calibrate`): a Xeon with AMX prefills bf16
several times faster than a core without it.

Worked example (the ``shared`` prior; a 350-token block, 9 queries, step_s 0.19 s, 55-token calls)::

    compute(slots) = 0.0011 * 380 + 5 * (0.045 + 0.003 * 9) = 0.78 s;  cost = 1.0 * 0.78 + 0.005 = 0.79 s
    saving(slots)  = 0.2 * 55 * 0.1 * 0.19 = 0.21 s   (the bank is ready before the target's 1 s prefill ends)
    -> skip.   With the ``split`` prior (interference 0.05): cost = 0.044 s -> slots.

:func:`decide` and the estimate functions are pure; :class:`WaveGate` holds the online sums (thread-safe) and
logs each decision (:class:`WaveDecision`, ``to_dict()`` is what the bench rows and the chat turn stats carry).
The gate changes only which hints exist; output stays the target's greedy output.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from ooospec.runtime import schemas
from ooospec.runtime.sidecar import prompts as sp
from ooospec.runtime.sidecar.protocol import only_tool

if TYPE_CHECKING:
    from ooospec.runtime.sidecar.outcome import WaveOutcome

logger = logging.getLogger(__name__)

Kind = Literal["skip", "index", "slots"]
KINDS: tuple[Kind, ...] = ("skip", "index", "slots")
VERBATIM_THRESHOLD = 0.5    # a slot whose value the request held verbatim this often is left to prompt lookup
MAX_REMEMBERED_BLOCKS = 64  # blocks a gate remembers sending (its view of the server's prefix cache)


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


@dataclass(frozen=True)
class WaveDecision:
    """One request's decision and the estimate behind it (``to_dict()`` is the logged record)."""

    kind: Kind
    saving_s: float                      # expected target seconds saved by the chosen option
    cost_s: float                        # expected target seconds it costs
    queries: tuple[str, ...]             # what is asked: "index", "<tool>.<param>"
    dropped: tuple[str, ...]             # argument slots left to prompt lookup (value usually verbatim)
    options: Mapping[str, tuple[float, float]]   # kind -> (saving_s, cost_s) of every option weighed
    key: str                             # the tool set the stats are kept for
    probe: bool = False                  # sent to measure although the estimate said skip
    cached_chars: int = 0                # leading block characters expected in the server's prefix cache
    model_latency_s: float = 0.0         # the chosen option's latency as the model priced it (before wave_scale)
    wave: sp.Wave | None = field(default=None, compare=False, repr=False)   # the wave to send (None: skip)

    def to_dict(self) -> dict:
        return {"decision": self.kind, "expected_saving_s": round(self.saving_s, 4),
                "expected_cost_s": round(self.cost_s, 4), "queries": list(self.queries),
                "num_queries": len(self.queries), "dropped_verbatim": list(self.dropped),
                "options": {k: [round(s, 4), round(c, 4)] for k, (s, c) in self.options.items()},
                "probe": self.probe, "cached_chars": self.cached_chars,
                "model_latency_s": round(self.model_latency_s, 4)}


def query_name(q: sp.SlotQuery) -> str:
    if q.form == "function_index":
        return "index"
    return "call" if q.form == "direct_call" else f"{q.function}.{q.parameter}"


def verbatim_prior(schema: Any) -> float:
    """P(a slot's value is in the request verbatim) before evidence: an enum's values are in the prompt's tools
    block, so prompt lookup copies them (0.9); anything else 0.3 (asked until the target shows otherwise)."""
    return 0.9 if isinstance(schema, Mapping) and "enum" in schema else 0.3


def decide(wave: sp.Wave, tools: Sequence[Any], est: Estimates,
           verbatim: Mapping[tuple[str, str], tuple[float, float]] | None = None, key: str = "",
           probe: bool = False, cached_chars: int = 0,
           value_chars: Mapping[tuple[str, str], float] | None = None) -> WaveDecision:
    """Weigh skip / index / slots for ``wave`` (the request's full wave) and pick the best net saving.

    Args:
        wave: :func:`~ooospec.runtime.sidecar.prompts.build_wave` of the request.
        tools: the request's tools (for the verbatim priors of slots without evidence).
        est: the estimates for this request's tool set.
        verbatim: ``(tool, parameter) -> (times its value was in the request verbatim, times seen)`` so far;
            the rate is ``(found + 2 * prior) / (seen + 2)`` with :func:`verbatim_prior` of the slot's schema.
        key: the tool set (:func:`tools_key`), recorded in the decision.
        probe: send anyway: the best option other than skip (its estimate is still what is logged).
        cached_chars: the block's leading characters whose KV the sidecar server is expected to hold (a toolbox an
            earlier wave or :meth:`WaveGate.remember` sent): they cost no prefill.
        value_chars: ``(tool, parameter) -> mean characters of the values the target wrote there``: a wave decodes
            until its longest answer ends, so the ``slots`` option costs at least ``2 + longest / chars_per_token``
            forwards (the index, the value, its end) where its slots were seen (the prior's forwards come from short
            values; free-text ones take many more).
    Returns:
        the decision; its ``wave`` is the subset to send (None for skip).
    """
    schemas_of = {(schemas.tool_name(t), p): s for t in tools for p, s in sp.tool_parameters(t).items()}
    index = tuple(q for q in wave.queries if q.form == "function_index")
    kept, dropped = [], []
    for q in wave.queries:
        if q.form != "argument":
            continue
        found, seen = (verbatim or {}).get((q.function, q.parameter), (0.0, 0.0))
        p = (found + 2.0 * verbatim_prior(schemas_of.get((q.function, q.parameter)))) / (seen + 2.0)
        (dropped if p >= VERBATIM_THRESHOLD else kept).append(q)
    cached = min(cached_chars, len(wave.block))
    longest = max(((value_chars or {}).get((q.function, q.parameter), 0.0) for q in kept), default=0.0)
    forwards = max(est.forwards["slots"], 2.0 + longest / est.chars_per_token) if longest else None
    options = [Option("skip", (), 0), Option("index", index, len(wave.block), cached),
               Option("slots", index + tuple(kept), len(wave.block), cached, forwards)]
    if not kept:
        options.pop()            # slots would be the index wave again
    if only_tool(tools):
        options.pop(1)           # one tool: its name is known (the schema FSM drafts it); an index wave buys nothing
    scored = {o.kind: (expected_saving_s(o, est), expected_cost_s(o, est)) for o in options}
    candidates = options[1:] if probe and len(options) > 1 else options     # nothing to probe: skip
    best = max(candidates, key=lambda o: (scored[o.kind][0] - scored[o.kind][1], -KINDS.index(o.kind)))
    saving, cost = scored[best.kind]
    return WaveDecision(best.kind, saving, cost, tuple(query_name(q) for q in best.queries),
                        tuple(query_name(q) for q in dropped) if best.kind == "slots" else (), scored, key,
                        probe=probe, cached_chars=cached, model_latency_s=model_latency_s(best, est),
                        wave=None if best.kind == "skip" else sp.Wave(wave.block, best.queries))


def tools_key(tools: Sequence[Any]) -> str:
    """A short id of a tool set (its sorted tool names): the stats are kept per target (one gate) and tool set."""
    names = sorted(str(schemas.tool_name(t)) for t in tools)
    return hashlib.sha256(json.dumps(names).encode()).hexdigest()[:12]


class StepFit:
    """A target's seconds per decode step from whole requests (a client in front of vLLM sees no step times): the
    least-squares slope of request seconds over forwards, so the fixed part of a request (its prefill, the engine's
    per-request work) is not spread over its steps as the mean ``seconds / forwards`` would (that overprices a step
    by 7-55% on the ``toolspec`` rows of eval/reports/vllm-wave-first/, ``ooospec vllm-report``; and with it the
    hints' saving). The mean until ``min_points`` requests with
    different forwards give a slope, and wherever the slope is not in ``(0, mean]``.

    >>> fit = StepFit()
    >>> for forwards in (4, 8, 12, 16):
    ...     fit.add(forwards, 0.3 + 0.05 * forwards)     # 0.3 s of prefill, 50 ms a step
    >>> round(fit.step_s(), 4), round(fit.mean_step_s(), 4)
    (0.05, 0.08)
    """

    def __init__(self, min_points: int = 4):
        self.min_points = min_points
        self.n = self.sx = self.sy = self.sxx = self.sxy = 0.0

    def add(self, forwards: float, seconds: float) -> None:
        self.n += 1
        self.sx += forwards
        self.sy += seconds
        self.sxx += forwards * forwards
        self.sxy += forwards * seconds

    def mean_step_s(self) -> float | None:
        return self.sy / self.sx if self.sx > 0 else None

    def step_s(self) -> float | None:
        """The slope when it is defined and plausible, else the mean (None before any request)."""
        mean = self.mean_step_s()
        var = self.n * self.sxx - self.sx * self.sx
        if mean is None or self.n < self.min_points or var <= 1e-9:
            return mean
        slope = (self.n * self.sxy - self.sx * self.sy) / var
        return slope if 0 < slope <= mean else mean


# ------------------------------------------------------------------------------------------ the online gate


class _Mean:
    """A running ratio ``(num + w * prior) / (den + w)`` whose sums fade past ``max_den``."""

    __slots__ = ("den", "num")

    def __init__(self):
        self.num = self.den = 0.0

    def add(self, num: float, den: float, max_den: float) -> None:
        self.num += num
        self.den += den
        if self.den > max_den:
            self.num, self.den = self.num * max_den / self.den, max_den

    def value(self, prior: float, weight: float) -> float:
        return (self.num + weight * prior) / (self.den + weight)


class WaveGate:
    """Online estimates for one target and deployment, and the decision per request (thread-safe).

    Args:
        prior: the deployment's :class:`Estimates` (:data:`~ooospec.runtime.sidecar.deployments.DEPLOYMENTS`).
        cost: the target's :class:`~ooospec.runtime.backends.cost_model.ForwardCost`; ``T(1)`` becomes ``step_s`` and
        the
            prior's; None = learn ``step_s`` from the measured steps alone.
        prior_weight: how many requests' worth of evidence the prior is.
        probe_every: send the best non-skip option every N-th request even when skip wins (0 = never), so a
            skipping gate still measures the sidecar; deterministic (a counter).
        max_requests: evidence older than this many requests fades.
    """

    def __init__(self, prior: Estimates, *, cost=None, prior_weight: float = 4.0, probe_every: int = 0,
                 max_requests: float = 200.0):
        if prior_weight <= 0 or probe_every < 0 or max_requests <= 0:
            raise ValueError(f"need prior_weight > 0, probe_every >= 0, max_requests > 0, got {prior_weight}, "
                             f"{probe_every}, {max_requests}")
        self.prior = prior if cost is None else replace(prior, step_s=cost.seconds(1))
        self.prior_weight, self.probe_every, self.max_requests = prior_weight, probe_every, max_requests
        self._lock = threading.Lock()
        self._m: dict[str, _Mean] = {}                          # global ratios, by name
        self._key: dict[tuple[str, str], _Mean] = {}            # (tool set, name) ratios
        self._verbatim: dict[tuple[str, str], _Mean] = {}       # (tool, parameter) -> verbatim rate
        self._values: dict[tuple[str, str], _Mean] = {}         # (tool, parameter) -> characters of its values
        self.num_requests = 0
        self.log: list[dict] = []                                # the last decisions (bounded)
        # the server's block KV cache as this client sees it: set True when the server keeps one (its /health);
        # then the blocks sent lately (bounded, most recent last) tell how much of a new block is cached
        self.server_prefix_cache = False
        self._blocks: OrderedDict[str, None] = OrderedDict()
        self._last: OrderedDict[str, Kind] = OrderedDict()       # tool set -> its latest decision (bounded)
        self.prefills = {"sent": 0, "skipped": 0}                 # idle-window prefills (prefill_pays)
        self.calibration: dict | None = None                      # what the server measured (calibrate)

    def fresh(self) -> WaveGate:
        """A gate with this one's prior and settings and none of its evidence (what it knows of the server kept)."""
        gate = WaveGate(self.prior, prior_weight=self.prior_weight, probe_every=self.probe_every,
                        max_requests=self.max_requests)
        gate.server_prefix_cache = self.server_prefix_cache
        gate.calibration = self.calibration
        return gate

    def calibrate_target(self, step_s: float, call_tokens: float) -> bool:
        """Price the target's side with one of its requests measured on this machine (a client that times whole
        requests, such as one in front of vLLM): its seconds per step and its tokens replace the prior's, which
        were measured on another machine and target. Out of range (not positive, a step over 60 s): ignored,
        False."""
        if not (0 < step_s < 60 and 0 < call_tokens < 1e6):
            logger.warning("target calibration ignored: step_s=%r, call_tokens=%r", step_s, call_tokens)
            return False
        with self._lock:
            self.prior = replace(self.prior, step_s=float(step_s), call_tokens=float(call_tokens))
        return True

    def calibrate(self, measured: Mapping[str, Any]) -> bool:
        """Price the sidecar's compute with what its server measured on this machine (its ``/health``
        ``calibration``; :func:`calibrated`) instead of the prior's figures, calibrated on another machine. A
        measurement out of range is logged and ignored (False): a wrong server changes no decision."""
        try:
            prior = calibrated(self.prior, measured)
        except ValueError as e:
            logger.warning("sidecar calibration ignored: %s", e)
            return False
        with self._lock:
            self.prior = prior
            self.calibration = {k: measured[k] for k in ("prefill_per_token", "decode_forward_s", "num_queries")}
        logger.info("wave gate calibrated: %.2f ms per prefill token, %.1f ms per decode forward of %d queries",
                    1e3 * prior.prefill_per_token, 1e3 * float(measured["decode_forward_s"]),
                    int(measured["num_queries"]))
        return True

    def _mean(self, name: str) -> _Mean:
        return self._m.setdefault(name, _Mean())

    def estimates(self, key: str = "") -> Estimates:
        """The current point estimates for tool set ``key`` (each: its prior, moved by the evidence)."""
        with self._lock:
            return self._estimates(key)

    def _estimates(self, key: str) -> Estimates:
        p, w = self.prior, self.prior_weight
        m = self._m
        def g(name: str, prior: float, weight: float = w) -> float:
            return m[name].value(prior, weight) if name in m else prior

        def per_key(name: str, glob: float, weight: float) -> float:
            cell = self._key.get((key, name))
            return glob if cell is None else cell.value(glob, weight)

        accept = {k: max(0.0, per_key(f"accept_{k}", g(f"accept_{k}", p.accept_rate[k], w * p.call_tokens),
                                      w * p.call_tokens))
                  for k in ("index", "slots")}
        forwards = {k: g(f"forwards_{k}", p.forwards[k]) for k in ("index", "slots")}
        # the decode fit keeps the prior's split between the fixed and per-query part; evidence scales both
        decode_scale = g("decode_scale", 1.0)
        return replace(
            p, interference=g("interference", p.interference, w * 0.5),
            latency_factor=g("latency_factor", p.latency_factor, w * 0.5),
            prefill_per_token=g("prefill_per_token", p.prefill_per_token, w * 300),
            decode_forward=p.decode_forward * decode_scale, decode_per_query=p.decode_per_query * decode_scale,
            forwards=forwards, accept_rate=accept, step_s=g("step_s", p.step_s, w * 10),
            call_tokens=per_key("call_tokens", g("call_tokens", p.call_tokens), w),
            target_prefill=per_key("target_prefill", g("target_prefill", p.target_prefill), w),
            target_token_s=g("target_token_s", p.target_token_s, w * p.call_tokens),
            client_s=g("client_s", p.client_s), chars_per_token=g("chars_per_token", p.chars_per_token, w * 300),
            tool_s=per_key("tool_s", g("tool_s", p.tool_s, 1.0), 1.0), hit_rate=g("hit_rate", p.hit_rate),
            wave_scale={k: per_key(f"wave_scale_{k}", p.wave_scale.get(k, 1.0), w * 0.5) for k in ("index", "slots")})

    def remember(self, block: str) -> None:
        """Note that the server has prefilled ``block`` (a wave or a prefill request was sent with it)."""
        with self._lock:
            self._blocks[block] = None
            self._blocks.move_to_end(block)
            while len(self._blocks) > MAX_REMEMBERED_BLOCKS:
                self._blocks.popitem(last=False)

    def cached_chars(self, block: str) -> int:
        """The leading characters of ``block`` the server is expected to hold (0 when it keeps no cache): the
        longest common prefix with a block sent lately. Tools-first blocks of one toolbox share the toolbox."""
        if not self.server_prefix_cache:
            return 0
        with self._lock:
            blocks = list(self._blocks)
        return max((len(os.path.commonprefix([block, b])) for b in blocks), default=0)

    def decide(self, wave: sp.Wave, tools: Sequence[Any]) -> WaveDecision:
        """The decision for a request whose full wave is ``wave`` (logged; see :func:`decide`)."""
        key = tools_key(tools)
        cached = self.cached_chars(wave.block)
        with self._lock:
            est = self._estimates(key)
            verbatim = {slot: (cell.num, cell.den) for slot, cell in self._verbatim.items()}
            values = {slot: cell.num / cell.den for slot, cell in self._values.items() if cell.den > 0}
            self.num_requests += 1
            n = self.num_requests
        decision = decide(wave, tools, est, verbatim, key, cached_chars=cached, value_chars=values)
        if decision.kind == "skip" and self.probe_every and n % self.probe_every == 0:
            decision = decide(wave, tools, est, verbatim, key, probe=True, cached_chars=cached, value_chars=values)
        if decision.wave is not None:
            self.remember(wave.block)
        record = decision.to_dict()
        with self._lock:
            self._last[key] = decision.kind
            self._last.move_to_end(key)
            while len(self._last) > MAX_REMEMBERED_BLOCKS:
                self._last.popitem(last=False)
            self.log.append(record)
            del self.log[:-256]
        logger.debug("sidecar wave: %s (saving %.3f s, cost %.3f s, %d queries)", decision.kind, decision.saving_s,
                     decision.cost_s, len(decision.queries))
        return decision

    def observe(self, o: WaveOutcome) -> None:
        """Learn from one finished request (a skipped one still teaches the target's side)."""
        cap = self.max_requests
        pc = self.prior.call_tokens
        with self._lock:
            def add(name: str, num: float, den: float, scale: float = 1.0) -> None:
                self._mean(name).add(num, den, cap * scale)

            def add_key(name: str, num: float, den: float, scale: float = 1.0) -> None:
                add(name, num, den, scale)
                self._key.setdefault((o.key, name), _Mean()).add(num, den, cap * scale)

            add_key("call_tokens", o.call_tokens, 1)
            if o.call_tokens:
                add("target_token_s", o.target_decode_s, o.call_tokens, pc)
            if o.kind == "skip" or o.wave_s is None:     # the prefill ran with no wave in flight
                add_key("target_prefill", o.target_prefill_s, 1)
            if o.idle_step_s:
                add("step_s", sum(o.idle_step_s), len(o.idle_step_s), 10)
            for fn, p, found in o.verbatim:
                self._verbatim.setdefault((fn, p), _Mean()).add(float(found), 1.0, cap)
            for fn, p, chars in o.values:
                self._values.setdefault((fn, p), _Mean()).add(float(chars), 1.0, cap)
            if o.kind == "skip":
                return
            add("client_s", o.client_s, 1)
            if o.tokens_after_ready:
                add_key(f"accept_{o.kind}", o.accepted_hint_tokens, o.tokens_after_ready, pc)
            sv = o.server
            if sv.get("n_forwards"):
                add(f"forwards_{o.kind}", sv["n_forwards"], 1)
                n = o.num_queries
                planned = sv["n_forwards"] * (self.prior.decode_forward + self.prior.decode_per_query * n)
                add("decode_scale", sv.get("decode_s", 0.0), planned)
            tokens = (sv.get("block_tokens") or 0) + (sv.get("query_tokens") or 0) - (sv.get("cached_tokens") or 0)
            if tokens > 0 and sv.get("prefill_s") is not None:
                add("prefill_per_token", sv["prefill_s"], tokens, 300)
            if sv.get("block_tokens") and o.block_chars:
                add("chars_per_token", o.block_chars + o.query_chars,
                    sv["block_tokens"] + (sv.get("query_tokens") or 0), 300)
            compute = (sv.get("prefill_s") or 0.0) + (sv.get("decode_s") or 0.0)
            if o.wave_s is not None and compute > 0:
                add("latency_factor", o.wave_s, compute, 0.5)
            if o.wave_s is not None and o.model_latency_s > 0:
                # what the model missed for this tool set (its values' lengths, a second candidate's slots); per
                # tool set only: across tool sets the forwards, decode and latency ratios above already learn
                cell = self._key.setdefault((o.key, f"wave_scale_{o.kind}"), _Mean())
                cell.add(o.wave_s, o.model_latency_s, cap * 0.5)
            if o.interference is not None:
                lost, overlapped = o.interference
                add("interference", max(0.0, lost), overlapped, 0.5)

    def prefill_pays(self, block: str, tools: Sequence[Any]) -> bool:
        """Whether to prefill ``block`` in an agent's idle window (while a tool runs): only when the latest decision
        for this tool set sent a wave (a skipped next wave would not use the prefill) and the prefill of its uncached
        part is expected to end within the tool's latency (else it runs into the target's next turn, on the same
        cores). Counted in :attr:`prefills`."""
        key = tools_key(tools)
        uncached = max(0, len(block) - self.cached_chars(block))
        with self._lock:
            last = self._last.get(key)
            est = self._estimates(key)
            seconds = est.latency_factor * est.prefill_per_token * uncached / max(est.chars_per_token, 1e-6)
            pays = last not in (None, "skip") and seconds <= est.tool_s
            self.prefills["sent" if pays else "skipped"] += 1
        logger.debug("idle prefill of %d chars: %s (%.3f s expected, tool %.3f s, last decision %s)", uncached,
                     "sent" if pays else "skipped", seconds, est.tool_s, last)
        return pays

    def observe_tool(self, key: str, tool_s: float, hit: bool | None) -> None:
        """Learn from a tool an agent loop ran for a call of tool set ``key``: its latency ``tool_s`` (how long
        the tool itself ran), and whether the turn's joined call was that call (``hit``; None when no joined call
        was ready, e.g. the wave was skipped: the hit rate learns only from sent waves)."""
        with self._lock:
            self._mean("tool_s").add(tool_s, 1.0, self.max_requests)
            self._key.setdefault((key, "tool_s"), _Mean()).add(tool_s, 1.0, self.max_requests)
            if hit is not None:
                self._mean("hit_rate").add(float(hit), 1.0, self.max_requests)

    def summary(self) -> dict:
        """The current global estimates and decision counts (for reports)."""
        est = self.estimates()
        with self._lock:
            counts = {k: sum(r["decision"] == k for r in self.log) for k in KINDS}
        return {"estimates": asdict(est), "decisions": counts, "requests": self.num_requests,
                "idle_prefills": dict(self.prefills), "calibration": self.calibration}
