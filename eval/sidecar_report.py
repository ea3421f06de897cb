"""Compare trained sidecars: offline quality vs slot-wave latency, as a table and a scatter plot.

Each run is the pair of metrics files that ``train_sidecar`` and ``eval_sidecar`` write::

    python -m ooospec.eval.sidecar_report \
        smollm2-540=runs/s540.train.json,runs/s540.eval.json \
        qwen0.5b-210=runs/q210.train.json,runs/q210.eval.json --out-dir eval/reports/sidecar

writes ``eval/reports/sidecar/table.md`` (one row per run) and ``eval/reports/sidecar/sidecar.png`` (x: median wave
latency, y: function-index accuracy and non-null argument exact match). A run without training metrics
(``LABEL=EVAL.json``) is an untrained base or a zero-shot evaluation of another run's adapter. The ``(always 0)`` / ``(always null)``
columns are what a constant answer scores on the same rows (``eval_sidecar``'s ``baselines``): a sidecar below
them has learned the answer format, not the task. Pure reading of the JSON files.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ooospec.eval.report import fmt_cell

# (header, getter over (train, eval) metrics, format)
COLUMNS = [
    ("base", lambda t, e: e.get("base"), "{}"),
    ("requests trained", lambda t, e: t.get("requests", {}).get("trained"), "{:d}"),
    ("train s", lambda t, e: t.get("train_seconds"), "{:.0f}"),
    ("train threads", lambda t, e: t.get("threads"), "{:d}"),
    ("CPU-s / request", lambda t, e: _per_request(t), "{:.2f}"),
    ("final loss", lambda t, e: t.get("final_loss"), "{:.3f}"),
    ("function acc", lambda t, e: e["function_index"]["accuracy"], "{:.1%}"),
    ("(always 0)", lambda t, e: e.get("baselines", {}).get("function_index_always_0"), "{:.1%}"),
    ("arg EM", lambda t, e: e["argument"]["exact_match"], "{:.1%}"),
    ("(always null)", lambda t, e: e.get("baselines", {}).get("argument_always_null"), "{:.1%}"),
    ("arg EM non-null", lambda t, e: e["argument"]["exact_match_non_null"], "{:.1%}"),
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


def _per_request(train: dict) -> float | None:
    n = train.get("requests", {}).get("trained")
    cpu = train.get("train_cpu_seconds")
    return cpu / n if n and cpu is not None else None


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
    head = "| run | " + " | ".join(h for h, _, _ in COLUMNS) + " |"
    sep = "|---|" + "|".join("---" if spec == "{}" else "---:" for _, _, spec in COLUMNS) + "|"
    lines = [head, sep]
    for label, t, e in runs:
        lines.append(f"| {label} | " + " | ".join(fmt_cell(get(t, e), spec) for _, get, spec in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def plot(runs: list[tuple[str, dict, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for key, getter, marker in (("function acc", lambda e: e["function_index"]["accuracy"], "o"),
                                ("arg EM non-null", lambda e: e["argument"]["exact_match_non_null"], "s")):
        xs = [_s(e["latency"].get("wave", {}).get("median_ms")) for _, _, e in runs]
        ys = [getter(e) for _, _, e in runs]
        pts = [(x, y, label) for (label, _, _), x, y in zip(runs, xs, ys) if x is not None and y is not None]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=key)
        if marker == "o":  # one label per run
            for x, y, label in pts:
                ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    floors = {e.get("baselines", {}).get("function_index_always_0") for _, _, e in runs} - {None}
    if len(floors) == 1:  # the same heldout rows: one constant-answer floor
        ax.axhline(floors.pop(), ls="--", lw=1, color="grey", label="function: always answer 0")
    threads = {e["latency"].get("threads") for _, _, e in runs}
    ax.set_xlabel(f"median one-pass wave latency, s ({'/'.join(str(t) for t in sorted(threads, key=str))} thread(s))")
    ax.set_ylabel("heldout accuracy")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title("OoO-Spec sidecar: quality vs wave latency")
    fig.tight_layout()
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
    (args.out_dir / "table.md").write_text(text)
    plot(runs, args.out_dir / "sidecar.png")
    print(text, end="")
    print(f"wrote {args.out_dir / 'table.md'} and {args.out_dir / 'sidecar.png'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ooospec.eval.sidecar_report", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_cli(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
