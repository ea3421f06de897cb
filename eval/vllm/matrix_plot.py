"""The vLLM transfer matrix's figure: per cell, each method's speed over vLLM plain on the same requests.

One panel per toolbox state (warm / cold); rows = target x benchmark; per method a bar at vLLM plain's mean seconds
over the method's (log x axis, 1x dashed). The sidecar's REAL deployment and its EMULATED own device are drawn apart
(hatched: emulated), so a reader never takes one for the other.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from ooospec.runtime.methods import LLAMACPP_REFERENCE, TOOLSPEC, VLLM_REFERENCE

# (method, label, colour, hatch): the bars of each row, in order
BARS = (
    (LLAMACPP_REFERENCE, "llama.cpp greedy (Q4 GGUF)", "#8c8c8c", ""),
    ("vllm-ngram", "vLLM ngram", "#9ecae1", ""),
    ("vllm-suffix", "vLLM suffix", "#3182bd", ""),
    (TOOLSPEC, "toolspec", "#fd8d3c", ""),
    ("ooospec", "sidecar REAL (shared, gated)", "#a50f15", ""),
    ("ooospec-wave-first", "sidecar REAL (wave-first, gated)", "#d62728", ""),
    ("ooospec-dedicated", "sidecar EMULATED (own device)", "#f4a3a3", "//"),
    ("ooospec-oracle", "oracle hints (ceiling)", "#7b3294", ""),
)
TICKS = (0.25, 0.5, 1, 2, 4, 8, 16)
plt.rcParams.update({"font.size": 8, "axes.spines.top": False, "axes.spines.right": False})


def speedups(cell: dict) -> dict[str, float]:
    """``method -> vLLM plain mean s / method mean s`` for the cell's methods in :data:`BARS`."""
    methods = cell["methods"]
    plain = methods[VLLM_REFERENCE]["mean_s"]
    return {name: plain / methods[name]["mean_s"] for name, *_ in BARS
            if methods.get(name, {}).get("mean_s")}


def label(cell: dict) -> str:
    return f"{Path(cell['target']).name}\n{cell['dataset']}"


def plot_cells(cells: list[dict], path: Path) -> None:
    """Write the figure for ``cells`` (vllm-bench cell dicts) to ``path`` (PNG), atomically."""
    states = [s for s in ("warm", "cold") if any(bool(c["env"].get("warm_tools")) == (s == "warm") for c in cells)]
    rows = {s: [c for c in cells if bool(c["env"].get("warm_tools")) == (s == "warm")] for s in states}
    tallest = max(len(r) for r in rows.values())
    height = 1.6 + 0.62 * tallest
    fig, axes = plt.subplots(1, len(states), figsize=(max(5.6 * len(states), 7.5), height), squeeze=False)
    band, seen = 0.8 / len(BARS), set()
    for ax, state in zip(axes[0], states):
        for i, cell in enumerate(rows[state]):
            values = speedups(cell)
            for j, (name, text, colour, hatch) in enumerate(BARS):
                if name in values:
                    ax.barh(i - 0.4 + band * (j + 0.5), values[name], height=band, color=colour, hatch=hatch,
                            edgecolor="white" if not hatch else "#d62728", linewidth=0.3,
                            label=None if text in seen else text)
                    seen.add(text)
        ax.set_yticks(range(len(rows[state])), [label(c) for c in rows[state]])
        ax.set_ylim(tallest - 0.5, -0.5)        # top down; the same row height in both panels
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator(TICKS))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}x"))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.axvline(1.0, color="black", linestyle="--", linewidth=0.7)
        ax.set_xlabel("speed over vLLM plain (mean seconds, same requests)")
        ax.set_title(f"toolbox {state}")
    handles, names = [h for ax in axes[0] for h in ax.get_legend_handles_labels()[0]], \
        [n for ax in axes[0] for n in ax.get_legend_handles_labels()[1]]
    fig.legend(handles, names, loc="lower center", ncol=3 if len(states) > 1 else 2, frameon=False)
    fig.tight_layout(rect=(0, 0.75 / height, 1, 1))     # ~0.75 in for the legend
    tmp = path.with_name(path.name + ".partial.png")
    fig.savefig(tmp, dpi=130)
    plt.close(fig)
    tmp.replace(path)
