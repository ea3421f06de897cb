"""Which sidecar to ship: two adapters on the numbers that matter for speed, and on their held-out quality.

Reads two ``transfer`` runs over the same targets, benchmarks and requests (the named params sets
``eval/transfer/sidecar_gold.yaml``: the adapter trained on the datasets' gold calls, with ``toolspec`` and the
gold / oracle hint ceilings; ``eval/transfer/sidecar_teacher.yaml``: the adapter trained on a teacher's traces),
both with every wave in full and ``wave-first`` (hints at a fixed point, so the counts do not depend on timing),
and the ``eval_sidecar`` metrics of both adapters on both held-out sets and the zero-shot benchmarks::

    python -m ooospec.eval.sidecar.compare \\
        --run gold-trained=eval/reports/transfer/sidecar-gold/transfer.json \\
        --run teacher-trained=eval/reports/transfer/sidecar-teacher/transfer.json \\
        --quality gold-trained=eval/reports/sidecar/runs/qwen2.5-coder-0.5b-full \\
        --quality teacher-trained=eval/reports/sidecar/runs/qwen2.5-coder-0.5b-teacher,teacher \\
        --out eval/reports/sidecar/compare.md

Per target x benchmark: hint tokens accepted per request (``oracle``: the target's own output, the ceiling of any
sidecar; ``gold``: the dataset's call; each adapter's real hints), #MAT (mean tokens committed per target forward,
with ``toolspec`` = no hints), how often the sidecar's call equals the call the target wrote and the gold call, and
``ooospec``'s speedup over ``ar`` in its own run (wave included: the target waits for it). The verdict (the
adapter with more hint tokens accepted per request over all cells, #MAT breaking a tie) is computed, not written.
``--quality LABEL=PREFIX[,SET]`` reads ``PREFIX.heldout.json`` (the heldout of the data the adapter trained on, SET:
gold or teacher), ``PREFIX.teacher-heldout.json`` / ``PREFIX.gold-heldout.json`` (the other's) and
``PREFIX.<benchmark>.json`` (zero-shot) where they exist. For two adapters, the paired difference of hint tokens
accepted per (target, request) with a seeded bootstrap interval. Pure reading of JSON files.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from ooospec.pipelines.params import module_main
from ooospec.reporting import fmt_cell, md_table
from ooospec.runtime.calls import canonical_json
from ooospec.runtime.methods import BASELINE, OOOSPEC, TOOLSPEC, hint_method
from ooospec.runtime.metrics import bootstrap_median_ci

ORACLE_METHOD, GOLD_METHOD = hint_method("oracle"), hint_method("gold")
# (file suffix of an eval_sidecar run, the set it names); ``heldout`` is the adapter's own (``--quality``'s ,SET)
QUALITY_SETS = (("gold-heldout", "gold heldout"), ("teacher-heldout", "teacher heldout"))
BOOTSTRAP_SEED = 0
QUALITY_COLUMNS = (("function acc", lambda e: e["function_index"]["accuracy"], "{:.1%}"),
                   ("arg EM non-null", lambda e: e["argument"]["exact_match_non_null"], "{:.1%}"),
                   ("joined call EM", lambda e: (e.get("joined") or {}).get("exact_match"), "{:.1%}"),
                   ("direct EM", lambda e: e["direct_call"]["exact_match"], "{:.1%}"),
                   ("wave median s", lambda e: (e["latency"].get("wave", {}).get("median_ms") or 0) / 1000, "{:.2f}"))


def same_call(a: Mapping | None, b: Mapping | None) -> bool:
    """Two parsed calls are the same call (name and arguments, key order ignored); None equals nothing."""
    return a is not None and b is not None and canonical_json(a) == canonical_json(b)


def cells_of(run: Mapping) -> dict[tuple[str, str], Mapping]:
    """``{(target, benchmark): cell}`` of one transfer.json."""
    return {(c["target"], c["benchmark"]): c for c in run["cells"]}


def rows_by_id(cell: Mapping, method: str) -> dict[str, Mapping]:
    return {r["id"]: r for r in cell["examples"] if r["method"] == method}


def agreement(cell: Mapping) -> float | None:
    """Fraction of requests whose ``ooospec`` hint call equals the call the target wrote (``ar``'s text)."""
    ar, hinted = rows_by_id(cell, BASELINE), rows_by_id(cell, OOOSPEC)
    ids = [i for i in hinted if i in ar]
    if not ids:
        return None
    return sum(same_call((hinted[i].get("hints") or {}).get("call"), ar[i].get("call")) for i in ids) / len(ids)


def hint_tokens(cell: Mapping, method: str) -> float | None:
    m = cell["methods"].get(method)
    return None if m is None or not m.get("hints") else m["hints"]["mean_hint_tokens_accepted"]


def method_stat(cell: Mapping, method: str, key: str) -> float | None:
    m = cell["methods"].get(method)
    return None if m is None else m.get(key)


def gold_rate(cell: Mapping) -> float | None:
    sc = ((cell["methods"].get(OOOSPEC) or {}).get("hints") or {}).get("sidecar_call")
    return None if not sc else sc.get("call")


def compare_cells(runs: Mapping[str, Mapping]) -> list[dict]:
    """One dict per (target, benchmark) present in every run: the ceilings from the first run that has them, each
    adapter's real hints, #MAT, call agreement and speedup from its own run. Raises when the runs' requests differ."""
    cells = {label: cells_of(run) for label, run in runs.items()}
    keys = sorted(set.intersection(*(set(c) for c in cells.values())))
    out = []
    for key in keys:
        ids = {label: sorted(rows_by_id(c[key], BASELINE)) for label, c in cells.items()}
        if len({tuple(v) for v in ids.values()}) != 1:
            raise ValueError(f"{key}: the runs measured different requests: {ids}")
        first = next(c[key] for c in cells.values())
        ceiling = next((c[key] for c in cells.values() if ORACLE_METHOD in c[key]["methods"]), first)
        row = {"target": key[0], "benchmark": key[1], "n": len(next(iter(ids.values()))),
               "hint_tokens": {"oracle": hint_tokens(ceiling, ORACLE_METHOD),
                               "gold": hint_tokens(ceiling, GOLD_METHOD)},
               "mat": {TOOLSPEC: method_stat(ceiling, TOOLSPEC, "mat"),
                       "oracle": method_stat(ceiling, ORACLE_METHOD, "mat"),
                       "gold": method_stat(ceiling, GOLD_METHOD, "mat")},
               "agreement": {}, "gold_rate": {}, "speedup": {}, "defects": 0, "near_ties": 0, "accepted": {}}
        for label, c in cells.items():
            cell = c[key]
            row["hint_tokens"][label] = hint_tokens(cell, OOOSPEC)
            row["mat"][label] = method_stat(cell, OOOSPEC, "mat")
            row["agreement"][label] = agreement(cell)
            row["gold_rate"][label] = gold_rate(cell)
            row["speedup"][label] = method_stat(cell, OOOSPEC, "speedup")
            row["accepted"][label] = {i: (r.get("hints") or {}).get("num_accepted_tokens") or 0
                                      for i, r in rows_by_id(cell, OOOSPEC).items()}
            row["defects"] += sum(m.get("defects") or 0 for m in cell["methods"].values())
            row["near_ties"] += sum(m.get("near_ties") or 0 for m in cell["methods"].values())
        out.append(row)
    return out


def _mean(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def paired_difference(rows: Sequence[Mapping], a: str, b: str) -> dict:
    """Hint tokens accepted by ``b`` minus ``a``, paired per (target, request): mean and a percentile bootstrap 95%
    interval of the mean over the pairs (runtime/metrics.py's, seeded, so the report is reproducible)."""
    diffs = [r["accepted"][b][i] - r["accepted"][a][i] for r in rows for i in sorted(r["accepted"][a])
             if i in r["accepted"][b]]
    if not diffs:
        return {"pairs": 0, "mean": None, "ci95": None}
    ci = bootstrap_median_ci(diffs, seed=BOOTSTRAP_SEED, statistic=statistics.fmean)
    return {"pairs": len(diffs), "mean": statistics.fmean(diffs), "ci95": list(ci)}


def verdict(rows: Sequence[Mapping], labels: Sequence[str]) -> dict:
    """The adapter with more hint tokens accepted per request (request-weighted over every cell), #MAT breaking a
    tie (within 0.5 tokens per request); with per-cell wins and, for two adapters, the paired difference."""
    def per_request(label):
        measured = [r for r in rows if r["hint_tokens"][label] is not None]
        n = sum(r["n"] for r in measured)
        return sum(r["hint_tokens"][label] * r["n"] for r in measured) / n if n else 0.0

    tokens = {label: per_request(label) for label in labels}
    mat = {label: _mean([r["mat"][label] for r in rows]) or 0.0 for label in labels}
    wins = {label: sum(1 for r in rows if all((r["hint_tokens"][label] or 0) > (r["hint_tokens"][o] or 0)
                                              for o in labels if o != label)) for label in labels}
    ranked = sorted(labels, key=lambda lb: (tokens[lb], mat[lb]), reverse=True)
    best, second = ranked[0], ranked[1] if len(ranked) > 1 else ranked[0]
    if abs(tokens[best] - tokens[second]) < 0.5:
        best = max(labels, key=lambda lb: mat[lb])
    out = {"winner": best, "hint_tokens_per_request": tokens, "mean_mat": mat, "cells_won": wins, "cells": len(rows)}
    if len(labels) == 2 and all("accepted" in r for r in rows):
        out["difference"] = {"of": f"{labels[1]} - {labels[0]}", **paired_difference(rows, labels[0], labels[1])}
    return out


def speed_table(rows: Sequence[Mapping], labels: Sequence[str]) -> str:
    head = (["target", "benchmark", "n", "hint tokens: oracle", "gold"] + [f"real: {lb}" for lb in labels]
            + ["#MAT: toolspec", "oracle", "gold"] + [f"real: {lb}" for lb in labels]
            + [f"= target's call: {lb}" for lb in labels] + [f"= gold call: {lb}" for lb in labels]
            + [f"ooospec vs ar: {lb}" for lb in labels] + ["defects / near-ties"])
    table = []
    for r in rows:
        table.append([r["target"], f"`{r['benchmark']}`", r["n"],
                      *(fmt_cell(r["hint_tokens"][k], "{:.1f}") for k in ("oracle", "gold", *labels)),
                      *(fmt_cell(r["mat"][k], "{:.2f}") for k in (TOOLSPEC, "oracle", "gold", *labels)),
                      *(fmt_cell(r["agreement"][k], "{:.0%}") for k in labels),
                      *(fmt_cell(r["gold_rate"][k], "{:.0%}") for k in labels),
                      *(fmt_cell(r["speedup"][k], "{:.2f}x") for k in labels),
                      f"{r['defects']} / {r['near_ties']}"])
    return md_table(head, table, labels=2)


def quality_runs(prefix: Path, own: str = "gold") -> dict[str, dict]:
    """``{set name: eval_sidecar metrics}`` of the files ``PREFIX.<suffix>.json`` that exist: ``PREFIX.heldout.json``
    is the heldout of the data the adapter trained on (``own``: gold or teacher), ``PREFIX.<other>-heldout.json``
    the other's, ``PREFIX.<benchmark>.json`` zero-shot."""
    out = {}
    for path in sorted(prefix.parent.glob(f"{prefix.name}.*.json")):
        name = path.name[len(prefix.name) + 1:-len(".json")]
        if name == "train":
            continue
        label = (f"{own} heldout" if name == "heldout" else dict(QUALITY_SETS).get(name) or f"zero-shot {name}")
        out[label] = json.loads(path.read_text())
    return out


def machine_of(e: Mapping) -> str:
    cpu = e.get("cpu")
    if isinstance(cpu, Mapping):
        flags = [f for f in cpu.get("flags", ()) if f in ("avx2", "avx_vnni", "avx512_bf16", "amx_bf16")]
        cpu = f"{cpu.get('model', '?')} ({' '.join(flags)})"
    return f"{cpu or '?'}, {e['latency'].get('threads')} threads, {e.get('dtype')}"


def quality_table(quality: Mapping[str, Mapping[str, dict]]) -> str:
    sets = sorted({s for runs in quality.values() for s in runs}, key=lambda s: (s.startswith("zero"), s))
    rows = []
    for s in sets:
        for label, runs in quality.items():
            if s in runs:
                e = runs[s]
                rows.append([s, label, e.get("requests"), *(fmt_cell(get(e), spec) for _, get, spec in QUALITY_COLUMNS),
                             machine_of(e)])
    return md_table(["set", "adapter", "requests", *(h for h, _, _ in QUALITY_COLUMNS), "machine"], rows,
                    align="llrrrrrrl")


def render(runs: Mapping[str, Mapping], quality: Mapping[str, Mapping[str, dict]], command: str) -> tuple[str, dict]:
    labels = list(runs)
    rows = compare_cells(runs)
    v = verdict(rows, labels)
    first = next(iter(runs.values()))
    machine = first.get("machine", {})
    diff = v.get("difference")
    lines = [
        "# Which sidecar to ship: " + " vs ".join(labels), "",
        f"Regenerate: `{command}`", "",
        (f"Targets x benchmarks: {len(rows)} cells, {rows[0]['n'] if rows else 0} requests each (the first by id), "
         f"on {machine.get('cpu', '?')}, {machine.get('threads', '?')} threads, {machine.get('dtype', '?')}. Every "
         "wave in full, the target decoding once it is ready (`wave-first`), so hint counts and #MAT do not depend "
         "on timing; `ooospec vs ar` includes the wave."), "",
        f"**Verdict (computed): {v['winner']}** — hint tokens accepted per request over every cell: "
        + ", ".join(f"{lb} {v['hint_tokens_per_request'][lb]:.1f}" for lb in labels)
        + "; mean #MAT: " + ", ".join(f"{lb} {v['mean_mat'][lb]:.2f}" for lb in labels)
        + "; cells won on hint tokens: " + ", ".join(f"{lb} {v['cells_won'][lb]}" for lb in labels)
        + f" of {v['cells']}."
        + (f" Paired per (target, request), {diff['of']}: {diff['mean']:+.1f} tokens, bootstrap 95% interval "
           f"[{diff['ci95'][0]:+.1f}, {diff['ci95'][1]:+.1f}] over {diff['pairs']} pairs."
           if diff and diff["pairs"] else ""), "",
        "## Speed: hint tokens accepted, #MAT, calls", "", speed_table(rows, labels), "",
    ]
    if quality:
        lines += ["## Quality (eval_sidecar)", "", quality_table(quality), ""]
    return "\n".join(lines), {"verdict": v, "cells": rows, "command": command}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", action="append", required=True, metavar="LABEL=TRANSFER_JSON",
                   help="a transfer run of one adapter (two or more; the first that ran the ceilings gives them)")
    p.add_argument("--quality", action="append", default=[], metavar="LABEL=PREFIX[,SET]",
                   help="eval_sidecar metrics PREFIX.<set>.json of the same adapter; SET (gold, the default, or "
                        "teacher) names the data PREFIX.heldout.json was held out of")
    p.add_argument("--out", type=Path, required=True, help="markdown table (a .json beside it)")


def _pairs(specs: Sequence[str], flag: str) -> dict[str, Path]:
    out = {}
    for spec in specs:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            raise SystemExit(f"{flag} {spec!r}: expected LABEL=PATH")
        out[label] = Path(path)
    return out


def run_cli(args: argparse.Namespace) -> int:
    import shlex
    import sys

    runs = {label: json.loads(path.read_text()) for label, path in _pairs(args.run, "--run").items()}
    if len(runs) < 2:
        raise SystemExit("--run: give two or more adapters' transfer runs")
    quality = {}
    for label, spec in _pairs(args.quality, "--quality").items():
        prefix, _, own = str(spec).partition(",")
        quality[label] = quality_runs(Path(prefix), own or "gold")
    command = "python -m ooospec.eval.sidecar.compare " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    md, data = render(runs, quality, command)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(md)
    args.out.with_suffix(".json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(md)
    return 0


def main(argv: list[str] | None = None) -> int:
    return module_main("ooospec.eval.sidecar.compare", __doc__, add_arguments, run_cli, argv)


if __name__ == "__main__":
    raise SystemExit(main())
