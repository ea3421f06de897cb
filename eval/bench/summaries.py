"""The bench's summaries: one method's rows against the baseline's, as the numbers every report shows.

    summarize(examples, ["ar", "toolspec"], roofline=roofline)   # -> {"ar": {...}, "toolspec": {"speedup": ...}}

Per method: ``n``, ``mean_s``, ``median_s``, ``speedup``, ``speedup_median``, ``decode_speedup``, ``mat``,
``mean_tree_size``, ``exact_rate``, ``exact_hf_rate``, ``near_ties``, ``defects`` and a few more (see
:func:`summarize_method`); every metric as defined in :mod:`ooospec.runtime.metrics`. Given this machine's roofline
(:func:`ooospec.runtime.backends.hardware.roofline`), each summary also has the target's achieved
``prefill_flops_per_s`` and
``decode_bytes_per_s`` (:func:`ooospec.runtime.metrics.prefill_flops`, :func:`~ooospec.runtime.metrics.decode_bytes`)
and their fractions of the roofs (``prefill_peak_frac``, ``decode_peak_frac``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from ooospec.eval.bench.ooospec_method import summarize_hints
from ooospec.runtime import metrics
from ooospec.runtime.methods import BASELINE, LLAMACPP_REFERENCE, REGISTRY


def json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float (nan / inf) replaced by None, so the JSON stays standard."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def summarize_method(rows: Sequence[dict], baseline: dict[str, dict], roofline: dict | None = None,
                     peer: dict[str, dict] | None = None) -> dict:
    """Summary of one method's rows against the baseline's rows ``{id: row}`` (same ids).

    ``peer``: the ``llama.cpp`` peer's rows ``{id: row}`` when it ran; ``vs_llamacpp`` is then the ratio of its
    mean time to this method's over the same ids (> 1: faster than llama.cpp's plain greedy decoding).

    Every metric is one of :mod:`ooospec.runtime.metrics`. Worked example: AR times ``[1.0, 3.0]``, method times
    ``[0.5, 2.0]`` -> ``mean_s`` 1.25, ``speedup`` 2.0 / 1.25 = 1.6, per-example ratios ``[2.0, 1.5]`` ->
    ``speedup_median`` 1.75.
    """
    if not rows:
        raise ValueError("no rows to summarize")
    missing = [r["id"] for r in rows if r["id"] not in baseline]
    if missing:
        raise ValueError(f"{rows[0]['method']}: examples without a baseline row: {missing[:5]}")
    times = [r["time_s"] for r in rows]
    out = {"n": len(rows), **_times(rows, times, baseline), **_decoding(rows, times), **_exactness(rows)}
    if peer and all(r["id"] in peer for r in rows):
        out["vs_llamacpp"] = metrics.speedup(statistics.fmean(peer[r["id"]]["time_s"] for r in rows),
                                             statistics.fmean(times))
    hint_summary = summarize_hints(rows)
    if hint_summary is not None:
        out["hints"] = hint_summary
    if all("prefill_flops" in r for r in rows):
        out.update(_rates(rows, roofline))
    return out


def _times(rows: Sequence[dict], times: list[float], baseline: dict[str, dict]) -> dict:
    """Mean and median times, and the speedups over the baseline's rows of the same ids."""
    base_times = [baseline[r["id"]]["time_s"] for r in rows]
    decode = [r["decode_s"] for r in rows]
    base_decode = [baseline[r["id"]]["decode_s"] for r in rows]
    return {
        "mean_s": statistics.fmean(times),
        "median_s": statistics.median(times),
        "mean_prefill_s": statistics.fmean(r["prefill_s"] for r in rows),
        "mean_decode_s": statistics.fmean(decode),
        "speedup": metrics.speedup(statistics.fmean(base_times), statistics.fmean(times)),
        "speedup_median": statistics.median(metrics.speedup(b, t) for b, t in zip(base_times, times)),
        "decode_speedup": metrics.speedup(statistics.fmean(base_decode), statistics.fmean(decode)),
    }


def _decoding(rows: Sequence[dict], times: list[float]) -> dict:
    """Tokens per target forward (#MAT), tree sizes and throughput."""
    tokens = sum(r["new_tokens"] for r in rows)
    forwards = sum(r["forwards"] for r in rows)
    trees = [t for r in rows for t in r["tree_sizes"]]
    proposed = [p for r in rows for p in (r.get("proposed") or [])]
    return {
        "mat": metrics.mat(tokens, forwards),
        "new_tokens": tokens,
        "forwards": forwards,
        "mean_tree_size": metrics.mean_tree_size(trees),
        "mean_proposed_nodes": statistics.fmean(proposed) if proposed else None,
        "tokens_per_s": metrics.per_second(tokens, sum(times)),
    }


def _exactness(rows: Sequence[dict]) -> dict:
    """How often the output equals ``ar``'s and the stock reference's, and the mismatches by kind."""
    mismatches = [r["mismatch"] for r in rows if r.get("mismatch")]
    exact_hf = [r["exact_hf"] for r in rows if r.get("exact_hf") is not None]
    return {
        "exact_rate": sum(bool(r["exact"]) for r in rows) / len(rows),
        "exact_hf_rate": sum(exact_hf) / len(exact_hf) if exact_hf else None,
        "near_ties": sum(m["kind"] == "near_tie" for m in mismatches),
        "defects": sum(m["kind"] == "defect" for m in mismatches),
        "overshoot_tokens": sum(r.get("overshoot", 0) for r in rows),
    }


def _rates(rows: Sequence[dict], roofline: dict | None) -> dict:
    """The target's achieved prefill FLOP/s and decode bytes/s, and their fractions of the ``roofline``'s peaks."""
    out = {"prefill_flops_per_s": metrics.per_second(sum(r["prefill_flops"] for r in rows),
                                                     sum(r["prefill_s"] for r in rows)),
           "decode_bytes_per_s": metrics.per_second(sum(r["decode_bytes"] for r in rows),
                                                    sum(r["decode_s"] for r in rows))}
    if roofline is not None:
        out["prefill_peak_frac"] = out["prefill_flops_per_s"] / roofline["peak_flops"]
        out["decode_peak_frac"] = out["decode_bytes_per_s"] / roofline["peak_bytes_per_s"]
    return out


def summarize(examples: Sequence[dict], order: Sequence[str] | None = None, baseline: str = BASELINE,
              roofline: dict | None = None) -> dict:
    """``{method: summary}`` in ``order`` (default: first appearance), each against ``baseline``'s rows."""
    by_method: dict[str, list[dict]] = {}
    for row in examples:
        by_method.setdefault(row["method"], []).append(row)
    if baseline not in by_method:
        raise ValueError(f"no {baseline!r} rows to compare against (methods: {sorted(by_method)})")
    base = {r["id"]: r for r in by_method[baseline]}
    peer = {r["id"]: r for r in by_method.get(LLAMACPP_REFERENCE, [])}
    return {m: summarize_method(by_method[m], base, roofline, peer) for m in (order or by_method)}


def method_label(name: str) -> str:
    """A method's row label: its name, ``(EMULATED)`` after a method whose deployment is an emulation.

    >>> method_label("ooospec-dedicated"), method_label("toolspec")
    ('ooospec-dedicated (EMULATED)', 'toolspec')
    """
    from ooospec.runtime.sidecar.deployments import DEPLOYMENTS

    m = REGISTRY.get(name)
    emulated = m is not None and m.deployment is not None and DEPLOYMENTS[m.deployment].emulated
    return f"{name} (EMULATED)" if emulated else name
