"""The README's results table, generated from the vLLM bench cells in ``eval/reports/`` (never hand-edited).

    python -m ooospec.eval.vllm.headline                 # print the table
    python -m ooospec.eval.vllm.headline --write README.md   # replace the block between the README's markers
    python -m ooospec.eval.vllm.headline --all --out eval/reports/transfer/cells.md    # + the earlier sessions

One row per cell (target x benchmark on one machine, weights and toolbox state), fixed columns: vLLM plain's mean
seconds per request, then ratios of mean seconds on the same requests -- ``toolspec`` over vLLM plain and over
llama.cpp's greedy on the registry's Q4_K_M GGUF (same threads), the sidecar's best REAL deployment over ``toolspec``
(``ooospec`` sharing the cores, or ``ooospec-wave-first``, paired on one engine where the cell ran it so), the
EMULATED own-device deployment over ``toolspec``, the hint ceiling (``ooospec-oracle``) over plain -- and every
drafted answer against plain's: identical / near ties / defects. ``-``: not run in that cell. The README's cells
are :data:`README_CELLS` (folders of one session each), the transfer report's ``cells.md`` all of :data:`CELLS`;
``tests/eval/test_headline.py`` fails when either differs.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from ooospec.eval.bench.summaries import method_label
from ooospec.reporting import md_table
from ooospec.runtime.backends.hardware import cpu_class
from ooospec.runtime.methods import LLAMACPP_REFERENCE, TOOLSPEC, VLLM_PREFILL, VLLM_REFERENCE

# (folder, glob): the sessions the README's table shows, each a complete set of cells on one machine
README_CELLS = (
    ("eval/reports/transfer/vllm", "*.json"),                               # the transfer_vllm stage's cells
    ("eval/reports/transfer/vllm-full", "*/*.json"),                        # the full matrix, a folder per CPU class
    ("eval/reports/cpu/quantized/xeon-amx", "w8a8*/*.json"),                # Xeon AMX, int8, warm
    ("eval/reports/cpu/quantized/epyc-avx2", "fp32/*.json"),                # EPYC Zen 3 (AVX2 only), fp32, warm
)
# ... and the earlier sessions' cells (two Qwen sizes), which the transfer report's cells.md adds (--all)
EARLIER_CELLS = (
    ("eval/reports/vllm", "qwen2.5-coder-*.json"),                          # EPYC Zen 5, bf16, cold
    ("eval/reports/vllm/dedicated/matrix", "*_cold.json"),                   # Xeon AMX, bf16, cold
    ("eval/reports/vllm/wave-first/gated-scale", "*_warm.json"),            # Xeon AMX, bf16, warm, gated
)
CELLS = README_CELLS + EARLIER_CELLS
ALL_CELLS_MD = "eval/reports/transfer/cells.md"    # every cell of CELLS: --all --out eval/reports/transfer/cells.md
REAL_SIDECAR = ("ooospec-wave-first", "ooospec")     # the sidecar's real deployments, best first when tied
EMULATED = "ooospec-dedicated"
ORACLE = "ooospec-oracle"
NOT_DRAFTED = (VLLM_REFERENCE, VLLM_PREFILL, LLAMACPP_REFERENCE)
BEGIN, END = "<!-- results: python -m ooospec.eval.vllm.headline --write README.md -->", "<!-- /results -->"
HEADERS = ["machine", "weights", "toolbox", "target", "benchmark", "n", "vLLM plain s", "toolspec x plain",
           "toolspec x llama.cpp", "sidecar REAL x toolspec", "sidecar EMULATED x toolspec", "oracle x plain",
           "identical / near ties / defects", "verdict"]
VLLM_OWN = ("vllm-ngram", "vllm-suffix")         # vLLM's own speculation
PAYS, LOSES = 1.05, 0.95     # the sidecar's best real deployment over toolspec: beyond these the verdict says so


def load_cells(root: Path, sources=README_CELLS) -> list[dict]:
    """Every vllm-bench cell of ``sources`` (``(folder, glob)`` pairs) under ``root``, in that order, each sorted by
    target and benchmark."""
    out = []
    for folder, pattern in sources:
        found = []
        for path in sorted((root / folder).glob(pattern)):
            if path.name.endswith(".llamacpp.json"):
                continue
            data = json.loads(path.read_text(encoding="utf-8"))
            if "methods" in data and "order" in data:
                found.append({**data, "source": folder})
        out += sorted(found, key=lambda d: (Path(d["target"]).name, d["dataset"]))
    return out


def ratio(num: float | None, den: float | None) -> str:
    return f"{num / den:.2f}x" if num and den else "-"


def best_real_value(methods: dict) -> tuple[float, str] | None:
    """``(ratio, deployment)`` of the sidecar's best real deployment over ``toolspec`` (the paired ratio where the
    cell ran one, else the ratio of mean seconds); None when the cell ran none. A deployment whose gate sent waves
    (or did not count them) comes before one that sent none -- a no-wave ratio is two runs' noise, not the sidecar --
    and among those a paired ratio before an unpaired one; then the larger."""
    toolspec = methods.get(TOOLSPEC, {}).get("mean_s")
    options = []
    for name in REAL_SIDECAR:
        s = methods.get(name)
        if s is None:
            continue
        value = s.get("paired_vs_toolspec") or (toolspec / s["mean_s"] if toolspec else None)
        if value:
            options.append(((waves_sent(s) != 0, "paired_vs_toolspec" in s, value), (value, name)))
    return max(options)[1] if options else None


def no_wave(methods: dict, deployment: str) -> bool:
    """True when the deployment's gate sent no wave in the cell: it drafted as ``toolspec`` on every request, and its
    ratio to ``toolspec`` is the two runs' noise, not the sidecar's doing."""
    return waves_sent(methods.get(deployment, {})) == 0


def waves_sent(summary: dict) -> int | None:
    """The requests a real deployment sent a wave for: wave-first's own count, or the shared deployment's as its
    sidecar server counted them; None where the cell did not count."""
    return summary.get("waves_sent", summary.get("sidecar_waves"))


def best_real(methods: dict) -> str:
    best = best_real_value(methods)
    if best is None:
        return "-"
    label = "wave-first" if best[1] == "ooospec-wave-first" else "shared"
    return f"{best[0]:.2f}x {label}" + (" (0 waves)" if no_wave(methods, best[1]) else "")


def verdict(methods: dict) -> str:
    """Where the sidecar pays (its best real deployment >= :data:`PAYS` x ``toolspec``), where it loses (<=
    :data:`LOSES`), else even (the gate holding it near 1.00x); ``even (no wave)`` where the gate sent none, whatever
    the ratio; ``toolspec only`` without a sidecar row."""
    best = best_real_value(methods)
    if best is None:
        return "toolspec only"
    if no_wave(methods, best[1]):
        return "even (no wave)"
    return "sidecar pays" if best[0] >= PAYS else "sidecar loses" if best[0] <= LOSES else "even"


def agreement(methods: dict, own: bool = False) -> str:
    """``identical/answers · near ties · defects`` over ooo-spec's drafted methods of the cell (``own``: vLLM's own
    speculation instead), against vLLM plain."""
    drafted = [s for name, s in methods.items() if name not in NOT_DRAFTED and (name in VLLM_OWN) == own]
    n = sum(s["n"] for s in drafted)
    identical = sum(round(s["exact_rate"] * s["n"]) for s in drafted)
    return f"{identical}/{n} · {sum(s['near_ties'] for s in drafted)} · {sum(s['defects'] for s in drafted)}"


def weights(env: dict) -> str:
    q = env.get("quantization") or {}
    return q.get("scheme", "int8") if q else {"bfloat16": "bf16", "float32": "fp32"}.get(env["dtype"], env["dtype"])


def machine(env: dict) -> str:
    """The CPU class a cell ran on (``xeon-amx``, ``epyc-avx512bf16``, ...)."""
    return cpu_class(env["cpu"]["model"], env["cpu"]["flags"])


def row(cell: dict) -> list:
    env, m = cell["env"], cell["methods"]
    plain, toolspec = m[VLLM_REFERENCE]["mean_s"], m.get(TOOLSPEC, {}).get("mean_s")
    llama = m.get(LLAMACPP_REFERENCE, {}).get("mean_s")
    emulated = m.get(EMULATED, {}).get("mean_s")
    oracle = m.get(ORACLE, {}).get("mean_s")
    return [f"{machine(env)}, {env['threads']} threads", weights(env),
            "warm" if env.get("warm_tools") else "cold", Path(cell["target"]).name, cell["dataset"],
            m[VLLM_REFERENCE]["n"], f"{plain:.2f}", ratio(plain, toolspec), ratio(llama, toolspec), best_real(m),
            ratio(toolspec, emulated), ratio(plain, oracle), agreement(m), verdict(m)]


def merge_summaries(summaries: list[dict]) -> dict:
    """One method's summaries over several cells as one over all their requests: counts summed, ``mean_s`` and the
    exact rate weighted by requests, the paired ratio as total seconds over total seconds, waves summed where every
    cell counted them."""
    n = sum(s["n"] for s in summaries)
    out = {"n": n, "mean_s": sum(s["mean_s"] * s["n"] for s in summaries) / n}
    if all("exact_rate" in s for s in summaries):     # a drafted method's agreement with plain
        out.update(exact_rate=sum(round(s["exact_rate"] * s["n"]) for s in summaries) / n,
                   near_ties=sum(s["near_ties"] for s in summaries), defects=sum(s["defects"] for s in summaries))
    if all("paired_toolspec_mean_s" in s for s in summaries):
        out["paired_vs_toolspec"] = (sum(s["paired_toolspec_mean_s"] * s["n"] for s in summaries)
                                     / sum(s["mean_s"] * s["n"] for s in summaries))
    for key in ("waves_sent", "sidecar_waves"):
        if all(key in s for s in summaries):
            out[key] = sum(s[key] for s in summaries)
    return out


def by_target(cells: list[dict]) -> list[dict]:
    """The cells of one source folder, machine, weights, toolbox state and target merged into one (first-seen
    order): its benchmarks named in ``dataset`` (the part before the first ``-`` where there are several), each
    method that ran in every one of them over all their requests (:func:`merge_summaries`)."""
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        env = c["env"]
        key = (c.get("source"), machine(env), env["threads"], weights(env),
               bool(env.get("warm_tools")), Path(c["target"]).name)
        groups.setdefault(key, []).append(c)
    out = []
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        names = [m for m in group[0]["methods"] if all(m in c["methods"] for c in group)]
        out.append({**group[0], "dataset": ", ".join(c["dataset"].split("-")[0] for c in group),
                    "order": names, "methods": {m: merge_summaries([c["methods"][m] for c in group]) for m in names}})
    return out


def render(root: Path, sources=README_CELLS, by: str = "cell") -> str:
    """The table (``by="target"``: one row per machine, weights, toolbox and target, over its benchmarks), with the
    line that names its sources."""
    cells = load_cells(root, sources)
    if not cells:
        raise ValueError(f"no vllm-bench cells in {', '.join(str(root / f) for f, _ in sources)}")
    names = ", ".join(f"`{folder}/`" for folder, _ in sources)
    rows = [row(c) for c in (by_target(cells) if by == "target" else cells)]
    grouped = (f"; a row: one target's cells on one machine and toolbox, its n their requests, its ratios total "
               f"seconds over total seconds; each cell: {ALL_CELLS_MD}" if len(rows) < len(cells) else "")
    return (md_table(HEADERS, rows, align="lllll" + "r" * 8 + "l")
            + f"\n\nFrom {len(cells)} cell{'' if len(cells) == 1 else 's'} in {names}{grouped} "
            f"({method_label(EMULATED)} is an emulation: "
            "its wave timed alone, replayed inside vLLM; REAL: the sidecar server on the target's own 2 cores; "
            "vLLM one request at a time, prefix caching on where the toolbox is warm).")


def spread(values: list[float]) -> str:
    """``min-max (median m)`` of ratios, or ``-`` for none."""
    if not values:
        return "-"
    values = sorted(values)
    return f"{values[0]:.2f}-{values[-1]:.2f}x (median {statistics.median(values):.2f}x)"


def engine_noise(cells: list[dict]) -> str | None:
    """How far one method's speed moves between two engines of one cell: ``toolspec`` alone against the paired arm of
    ``ooospec-wave-first`` (the same drafter on the same requests, on another engine later in the run), as the
    spread of ``|a / b - 1|``; None where no cell ran both."""
    gaps = [abs(c["methods"][TOOLSPEC]["mean_s"] / paired - 1) for c in cells
            if TOOLSPEC in c["methods"]
            and (paired := c["methods"].get("ooospec-wave-first", {}).get("paired_toolspec_mean_s"))]
    if not gaps:
        return None
    return (f"- run-to-run spread: `toolspec` timed twice per cell on two engines (alone, and as the paired arm of "
            f"`ooospec-wave-first`) moved by {min(gaps):.0%}-{max(gaps):.0%} (median {statistics.median(gaps):.0%}) "
            f"over {len(gaps)} cells; every ratio between two engines carries that much, a paired one does not.")


def findings(cells: list[dict]) -> str:
    """What the cells say, computed from them (never hand-written): ``toolspec`` over vLLM plain, over llama.cpp and
    over vLLM's own speculation; the sidecar's verdicts and the waves its real deployments sent; its EMULATED own
    device and the oracle ceiling over ``toolspec``; exactness over every drafted answer."""
    def per(cell, name):
        return cell["methods"].get(name, {}).get("mean_s")

    def over(cells_, num, den):    # den's speed over num's: num mean s / den mean s, where both ran
        return [per(c, num) / per(c, den) for c in cells_ if per(c, num) and per(c, den)]

    several_cpus = len({machine(c["env"]) for c in cells}) > 1     # then a cell's name says which machine it ran on

    def name(c):
        w = weights(c["env"])
        return (f"{Path(c['target']).name} x {c['dataset']} ({'warm' if c['env'].get('warm_tools') else 'cold'}"
                + ("" if w == "bf16" else f", {w}") + (f", {machine(c['env'])}" if several_cpus else "") + ")")

    vs_plain = over(cells, VLLM_REFERENCE, TOOLSPEC)
    lines = [f"- `toolspec` x vLLM plain: {spread(vs_plain)} over {len(cells)} cells; slower than plain in "
             + f"{sum(r < 1 for r in vs_plain)}."]
    llama = [(c, r) for c in cells for r in over([c], LLAMACPP_REFERENCE, TOOLSPEC)]
    behind = [name(c) for c, r in llama if r < 1]
    lines.append(f"- `toolspec` x llama.cpp greedy: {spread([r for _, r in llama])}; behind it in {len(behind)} of "
                 f"{len(llama)}" + (f": {', '.join(behind)}." if behind else "."))
    own = [(c, min(per(c, m) for m in VLLM_OWN if per(c, m))) for c in cells if any(per(c, m) for m in VLLM_OWN)]
    slower = [name(c) for c, best in own if not (per(c, TOOLSPEC) and per(c, TOOLSPEC) < best)]
    lines.append("- `toolspec` faster than vLLM's own best speculation (`ngram` / `suffix`) in "
                 f"{len(own) - len(slower)} of {len(own)} cells"
                 + (f"; not in {', '.join(slower)}." if slower else "."))
    verdicts: dict[str, list[str]] = {}
    for c in cells:
        verdicts.setdefault(verdict(c["methods"]), []).append(name(c))
    counted = [c["methods"][m] for c in cells for m in REAL_SIDECAR if waves_sent(c["methods"].get(m, {})) is not None]
    sent, timed = sum(waves_sent(s) for s in counted), sum(s["n"] for s in counted)
    lines.append("- the sidecar's best REAL deployment x `toolspec`: " + "; ".join(
        f"{v} {len(names)}" + (f" ({', '.join(names)})" if v in ("sidecar pays", "sidecar loses") else "")
        for v, names in sorted(verdicts.items())) + f" (waves sent: {sent} of {timed} timed requests, "
        f"ratios {spread([b[0] for c in cells if (b := best_real_value(c['methods']))])}).")
    for m in REAL_SIDECAR:    # each real deployment on its own (the column above shows the better of the two)
        ratios = [s.get("paired_vs_toolspec") or per(c, TOOLSPEC) / s["mean_s"]
                  for c in cells if (s := c["methods"].get(m)) and per(c, TOOLSPEC)]
        if ratios:
            lines.append(f"  - `{m}` x `toolspec`: {spread(ratios)} over {len(ratios)} cells"
                         + (" (paired on one engine)" if m == "ooospec-wave-first" else " (separate engines)") + ".")
    lines.append(f"- EMULATED own device x `toolspec`: {spread(over(cells, TOOLSPEC, EMULATED))}; oracle hints x "
                 f"`toolspec` (the ceiling): {spread(over(cells, TOOLSPEC, ORACLE))}.")
    lines += [line for line in [engine_noise(cells)] if line]
    for own, label, beyond in ((False, "ooo-spec's drafted answers", "defects"),
                               (True, "vLLM's own `ngram` / `suffix` answers", "beyond the near-tie rules")):
        parts = [[int(x) for x in agreement(c["methods"], own).replace("/", " · ").split(" · ")] for c in cells]
        if not sum(p[1] for p in parts):
            continue
        bad = [name(c) for c, p in zip(cells, parts) if p[3]]
        lines.append(f"- {label} vs vLLM plain: {sum(p[0] for p in parts)} of {sum(p[1] for p in parts)} "
                     f"identical, {sum(p[2] for p in parts)} near ties, {sum(p[3] for p in parts)} {beyond}"
                     + (f" (in {', '.join(bad)})." if bad else "."))
    return "\n".join(lines)


def block(root: Path, sources=README_CELLS, by: str = "cell") -> str:
    """The generated block: :func:`render`'s table, then :func:`findings` over the same cells (always cell by
    cell, whatever ``by``)."""
    return render(root, sources, by) + "\n\nWhat the cells say (computed from them):\n\n" + findings(
        load_cells(root, sources))


def replace_block(text: str, table: str, begin: str = BEGIN, end: str = END) -> str:
    """``text`` with the block between ``begin`` and ``end`` (default: the README's results markers) replaced by
    ``table``."""
    if begin not in text or end not in text:
        raise ValueError(f"the README has no results block ({begin} ... {end})")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{table}\n{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ooospec.eval.vllm.headline", description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=Path("."), help="the repository root (default: here)")
    p.add_argument("--write", type=Path, default=None, help="replace the results block of this README")
    p.add_argument("--cells", action="append", default=[], metavar="FOLDER",
                   help="render these folders' cells (*.json) instead of the README's sources")
    p.add_argument("--all", action="store_true",
                   help=f"the earlier sessions' cells too (as {ALL_CELLS_MD}); default: the README's sources")
    p.add_argument("--out", type=Path, default=None, help="also write the table (markdown) here")
    p.add_argument("--by", choices=("cell", "target"), default=None,
                   help="a row per cell, or per target (its benchmarks merged); default: target for --write (the "
                        "README's form, short as the matrix grows), cell otherwise")
    args = p.parse_args(argv)
    sources = tuple((f, "*.json") for f in args.cells) or (CELLS if args.all else README_CELLS)
    for path, by in ((args.out, args.by or "cell"), (args.write, args.by or "target")):
        if path is None:
            continue
        table = block(args.root, sources, by)
        text = replace_block(path.read_text(encoding="utf-8"), table) if path == args.write else table + "\n"
        tmp = path.with_name(path.name + ".partial")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    if args.write is None and args.out is None:
        print(block(args.root, sources, args.by or "cell"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
