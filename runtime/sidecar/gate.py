"""The wave gate: send a request's sidecar wave only when the target time its hints save exceeds what it costs.

The gate is three modules: the pricing model (:mod:`~ooospec.runtime.sidecar.gate_pricing`: the formulas, the
:class:`~ooospec.runtime.sidecar.gate_pricing.Estimates` they take, a prior calibrated with this machine's
measurement), the decision for one request (:mod:`~ooospec.runtime.sidecar.gate_decision`: ``skip``, ``index`` or
``slots``, and the queries to ask), and this one, the online state: :class:`WaveGate` holds one target's and
deployment's running sums, started from the deployment's prior and moved by each finished request's
:class:`~ooospec.runtime.sidecar.outcome.WaveOutcome` (thread-safe), decides each request with the current
estimates and logs it (:class:`~ooospec.runtime.sidecar.gate_decision.WaveDecision`); it also keeps its view of
the server's block cache (the blocks it sent lately) and decides idle-window prefills. :class:`StepFit` prices a
target's decode step from whole requests, for clients that see no step times. The gate changes only which hints
exist; output stays the target's greedy output.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from ooospec.runtime.sidecar import prompts as sp
from ooospec.runtime.sidecar.gate_decision import WaveDecision, decide, query_name, tools_key
from ooospec.runtime.sidecar.gate_pricing import KINDS, Estimates, Kind, calibrated

if TYPE_CHECKING:
    from ooospec.runtime.sidecar.outcome import WaveOutcome

logger = logging.getLogger(__name__)

# query_name and tools_key live in gate_decision; eval/ imports them from here
__all__ = ["MAX_REMEMBERED_BLOCKS", "StepFit", "WaveGate", "query_name", "tools_key"]

MAX_REMEMBERED_BLOCKS = 64  # blocks a gate remembers sending (its view of the server's prefix cache)


class StepFit:
    """A target's seconds per decode step from whole requests (a client in front of vLLM sees no step times): the
    least-squares slope of request seconds over forwards, so the fixed part of a request (its prefill, the engine's
    per-request work) is not spread over its steps as the mean ``seconds / forwards`` would (that overprices a step
    by 7-55% on the ``toolspec`` rows of eval/reports/vllm/wave-first/, ``ooospec vllm-report``; and with it the
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
