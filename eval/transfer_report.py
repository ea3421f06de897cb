"""The transfer report: ``transfer.md`` (tables) and ``transfer.html`` (one self-contained page, plots inline),
built from the ``transfer`` stage's JSON and nothing else.

Run as::

    ooospec transfer-report eval/reports/transfer/transfer.json --out-dir eval/reports/transfer

(the stage runs the same :func:`write_reports` at its end). Every number printed is a value of the JSON,
formatted by :func:`ooospec.reporting.fmt_cell`; the "transfer, honestly" sentences (:func:`transfer_notes`)
compare those values with the thresholds below. Both documents render the same :class:`Table` objects
(:func:`tables`), so the Markdown and the HTML cannot disagree.
"""

from __future__ import annotations

import argparse
import html
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ooospec.eval.transfer_data import bench_name, methods_of, targets_of
from ooospec.reporting import fmt_cell, md_table, md_text

HELPS = 1.05          # hint gain (ooospec over toolspec, ratio of mean times) from which hints "help"
WEAK_CALLER = 0.5     # own call accuracy below which a target is a weak caller
LATE = 0.5            # share of requests whose wave was ready before the call ended, below which hints are late
WRONG = 0.5           # share of requests with a right sidecar call, below which hints are mostly wrong
HEADLINE_SKIP = ("ar", "hf-greedy")   # the baseline and the stock-generate reference: detail tables only
DISPLAY = {"ooospec-gold": "ooospec-gold (ceiling)", "hf-greedy": "hf-greedy (stock generate)"}


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


# -------------------------------------------------------------------------------------------- reading


def dig(obj: Any, *keys: str) -> Any:
    """``obj[k1][k2]...``, None as soon as a level is missing or None.

    >>> dig({"a": {"b": 1}}, "a", "b"), dig({"a": None}, "a", "b")
    (1, None)
    """
    for k in keys:
        if not isinstance(obj, dict) or obj.get(k) is None:
            return None
        obj = obj[k]
    return obj


def speedup_cell(value: float | None) -> Cell:
    return Cell(fmt_cell(value, "{:.2f}x"), value)


def ci_cell(summary: dict | None) -> Cell:
    """``1.48x [1.21, 1.80]``: the median per-example speedup and its bootstrap 95% interval."""
    if summary is None or summary.get("speedup_median") is None:
        return Cell("-")
    lo, hi = summary["speedup_median_ci"]
    return Cell(f"{summary['speedup_median']:.2f}x [{fmt_cell(lo, '{:.2f}')}, {fmt_cell(hi, '{:.2f}')}]",
                summary["speedup_median"])


# ---------------------------------------------------------------------------------------------- tables


def speedup_table(results: dict) -> Table:
    methods = [m for m in methods_of(results) if m not in HEADLINE_SKIP]
    rows = [[Cell(c["target"]), Cell(bench_name(c)), Cell(fmt_cell(c["methods"]["ar"]["n"], "{:d}"))]
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
                     speedup_cell(dig(s, "speedup", "toolspec")), speedup_cell(dig(s, "speedup", "ooospec")),
                     speedup_cell(s.get("ooospec_gain")), speedup_cell(s.get("ooospec-gold_gain"))])
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
    if not any("ooospec" in c["methods"] and "toolspec" in c["methods"] for c in results["cells"]):
        return None
    rows = [[Cell(c["target"]), Cell(bench_name(c)), speedup_cell(ratio(c, "ooospec", "toolspec")),
             speedup_cell(ratio(c, "ooospec-gold", "toolspec"))] for c in results["cells"]]
    return Table("gains", "Hint gain per cell (over toolspec)",
                 ["target", "benchmark", "ooospec / toolspec", "gold at time zero / toolspec (ceiling)"], rows,
                 lead="ToolSpec's mean time over the method's, same examples, same process (1.00x: hints changed "
                      "nothing).")


def call_table(results: dict) -> Table:
    rows = []
    for c in results["cells"]:
        own = c["methods"]["ar"]["call"]
        side = dig(c, "methods", "ooospec", "hints", "sidecar_call")
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
    cells = [c for c in results["cells"] if dig(c, "methods", "ooospec", "hints")]
    if not cells:
        return None
    rows = []
    for c in cells:
        h = c["methods"]["ooospec"]["hints"]
        errors = ", ".join(f"{k} {v}" for k, v in sorted((h.get("errors") or {}).items())) or "-"
        target_ms = h.get("mean_target_sidecar_s")
        rows.append([Cell(c["target"]), Cell(bench_name(c))]
                    + [Cell(fmt_cell(dig(h, *keys), spec)) for _, keys, spec in HINT_COLUMNS]
                    + [Cell(fmt_cell(None if target_ms is None else target_ms * 1e3, "{:.1f}")), Cell(errors),
                       Cell(fmt_cell(dig(c, "methods", "ooospec-gold", "hints", "used"), "{:.0%}"))])
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


# ---------------------------------------------------------------------------------------- honest notes


def sidecar_line(results: dict) -> str:
    s = results.get("sidecar")
    if not s:
        return "none (method ooospec not run)"
    trained = f", {s['requests_trained']} training requests" if s.get("requests_trained") else ""
    return f"{s['adapter']} (base {s.get('base')}{trained}, weights {s.get('weights')})"


def transfer_notes(results: dict) -> list[tuple[str, str, list[str]]]:
    """Per target ``(target, verdict, reasons)``: whether hints help it, and when they help little, why -- every
    reason a comparison of the JSON's values with :data:`HELPS`, :data:`WEAK_CALLER`, :data:`LATE`, :data:`WRONG`."""
    out = []
    sidecar_base = (results.get("sidecar") or {}).get("base") or "the sidecar"
    for t in targets_of(results):
        info, s = results["targets"][t]["info"], results["targets"][t]["summary"]
        gain, ceiling = s.get("ooospec_gain"), s.get("ooospec-gold_gain")
        reasons: list[str] = []
        if gain is None:
            out.append((t, "ooospec (or toolspec) did not run for this target.", reasons))
            continue
        sp = s["speedup"]
        numbers = (f"ooospec {sp['ooospec']:.2f}x vs AR, {gain:.2f}x over toolspec's {sp['toolspec']:.2f}x"
                   + (f"; gold-hint ceiling {ceiling:.2f}x over toolspec" if ceiling is not None else ""))
        helps = gain >= HELPS
        verdict = f"Hints help: {numbers}." if helps else f"Hints help little: {numbers}."
        call = s["call"]
        if call["call"] < WEAK_CALLER:
            reasons.append(f"a weak caller: its own output is the right call in {call['call']:.0%} of its "
                           f"{call['n']} requests (right function in {call['name']:.0%}); hints carry the right "
                           f"call, so they seldom match what this target writes.")
        if s.get("budget_without_call", 0) >= 0.5:
            reasons.append(f"{s['budget_without_call']:.0%} of its answers hold no call and ran into the "
                           f"{results['params']['max_new_tokens']}-token budget: its speedups there measure drafting "
                           f"of that text (often repetitive, which prompt lookup copies well), not of tool calls.")
        if info["chat_template"] == "none":
            reasons.append("no chat template (a base model): the prompt is the plain System/User/Assistant "
                           "fallback, so it answers in its own way rather than in a call format it was tuned on.")
        elif info["chat_template"] == "plain":
            reasons.append(f"its chat template has no tool support: the tools go into the system prompt as JSON and "
                           f"the call format is the {info['format']} fallback.")
        h = s.get("hints") or {}
        errors = h.get("errors") or {}
        skipped = (h.get("wave_decisions") or {}).get("skip", 0) if h else 0
        if skipped:
            reasons.append(f"the wave gate skipped {skipped} of {h['n']} waves: on this machine and deployment "
                           f"their expected cost (sidecar compute on the target's cores) exceeded what their hints "
                           f"would save, so those requests ran as toolspec does (each decision with its estimate is "
                           f"in the cell's hints.wave).")
        if h and h["ready_before_end"] < LATE and skipped < h["n"]:
            why = []
            if errors.get("cancelled"):
                why.append(f"{errors['cancelled']} of {h['n']} waves were still running when the call ended "
                           f"(median wave {fmt_cell(h.get('median_wave_s'), '{:.1f}')} s; a whole toolspec call took "
                           f"{s['mean_s']['toolspec']:.1f} s on average)")
            failed = {k: v for k, v in errors.items() if k != "cancelled"}
            if failed:
                why.append(f"{sum(failed.values())} of {h['n']} waves brought no usable call ("
                           + ", ".join(f"{k} {v}" for k, v in sorted(failed.items())) + ")")
            reasons.append(f"hints seldom arrive: the bank was ready before the call ended in "
                           f"{h['ready_before_end']:.0%} of requests" + (": " + "; ".join(why) if why else "") + ".")
        side = h.get("sidecar_call_arrived") if h else None
        if side and side["call"] < WRONG:
            reasons.append(f"hints are mostly wrong: of the {side['n']} calls the sidecar delivered in time, "
                           f"{side['call']:.0%} were right ({side['name']:.0%} named the right function).")
        deployment = next((c["env"].get("deployment") for c in results["cells"] if c["target"] == t), None)
        if h and gain < 1 / HELPS and h.get("mean_wave_s") is not None:
            reasons.append(f"the sidecar costs more than it saves: ooospec took {s['mean_s']['ooospec']:.1f} s per "
                           f"request against toolspec's {s['mean_s']['toolspec']:.1f} s, hints used in "
                           f"{h['used']:.0%} of requests; under the {deployment} deployment the wave (mean "
                           f"{h['mean_wave_s']:.1f} s of sidecar compute) runs on cores the target needs.")
        if ceiling is not None and ceiling < HELPS:
            reasons.append(f"little headroom: even gold hints at time zero gain only {ceiling:.2f}x over toolspec; "
                           f"the schema FSM and retrieval drafts already propose most of what a hint would.")
        if not helps and not reasons:
            reasons.append(f"none of the usual causes shows in the data (calls right, waves on time, headroom "
                           f"present); with {s['examples']} examples this may be noise.")
        if info.get("same_tokenizer_as_sidecar") is False:
            reasons.append(f"its tokenizer differs from the sidecar's ({sidecar_base}): hints travel as text and are "
                           f"re-tokenized with the target's tokenizer, so that alone costs nothing (the gold-hint "
                           f"ceiling takes the same path).")
        out.append((t, verdict, reasons))
    return out


# ------------------------------------------------------------------------------------------- markdown


def table_markdown(table: Table) -> str:
    lines = [f"### {table.title}", ""]
    if table.lead:
        lines += [table.lead, ""]
    lines.append(md_table(table.headers, [[c.text for c in row] for row in table.rows], labels=table.labels))
    if table.notes:
        lines += [""] + [f"- {md_text(n)}" for n in table.notes]
    return "\n".join(lines)


def plural(n: int, noun: str) -> str:
    """``plural(1, "cell")`` -> ``'1 cell'``, ``plural(3, "cell")`` -> ``'3 cells'``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def headline(results: dict) -> str:
    p = results["params"]
    n_cells = len(results["cells"])
    n_benches = len({bench_name(c) for c in results["cells"]})
    return (f"{plural(len(results['targets']), 'target')} x {plural(n_benches, 'benchmark')} "
            f"({plural(n_cells, 'cell')}), the first {plural(p['limit'], 'example')} of each, up to "
            f"{p['max_new_tokens']} new tokens, "
            + ("warm toolbox (every method's system + tools block cached before the clock starts); "
               if p.get("warm_tools") else "cold (every prompt prefilled in full); ")
            + f"one frozen sidecar: {sidecar_line(results)}. Measured on {results['machine']['cpu']}, "
            f"{plural(results['machine']['threads'], 'thread')}, {results['machine']['dtype']}. Measuring took "
            f"{results['measured_s'] / 60:.1f} min"
            + (f" ({plural(results['resumed_cells'], 'cell')} resumed after a stop)"
               if results["resumed_cells"] else "")
            + f"; the stage's last "
            f"run took {results['wall_s'] / 60:.1f} min (started {results['started']}).")


def regenerate_sentence(results: dict) -> str:
    if results["command"] == results["full_command"]:
        return f"Regenerate (this is the full matrix): `{results['command']}`."
    return f"Regenerate: `{results['command']}`; the full matrix: `{results['full_command']}`."


def report_dir_of(results: dict) -> str:
    """The report folder the run wrote (the command's second argument), for the rebuild command."""
    words = results["command"].split()
    if len(words) > 4 and words[:3] == ["python", "-m", "ooospec.eval.transfer"]:
        return words[4]
    return "eval/reports/transfer"


def markdown(results: dict) -> str:
    """The whole Markdown report."""
    by_slug = {t.slug: t for t in tables(results)}
    parts = ["# Transfer: one frozen sidecar, every target", "", headline(results), "",
             regenerate_sentence(results), "",
             "![speedup per target and benchmark](speedup.png)", "",
             "Dots: median per-example speedup vs AR with its bootstrap 95% interval; crosses: ratio of mean times.",
             "", "## Headline", "", table_markdown(by_slug["speedup"]), "", table_markdown(by_slug["median"]), "",
             "## Transfer, honestly", ""]
    for target, verdict, reasons in transfer_notes(results):
        parts.append(f"- **{target}**: {verdict}" + "".join(f" ({i}) {r}" for i, r in enumerate(reasons, 1)))
    parts += ["", "## Targets, calls and hints", ""]
    parts += [table_markdown(by_slug[s]) + "\n" for s in ("targets", "gains", "calls", "hints") if s in by_slug]
    parts += ["## Cells in detail", ""]
    parts += [table_markdown(t) + "\n" for slug, t in by_slug.items() if slug.startswith("cell-")]
    parts += ["## Setup", "", table_markdown(by_slug["setup"]), "",
              ("Every number above is read from `transfer.json` (the stage's output); `ooospec transfer-report` "
               "rebuilds this file and `transfer.html` from it.")]
    return "\n".join(parts) + "\n"


# ----------------------------------------------------------------------------------------------- HTML

CSS = """
:root { --ink: #1f2328; --muted: #59636e; --rule: #d8dee4; --band: #f6f8fa; --accent: #d62728; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color: var(--ink); background: #fff; }
main { max-width: 1180px; margin: 0 auto; padding: 28px 28px 60px; }
h1 { font-size: 26px; margin: 0 0 6px; letter-spacing: -0.01em; }
h2 { font-size: 19px; margin: 38px 0 10px; padding-bottom: 4px; border-bottom: 1px solid var(--rule); }
h3 { font-size: 15px; margin: 22px 0 6px; }
p.lead { color: var(--muted); margin: 4px 0 10px; max-width: 980px; }
.sub { color: var(--muted); max-width: 980px; }
code { font: 12.5px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; background: var(--band);
       padding: 1px 5px; border-radius: 4px; }
.cmd { display: block; white-space: pre-wrap; overflow-wrap: anywhere; padding: 8px 10px; margin: 4px 0 0; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(255px, 1fr)); gap: 12px; margin: 18px 0 6px; }
.card { border: 1px solid var(--rule); border-radius: 10px; padding: 12px 14px; background: #fff; }
.card h4 { margin: 0 0 2px; font-size: 14px; }
.card .chips { color: var(--muted); font-size: 12px; margin-bottom: 8px; }
.card .big { font-size: 24px; font-weight: 650; letter-spacing: -0.02em; }
.card .big small { font-size: 12px; font-weight: 400; color: var(--muted); letter-spacing: 0; }
.card .line { font-size: 12.5px; color: var(--muted); }
.card .verdict { margin-top: 6px; font-size: 12.5px; font-weight: 600; }
.good { color: #1a7f37; } .meh { color: #9a6700; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; font-size: 13px; margin: 6px 0 4px; }
th, td { padding: 4px 10px; border-bottom: 1px solid var(--rule); white-space: nowrap; }
th { text-align: right; font-weight: 600; background: var(--band); vertical-align: bottom; white-space: normal;
     max-width: 130px; line-height: 1.25; }
th.label, td.label { text-align: left; }
td { text-align: right; }
tbody tr:hover td { background: #fafbfc; }
ul.notes { color: var(--muted); font-size: 12.5px; margin: 4px 0 0; padding-left: 18px; }
figure { margin: 10px 0 8px; }
figure svg { max-width: 100%; height: auto; }
figcaption { color: var(--muted); font-size: 12.5px; max-width: 980px; }
.honest { border-left: 4px solid var(--rule); padding: 6px 12px; margin: 10px 0; background: #fcfcfd; }
.honest.helps { border-left-color: #1a7f37; } .honest.little { border-left-color: #bf8700; }
.honest ol { margin: 4px 0 0; padding-left: 20px; }
details { margin: 8px 0; } summary { cursor: pointer; font-weight: 600; }
footer { margin-top: 40px; color: var(--muted); font-size: 12.5px; }
"""


def shade(value: float | None) -> str:
    """A background for a speedup cell: green above 1x, red below, stronger further away (log scale, capped)."""
    import math

    if value is None or value <= 0:
        return ""
    x = max(-1.0, min(1.0, math.log2(value) / 1.5))
    if abs(x) < 0.03:
        return ""
    rgb = "26,127,55" if x > 0 else "207,34,46"
    return f' style="background: rgba({rgb},{0.06 + 0.30 * abs(x):.2f})"'


def table_html(table: Table) -> str:
    esc = html.escape
    head = "".join(f'<th class="label">{esc(h)}</th>' if i < table.labels else f"<th>{esc(h)}</th>"
                   for i, h in enumerate(table.headers))
    body = []
    for row in table.rows:
        tds = "".join(f'<td class="label">{esc(c.text)}</td>' if i < table.labels
                      else f"<td{shade(c.value)}>{esc(c.text)}</td>" for i, c in enumerate(row))
        body.append(f"<tr>{tds}</tr>")
    parts = [f'<h3 id="{esc(table.slug)}">{esc(table.title)}</h3>']
    if table.lead:
        parts.append(f'<p class="lead">{esc(table.lead)}</p>')
    parts.append(f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody>'
                 f"</table></div>")
    if table.notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in table.notes) + "</ul>")
    return "\n".join(parts)


def cards_html(results: dict) -> str:
    """One card per target: ooospec's and toolspec's pooled speedup, the hint gain, own call accuracy, verdict."""
    esc = html.escape
    notes = {t: (verdict, reasons) for t, verdict, reasons in transfer_notes(results)}
    out = []
    for t in targets_of(results):
        info, s = results["targets"][t]["info"], results["targets"][t]["summary"]
        sp = s.get("speedup", {})
        best = "ooospec" if "ooospec" in sp else "toolspec" if "toolspec" in sp else None
        big = (f'{sp[best]:.2f}x <small>{esc(best)} vs AR</small>' if best else "-")
        lines = []
        if "toolspec" in sp and best == "ooospec":
            lines.append(f"toolspec {sp['toolspec']:.2f}x · hint gain {fmt_cell(s.get('ooospec_gain'), '{:.2f}x')}"
                         f" (ceiling {fmt_cell(s.get('ooospec-gold_gain'), '{:.2f}x')})")
        lines.append(f"own call right: {fmt_cell(dig(s, 'call', 'call'), '{:.0%}')} of {s['examples']} requests")
        verdict = notes[t][0]
        cls = "good" if verdict.startswith("Hints help:") else "meh"
        short = "hints help" if cls == "good" else "hints help little" if "little" in verdict else "no hints run"
        chips = f"{info['model_type']} · {info['num_params'] / 1e6:.0f}M · template: {info['chat_template']}"
        out.append(f'<div class="card"><h4>{esc(t)}</h4><div class="chips">{esc(chips)}</div>'
                   f'<div class="big">{big}</div>' + "".join(f'<div class="line">{esc(x)}</div>' for x in lines)
                   + f'<div class="verdict {cls}">{esc(short)}</div></div>')
    return '<div class="cards">' + "".join(out) + "</div>"


def honest_html(results: dict) -> str:
    esc = html.escape
    out = []
    for target, verdict, reasons in transfer_notes(results):
        cls = "helps" if verdict.startswith("Hints help:") else "little"
        items = "".join(f"<li>{esc(r)}</li>" for r in reasons)
        out.append(f'<div class="honest {cls}"><b>{esc(target)}</b>: {esc(verdict)}'
                   + (f"<ol>{items}</ol>" if items else "") + "</div>")
    return "\n".join(out)


CAPTIONS = {
    "speedup": "Each dot: a method's median per-example speedup vs AR in one cell, the line through it its "
               "bootstrap 95% interval; the cross: the ratio of mean times (the headline number). Right of the dashed "
               "line is faster than AR.",
    "accepted": "Tokens committed per target forward (accepted drafts + the bonus token), pooled over every cell. "
                "Plain decoding commits 1; every bar further right is a forward that did the work of several.",
    "timeline": "A few requests on one time axis: AR, ToolSpec and OoO-Spec decoding the same prompt, and the "
                "sidecar's wave for the OoO-Spec call (submitted at arrival; the target never waits for it).",
    "cost_gain": "Per target: seconds per request that hints save over ToolSpec (sidecar hints, and gold hints as the "
                 "ceiling) next to what the sidecar costs: its wave (compute beside the target) and the target "
                 "process's own sidecar work.",
}


def html_page(results: dict, figures: dict[str, str]) -> str:
    """The whole page; ``figures``: ``{name: inline svg}`` (see :mod:`ooospec.eval.transfer_plots`)."""
    esc = html.escape
    all_tables = tables(results)
    by_slug = {t.slug: t for t in all_tables}

    def fig(name: str, title: str) -> str:
        if name not in figures:
            return ""
        return (f'<h3 id="fig-{name}">{esc(title)}</h3><figure>{figures[name]}'
                f"<figcaption>{esc(CAPTIONS[name])}</figcaption></figure>")

    cells = "\n".join(table_html(t) for t in all_tables if t.slug.startswith("cell-"))
    body = f"""
<main>
<h1>Transfer: one frozen sidecar, every target</h1>
<p class="sub">{esc(headline(results))}</p>
{cards_html(results)}
<h2 id="headline">Speedup per target and benchmark</h2>
{fig("speedup", "Median per-example speedup with 95% intervals")}
{table_html(by_slug["speedup"])}
{table_html(by_slug["median"])}
<h2 id="honest">Transfer, honestly</h2>
<p class="lead">Where hints help little, the reasons below are the measured values that fall short
(own call accuracy under {WEAK_CALLER:.0%}, waves ready in time for under {LATE:.0%} of requests, sidecar calls right
for under {WRONG:.0%}, a gold-hint ceiling under {HELPS:.2f}x), plus what the prompt looked like.</p>
{honest_html(results)}
<h2 id="targets">Targets, calls and hints</h2>
{table_html(by_slug["targets"])}
{table_html(by_slug["gains"]) if "gains" in by_slug else ""}
{table_html(by_slug["calls"])}
{table_html(by_slug["hints"]) if "hints" in by_slug else ""}
{fig("cost_gain", "What the sidecar costs vs what it saves")}
<h2 id="decoding">How decoding went</h2>
{fig("accepted", "Accepted length per forward")}
{fig("timeline", "Target steps vs the sidecar's wave")}
<details open><summary>Cells in detail (every method, exactness, near-ties)</summary>
{cells}
</details>
<h2 id="setup">Setup</h2>
{table_html(by_slug["setup"])}
<footer>
<p>Regenerate this run: <code class="cmd">{esc(results["command"])}</code></p>
{"" if results["command"] == results["full_command"] else
 f'<p>The full matrix: <code class="cmd">{esc(results["full_command"])}</code></p>'}
<p>Every number on this page is read from <code>transfer.json</code>, the stage's output;
<code>ooospec transfer-report {report_dir_of(results)}/transfer.json --out-dir {report_dir_of(results)}</code> rebuilds
this page and <code>transfer.md</code> from it. Code fingerprint {esc(str(results.get("code")))}.</p>
</footer>
</main>"""
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>ooo-spec transfer report</title><style>{CSS}</style></head><body>{body}</body></html>\n")


# ---------------------------------------------------------------------------------------------- writing


def dvc_plot_rows(results: dict) -> list[dict]:
    """Rows of ``plots/speedup.json`` for ``dvc plots``: one per cell and method (ratio of mean times)."""
    return [{"cell": f"{c['target']} · {bench_name(c)} · {m}", "target": c["target"], "benchmark": bench_name(c),
             "method": m, "speedup": s["speedup"], "speedup_median": s["speedup_median"],
             "ci_lo": s["speedup_median_ci"][0], "ci_hi": s["speedup_median_ci"][1]}
            for c in results["cells"] for m in c["methods_run"] if m != "ar" for s in [c["methods"][m]]]


def write_reports(results: dict, out_dir: Path) -> list[Path]:
    """``transfer.md``, ``transfer.html``, ``speedup.png`` and ``plots/speedup.json`` under ``out_dir``."""
    from ooospec.eval import transfer_plots
    from ooospec.pipelines.records import atomic_write_text

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figs = transfer_plots.figures(results)
    png = transfer_plots.to_png(transfer_plots.speedup_figure(results), out_dir / "speedup.png")
    svgs = {name: transfer_plots.to_svg(f) for name, f in figs.items()}
    md, page, plot_rows = out_dir / "transfer.md", out_dir / "transfer.html", out_dir / "plots" / "speedup.json"
    atomic_write_text(md, markdown(results))
    atomic_write_text(page, html_page(results, svgs))
    plot_rows.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(plot_rows, json.dumps(dvc_plot_rows(results), indent=1, sort_keys=True) + "\n")
    return [md, page, png, plot_rows]


# -------------------------------------------------------------------------------------------------- CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", type=Path, help="the transfer stage's JSON (eval/reports/transfer/transfer.json)")
    p.add_argument("--out-dir", type=Path, default=None, help="default: the JSON's folder")


def run_cli(args: argparse.Namespace) -> int:
    with open(args.results, encoding="utf-8") as f:
        results = json.load(f)
    for path in write_reports(results, args.out_dir or args.results.parent):
        print(path)
    return 0
