"""The bench report: tables and plots from ``ooospec bench`` results JSONs. Pure functions; method and hint-source
names come from the registry (:mod:`ooospec.runtime.methods`, torch-free); every table is rendered by
:func:`ooospec.reporting.md_table`, the markdown primitives every report shares.

Run as::

    python -m ooospec.eval.bench.report results.json --out-dir reports/bench   # writes table.md and bench.png
    python -m ooospec.eval.bench.report a.json b.json --vs-llamacpp            # one row per run against llama.cpp

The results JSON (see ``eval/bench/cli.py``) holds ``methods`` (``{name: summary}``), ``examples`` (one row per
example and method, with ``id``, ``method``, ``time_s``), and optionally ``config``, ``env`` and ``notes``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ooospec.eval.bench.summaries import method_label
from ooospec.reporting import fmt_cell, md_table
from ooospec.runtime.methods import (
    BASELINE,
    HINT_SOURCES,
    LLAMACPP_REFERENCE,
    OOOSPEC,
    REGISTRY,
    SIDECAR,
    TOOLSPEC,
)

# (header, summary key, format[, scale]), a line per group: times; speedups; tree; prefill and decode against
# the machine's roofline; exactness and defects
COLUMNS: list[tuple] = [
    ("n", "n", "{:d}"), ("mean s", "mean_s", "{:.3f}"), ("median s", "median_s", "{:.3f}"),
    ("speedup (mean)", "speedup", "{:.2f}x"), ("speedup (median/ex)", "speedup_median", "{:.2f}x"),
    (f"vs {LLAMACPP_REFERENCE}", "vs_llamacpp", "{:.2f}x"), ("decode speedup", "decode_speedup", "{:.2f}x"),
    ("#MAT", "mat", "{:.2f}"), ("mean tree", "mean_tree_size", "{:.1f}"), ("proposed", "mean_proposed_nodes", "{:.1f}"),
    ("prefill GFLOP/s", "prefill_flops_per_s", "{:.0f}", 1e-9), ("% peak", "prefill_peak_frac", "{:.0%}"),
    ("decode GB/s", "decode_bytes_per_s", "{:.1f}", 1e-9), ("% peak bw", "decode_peak_frac", "{:.0%}"),
    (f"exact vs {BASELINE}", "exact_rate", "{:.0%}"), ("exact vs stock", "exact_hf_rate", "{:.0%}"),
    ("near-ties", "near_ties", "{:d}"), ("defects", "defects", "{:d}"),
]


def method_order(results: dict) -> list[str]:
    """Methods in run order (``config.methods`` when present, else the ``methods`` object's order)."""
    listed = results.get("config", {}).get("methods") or []
    return [m for m in listed if m in results["methods"]] + [m for m in results["methods"] if m not in listed]


def cell(summary: dict, column: tuple) -> str:
    """The table cell of one summary for a ``COLUMNS`` entry (scaled when the entry has a scale).

    >>> cell({"decode_bytes_per_s": 2.5e9}, ("decode GB/s", "decode_bytes_per_s", "{:.1f}", 1e-9))
    '2.5'
    """
    _, key, spec, *scale = column
    value = summary.get(key)
    if scale and isinstance(value, (int, float)):
        value = value * scale[0]
    return fmt_cell(value, spec)


def env_line(results: dict) -> str:
    """One line naming what the numbers were measured on."""
    env, cfg = results.get("env", {}), results.get("config", {})
    parts = [f"target {cfg['target']}" if "target" in cfg else None,
             f"dataset {cfg['dataset']}" if "dataset" in cfg else None,
             f"dtype {env['dtype']}" + (f" ({env['dtype_reason']})" if env.get("dtype_reason") else "")
             if "dtype" in env else None,
             f"threads {env['threads']}" + (f" ({env['threads_reason']})" if env.get("threads_reason") else "")
             if "threads" in env else None,
             env.get("cpu"),
             "flags " + " ".join(env["cpu_flags"]) if env.get("cpu_flags") else None,
             "roofs {:.0f} GFLOP/s, {:.1f} GB/s".format(env["roofline"]["peak_flops"] * 1e-9,
                                                       env["roofline"]["peak_bytes_per_s"] * 1e-9)
             if env.get("roofline") else None,
             f"torch {env['torch']}" if "torch" in env else None,
             f"commit {str(env['commit'])[:10]}{'+dirty' if env.get('commit_dirty') else ''}"
             if env.get("commit") else None,
             "load avg {:.1f} -> {:.1f}".format(env["loadavg_start"][0], env["loadavg_end"][0])
             if "loadavg_start" in env and "loadavg_end" in env else None]
    return "; ".join(p for p in parts if p)


def mismatch_lines(results: dict) -> list[str]:
    """One line per example whose tokens differ from AR's: method, id, divergence position, AR margin, class."""
    lines = []
    for r in results["examples"]:
        m = r.get("mismatch")
        if m:
            margin = fmt_cell(m.get("margin"), "{:.3f}")
            lines.append(f"mismatch vs ar: {r['method']} {r['id']} at token {m['position']}, "
                         f"AR top-2 margin {margin} -> {m['kind']}")
    return lines


# the hint columns of methods with sidecar / gold hints (``summary["hints"]``, see eval/bench/ooospec_method.py)
HINT_COLUMNS: list[tuple] = [
    ("requests", "n", "{:d}"),
    ("ready before 1st tree", "ready_before_first_tree", "{:.0%}"), ("ready before end", "ready_before_end", "{:.0%}"),
    ("used", "used", "{:.0%}"), ("hint tokens accepted (mean)", "mean_hint_tokens_accepted", "{:.1f}"),
    ("ready after (median s)", "median_ready_s", "{:.3f}"),
    ("wave median s", "median_wave_s", "{:.3f}"), ("wave p90 s", "p90_wave_s", "{:.3f}"),
    ("sidecar prefill (median s)", "median_server_prefill_s", "{:.3f}"),
    ("sidecar decode (median s)", "median_server_decode_s", "{:.3f}"),
    ("payload bytes (median)", "median_payload_bytes", "{:.0f}"),
    ("target-side sidecar work (mean ms)", "mean_target_sidecar_s", "{:.1f}", 1e3),
]


def hint_table(results: dict) -> list[str]:
    """Markdown lines of the hint table (empty when no method has hints)."""
    names = [n for n in method_order(results) if results["methods"][n].get("hints")]
    if not names:
        return []
    rows = []
    for name in names:
        h = results["methods"][name]["hints"]
        errors = ", ".join(f"{k} {v}" for k, v in sorted((h.get("errors") or {}).items())) or "-"
        rows.append([method_label(name), *(cell(h, c) for c in HINT_COLUMNS), errors])
    table = md_table(["hints of", *(c[0] for c in HINT_COLUMNS), "errors"], rows,
                     align="l" + "r" * len(HINT_COLUMNS) + "l")
    return ["", table] + wave_vs_call_lines(results, names)


def wave_vs_call_lines(results: dict, names: list[str], against: str = TOOLSPEC) -> list[str]:
    """One line per hint method: its median and p90 wave as fractions of the median ``against`` call of the same
    run (the sidecar issue's budget: a hint is only worth something if the wave is short next to the call)."""
    call = results["methods"].get(against, {}).get("median_s")
    if not call:
        return []
    out = []
    for name in names:
        h = results["methods"][name]["hints"]
        if h.get("median_wave_s") is None:
            continue
        out.append(f"{name}: median wave {h['median_wave_s']:.3f} s = {h['median_wave_s'] / call:.2f} x and p90 "
                   f"wave {h['p90_wave_s']:.3f} s = {h['p90_wave_s'] / call:.2f} x the median {against} call "
                   f"({call:.3f} s) of this run")
    return [""] + out if out else []


def hint_source_of(name: str, summary_hints: dict, config: dict) -> str:
    """Where method ``name``'s hints came from: its summary's ``hints.source`` when it has one, else the registry's
    source of a ceiling method, else the run's ``--hints`` (method ``ooospec`` takes its hints from there)."""
    method = REGISTRY.get(name)
    registered = method.hints if method is not None and not method.uses_sidecar else None
    return summary_hints.get("source") or registered or config.get("hints") or SIDECAR


def hint_sources_table(results: dict) -> list[str]:
    """Markdown lines of the "hints: oracle / gold / real" table (empty when no method has hints): for each hint
    method of this run (``ooospec-oracle``, ``ooospec-gold``, ``ooospec``), on its benchmark, the hint tokens
    accepted per request (mean) and #MAT, in the order of :data:`~ooospec.runtime.methods.HINT_SOURCES`: the oracle
    (the target's own call) first, then gold, then the sidecar ("real")."""
    cfg = results.get("config", {})
    benchmark = Path(str(cfg["dataset"])).stem if cfg.get("dataset") else "-"
    found = []
    for name in method_order(results):
        summary = results["methods"][name]
        h = summary.get("hints")
        if h:
            found.append((hint_source_of(name, h, cfg), name, summary, h))
    if not found:
        return []
    order = list(HINT_SOURCES)
    found.sort(key=lambda f: order.index(f[0]) if f[0] in order else len(order))
    rows = [[benchmark, HINT_SOURCES[source].label if source in HINT_SOURCES else source, name,
             fmt_cell(h.get("n"), "{:d}"),
             fmt_cell(h.get("mean_hint_tokens_accepted"), "{:.1f}"), fmt_cell(summary.get("mat"), "{:.2f}")]
            for source, name, summary, h in found]
    table = md_table(["benchmark", "hints", "method", "requests", "hint tokens accepted (mean)", "#MAT"], rows,
                     labels=3)
    return ["", "hints: oracle / gold / real", "", table]


def adapter_line(results: dict) -> str | None:
    """The sidecar adapter behind the run's sidecar hints (``env.sidecar_adapter``), None when no sidecar ran."""
    rec = results.get("env", {}).get("sidecar_adapter")
    if not rec:
        return None
    if rec.get("path") is None:
        return f"sidecar hints from the server {rec.get('url')} (adapter not named)"
    sha = fmt_cell(rec.get("sha256"), "{:.12}")
    return f"sidecar adapter {rec['path']} (weights sha256 {sha}, layout {fmt_cell(rec.get('layout_version'), '{}')})"


def markdown_table(results: dict) -> str:
    """The per-method summary as a markdown table (and the hint tables); the environment line, notes and
    mismatches under it."""
    rows = [[method_label(name), *(cell(results["methods"][name], c) for c in COLUMNS)]
            for name in method_order(results)]
    lines = [md_table(["method", *(c[0] for c in COLUMNS)], rows)]
    lines += hint_table(results)
    lines += hint_sources_table(results)
    footer = ([env_line(results), adapter_line(results)] + [f"note: {n}" for n in results.get("notes", [])]
              + mismatch_lines(results))
    return "\n".join(lines + [""] + [f for f in footer if f])


def times_vs_baseline(results: dict, method: str, baseline: str = BASELINE) -> tuple[list[float], list[float]]:
    """``(baseline times, method times)`` paired by example id, in id order."""
    rows = {(r["method"], r["id"]): r["time_s"] for r in results["examples"]}
    ids = sorted(i for m, i in rows if m == method and (baseline, i) in rows)
    return [rows[(baseline, i)] for i in ids], [rows[(method, i)] for i in ids]


def plot(results: dict, path: Path, baseline: str = BASELINE) -> Path:
    """A PNG: speedup bars (mean-time ratio, exactness annotated) and per-example time vs the baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = method_order(results)
    summaries = [results["methods"][n] for n in names]
    fig, (ax_bar, ax_sc) = plt.subplots(1, 2, figsize=(12, 4.5))

    speedups = [s.get("speedup") or 0.0 for s in summaries]
    bars = ax_bar.bar(names, speedups, color=["#888888" if n == baseline else "#3b75af" for n in names])
    ax_bar.axhline(1.0, color="black", lw=0.8, ls="--")
    for bar, s in zip(bars, summaries):
        exact = fmt_cell(s.get("exact_rate"), "{:.0%}")
        ax_bar.annotate(f"{bar.get_height():.2f}x\nexact {exact}", (bar.get_x() + bar.get_width() / 2,
                        bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax_bar.set_ylabel(f"speedup vs {baseline} (ratio of mean times)")
    ax_bar.set_ylim(0, max(speedups + [1.0]) * 1.3)
    ax_bar.tick_params(axis="x", rotation=30)

    top = 0.0
    for name in names:
        if name == baseline:
            continue
        x, y = times_vs_baseline(results, name, baseline)
        ax_sc.scatter(x, y, s=14, label=name, alpha=0.8)
        top = max([top] + x + y)
    ax_sc.plot([0, top or 1.0], [0, top or 1.0], color="black", lw=0.8, ls="--", label="= " + baseline)
    ax_sc.set_xlabel(f"{baseline} time per example (s)")
    ax_sc.set_ylabel("method time per example (s)")
    ax_sc.legend(fontsize=8)

    fig.suptitle(env_line(results), fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(results: dict, out_dir: Path) -> list[Path]:
    """``out_dir/table.md`` and ``out_dir/bench.png``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    table = out_dir / "table.md"
    table.write_text(markdown_table(results) + "\n", encoding="utf-8")
    return [table, plot(results, out_dir / "bench.png")]


def vs_llamacpp_table(runs: list[dict], methods: tuple[str, ...] = (BASELINE, TOOLSPEC)) -> str:
    """One row per bench run that has the ``llama.cpp`` peer: its mean time and each method's ratio to it
    (> 1: faster than llama.cpp's plain greedy decoding), #MAT, exactness vs ``ar`` and the mismatch classes."""
    peer = LLAMACPP_REFERENCE
    head = ["target", "benchmark", "toolbox", "n", f"{peer} mean s"]
    for m in methods:
        head += [f"{m} mean s", f"{m} vs {peer}"]
    head += [f"{TOOLSPEC} #MAT", f"identical to {BASELINE}", "near-ties", "defects"]
    rows = []
    for res in runs:
        cfg, summ = res.get("config", {}), res["methods"]
        if peer not in summ:
            continue
        row = [cfg.get("target", "?"), cfg.get("dataset", "?"), "warm" if cfg.get("warm_tools") else "cold",
               str(summ[peer]["n"]), f"{summ[peer]['mean_s']:.2f}"]
        for m in methods:
            s = summ.get(m, {})
            row += [fmt_cell(s.get("mean_s"), "{:.2f}"), fmt_cell(s.get("vs_llamacpp"), "**{:.2f}x**")]
        spec = [summ[m] for m in summ if m not in (BASELINE, peer)]
        n = sum(s["n"] for s in spec)
        row += [fmt_cell(summ.get(TOOLSPEC, {}).get("mat"), "{:.2f}"),
                f"{sum(s['exact_rate'] * s['n'] for s in spec) / n:.0%}" if n else "-",
                str(sum(s["near_ties"] for s in spec)), str(sum(s["defects"] for s in spec))]
        rows.append(row)
    return md_table(head, rows, align="l" * len(head)) + "\n"


def gate_table(runs: list[dict]) -> str:
    """One row per bench run with ``toolspec`` and ``ooospec``: the ratio of their mean times (> 1: the sidecar paid),
    what the wave gate decided for the run's requests (``skip`` / ``index`` / ``slots``), the hint tokens accepted
    per request and exactness (identical to ``ar``, near-ties, defects of ``ooospec``)."""
    head = ["target", "benchmark", "toolbox", "n", f"{TOOLSPEC} mean s", f"{OOOSPEC} mean s",
            f"{OOOSPEC} vs {TOOLSPEC}", "waves: skip / index / slots", "hint tokens accepted",
            f"identical to {BASELINE}", "near-ties", "defects"]
    rows = []
    for res in runs:
        cfg, summ = res.get("config", {}), res["methods"]
        if TOOLSPEC not in summ or OOOSPEC not in summ:
            continue
        ts, oo = summ[TOOLSPEC], summ[OOOSPEC]
        hints = [e.get("hints") or {} for e in res["examples"] if e["method"] == OOOSPEC]
        decided = [(h.get("wave") or {}).get("decision") for h in hints]
        waves = " / ".join(str(decided.count(k)) for k in ("skip", "index", "slots")) if any(decided) else "no gate"
        accepted = [h.get("num_accepted_tokens") or 0 for h in hints]
        rows.append([cfg.get("target", "?"), cfg.get("dataset", "?"), "warm" if cfg.get("warm_tools") else "cold",
                     str(oo["n"]), f"{ts['mean_s']:.2f}", f"{oo['mean_s']:.2f}",
                     f"**{ts['mean_s'] / oo['mean_s']:.2f}x**" if oo["mean_s"] else "-", waves,
                     f"{sum(accepted) / len(accepted):.1f}" if accepted else "-", f"{oo['exact_rate']:.0%}",
                     str(oo["near_ties"]), str(oo["defects"])])
    return md_table(head, rows, align="l" * len(head)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ooospec.eval.bench.report", description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="+", help="results JSON(s) written by `ooospec bench --out`")
    parser.add_argument("--out-dir", type=Path, default=None, help="write table.md and bench.png here (one JSON)")
    parser.add_argument("--vs-llamacpp", action="store_true",
                        help="print one summary row per JSON against the llama.cpp peer (several JSONs)")
    parser.add_argument("--vs-toolspec", action="store_true",
                        help="print one row per JSON: ooospec against toolspec and the wave gate's decisions")
    args = parser.parse_args(argv)
    runs = []
    for path in args.results:
        with open(path, encoding="utf-8") as f:
            runs.append(json.load(f))
    if args.vs_llamacpp or args.vs_toolspec:
        if args.vs_llamacpp:
            print(vs_llamacpp_table(runs))
        if args.vs_toolspec:
            print(gate_table(runs))
        return 0
    if args.out_dir is None or len(runs) != 1:
        parser.error("give one results JSON and --out-dir (or --vs-llamacpp for a summary of several)")
    for path in write_report(runs[0], args.out_dir):
        print(path)
    print(markdown_table(runs[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
