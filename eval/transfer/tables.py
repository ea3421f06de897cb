"""The transfer report's tables, built from the stage's JSON: one :class:`Table` of :class:`Cell` s per table.

    for table in tables(results):     # headline speedups, medians, targets, gains, calls, hints, each cell, setup
        print(table.title, table.headers, [[c.text for c in row] for row in table.rows])

Every number is a value of the JSON formatted by :func:`ooospec.reporting.fmt_cell`; the Markdown
(:mod:`ooospec.eval.transfer.report`), the HTML page (:mod:`ooospec.eval.transfer.html`) and the W&B run render
the same objects, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ooospec.eval.transfer.data import CEILING, CEILING_GAIN, GAIN, bench_name, dig, methods_of, targets_of
from ooospec.eval.transfer.notes import sidecar_line
from ooospec.reporting import fmt_cell
from ooospec.runtime.methods import BASELINE, HF_REFERENCE, OOOSPEC, TOOLSPEC

HEADLINE_SKIP = (BASELINE, HF_REFERENCE)   # the baseline and the stock-generate reference: detail tables only
DISPLAY = {CEILING: f"{CEILING} (ceiling)", HF_REFERENCE: f"{HF_REFERENCE} (stock generate)"}


@dataclass
class Cell:
    text: str
    value: float | None = None        # a speedup behind the text: the HTML shades it


@dataclass
class Table:
    slug: str
    title: str
    headers: list[str]
    rows: list[list[Cell]]
    lead: str = ""                    # a sentence above the table
    notes: list[str] = field(default_factory=list)
    labels: int = 2                   # leading label columns (left-aligned)


def speedup_cell(value: float | None) -> Cell:
    return Cell(fmt_cell(value, "{:.2f}x"), value)


def ci_cell(summary: dict | None) -> Cell:
    """``1.48x [1.21, 1.80]``: the median per-example speedup and its bootstrap 95% interval."""
    if summary is None or summary.get("speedup_median") is None:
        return Cell("-")
    lo, hi = summary["speedup_median_ci"]
    return Cell(f"{summary['speedup_median']:.2f}x [{fmt_cell(lo, '{:.2f}')}, {fmt_cell(hi, '{:.2f}')}]",
                summary["speedup_median"])


def speedup_table(results: dict) -> Table:
    methods = [m for m in methods_of(results) if m not in HEADLINE_SKIP]
    rows = [[Cell(c["target"]), Cell(bench_name(c)), Cell(fmt_cell(c["methods"][BASELINE]["n"], "{:d}"))]
            + [speedup_cell(dig(c, "methods", m, "speedup")) for m in methods] for c in results["cells"]]
    notes = []
    if any(m not in c["methods"] for c in results["cells"] for m in methods):
        notes.append("-: not run for that target (hf-assisted needs a same-vocabulary draft model; see Setup).")
    return Table("speedup", "Speedup vs AR (ratio of mean times)",
                 ["target", "benchmark", "n"] + [DISPLAY.get(m, m) for m in methods], rows,
                 lead="Mean AR time over mean method time, same examples, same process. Every method's output "
                      "is the target's own greedy output (exactness below).", notes=notes)


def median_table(results: dict) -> Table:
    methods = [m for m in methods_of(results) if m not in HEADLINE_SKIP]
    rows = [[Cell(c["target"]), Cell(bench_name(c))] + [ci_cell(c["methods"].get(m)) for m in methods]
            for c in results["cells"]]
    return Table("median", "Median per-example speedup [bootstrap 95% interval]",
                 ["target", "benchmark"] + [DISPLAY.get(m, m) for m in methods], rows,
                 lead=f"Median of AR time / method time over a cell's examples; the interval is a percentile "
                      f"bootstrap ({results['params']['bootstrap_resamples']} resamples, seed "
                      f"{results['params']['seed']}).")


def target_table(results: dict) -> Table:
    rows = []
    for t in targets_of(results):
        info, s = results["targets"][t]["info"], results["targets"][t]["summary"]
        same = info.get("same_tokenizer_as_sidecar")
        rows.append([Cell(t), Cell(str(info["model_type"])), Cell(info["chat_template"]), Cell(info["format"]),
                     Cell("-" if same is None else "same" if same else "differs"),
                     Cell(fmt_cell(info["num_params"] / 1e6, "{:.0f}M")), Cell(fmt_cell(s["examples"], "{:d}")),
                     Cell(fmt_cell(dig(s, "call", "call"), "{:.0%}")),
                     speedup_cell(dig(s, "speedup", TOOLSPEC)), speedup_cell(dig(s, "speedup", OOOSPEC)),
                     speedup_cell(s.get(GAIN)), speedup_cell(s.get(CEILING_GAIN))])
    return Table("targets", "Per target, pooled over its benchmarks",
                 ["target", "family", "chat template", "call format", "tokenizer vs sidecar's", "params",
                  "examples", "own call right", "toolspec vs AR", "ooospec vs AR", "hint gain (ooospec / toolspec)",
                  "ceiling (gold / toolspec)"], rows, labels=5,
                 lead="Speedups here are ratios of mean times over all the target's examples; the hint gain is "
                      "ToolSpec's mean time over OoO-Spec's (1.00x: hints changed nothing).")


def ratio(cell: dict, num: str, den: str) -> float | None:
    """``den``'s mean time over ``num``'s in ``cell`` (> 1: ``num`` is faster); None where either is missing."""
    a, b = dig(cell, "methods", num, "mean_s"), dig(cell, "methods", den, "mean_s")
    return b / a if a and b else None


def gain_table(results: dict) -> Table | None:
    """Per cell, what the hints add over ToolSpec: the real sidecar's and, as the ceiling, gold hints at time zero."""
    if not any(OOOSPEC in c["methods"] and TOOLSPEC in c["methods"] for c in results["cells"]):
        return None
    rows = [[Cell(c["target"]), Cell(bench_name(c)), speedup_cell(ratio(c, OOOSPEC, TOOLSPEC)),
             speedup_cell(ratio(c, CEILING, TOOLSPEC))] for c in results["cells"]]
    return Table("gains", "Hint gain per cell (over toolspec)",
                 ["target", "benchmark", "ooospec / toolspec", "gold at time zero / toolspec (ceiling)"], rows,
                 lead="ToolSpec's mean time over the method's, same examples, same process (1.00x: hints changed "
                      "nothing).")


def call_table(results: dict) -> Table:
    rows = []
    for c in results["cells"]:
        own = c["methods"][BASELINE]["call"]
        side = dig(c, "methods", OOOSPEC, "hints", "sidecar_call")
        rows.append([Cell(c["target"]), Cell(bench_name(c)), Cell(fmt_cell(own["n"], "{:d}")),
                     Cell(fmt_cell(own["parsed"], "{:.0%}")), Cell(fmt_cell(own["name"], "{:.0%}")),
                     Cell(fmt_cell(own["call"], "{:.0%}")), Cell(fmt_cell(dig(side, "parsed"), "{:.0%}")),
                     Cell(fmt_cell(dig(side, "call"), "{:.0%}"))])
    return Table("calls", "Calls vs gold: the target's own and the sidecar's",
                 ["target", "benchmark", "n", "target: a call", "target: right function", "target: right call",
                  "sidecar: a call in time", "sidecar: right call"], rows,
                 lead="The target's greedy output (AR's; every exact method writes the same) parsed with its call "
                      "format; arguments must equal gold's or, on BFCL, take one of its allowed values. The "
                      "sidecar's call is the one its wave joined, when the wave arrived before the call ended.")


HINT_COLUMNS: list[tuple[str, tuple[str, ...], str]] = [
    ("requests", ("n",), "{:d}"),
    ("ready before 1st tree", ("ready_before_first_tree",), "{:.0%}"),
    ("ready before end", ("ready_before_end",), "{:.0%}"),
    ("used", ("used",), "{:.0%}"),
    ("hint tokens kept (mean)", ("mean_hint_tokens_accepted",), "{:.1f}"),
    ("wave median s", ("median_wave_s",), "{:.2f}"),
    ("ready median s", ("median_ready_s",), "{:.2f}"),
    ("payload bytes (median)", ("median_payload_bytes",), "{:.0f}"),
]


def hint_table(results: dict) -> Table | None:
    cells = [c for c in results["cells"] if dig(c, "methods", OOOSPEC, "hints")]
    if not cells:
        return None
    rows = []
    for c in cells:
        h = c["methods"][OOOSPEC]["hints"]
        errors = ", ".join(f"{k} {v}" for k, v in sorted((h.get("errors") or {}).items())) or "-"
        target_ms = h.get("mean_target_sidecar_s")
        rows.append([Cell(c["target"]), Cell(bench_name(c))]
                    + [Cell(fmt_cell(dig(h, *keys), spec)) for _, keys, spec in HINT_COLUMNS]
                    + [Cell(fmt_cell(None if target_ms is None else target_ms * 1e3, "{:.1f}")), Cell(errors),
                       Cell(fmt_cell(dig(c, "methods", CEILING, "hints", "used"), "{:.0%}"))])
    return Table("hints", "Sidecar hints (method ooospec)",
                 ["target", "benchmark"] + [h for h, _, _ in HINT_COLUMNS]
                 + ["target-side ms (mean)", "errors", "gold hints used"], rows,
                 lead="Per request: was the hint bank ready before the first tree / before the call ended, and was "
                      "any hint token accepted; the wave is the sidecar's one HTTP round trip; target-side ms is the "
                      "target process's own sidecar work (wave text, views, tokenizing, matching).")


DETAIL_COLUMNS: list[tuple[str, str, str]] = [
    ("n", "n", "{:d}"), ("mean s", "mean_s", "{:.2f}"), ("speedup (mean)", "speedup", "{:.2f}x"),
    ("decode speedup", "decode_speedup", "{:.2f}x"), ("#MAT", "mat", "{:.2f}"),
    ("mean tree", "mean_tree_size", "{:.1f}"), ("exact vs AR", "exact_rate", "{:.0%}"),
    ("exact vs HF", "exact_hf_rate", "{:.0%}"), ("near-ties", "near_ties", "{:d}"), ("defects", "defects", "{:d}"),
]


def cell_table(cell: dict) -> Table:
    rows = []
    for m in cell["methods_run"]:
        s = cell["methods"][m]
        row = [Cell(DISPLAY.get(m, m))]
        for header, key, spec in DETAIL_COLUMNS:
            row.append(speedup_cell(s.get(key)) if spec.endswith("x") else Cell(fmt_cell(s.get(key), spec)))
        row.insert(4, ci_cell(s))
        rows.append(row)
    headers = ["method"] + [h for h, _, _ in DETAIL_COLUMNS]
    headers.insert(4, "median/ex [95% CI]")
    mismatches = [f"{r['method']} {r['id']}: differs from AR at token {r['mismatch']['position']} "
                  f"(AR top-2 margin {fmt_cell(r['mismatch'].get('margin'), '{:.3f}')}, {r['mismatch']['kind']})"
                  for r in cell["examples"] if r.get("mismatch")]
    return Table(f"cell-{cell['target']}-{bench_name(cell)}", f"{cell['target']} on {bench_name(cell)}", headers,
                 rows, labels=1, notes=mismatches)


def deployment_label(env: Mapping) -> str:
    """The setup table's sidecar cell: the deployment, ``+ gate`` when the wave gate was on, ``-`` without a sidecar.

    >>> deployment_label({"deployment": "shared", "sidecar_gate": True})
    'shared + gate'
    >>> deployment_label({"deployment": None})
    '-'
    """
    if not env.get("deployment"):
        return "-"
    return env["deployment"] + (" + gate" if env.get("sidecar_gate") else "")


def setup_table(results: dict) -> Table:
    rows, reasons = [], []
    for t in targets_of(results):
        cells = [c for c in results["cells"] if c["target"] == t]
        env = cells[0]["env"]
        sessions = [s for c in cells for s in c["sessions"]]
        measured = sum(s.get("wall_s") or 0.0 for s in sessions)
        rows.append([Cell(t), Cell(env["dtype"]), Cell(str(env["threads"])), Cell(deployment_label(env)),
                     Cell(f"torch {env.get('torch')}, transformers {env.get('transformers')}"),
                     Cell(f"{str(env.get('commit'))[:10]}{'+dirty' if env.get('commit_dirty') else ''}"),
                     Cell(fmt_cell(len(sessions), "{:d}")), Cell(fmt_cell(measured / 60, "{:.1f}"))])
        reasons += [f"dtype {env['dtype']}: {env['dtype_reason']}" if env.get("dtype_reason") else "",
                    f"threads {env['threads']}: {env['threads_reason']}" if env.get("threads_reason") else ""]
    notes = list(dict.fromkeys(r for r in reasons if r))
    notes += sorted({n for c in results["cells"] for n in c.get("notes", [])})
    return Table("setup", "Machine, versions and sessions", ["target", "dtype", "threads", "sidecar deployment",
                                                             "versions", "commit", "cell sessions", "measured min"],
                 rows, labels=6, notes=notes,
                 lead=f"Machine: {results['machine']['cpu']}. Sidecar: {sidecar_line(results)}. Each cell ran "
                      f"every method interleaved per example, warm-up first, in one process; before each timed call "
                      f"the harness waited (untimed) until the sidecar server was idle.")


def tables(results: dict) -> list[Table]:
    """Every table of the report, in order (also what the W&B run logs)."""
    out = [speedup_table(results), median_table(results), target_table(results)]
    gains = gain_table(results)
    out += ([gains] if gains is not None else []) + [call_table(results)]
    hints = hint_table(results)
    if hints is not None:
        out.append(hints)
    out += [cell_table(c) for c in results["cells"]]
    out.append(setup_table(results))
    return out
