"""One cell of the transfer matrix -- one target on one benchmark, every method -- run so that a crash loses at
most the example in flight.

A cell is one JSON file (``data/transfer/cells/<target>/<benchmark>.json``), rewritten atomically after every
example with everything measured so far::

    {"key": {...},          what the rows were measured under: target, benchmark, methods, budget, dtype,
                            threads, deployment, sidecar adapter, CPU, code fingerprint
     "examples": [rows],    one row per example and method (eval/bench/harness.py's rows, plus "call" / "call_score")
     "methods": {name: summary},   eval/bench/summaries.py's summary + speedup_median_ci, call accuracy, wave latency
     "sessions": [{"started", "wall_s", "examples", "loadavg_start", "loadavg_end"}],
     "partial": bool, "limit": int, ...header (env, target_info, notes)}

Resuming (:func:`run_cell`): rows stored under the same ``key`` are kept, the examples that have a row for every
method are skipped, and the rest run through :func:`ooospec.eval.bench.harness.run_bench` -- which warms every method up
again first, so a resumed session's timings are as warm as a fresh one's. A changed key (other settings, other
code) starts the cell over: rows measured under different conditions never share a summary. The learning
drafters' state (retrieval bank, acceptance estimates) starts cold in each session, like a restarted server.
``limit`` is not part of the key: examples run in id order, so a larger limit extends a finished cell.

    cell = run_cell(path, key, records, measure, header={"env": env}, fmt=fmt, seed=0, num_resamples=2000)
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path

from ooospec.eval.bench import summaries
from ooospec.pipelines.records import write_json
from ooospec.runtime import metrics
from ooospec.runtime.methods import BASELINE, SIDECAR

logger = logging.getLogger(__name__)

# measure(records, on_example) -> bench results ({"methods", "examples", ...}): harness.run_bench on a loaded target
Measure = Callable[[Sequence[dict], Callable[[dict], None]], dict]


def read_cell(path: Path) -> dict | None:
    """The cell stored at ``path`` (None when there is none)."""
    if not path.is_file():
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def done_ids(rows: Sequence[dict], methods: Sequence[str]) -> set[str]:
    """Ids of the examples that have a row for every method.

    >>> sorted(done_ids([{"id": "a", "method": "ar"}, {"id": "a", "method": "pld"}, {"id": "b", "method": "ar"}],
    ...                 ["ar", "pld"]))
    ['a']
    """
    have: dict[str, set[str]] = {}
    for row in rows:
        have.setdefault(row["id"], set()).add(row["method"])
    return {i for i, m in have.items() if set(methods) <= m}


def is_complete(stored: dict | None, key: Mapping, ids: Sequence[str]) -> bool:
    """Whether a stored cell already has every example of ``ids`` under ``key`` (then the target need not load)."""
    return (stored is not None and stored.get("key") == dict(key)
            and set(ids) <= done_ids(stored["examples"], key["methods"]))


def kept_rows(stored: dict | None, key: Mapping, ids: Sequence[str], where: str) -> list[dict]:
    """The stored rows that may be reused: same ``key``, examples among ``ids`` and complete (all methods)."""
    if stored is None:
        return []
    if stored.get("key") != dict(key):
        old = stored.get("key") or {}
        differs = sorted(k for k in set(old) | set(key) if old.get(k) != key.get(k))
        logger.warning("%s: the stored rows were measured under other settings (%s differ); starting the cell over",
                       where, ", ".join(differs))
        return []
    wanted = set(ids) & done_ids(stored["examples"], key["methods"])
    return [r for r in stored["examples"] if r["id"] in wanted and r["method"] in key["methods"]]


def score_rows(rows: Sequence[dict], records: Mapping[str, dict], fmt) -> None:
    """Fill each row's ``call`` (the first call parsed from its text) and ``call_score`` against the gold call
    (:func:`ooospec.runtime.metrics.score_call`, BFCL's ``meta.allowed`` respected); in place."""
    for row in rows:
        rec = records[row["id"]]
        calls = fmt.parse_calls(row["text"])
        row["call"] = calls[0] if calls else None
        row["call_score"] = metrics.score_call(calls, rec["calls"], (rec.get("meta") or {}).get("allowed"))


def sidecar_call_score(row: dict, record: dict) -> metrics.CallScore | None:
    """The sidecar's joined call of an ``ooospec`` row against gold (no call: a wave that failed or came late);
    None for rows without sidecar hints."""
    hints = row.get("hints") or {}
    if hints.get("source") != SIDECAR:
        return None
    call = hints.get("call")
    return metrics.score_call([call] if call else [], record["calls"], (record.get("meta") or {}).get("allowed"))


def summarize_cell(rows: Sequence[dict], methods: Sequence[str], records: Mapping[str, dict], fmt, *,
                   roofline: dict | None, seed: int, num_resamples: int) -> dict:
    """``{method: summary}``: :func:`ooospec.eval.bench.summaries.summarize` plus, per method,
    ``speedup_median_ci`` (the bootstrap 95% interval of the median per-example ratio), ``call`` (call accuracy of
    the method's own output vs gold) and, for hint methods, ``hints.median_wave_s`` and ``hints.sidecar_call`` (the
    sidecar's call vs gold).
    """
    score_rows(rows, records, fmt)
    summary = summaries.summarize(rows, methods, roofline=roofline)
    base = {r["id"]: r["time_s"] for r in rows if r["method"] == BASELINE}
    for name in methods:
        own = [r for r in rows if r["method"] == name]
        ratios = [metrics.speedup(base[r["id"]], r["time_s"]) for r in own]
        lo, hi = metrics.bootstrap_median_ci(ratios, seed=seed, num_resamples=num_resamples)
        s = summary[name]
        s["speedup_median_ci"] = [lo, hi]
        s["call"] = metrics.call_accuracy([r["call_score"] for r in own])
        if "hints" in s:
            waves = [r["hints"]["wave_s"] for r in own if (r.get("hints") or {}).get("wave_s") is not None]
            s["hints"]["median_wave_s"] = statistics.median(waves) if waves else None
            scores = [sc for r in own if (sc := sidecar_call_score(r, records[r["id"]])) is not None]
            s["hints"]["sidecar_call"] = metrics.call_accuracy(scores) if scores else None
    return summary


def run_cell(path: Path, key: Mapping, records: Sequence[dict], measure: Measure | None, *, header: Mapping, fmt,
             seed: int, num_resamples: int, resume: bool = True) -> dict:
    """Run (or finish) one cell and return it; the file at ``path`` is rewritten after every example.

    Args:
        path: the cell's JSON file.
        key: the measurement conditions (must contain ``methods``, in run order); stored rows are reused only
            under an equal key.
        records: the benchmark's first ``limit`` records (id order).
        measure: ``measure(records, on_example) -> results`` -- :func:`ooospec.eval.bench.harness.run_bench` on the
            loaded target with these methods (warm-up first); None for a cell known to be complete.
        header: stored with the cell as is (``env``, ``target_info``, ``notes``...); ``env.roofline`` is used for
            the roofline fractions.
        fmt: the target's format module (``parse_calls``) for call accuracy.
        seed, num_resamples: of the bootstrap interval.
        resume: reuse stored rows (False: start over).
    """
    by_id = {r["id"]: r for r in records}
    ids = [r["id"] for r in records]
    stored = read_cell(path)
    kept = kept_rows(stored, key, ids, str(path)) if resume else []
    sessions = list(stored.get("sessions", [])) if kept else []
    done = done_ids(kept, key["methods"])
    todo = [r for r in records if r["id"] not in done]
    roofline = (header.get("env") or {}).get("roofline")

    def save(rows: list[dict], session: dict | None, partial: bool) -> dict:
        cell = {**header, "key": dict(key), "limit": len(records), "partial": partial,
                "sessions": sessions + ([session] if session else []),
                "methods": summarize_cell(rows, key["methods"], by_id, fmt, roofline=roofline, seed=seed,
                                          num_resamples=num_resamples),
                "examples": sorted(rows, key=lambda r: (r["id"], key["methods"].index(r["method"])))}
        cell = summaries.json_safe(cell)
        write_json(path, cell)
        return cell

    if not todo:
        logger.info("%s: complete (%d examples), nothing to run", path, len(ids))
        return save(kept, None, False)
    if kept:
        logger.info("%s: resuming, %d of %d examples done", path, len(done), len(ids))
    session = {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "examples": 0,
               "loadavg_start": list(os.getloadavg())}
    t0 = time.perf_counter()

    def on_example(partial: dict) -> None:
        session.update(examples=len(done_ids(partial["examples"], key["methods"])),
                       wall_s=time.perf_counter() - t0, loadavg_end=list(os.getloadavg()))
        save(kept + partial["examples"], session, partial=True)

    assert measure is not None, f"{path}: {len(todo)} examples left but nothing to measure them with"
    results = measure(todo, on_example)
    session.update(examples=len(todo), wall_s=time.perf_counter() - t0, loadavg_end=list(os.getloadavg()))
    return save(kept + results["examples"], session, partial=False)
