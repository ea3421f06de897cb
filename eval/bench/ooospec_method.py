"""The ``ooospec`` benchmark method: ToolSpec's drafters plus sidecar hints, and where the sidecar runs.

At request arrival (the start of the timed call) the method sends the request's wave to the sidecar server
(:class:`~ooospec.runtime.sidecar.client.SidecarClient`, one HTTP request, a background thread), builds ToolSpec's
drafters and a :class:`~ooospec.runtime.drafters.hints.HintDrafter` on that request, and decodes; the drafter polls
without blocking and, once the hint bank is ready, adds suffix-matched hint branches to the trees. The target stays the
only commit authority: output == greedy AR whatever the sidecar answers, or whether it answers at all.

The bench's hint sources (:class:`BenchHints`, one per :data:`~ooospec.runtime.methods.HINT_SOURCES` name; each
starts a request's :class:`~ooospec.runtime.drafters.hints.CallGuess`, built by
:mod:`~ooospec.runtime.drafters.hint_source`): :class:`SidecarHints` (the real thing), and two ceilings through the
same views and bank, ready at time zero, no sidecar -- diagnostics, never a headline:

- :class:`GoldHints` (``--hints gold``, method ``ooospec-gold``): the benchmark's gold call.
- :class:`OracleHints` (``--hints oracle``, method ``ooospec-oracle``): the call the target itself writes for the
  request (``ar``'s output of the same example, parsed with the format's ``parse_calls``). Gold can differ from
  what the target writes (another argument order, spelling, value), so this is the ceiling of what any sidecar's
  hints can give: how fast ``ooospec`` could be with perfect, free hints.

Where the sidecar runs on one CPU box is a deployment of :data:`~ooospec.runtime.sidecar.deployments.DEPLOYMENTS` (its
placement of the server and of the target during the call; the baselines always run at the bench's own threads).

Per request the method reports (``row["hints"]``): the wave gate's decision (``wave``: skip / index / slots, the
expected saving and cost in seconds, the queries asked; None without a gate), when the wave was submitted and
ready (relative to arrival),
the engine step at which the bank became ready (0 = before the first tree, None = never), hint tokens proposed
and accepted, the answer payload bytes, the error kind if any, and the target process's own time on sidecar work
(building the wave, joining, views, tokenizing, suffix matching).
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from ooospec.runtime.drafters.hint_source import HintInputs, resolve_hints, start_wave
from ooospec.runtime.drafters.hints import CallGuess, HintBank, ScheduledBanks
from ooospec.runtime.methods import BASELINE, GOLD, ORACLE, SIDECAR
from ooospec.runtime.metrics import nearest_rank
from ooospec.runtime.sidecar.deployments import Deployment

if TYPE_CHECKING:
    from ooospec.runtime.sidecar.client import HintRequest

logger = logging.getLogger(__name__)


WAVE_FIRST_TIMEOUT_S = 30.0


def cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def server_placement(deploy: Deployment, bench_threads: int) -> tuple[list[int] | None, int]:
    """``(cpus, threads)`` for the sidecar server the bench starts for ``deploy`` (cpus None = all)."""
    if deploy.placement is None:
        raise ValueError(f"the bench cannot place a sidecar in deployment {deploy.name!r} ({deploy.summary})")
    if deploy.placement.server_cpus == "last":
        all_cores = cores()
        if len(all_cores) < 2:
            raise ValueError(f"the {deploy.name} deployment needs at least 2 cores")
        return [all_cores[-1]], 1
    return None, 1 if deploy.placement.server_threads == "one" else bench_threads


class BenchHints(Protocol):
    """A hint source of the bench: it starts each request's guess of the call and measures how it went."""

    def warm(self, ctx) -> None:
        """``--warm-tools`` (untimed, before the request's clock starts): prepare what the next guess reuses."""
        ...

    def start(self, ctx, arrival: float) -> CallGuess:
        """Begin this request's guess (never blocks, except ``wave-first``)."""
        ...

    def finish(self, guess: CallGuess, drafter, result) -> dict:
        """End the request (cancel what is in flight) and return its instrumentation."""
        ...


class TimeZeroHints:
    """A call known before the request arrives (:meth:`calls`), rendered into the bank at time zero (no sidecar).

    The row's instrumentation: the drafter's stats, ``source`` (:attr:`name`), ``ready_s`` 0, ``call`` (the call
    in the bank, None when there is none) and ``target_sidecar_s`` (building the bank + suffix matching).
    """

    name = ""

    def warm(self, ctx) -> None:
        """Nothing to prepare: the call is known at arrival."""

    def calls(self, ctx) -> list[dict]:
        """The calls of the request in ``ctx`` to hint with (only the first is used, like a sidecar's one call)."""
        raise NotImplementedError

    def start(self, ctx, arrival: float) -> HintBank:
        t0 = time.perf_counter()
        calls = list(self.calls(ctx))[:1]
        bank = resolve_hints(HintInputs(calls=calls), ctx.fmt, ctx.tokenizer).guess
        self._build_s = time.perf_counter() - t0
        self._call = calls[0] if calls else None
        return bank

    def finish(self, guess: CallGuess, drafter, result) -> dict:
        stats = drafter.stats(result).to_dict()
        return {**stats, "source": self.name, "ready_s": 0.0, "call": self._call,
                "target_sidecar_s": self._build_s + stats["match_s"]}


class GoldHints(TimeZeroHints):
    """A ceiling: the record's gold call."""

    name = GOLD

    def calls(self, ctx) -> list[dict]:
        return ctx.record["calls"]


class OracleHints(TimeZeroHints):
    """The ceiling of any sidecar: the call the target writes for this request, from ``ar``'s tokens of the same
    example (``ctx.reference_tokens``, which the harness sets after ``ar`` ran on it), parsed with the format's
    ``parse_calls``; no call in them gives an empty bank. Never reads the gold call.

    Raises:
        ValueError: ``ar`` has not run on this example first (no reference, or one for another record).
    """

    name = ORACLE

    def calls(self, ctx) -> list[dict]:
        record_id = ctx.record.get("id")
        if ctx.reference_tokens is None or ctx.reference_id != record_id:
            have = "none" if ctx.reference_tokens is None else f"one for {ctx.reference_id!r}"
            raise ValueError(f"{self.name} hints for {record_id!r} need the baseline {BASELINE!r} output of that same "
                             f"request (have {have}): run {BASELINE!r} first on every example (the bench harness "
                             f"does)")
        return ctx.fmt.parse_calls(ctx.tokenizer.decode(ctx.reference_tokens, skip_special_tokens=False))


TIME_ZERO_HINTS: dict[str, type[TimeZeroHints]] = {h.name: h for h in (GoldHints, OracleHints)}


class ReleasedGuess(ScheduledBanks):
    """``dedicated`` (an EMULATION of the sidecar on a device of its own, as fast as this CPU): the wave ran alone
    (:meth:`after_alone`: nothing else ran while it did), and each bank it produced -- the early one of a
    function-first wave, then the final one -- is released to the target at the latency it had then, counted
    from the target's start (:class:`~ooospec.runtime.drafters.hints.ScheduledBanks`); the finished request ``req``
    keeps its stats and its gate."""

    def __init__(self, req, schedule: Sequence[tuple[float, HintBank]]):
        super().__init__(schedule)
        self.req = req

    @classmethod
    def after_alone(cls, req, arrival: float, timeout: float = WAVE_FIRST_TIMEOUT_S) -> ReleasedGuess:
        """Wait for ``req`` (polled every half millisecond), noting when each distinct bank appeared."""
        schedule: list[tuple[float, HintBank]] = []
        deadline = arrival + timeout
        while time.perf_counter() < deadline:
            done = req.done                  # read first: a bank polled after done is the last
            bank = req.poll()
            if bank is not None and (not schedule or bank is not schedule[-1][1]):
                schedule.append((time.perf_counter() - arrival, bank))
            if done:
                break
            time.sleep(0.0005)
        return cls(req, schedule)


class SidecarHints:
    """Hints from a running sidecar server, deployed as ``deploy`` next to a bench running ``bench_threads``.

    With a wave gate on the client (``client.gate``, a :class:`~ooospec.runtime.sidecar.gate.WaveGate` from the
    deployment's prior) each request's wave is sent, cut to the queries that pay, or skipped; the decision and its
    estimate are in the row's ``hints["wave"]``.
    """

    name = SIDECAR

    def __init__(self, client, deploy: Deployment, bench_threads: int):
        self.client = client
        self.deploy = deploy
        self.bench_threads = bench_threads
        self._restore: tuple[set[int], int] | None = None

    def warm(self, ctx) -> None:
        """``--warm-tools`` (untimed): the server prefills the request's toolbox -- its block with the leading
        system messages and no turn yet -- so the wave at arrival starts from it (a tools-first adapter shares
        that much of its block; a context-first one shares nothing and pays in full, as it would in use)."""
        from ooospec.runtime.sidecar.prompts import toolbox_messages

        self.client.prefill(toolbox_messages(ctx.record["messages"]), ctx.record["tools"], wait=True)

    def start(self, ctx, arrival: float) -> HintRequest:
        import torch

        self._ctx = ctx
        req = start_wave(self.client, ctx.record["messages"], ctx.record["tools"], fmt=ctx.fmt, tokenizer=ctx.tokenizer,
                         arrival=arrival)
        if self.deploy.placement is not None and self.deploy.placement.target_cpus == "rest":
            all_cores = cores()
            self._restore = (set(all_cores), torch.get_num_threads())
            rest = set(all_cores[:-1])
            os.sched_setaffinity(0, rest)
            torch.set_num_threads(len(rest))
        if self.deploy.emulated:
            return ReleasedGuess.after_alone(req, arrival)
        if self.deploy.target_waits:
            req.wait_call(WAVE_FIRST_TIMEOUT_S)
        return req

    def finish(self, req: HintRequest, drafter, result) -> dict:
        import torch

        if self._restore is not None:
            cpus, threads = self._restore
            os.sched_setaffinity(0, cpus)
            torch.set_num_threads(threads)
            self._restore = None
        released = req if isinstance(req, ReleasedGuess) else None     # dedicated: the emulation's schedule
        req = req.req if released is not None else req
        req.cancel()
        hint_stats = drafter.stats(result)
        hint = hint_stats.to_dict()
        calls = []
        if result is not None and req.gate is not None:   # the gate learns which slots the target copies verbatim
            ctx = self._ctx
            calls = ctx.fmt.parse_calls(ctx.tokenizer.decode(result.tokens, skip_special_tokens=False))
        wave = req.report(result, hint_stats, calls)
        st = req.stats()
        arrival = st.arrival_t

        def rel(t: float | None) -> float | None:
            return None if t is None else t - arrival

        return {**hint, "source": self.name, "deployment": self.deploy.name,
                "submit_s": rel(st.submit_t), "ready_s": rel(st.ready_t), "wave_s": st.wave_s,
                "early_s": rel(st.early_t), "index_s": st.index_s, "functions": st.functions,
                "n_queries": st.n_queries, "payload_bytes": st.payload_bytes, "response_bytes": st.response_bytes,
                "error": st.error, "call": st.call, "server": st.server,
                "target_sidecar_s": st.build_s + hint["match_s"], "wave": wave,
                "emulated": self.deploy.emulated,
                "released_s": None if released is None else [round(t, 4) for t, _ in released.schedule]}


def summarize_hints(rows: Sequence[dict]) -> dict | None:
    """Per-method hint summary over rows that carry ``hints`` (None when none do).

    ``source``: the rows' hint source (``sidecar`` / ``gold`` / ``oracle``; None when they differ or lack one).
    Rates are over requests: ``ready_before_first_tree`` (bank ready at step 0), ``ready_before_end`` (ready at
    some step), ``used`` (at least one hint token accepted) -- the paper's 65.2% / 98.6% / 94.6%. Latency:
    the wave as the client saw it (median, nearest-rank p90) and the server's own prefill and decode (medians).
    """
    hints = [r["hints"] for r in rows if r.get("hints")]
    if not hints:
        return None
    n = len(hints)
    ready = [h["ready_s"] for h in hints if h.get("ready_s") is not None]
    waves = sorted(h["wave_s"] for h in hints if h.get("wave_s") is not None)
    server = [h.get("server") or {} for h in hints]
    prefill = [sv["prefill_s"] for sv in server if sv.get("prefill_s") is not None]
    decode = [sv["decode_s"] for sv in server if sv.get("decode_s") is not None]
    payload = [h["payload_bytes"] for h in hints if h.get("payload_bytes") is not None]
    sources = {h.get("source") for h in hints}
    errors: dict[str, int] = {}
    for h in hints:
        if h.get("error"):
            errors[h["error"]] = errors.get(h["error"], 0) + 1
    return {
        "n": n,
        "source": sources.pop() if len(sources) == 1 else None,
        "ready_before_first_tree": sum(h.get("ready_step") == 0 for h in hints) / n,
        "ready_before_end": sum(h.get("ready_step") is not None for h in hints) / n,
        "used": sum(bool(h.get("num_accepted_tokens")) for h in hints) / n,
        "mean_hint_tokens_accepted": statistics.fmean(h.get("num_accepted_tokens") or 0 for h in hints),
        "median_ready_s": statistics.median(ready) if ready else None,
        "median_wave_s": statistics.median(waves) if waves else None,
        "p90_wave_s": nearest_rank(waves, 0.9) if waves else None,
        "median_server_prefill_s": statistics.median(prefill) if prefill else None,
        "median_server_decode_s": statistics.median(decode) if decode else None,
        "median_payload_bytes": statistics.median(payload) if payload else None,
        "mean_target_sidecar_s": statistics.fmean(h.get("target_sidecar_s") or 0.0 for h in hints),
        "errors": errors,
        "wave_decisions": {k: sum((h.get("wave") or {}).get("decision") == k for h in hints)
                           for k in ("skip", "index", "slots")} if any(h.get("wave") for h in hints) else None,
    }
