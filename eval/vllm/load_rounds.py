"""Interleaved rounds for ``ooospec vllm-load`` (``--rounds R``): plain runs before and after each drafting run.

A CPU box's speed drifts over tens of minutes (the KVM Xeon of ``eval/reports/cpu/quantized/`` moved by 35-60%
between two plain servers), so one plain run before all drafting runs cannot tell a drafter's 0.97x from drift.
With ``R`` > 1 the servers run as ``P0 A0 B0 P1 A1 B1 ... P_R`` (one fresh server each): every drafting run is
bracketed by the plain runs just before and just after it, and its throughput ratio is taken against their mean
wall time; over the rounds the table gives the median and range of those ratios and how far plain itself moved::

    schedule(["vllm", "toolspec"], 2)  ->  [("vllm", "vllm"), ("toolspec", "toolspec"), ("vllm@1", "vllm"),
                                            ("toolspec@1", "toolspec"), ("vllm@2", "vllm")]

A run's key is its method for round 0 (so ``--rounds 1`` runs and saves exactly what the bench always did) and
``method@r`` after. Answers are compared with the first plain run's at the same level, plain's later runs
included (a plain server restarted must give plain's answers: near ties aside, a check of the bench itself).
"""

from __future__ import annotations

import statistics

from ooospec.reporting import md_table
from ooospec.runtime.methods import VLLM_REFERENCE


def run_key(method: str, r: int) -> str:
    """The key of ``method``'s run in round ``r`` (0: the method's own name)."""
    return method if r == 0 else f"{method}@{r}"


def parse_key(key: str) -> tuple[str, int]:
    """``(method, round)`` of a run key (:func:`run_key`'s inverse)."""
    method, _, r = key.partition("@")
    return method, int(r) if r else 0


def schedule(order: list[str], rounds: int) -> list[tuple[str, str]]:
    """``(key, method)`` in run order: plain, then each round's other methods followed by plain again (for
    ``rounds`` > 1; one round is the bench's classic order, plain first and once)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    others = [m for m in order if m != VLLM_REFERENCE]
    keys = [(VLLM_REFERENCE, VLLM_REFERENCE)]
    for r in range(rounds):
        keys += [(run_key(m, r), m) for m in others]
        if rounds > 1:
            keys.append((run_key(VLLM_REFERENCE, r + 1), VLLM_REFERENCE))
    return keys


def bracket(key: str, keys: list[str]) -> list[str]:
    """The plain runs ``key``'s throughput is compared with: for a drafting run of round r, plain's runs r and
    r + 1 (those present in ``keys``); for a plain run, plain's first (so its ratio shows how far plain moved)."""
    method, r = parse_key(key)
    if method == VLLM_REFERENCE:
        return [VLLM_REFERENCE]
    return [k for k in (run_key(VLLM_REFERENCE, r), run_key(VLLM_REFERENCE, r + 1)) if k in keys]


def round_summary(levels: list[dict]) -> list[dict]:
    """Per method, concurrency and stream mode of a bench of several rounds: its runs' throughput ratios (each
    against its bracket; for plain, its later runs against its first), their median, min and max, and the plain
    runs' requests/s range at that level. Empty for a bench of one round."""
    groups: dict[tuple, list[dict]] = {}
    for lv in levels:
        groups.setdefault((parse_key(lv["method"])[0], lv["concurrency"], lv["stream"]), []).append(lv)
    plain = {(c, s): [lv["requests_per_s"] for lv in runs] for (m, c, s), runs in groups.items()
             if m == VLLM_REFERENCE}
    out = []
    for (method, c, stream), runs in groups.items():
        if len(plain.get((c, stream), [])) < 2:          # one round: nothing brackets a run
            continue
        if method == VLLM_REFERENCE:                      # plain's later runs against its first
            runs = [lv for lv in runs if lv["method"] != VLLM_REFERENCE]
        ratios = [lv["throughput_x"] for lv in runs]
        out.append({"method": method, "concurrency": c, "stream": stream, "runs": len(runs), "thru_x": ratios,
                    "median_x": statistics.median(ratios), "min_x": min(ratios), "max_x": max(ratios),
                    "plain_req_s": (min(plain[(c, stream)]), max(plain[(c, stream)]))})
    return out


def render_rounds(summary: list[dict]) -> str:
    """The rounds table: one row per method x level; '' when the bench ran one round."""
    if not summary:
        return ""
    headers = ["method", "c", "stream", "runs", "thru x per run", "median", "min", "max", "plain req/s (min-max)"]
    rows = [[s["method"], s["concurrency"], "on" if s["stream"] else "off", s["runs"],
             " ".join(f"{x:.2f}" for x in s["thru_x"]), f"{s['median_x']:.2f}x", f"{s['min_x']:.2f}x",
             f"{s['max_x']:.2f}x", f"{s['plain_req_s'][0]:.2f}-{s['plain_req_s'][1]:.2f}"] for s in summary]
    note = ("Interleaved rounds: each drafting run's throughput against the mean of the plain runs just before and "
            "after it; plain's rows: its later runs against its first (how far the box moved).")
    return "#### Rounds\n\n" + note + "\n\n" + md_table(headers, rows, labels=3)
