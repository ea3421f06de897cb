"""The transfer report: ``transfer.md`` (tables) and ``transfer.html`` (one self-contained page, plots inline),
built from the ``transfer`` stage's JSON and nothing else.

Run as::

    ooospec transfer-report eval/reports/transfer/transfer.json --out-dir eval/reports/transfer

(the stage runs the same :func:`write_reports` at its end). Every number printed is a value of the JSON,
formatted by :func:`ooospec.reporting.fmt_cell`; the "transfer, honestly" sentences
(:func:`~ooospec.eval.transfer.notes.transfer_notes`) compare those values with the thresholds there. Both
documents render the same :class:`~ooospec.eval.transfer.tables.Table` objects
(:func:`~ooospec.eval.transfer.tables.tables`), so the Markdown and the HTML (:mod:`ooospec.eval.transfer.html`)
cannot disagree.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ooospec.eval.transfer.data import bench_name
from ooospec.eval.transfer.html import html_page
from ooospec.eval.transfer.notes import headline, transfer_notes
from ooospec.eval.transfer.tables import Table, tables
from ooospec.reporting import md_table, md_text
from ooospec.runtime.methods import BASELINE


def table_markdown(table: Table) -> str:
    lines = [f"### {table.title}", ""]
    if table.lead:
        lines += [table.lead, ""]
    lines.append(md_table(table.headers, [[c.text for c in row] for row in table.rows], labels=table.labels))
    if table.notes:
        lines += [""] + [f"- {md_text(n)}" for n in table.notes]
    return "\n".join(lines)


def regenerate_sentence(results: dict) -> str:
    if results["command"] == results["full_command"]:
        return f"Regenerate (this is the full matrix): `{results['command']}`."
    return f"Regenerate: `{results['command']}`; the full matrix: `{results['full_command']}`."


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


def dvc_plot_rows(results: dict) -> list[dict]:
    """Rows of ``plots/speedup.json`` for ``dvc plots``: one per cell and method (ratio of mean times)."""
    return [{"cell": f"{c['target']} · {bench_name(c)} · {m}", "target": c["target"], "benchmark": bench_name(c),
             "method": m, "speedup": s["speedup"], "speedup_median": s["speedup_median"],
             "ci_lo": s["speedup_median_ci"][0], "ci_hi": s["speedup_median_ci"][1]}
            for c in results["cells"] for m in c["methods_run"] if m != BASELINE for s in [c["methods"][m]]]


def write_reports(results: dict, out_dir: Path) -> list[Path]:
    """``transfer.md``, ``transfer.html``, ``speedup.png`` and ``plots/speedup.json`` under ``out_dir``."""
    from ooospec.eval.transfer import plots as transfer_plots
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", type=Path, help="the transfer stage's JSON (eval/reports/transfer/transfer.json)")
    p.add_argument("--out-dir", type=Path, default=None, help="default: the JSON's folder")


def run_cli(args: argparse.Namespace) -> int:
    with open(args.results, encoding="utf-8") as f:
        results = json.load(f)
    for path in write_reports(results, args.out_dir or args.results.parent):
        print(path)
    return 0
