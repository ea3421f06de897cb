"""The transfer report's figures, drawn from the stage's JSON (``eval/reports/transfer/transfer.json``) only.

Each function takes the results and returns a matplotlib ``Figure`` (None when the data for it is absent);
:func:`to_svg` / :func:`to_png` serialize one. Pure reading: no number here is computed that the JSON lacks,
except the layout (positions of bars and segments) and the histogram counts of the stored per-step counts.

    speedup_figure(results)      per target: each method's median per-example speedup with its 95% interval
    accepted_figure(results)     per engine method: tokens committed per target forward (histogram)
    timeline_figure(results)     a few requests: the target's steps next to the sidecar's wave
    cost_gain_figure(results)    per target: seconds hints save vs seconds the sidecar spends
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from ooospec.eval.transfer.data import CEILING, methods_of, targets_of
from ooospec.runtime.methods import BASELINE, HF_REFERENCE, OOOSPEC, REGISTRY, SIDECAR, TOOLSPEC

# one colour per method, the same in every figure and in the HTML legend (a palette: presentation, keyed by name)
METHOD_COLORS = {
    "ar": "#8c8c8c", "hf-greedy": "#b0b0b0", "pld": "#9ecae1", "hf-pld": "#6baed6", "hf-assisted": "#2171b5",
    "toolspec": "#fd8d3c", "ooospec": "#d62728", "ooospec-gold": "#7b3294",
    "pld-fixed": "#c6dbef", "toolspec-fixed": "#fdd0a2",
}
ENGINE_DRAFTERS = tuple(n for n, m in REGISTRY.items() if m.is_engine and m.drafters)
MAX_BIN = 12          # the accepted-length histogram's last bin is ">= MAX_BIN tokens"
TIMELINE_REQUESTS = 3
# svg.hashsalt + no date: the same JSON gives byte-identical figures (DVC sees no change on a rerun)
plt.rcParams.update({"font.size": 9, "axes.spines.top": False, "axes.spines.right": False,
                     "svg.fonttype": "none", "font.family": "DejaVu Sans", "svg.hashsalt": "ooospec-transfer"})


def color(method: str) -> str:
    return METHOD_COLORS.get(method, "#444444")


def benchmark_name(cell: dict) -> str:
    return Path(cell["benchmark"]).stem


def speedup_figure(results: dict) -> Figure:
    """One panel per target; rows = benchmarks; per method (``ar`` and the stock ``hf-greedy`` reference left out)
    a dot at the median per-example speedup vs AR and a line over its bootstrap 95% interval; a cross at the ratio
    of mean times. Log x axis, 1x dashed."""
    targets = targets_of(results)
    methods = [m for m in methods_of(results) if m not in (BASELINE, HF_REFERENCE)]
    benches = list(dict.fromkeys(benchmark_name(c) for c in results["cells"]))
    band = 0.8 / max(len(methods), 1)
    width = min(max(4.6 * len(targets), 8.0), 17.0)
    fig, axes = plt.subplots(1, len(targets), figsize=(width, 1.3 + 0.7 * len(benches)
                                                       + 0.09 * len(benches) * len(methods)),
                             sharey=True, squeeze=False)
    values = [1.0]
    for ax, target in zip(axes[0], targets):
        for c in (c for c in results["cells"] if c["target"] == target):
            y0 = benches.index(benchmark_name(c))
            for k, m in enumerate(methods):
                s = c["methods"].get(m)
                if s is None:
                    continue
                y = y0 - 0.4 + band * (k + 0.5)
                lo, hi = s["speedup_median_ci"]
                ax.plot([lo, hi], [y, y], color=color(m), lw=2.2, alpha=0.55, solid_capstyle="round")
                ax.plot([s["speedup_median"]], [y], "o", color=color(m), ms=5)
                ax.plot([s["speedup"]], [y], "x", color="black", ms=4, mew=1)
                values += [lo, hi, s["speedup"]]
        ax.axvline(1.0, color="black", lw=0.8, ls="--")
        ax.set_title(target, fontsize=10, fontweight="bold")
        ax.set_xscale("log")
        ax.grid(axis="x", color="#e5e5e5", lw=0.6)
        ax.set_xlabel("speedup vs AR (log)")
    axes[0][0].set_yticks(range(len(benches)), benches)
    axes[0][0].invert_yaxis()
    lo, hi = min(values) / 1.25, max(values) * 1.25
    fine = hi / lo < 8 / len(targets) ** 0.5        # room for in-between ticks on a narrow range only
    ticks = [t for t in ((0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4, 6, 8, 12, 16) if fine else (0.25, 0.5, 1, 2, 4, 8, 16))
             if lo <= t <= hi]
    for ax in axes[0]:
        ax.set_xlim(lo, hi)
        ax.set_xticks(ticks, [f"{t:g}x" for t in ticks])
        ax.minorticks_off()
    handles = [plt.Line2D([], [], color=color(m), marker="o", lw=2.2, label=m) for m in methods]
    handles.append(plt.Line2D([], [], color="black", marker="x", lw=0, label="ratio of mean times"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 8), frameon=False,
               bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, 0.09 if len(handles) <= 8 else 0.14, 1, 1))
    return fig


def committed_per_forward(results: dict, method: str) -> list[int]:
    """Tokens committed by each target forward of ``method`` over every cell: accepted drafts + the bonus."""
    return [a + 1 for c in results["cells"] for r in c["examples"] if r["method"] == method
            for a in (r.get("accepted") or [])]


def accepted_figure(results: dict) -> Figure | None:
    """Per engine method that drafts: the share of forwards committing 1, 2, ... tokens (last bin: >= MAX_BIN),
    pooled over every cell, with #MAT (tokens / forwards) in the title."""
    methods = [m for m in methods_of(results) if m in ENGINE_DRAFTERS and committed_per_forward(results, m)]
    if not methods:
        return None
    fig, axes = plt.subplots(1, len(methods), figsize=(3.1 * len(methods), 2.7), sharey=True, squeeze=False)
    for ax, m in zip(axes[0], methods):
        counts = committed_per_forward(results, m)
        bins = [0] * MAX_BIN
        for n in counts:
            bins[min(n, MAX_BIN) - 1] += 1
        ax.bar(range(1, MAX_BIN + 1), [b / len(counts) for b in bins], color=color(m), width=0.8)
        ax.set_title(f"{m}  (#MAT {sum(counts) / len(counts):.2f})", fontsize=9.5)
        ax.set_xticks([1, 2, 4, 6, 8, 10, MAX_BIN], ["1", "2", "4", "6", "8", "10", f"{MAX_BIN}+"])
        ax.set_xlabel("tokens per forward")
        ax.grid(axis="y", color="#e5e5e5", lw=0.6)
    axes[0][0].set_ylabel("share of forwards")
    axes[0][0].yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0, decimals=0))
    fig.tight_layout()
    return fig


def timeline_rows(results: dict, limit: int = TIMELINE_REQUESTS) -> list[tuple[dict, dict]]:
    """Up to ``limit`` ``(cell, ooospec row)`` pairs with sidecar hints, one per target first, waves that arrived
    preferred."""
    found = [(c, r) for c in results["cells"] for r in c["examples"]
             if r["method"] == OOOSPEC and (r.get("hints") or {}).get("source") == SIDECAR and r.get("step_s")]
    found.sort(key=lambda cr: ((cr[1]["hints"].get("ready_s") is None), cr[1]["id"]))
    picked, targets = [], set()
    for c, r in found:
        if c["target"] not in targets:
            picked.append((c, r))
            targets.add(c["target"])
    picked += [cr for cr in found if cr not in picked]
    return picked[:limit]


def _steps(ax, y: float, row: dict, height: float = 0.56) -> None:
    """One method's call as segments: setup (hatched), prefill (black), then each forward, darker the more tokens
    it kept (AR keeps one per forward: flat)."""
    setup = max(row["time_s"] - row["prefill_s"] - row["decode_s"], 0.0)
    ax.barh(y, setup, left=0, height=height, color="white", edgecolor="#9e9e9e", hatch="////", lw=0.4)
    ax.barh(y, row["prefill_s"], left=setup, height=height, color="#252525", edgecolor="white", lw=0.4)
    t = setup + row["prefill_s"]
    base = color(row["method"])
    for dt, acc in zip(row["step_s"] or [], row.get("accepted") or []):
        shade = 1.0 if row["method"] == BASELINE else 0.3 + 0.7 * min(acc, 8) / 8
        ax.barh(y, dt, left=t, height=height, color=base, alpha=shade, edgecolor="white", lw=0.3)
        t += dt


def timeline_figure(results: dict) -> Figure | None:
    """For a few requests: AR's call, ToolSpec's and OoO-Spec's steps, and the sidecar's wave on one time axis
    (0 = the request's arrival). Setup (building the drafters) is drawn before the prefill."""
    picked = timeline_rows(results)
    if not picked:
        return None
    fig, axes = plt.subplots(len(picked), 1, figsize=(11, 1.55 * len(picked) + 0.5), squeeze=False)
    for ax, (cell, row) in zip(axes[:, 0], picked):
        same = {r["method"]: r for r in cell["examples"] if r["id"] == row["id"]}
        lanes = [m for m in (BASELINE, TOOLSPEC, OOOSPEC) if m in same]
        labels = []
        for k, m in enumerate(lanes):
            r = same[m]
            if r.get("step_s"):
                _steps(ax, k, r)
            else:
                ax.barh(k, r["time_s"], height=0.56, color=color(m))
            ax.text(r["time_s"], k, f"  {r['time_s']:.2f} s, {r['forwards']} fwd", va="center", fontsize=8)
            labels.append(m)
        h = row["hints"]
        y = len(lanes)
        submit = h.get("submit_s") or 0.0
        if h.get("ready_s") is not None:
            ax.barh(y, h["ready_s"] - submit, left=submit, height=0.56, color="#2ca02c", alpha=0.8)
            ax.axvline(h["ready_s"], color="#2ca02c", lw=0.9, ls=":")
            text = f"  wave ready at {h['ready_s']:.2f} s (step {h.get('ready_step')})"
            ax.text(h["ready_s"], y, text, va="center", fontsize=8)
        elif h.get("wave_s") is not None:      # answered, but nothing usable (e.g. no_call)
            end = submit + h["wave_s"]
            ax.barh(y, h["wave_s"], left=submit, height=0.56, color="#2ca02c", alpha=0.35)
            ax.text(end, y, f"  answered at {end:.2f} s, no hints ({h.get('error')})", va="center", fontsize=8)
        else:                                   # still running when the call ended (cancelled), or failed
            ax.barh(y, row["time_s"] - submit, left=submit, height=0.56, color="#2ca02c", alpha=0.25, hatch="//")
            ax.text(row["time_s"], y, f"  not ready ({h.get('error') or 'no answer'})", va="center", fontsize=8)
        labels.append("sidecar wave")
        ax.set_yticks(range(len(labels)), labels)
        ax.invert_yaxis()
        ax.set_title(f"{cell['target']} · {benchmark_name(cell)} · {row['id']}", fontsize=9, loc="left")
        ax.set_xlim(0, max(r["time_s"] for r in same.values()) * 1.32)
    axes[-1, 0].set_xlabel("seconds since the request arrived  (hatched: setup, black: prefill, "
                           "coloured: one target forward each, darker = more tokens kept)")
    fig.tight_layout()
    return fig


def cost_gain_figure(results: dict) -> Figure | None:
    """Per target: mean seconds per request that hints save over ToolSpec (the sidecar's, and gold hints' as the
    ceiling) next to the sidecar's cost: its wave (compute beside the target) and the target's own sidecar work."""
    rows = [(t, results["targets"][t]["summary"]) for t in targets_of(results)
            if f"{OOOSPEC}_saved_s" in results["targets"][t]["summary"]]
    if not rows:
        return None
    series = [("saved by sidecar hints", lambda s: s.get(f"{OOOSPEC}_saved_s"), color(OOOSPEC)),
              ("saved by gold hints (ceiling)", lambda s: s.get(f"{CEILING}_saved_s"), color(CEILING)),
              ("sidecar wave (mean s)", lambda s: (s.get("hints") or {}).get("mean_wave_s"), "#2ca02c"),
              ("target-side sidecar work", lambda s: (s.get("hints") or {}).get("mean_target_sidecar_s"), "#bdbdbd")]
    fig, ax = plt.subplots(figsize=(10, 1.5 + 0.95 * len(rows)))
    h = 0.8 / len(series)
    for k, (label, get, col) in enumerate(series):
        ys = [i - 0.4 + h * (k + 0.5) for i in range(len(rows))]
        vals = [get(s) for _, s in rows]
        ax.barh([y for y, v in zip(ys, vals) if v is not None], [v for v in vals if v is not None], height=h,
                color=col, label=label)
        for y, v in zip(ys, vals):
            if v is not None:
                ax.text(v, y, f" {v:+.2f} " if k < 2 else f" {v:.2f} ", va="center", fontsize=7.5,
                        ha="left" if v >= 0 else "right")
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(rows)), [t for t, _ in rows])
    ax.invert_yaxis()
    lo, hi = ax.get_xlim()
    ax.set_xlim(lo - 0.08 * (hi - lo), hi + 0.08 * (hi - lo))
    ax.set_xlabel("seconds per request (mean over the target's examples)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22 - 0.1 / len(rows)), ncol=4, fontsize=8,
              frameon=False)
    ax.grid(axis="x", color="#e5e5e5", lw=0.6)
    fig.tight_layout()
    return fig


FIGURES = (("speedup", speedup_figure), ("accepted", accepted_figure), ("timeline", timeline_figure),
           ("cost_gain", cost_gain_figure))


def to_svg(fig: Figure) -> str:
    """The figure as an inline ``<svg>`` element (text kept as text), and the figure closed."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]


def to_png(fig: Figure, path: Path, dpi: int = 130) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return path


def figures(results: dict, names: Sequence[str] | None = None) -> dict[str, Figure]:
    """``{name: Figure}`` of :data:`FIGURES` (those with data)."""
    out = {}
    for name, make in FIGURES:
        if names is None or name in names:
            fig = make(results)
            if fig is not None:
                out[name] = fig
    return out
