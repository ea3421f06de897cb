"""The substrate table: what a verification forward costs per engine and weight format, against this CPU's roofs,
and what more cores predict.

    python -m ooospec.eval.substrate.roofline eval/reports/cpu/quantized/<cpu>

reads the folder's ``substrate_vllm_<target>[_t<threads>].json`` (:mod:`ooospec.eval.vllm.substrate`) and
``substrate_llamacpp_<target>[_t<threads>].json`` (:mod:`ooospec.eval.substrate.cli`) files and writes ``roofline.md``:

* per target, engine and format: MB of weights a token reads, ``T(1)`` against the memory roof (``bytes / read
  bandwidth``), ``T(n)`` for n = 2..16, the cost of one more verified token (the slope ``(T(16) - T(1)) / 15``)
  against the compute roof (``2 x matmul params / rate`` of the format's kernels: int8 for llama.cpp's k-quants and
  W8A8, bf16 for vLLM bf16 and W4A16), and the decode tokens/s of greedy (``1 / T(1)``) and of a drafter reaching
  ``#MAT`` tokens per forward at ``n`` verified tokens (``#MAT / T(n)``, ``T`` interpolated between the measured
  sizes) -- ``#MAT`` and ``n`` as ``toolspec`` measured them on that target in the folder's vllm-bench cells
  (:func:`measured_acceptance`), else ``--mat`` / ``--verified``;
* :func:`predict`: the model for more cores, fitted per row on its 1- and 2-thread ``T(n)``:
  ``T(n, c) = o + m / min(c, c_mem) + k n / c`` -- a fixed per-step overhead ``o`` (Python, scheduling, sampling),
  a memory term ``m`` that scales with cores until the memory bus saturates at ``c_mem`` cores (an assumption,
  :data:`C_MEM`), and a compute term ``k`` per verified token that scales with every core.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
from pathlib import Path

from ooospec.reporting import md_table

SHOWN = (1, 2, 4, 8, 16)
C_MEM = 8          # cores at which a socket's memory bandwidth stops growing (typical of 8-12 channel servers)
RATE_OF = {("vllm", "bf16"): "bf16_gops", ("vllm", "fp32"): "fp32_gops", ("vllm", "w8a8"): "int8_gops",
           ("vllm", "w8a8-rtn"): "int8_gops",
           ("vllm", "w4a16"): "bf16_gops", ("vllm", "w4a16-rtn"): "bf16_gops", ("llama.cpp", None): "int8_gops"}
_NAME = re.compile(r"substrate_(vllm|llamacpp)_(?P<target>.+?)(?:_t(?P<threads>\d+))?\.json$")


def load(folder: Path) -> list[dict]:
    """Every substrate row of ``folder``, flattened: engine, target, threads, format, T(n), bytes, roofs."""
    rows = []
    for path in sorted(folder.glob("substrate_*.json")):
        match = _NAME.search(path.name)
        if not match:
            continue
        data = json.loads(path.read_text())
        threads = int(data.get("threads") or match["threads"] or 0)
        for r in data["rows"]:
            if r.get("error"):
                continue                             # not measured here: :func:`failures`
            engine = r.get("engine", "llama.cpp")
            rows.append({"engine": engine, "target": data["target"], "threads": threads, "cpu": data["cpu"],
                         "format": r.get("format") or r.get("weights"), "bytes": r.get("weight_bytes", r.get("bytes")),
                         "params": r.get("matmul_params"), "T": {int(k): v for k, v in r["T_ms"].items()},
                         "source": path.name, "roofs": data.get("roofs"), "dtype": r.get("dtype")})
    for r in rows:       # llama.cpp rows take the params and roofs of a vLLM run (same target and threads first)
        r["params"] = r["params"] or next((o["params"] for o in rows if o["target"] == r["target"]
                                           and o["params"]), None)
        r["roofs"] = r["roofs"] or next((o["roofs"] for o in sorted(rows, key=lambda o: (
            o["target"] != r["target"], o["threads"] != r["threads"])) if o["roofs"]), None)
    return rows


def failures(folder: Path) -> list[str]:
    """``target engine format (threads): exit status: last log line`` of every row a substrate run could not
    measure."""
    out = []
    for path in sorted(folder.glob("substrate_*.json")):
        data = json.loads(path.read_text())
        for r in data.get("rows", []):
            if r.get("error"):
                lines = [ln.strip() for ln in r["error"].splitlines() if ln.strip()]
                out.append(f"{data['target']} {r.get('engine', 'llama.cpp')} {r.get('format')} "
                           f"({data.get('threads')} threads): {lines[0].split(':')[0]}: {r.get('cause') or lines[-1]}")
    return out


def measured_acceptance(folder: Path) -> dict[str, dict]:
    """Per target: ``toolspec``'s tokens per forward (``mat``) and tokens verified per forward (``verified``: 1 +
    drafted tokens per step) over the folder's vllm-bench cells (every format and benchmark, weighted by steps),
    and how many cells gave them."""
    from ooospec.eval.substrate.quantized import cells

    sums: dict[str, list[float]] = {}
    for _fmt, target, _bench, data in cells(folder):
        spec = data["methods"].get("toolspec") or {}
        if not spec.get("mat") or not spec.get("new_tokens"):
            continue
        steps = spec["new_tokens"] / spec["mat"]
        acc = sums.setdefault(target, [0.0, 0.0, 0.0, 0])
        acc[0] += spec["new_tokens"]
        acc[1] += steps
        acc[2] += spec.get("draft_tokens_per_step", 0.0) * steps
        acc[3] += 1
    return {t: {"mat": tok / steps, "verified": 1 + drafted / steps, "cells": n}
            for t, (tok, steps, drafted, n) in sums.items()}


def interp(t: dict[int, float], n: float) -> float:
    """``T(n)`` between the measured sizes (linear; clamped to the smallest and largest)."""
    sizes = sorted(t)
    if n <= sizes[0]:
        return t[sizes[0]]
    for lo, hi in itertools.pairwise(sizes):
        if n <= hi:
            return t[lo] + (t[hi] - t[lo]) * (n - lo) / (hi - lo)
    return t[sizes[-1]]


def tokens_per_s(t: dict[int, float], acceptance: dict | None) -> str:
    """``greedy / drafted`` decode tokens/s of one row at ``acceptance`` (``-`` for drafted without it)."""
    greedy = f"{1000 / t[1]:.1f}"
    if not acceptance:
        return greedy + " / -"
    return f"{greedy} / {1000 * acceptance['mat'] / interp(t, acceptance['verified']):.1f}"


def slope(t: dict[int, float]) -> float:
    """ms per extra verified token, from ``T(1)`` to ``T(16)``."""
    return (t[16] - t[1]) / 15


def roof_row(r: dict, acceptance: dict | None = None) -> list:
    t, roofs = r["T"], r["roofs"] or {}
    mem = r["bytes"] / (roofs["mem_read_gbs"] * 1e9) * 1e3 if roofs.get("mem_read_gbs") and r["bytes"] else None
    key = RATE_OF.get((r["engine"], r["format"]), RATE_OF.get((r["engine"], None)))
    if key == "bf16_gops" and r.get("dtype") == "float32":     # int4 weights, fp32 activations (no native bf16)
        key = "fp32_gops"
    if key == "int8_gops" and (roofs.get(key) or 0) < (roofs.get("fp32_gops") or 0):
        key = "fp32_gops"      # torch has no fast int8 matmul on this CPU (AVX2: no VNNI): fp32 is the better bound
    rate = roofs.get(key) if key else None
    compute = 2 * r["params"] / (rate * 1e9) * 1e3 if rate and r["params"] else None
    return [r["target"], r["engine"], r["format"], r["threads"], f"{r['bytes'] / 1e6:.0f}" if r["bytes"] else "-",
            f"{t[1]:.1f}", f"{mem:.1f}" if mem else "-", *(f"{t[n]:.1f}" for n in SHOWN[1:]),
            f"{slope(t):.2f}", f"{compute:.2f} ({key.split('_')[0]})" if compute else "-", tokens_per_s(t, acceptance)]


def fit(t1: dict[int, float], t2: dict[int, float]) -> dict:
    """``o``, ``m`` and ``k`` of :func:`predict` from ``T(n)`` at 1 and 2 threads (least squares over n)."""
    import numpy as np

    ns = sorted(set(t1) & set(t2))
    a = [[1.0, 1.0 / c, n / c] for c, t in ((1, t1), (2, t2)) for n in ns]
    b = [t[n] for c, t in ((1, t1), (2, t2)) for n in ns]
    o, m, k = np.linalg.lstsq(np.array(a), np.array(b), rcond=None)[0]
    return {"o": max(float(o), 0.0), "m": max(float(m), 0.0), "k": max(float(k), 0.0)}


def not_sharing(t1: dict[int, float], t2: dict[int, float]) -> list[int]:
    """The sizes ``n`` at which 2 threads were no faster than 1: where the model's premise (threads share a
    forward's work) fails on this box and :func:`fit` would only clip negative terms; empty where it holds."""
    return [n for n in sorted(set(t1) & set(t2)) if t2[n] >= t1[n]]


def predict(model: dict, n: int, cores: int, c_mem: int = C_MEM) -> float:
    """``T(n)`` in ms on ``cores`` cores under the fitted model."""
    return model["o"] + model["m"] / min(cores, c_mem) + model["k"] * n / cores


def cores_table(rows: list[dict], mat: float, n_verified: float, cores=(1, 2, 8, 32),
                measured: dict[str, dict] | None = None) -> str | None:
    """Predicted decode tokens/s per row that has 1- and 2-thread measurements: greedy (``1 / T(1)``) and a drafter
    at ``mat`` tokens per forward verifying ``n_verified`` tokens (``mat / T(n_verified)``); a target in ``measured``
    (:func:`measured_acceptance`) takes its own ``mat`` / ``verified``. A row whose 2-thread forward was no faster
    than its 1-thread one at some size (:func:`not_sharing`) is not predicted: it says at which sizes."""
    by = {}
    for r in rows:
        by.setdefault((r["target"], r["engine"], r["format"]), {})[r["threads"]] = r["T"]
    table = []
    for (target, engine, fmt), per in sorted(by.items()):
        if 1 not in per or 2 not in per:
            continue
        slower = not_sharing(per[1], per[2])
        if slower:
            why = (f"not predicted: 2 threads no faster than 1 at n = {', '.join(map(str, slower))} "
                   f"(T(1) {per[1][1]:.1f} ms at 1 thread, {per[2][1]:.1f} at 2)")
            table.append([target, engine, fmt, "-", "-", "-", why, *[""] * (len(cores) - 1)])
            continue
        model = fit(per[1], per[2])
        acc = (measured or {}).get(target) or {"mat": mat, "verified": n_verified}
        cells = [f"{1000 / predict(model, 1, c):.0f} / {1000 * acc['mat'] / predict(model, acc['verified'], c):.0f}"
                 for c in cores]
        table.append([target, engine, fmt, f"{model['o']:.1f}", f"{model['m']:.1f}", f"{model['k']:.2f}", *cells])
    if not table:
        return None
    head = ["target", "engine", "weights", "o ms", "m ms", "k ms/token",
            *(f"{c} cores: greedy / drafted tok/s" for c in cores)]
    return md_table(head, table, align="lll" + "r" * (len(head) - 3))


def render(folder: Path, mat: float, n_verified: float) -> str:
    rows = load(folder)
    if not rows:
        raise SystemExit(f"{folder}: no substrate_*.json files")
    measured = measured_acceptance(folder)
    head = ["target", "engine", "weights", "threads", "MB / token", "T(1) ms", "memory roof ms",
            *(f"T({n}) ms" for n in SHOWN[1:]), "ms / extra token", "compute roof ms / token",
            "greedy / drafted tok/s"]
    table = [roof_row(r, measured.get(r["target"])) for r in sorted(rows, key=lambda r: (r["target"], r["threads"]))]
    measured_roofs = {r["source"]: r for r in rows if r["engine"] == "vllm"}
    out = [f"CPU: {rows[0]['cpu']}; roofs (torch, measured by each vLLM run; a llama.cpp row takes those of the "
           "vLLM run of its target and threads): "
           + "; ".join(f"`{src}` ({r['threads']} threads) {r['roofs']}" for src, r in sorted(measured_roofs.items())),
           "", md_table(head, table, align="lllr" + "r" * (len(head) - 4)), "", acceptance_note(measured)]
    out += [f"Not measured (the engine failed): {f}" for f in failures(folder)]
    cores = cores_table(rows, mat, n_verified, measured=measured)
    if cores:
        note = (f"Predicted for more cores (model in `eval/substrate/roofline.py`, memory saturating at {C_MEM} cores; "
                f"drafted: as above, or #MAT {mat} at {n_verified} verified tokens per forward where not measured):")
        out += ["", note, "", cores]
    return "\n".join(out) + "\n"


def acceptance_note(measured: dict[str, dict]) -> str:
    """What the drafted tokens/s column assumes, per target."""
    if not measured:
        return "Drafted tok/s: no toolspec cell in this folder, so none is shown."
    parts = [f"{t} #MAT {a['mat']:.2f} at {a['verified']:.1f} verified tokens ({a['cells']} cells)"
             for t, a in sorted(measured.items())]
    return ("Drafted tok/s = toolspec's measured #MAT / T(its measured tokens verified per forward), from this "
            "folder's vllm-bench cells (every format and benchmark): " + "; ".join(parts) + ". Greedy = 1 / T(1).")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ooospec.eval.substrate.roofline", description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--mat", type=float, default=4.0,
                   help="tokens per target forward of the drafter where the folder has no toolspec cell of a target")
    p.add_argument("--verified", type=float, default=8, help="tokens verified per forward at that #MAT")
    args = p.parse_args(argv)
    text = render(args.folder, args.mat, args.verified)
    (args.folder / "roofline.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
