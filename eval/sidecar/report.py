"""Compare trained sidecars: offline quality vs slot-wave latency, as a table and a scatter plot.

Each run is the pair of metrics files that ``train_sidecar`` and ``eval_sidecar`` write::

    python -m ooospec.eval.sidecar.report \
        smollm2-540=runs/s540.train.json,runs/s540.eval.json \
        qwen0.5b-210=runs/q210.train.json,runs/q210.eval.json --out-dir eval/reports/sidecar

writes ``eval/reports/sidecar/table.md`` (one row per run) and ``eval/reports/sidecar/sidecar.png`` (x: median wave
latency, y: function-index accuracy and non-null argument exact match). A run without training metrics
(``LABEL=EVAL.json``) is an untrained base or a zero-shot evaluation of another run's adapter. The ``(always 0)`` /
``(always null)`` columns are what a constant answer scores on the same rows (``eval_sidecar``'s ``baselines``): a
sidecar below them has learned the answer format, not the task. Pure reading of the JSON files.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ooospec.pipelines.params import module_main
from ooospec.reporting import fmt_cell, md_table

# (header, getter over (train, eval) metrics, format)
COLUMNS = [
    ("base", lambda t, e: e.get("base"), "{}"),
    ("requests trained", lambda t, e: t.get("requests", {}).get("trained"), "{:d}"),
    ("train s", lambda t, e: _train_seconds(t), "{}"),
    ("train threads", lambda t, e: t.get("threads"), "{:d}"),
    ("CPU-s / request", lambda t, e: _per_request(t), "{:.2f}"),
    ("final loss", lambda t, e: t.get("final_loss"), "{:.3f}"),
    ("function acc", lambda t, e: e["function_index"]["accuracy"], "{:.1%}"),
    ("(always 0)", lambda t, e: e.get("baselines", {}).get("function_index_always_0"), "{:.1%}"),
    ("arg EM", lambda t, e: e["argument"]["exact_match"], "{:.1%}"),
    ("(always null)", lambda t, e: e.get("baselines", {}).get("argument_always_null"), "{:.1%}"),
    ("arg EM non-null", lambda t, e: e["argument"]["exact_match_non_null"], "{:.1%}"),
    ("... of them in the block", lambda t, e: e["argument"].get("exact_match_in_block"), "{:.1%}"),
    ("joined call EM", lambda t, e: (e.get("joined") or {}).get("exact_match"), "{:.1%}"),
    ("direct EM", lambda t, e: e["direct_call"]["exact_match"], "{:.1%}"),
    ("requests", lambda t, e: e.get("requests"), "{:d}"),
    ("queries / wave", lambda t, e: e["latency"].get("median_queries"), "{}"),
    ("prefill median s", lambda t, e: _s(e["latency"].get("prefill", {}).get("median_ms")), "{:.3f}"),
    ("decode median s", lambda t, e: _s(e["latency"].get("decode", {}).get("median_ms")), "{:.3f}"),
    ("wave median s", lambda t, e: _s(e["latency"].get("wave", {}).get("median_ms")), "{:.3f}"),
    ("wave p90 s", lambda t, e: _s(e["latency"].get("wave", {}).get("p90_ms")), "{:.3f}"),
    ("threads / dtype", lambda t, e: f"{e['latency'].get('threads')} / {e.get('dtype')}", "{}"),
]


def _s(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000


def _fraction_this_run(train: dict) -> float:
    """The share of the run's steps that its timings cover (a resumed run times only the steps after the resume)."""
    steps, this_run = train.get("steps"), train.get("steps_this_run")
    return this_run / steps if steps and this_run is not None else 1.0


def _train_seconds(train: dict) -> str | None:
    """``"6985"``, or ``"3519 (325 of 400 steps)"`` for a resumed run: its seconds cover only the steps after the
    resume."""
    secs = train.get("train_seconds")
    if secs is None:
        return None
    if _fraction_this_run(train) < 1.0:
        return f"{secs:.0f} ({train['steps_this_run']} of {train['steps']} steps)"
    return f"{secs:.0f}"


def _per_request(train: dict) -> float | None:
    """Training CPU-seconds per request, from the steps the timing covers."""
    n = train.get("requests", {}).get("trained")
    cpu = train.get("train_cpu_seconds")
    frac = _fraction_this_run(train)
    return cpu / (n * frac) if n and cpu is not None and frac > 0 else None


def parse_run(spec: str) -> tuple[str, Path | None, Path]:
    """``"label=train.json,eval.json"`` or ``"label=eval.json"`` (no training: an untrained base, say) ->
    ``(label, train or None, eval)``; a malformed spec raises naming it."""
    label, sep, files = spec.partition("=")
    parts = files.split(",")
    if not sep or not label or len(parts) not in (1, 2) or not all(parts):
        raise ValueError(f"run {spec!r}: expected LABEL=TRAIN_METRICS.json,EVAL_METRICS.json or LABEL=EVAL.json")
    return (label, Path(parts[0]), Path(parts[1])) if len(parts) == 2 else (label, None, Path(parts[0]))


def table(runs: list[tuple[str, dict, dict]]) -> str:
    """Markdown table, one row per ``(label, train_metrics, eval_metrics)``."""
    rows = [[label, *(fmt_cell(get(t, e), spec) for _, get, spec in COLUMNS)] for label, t, e in runs]
    align = "l" + "".join("l" if spec == "{}" else "r" for _, _, spec in COLUMNS)
    return md_table(["run", *(h for h, _, _ in COLUMNS)], rows, align=align) + "\n"


def source_table(runs: list[tuple[str, dict, dict]]) -> str:
    """Markdown table of the runs' ``by_source`` metrics (one row per run x source); empty when no run has them."""
    rows = [(label, name, m) for label, _, e in runs for name, m in (e.get("by_source") or {}).items()]
    if not rows:
        return ""
    head = ["run", "source", "requests", "function acc", "(always 0)", "arg EM non-null", "joined call EM"]
    keys = ("function_acc", "function_always_0", "argument_exact_match_non_null", "joined_exact_match")
    cells = [[label, name, fmt_cell(m.get("requests"), "{:d}"), *(fmt_cell(m.get(k), "{:.1%}") for k in keys)]
             for label, name, m in rows]
    return md_table(head, cells, labels=2) + "\n"


TICKS_S = (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50)


def eval_set(ev: dict) -> str:
    """The short name of the rows a run was evaluated on: ``heldout``, ``apibank-l1``, ..."""
    return Path(str(ev.get("source") or "?").split()[0]).stem


def plot(runs: list[tuple[str, dict, dict]], path: Path) -> None:
    """One panel per eval set (heldout first): x = median wave latency (log), y = function accuracy (circles) and
    non-null argument EM (squares), one colour per sidecar (the label before any ``@``), the always-0 floor dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    sets = sorted({eval_set(e) for _, _, e in runs}, key=lambda n: (n != "heldout", n))
    sidecars = list(dict.fromkeys(label.split("@")[0] for label, _, _ in runs))
    colours = {name: f"C{i % 10}" for i, name in enumerate(sidecars)}
    fig, axes = plt.subplots(1, len(sets), figsize=(3.3 * len(sets) + 1.2, 3.6), sharex=True, sharey=True,
                             squeeze=False)
    for ax, name in zip(axes[0], sets):
        for label, _, e in runs:
            if eval_set(e) != name:
                continue
            x = _s(e["latency"].get("wave", {}).get("median_ms"))
            c = colours[label.split("@")[0]]
            for y, marker in ((e["function_index"]["accuracy"], "o"), (e["argument"]["exact_match_non_null"], "s")):
                if x is not None and y is not None:
                    ax.scatter([x], [y], marker=marker, color=c, s=36)
        # the constant-answer floor of the largest evaluation of this set (every run's own floor is in the table)
        sized = [(e.get("requests") or 0, e.get("baselines", {}).get("function_index_always_0"))
                 for _, _, e in runs if eval_set(e) == name]
        floor = max(sized, key=lambda t: t[0])[1] if sized else None
        if floor is not None:
            ax.axhline(floor, ls="--", lw=1, color="grey")
        n = {e.get("requests") for _, _, e in runs if eval_set(e) == name}
        ax.set_title(f"{name} ({'/'.join(str(k) for k in sorted(n, key=str))} requests)", fontsize=9)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator(TICKS_S))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("median wave, s (log)", fontsize=8)
        ax.grid(alpha=0.3, which="both")
        ax.set_ylim(0, 1.02)
    axes[0][0].set_ylabel("accuracy")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], ls="", marker="o", color=colours[n], label=n) for n in sidecars]
    handles += [Line2D([], [], ls="", marker="o", color="k", label="function acc"),
                Line2D([], [], ls="", marker="s", color="k", label="arg EM non-null"),
                Line2D([], [], ls="--", color="grey", label="function: always 0")]
    fig.legend(handles=handles, loc="center right", fontsize=7, frameon=False)
    threads = {e["latency"].get("threads") for _, _, e in runs}
    shown = "/".join(str(t) for t in sorted(threads, key=str))
    fig.suptitle(f"OoO-Spec sidecar: quality vs one-pass wave latency ({shown} thread(s))", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1 - 1.3 / (3.3 * len(sets) + 1.2), 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="LABEL=[TRAIN.json,]EVAL.json",
                        help="metrics of train_sidecar (optional) and eval_sidecar for one run")
    parser.add_argument("--out-dir", type=Path, default=Path("eval/reports/sidecar"))


def run_cli(args: argparse.Namespace) -> int:
    runs = []
    for spec in args.runs:
        label, train_path, eval_path = parse_run(spec)
        train = json.loads(train_path.read_text()) if train_path else {}
        runs.append((label, train, json.loads(eval_path.read_text())))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    text = table(runs)
    per_source = source_table(runs)
    if per_source:
        text += "\nPer source (`eval_sidecar`'s `by_source`):\n\n" + per_source
    (args.out_dir / "table.md").write_text(text)
    plot(runs, args.out_dir / "sidecar.png")
    print(text, end="")
    print(f"wrote {args.out_dir / 'table.md'} and {args.out_dir / 'sidecar.png'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return module_main("ooospec.eval.sidecar.report", __doc__, add_arguments, run_cli, argv)


if __name__ == "__main__":
    raise SystemExit(main())
