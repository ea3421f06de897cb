"""The ``ooospec`` benchmark method: ToolSpec's drafters plus sidecar hints, and where the sidecar runs.

At request arrival (the start of the timed call) the method sends the request's wave to the sidecar server
(:class:`~ooospec.runtime.sidecar_client.SidecarClient`, one HTTP request, a background thread), builds ToolSpec's
drafters and a :class:`~ooospec.runtime.hints.HintDrafter` on that request, and decodes; the drafter polls without
blocking and, once the hint bank is ready, adds suffix-matched hint branches to the trees. The target stays the
only commit authority: output == greedy AR whatever the sidecar answers, or whether it answers at all.

Hint sources (:class:`BenchHints`): :class:`SidecarHints` (the real thing) and :class:`GoldHints`, the ceiling
(``--hints gold``, method ``ooospec-gold``): the benchmark's gold call through the same views and bank, ready at
time zero, no sidecar -- how fast ``ooospec`` could be with perfect, free hints. A diagnostic, never a headline.

Deployments on one CPU box (:data:`DEPLOYMENTS`; the baselines always run at the bench's own threads):

==============  ===============================  ===================================  =====================
deployment      sidecar server                   target during an ooospec call        the target waits?
==============  ===============================  ===================================  =====================
``split``       pinned to the last core, 1 thr.  pinned to the other cores            never
``shared``      all cores, bench threads         all cores, bench threads             never
``wave-first``  all cores, bench threads         all cores, after the wave is ready   for the wave
==============  ===============================  ===================================  =====================

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
from dataclasses import dataclass
from typing import Any, Protocol

from ooospec.runtime.metrics import nearest_rank

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Deployment:
    name: str
    server_cpus: str        # "last" | "all"
    server_threads: str     # "one" | "bench"
    target_cpus: str        # "rest" | "all"
    wait_for_wave: bool


DEPLOYMENTS = {
    "split": Deployment("split", "last", "one", "rest", False),
    "shared": Deployment("shared", "all", "bench", "all", False),
    "wave-first": Deployment("wave-first", "all", "bench", "all", True),
}
DEFAULT_DEPLOYMENT = "shared"
WAVE_FIRST_TIMEOUT_S = 30.0


def cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def server_placement(deploy: Deployment, bench_threads: int) -> tuple[list[int] | None, int]:
    """``(cpus, threads)`` for the sidecar server of ``deploy`` (cpus None = all)."""
    all_cores = cores()
    if deploy.server_cpus == "last":
        if len(all_cores) < 2:
            raise ValueError("the split deployment needs at least 2 cores")
        return [all_cores[-1]], 1
    return None, bench_threads


class BenchHints(Protocol):
    def start(self, ctx, arrival: float) -> Any:
        """Begin this request's hints (never blocks, except ``wave-first``); returns the drafter's source."""
        ...

    def finish(self, source: Any, drafter, result) -> dict:
        """End the request (cancel what is in flight) and return its instrumentation."""
        ...


class GoldHints:
    """The ceiling: the record's gold call rendered into the bank at time zero (no sidecar)."""

    name = "gold"

    def start(self, ctx, arrival: float):
        from ooospec.runtime.hints import HintBank

        t0 = time.perf_counter()
        bank = HintBank.from_calls(ctx.record["calls"][:1], ctx.fmt, ctx.tokenizer)
        self._build_s = time.perf_counter() - t0
        return bank

    def finish(self, source, drafter, result) -> dict:
        stats = drafter.stats(result).to_dict()
        return {**stats, "source": "gold", "ready_s": 0.0, "target_sidecar_s": self._build_s + stats["match_s"]}


def wave_gate_for(deploy: Deployment):
    """A :class:`~ooospec.runtime.wave_gate.WaveGate` starting from ``deploy``'s prior (``--sidecar-gate on``)."""
    from ooospec.runtime.wave_gate import PRIORS, WaveGate

    return WaveGate(PRIORS[deploy.name])


class SidecarHints:
    """Hints from a running sidecar server, deployed as ``deploy`` next to a bench running ``bench_threads``.

    With a wave gate on the client (``client.gate``, :func:`wave_gate_for`) each request's wave is sent, cut to
    the queries that pay, or skipped; the decision and its estimate are in the row's ``hints["wave"]``.
    """

    name = "sidecar"

    def __init__(self, client, deploy: Deployment, bench_threads: int):
        self.client = client
        self.deploy = deploy
        self.bench_threads = bench_threads
        self._restore: tuple[set[int], int] | None = None

    def start(self, ctx, arrival: float):
        import torch

        self._ctx = ctx
        req = self.client.submit(ctx.record["messages"], ctx.record["tools"], fmt=ctx.fmt, tokenizer=ctx.tokenizer,
                                 arrival=arrival)
        if self.deploy.target_cpus == "rest":
            all_cores = cores()
            self._restore = (set(all_cores), torch.get_num_threads())
            rest = set(all_cores[:-1])
            os.sched_setaffinity(0, rest)
            torch.set_num_threads(len(rest))
        if self.deploy.wait_for_wave:
            req.wait(WAVE_FIRST_TIMEOUT_S)
        return req

    def finish(self, req, drafter, result) -> dict:
        import torch

        if self._restore is not None:
            cpus, threads = self._restore
            os.sched_setaffinity(0, cpus)
            torch.set_num_threads(threads)
            self._restore = None
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

        return {**hint, "source": "sidecar", "deployment": self.deploy.name,
                "submit_s": rel(st.submit_t), "ready_s": rel(st.ready_t), "wave_s": st.wave_s,
                "n_queries": st.n_queries, "payload_bytes": st.payload_bytes, "response_bytes": st.response_bytes,
                "error": st.error, "call": st.call, "server": st.server,
                "target_sidecar_s": st.build_s + hint["match_s"], "wave": wave}


def summarize_hints(rows: Sequence[dict]) -> dict | None:
    """Per-method hint summary over rows that carry ``hints`` (None when none do).

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
    errors: dict[str, int] = {}
    for h in hints:
        if h.get("error"):
            errors[h["error"]] = errors.get(h["error"], 0) + 1
    return {
        "n": n,
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
