"""The transfer matrix inside vLLM: a named params set run cell by cell through ``eval/vllm/transfer_cells.sh`` (the
``transfer_vllm`` stage's script), then each target's own near-tie bound (:mod:`~ooospec.eval.vllm.numerics`) and
the cells counted against it, then its table, plot and W&B run.

    python -m ooospec.eval.vllm.matrix eval/vllm/transfer_full.yaml           # run (resumable: run it again)
    python -m ooospec.eval.vllm.matrix eval/vllm/transfer_full.yaml --report  # only bounds, table, plot, W&B

The params file has one ``transfer_vllm`` section, as params.yaml's, with ``caches`` (a list of ``warm`` / ``cold``)
instead of ``cache`` and an ``out`` folder, where ``{cpu}`` stands for this machine's CPU class (``xeon-amx``,
``epyc-avx512bf16``, ...): a matrix holds one machine's cells, so each CPU class fills its own folder
(``--report --cpu CLASS`` renders another class's folder without measuring anything). The script runs once per
toolbox state and benchmark, every target in each, so all families reach a benchmark before the next one starts.
A finished cell is kept; a cell that fails (a target vLLM cannot load) leaves ``CELL.error.txt`` with its error,
which the table lists. ``touch OUT/.stop`` stops the run after the cell it is in (no report); remove the file and
run again to go on.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from ooospec.eval.vllm.headline import replace_block
from ooospec.eval.vllm.report import unresolved
from ooospec.reporting import md_table
from ooospec.runtime.backends.hardware import cpu_info, cpu_tag

SCRIPT = Path(__file__).with_name("transfer_cells.sh")
REPORT_BEGIN, REPORT_END = "<!-- table: python -m ooospec.eval.vllm.matrix PARAMS --report -->", "<!-- /table -->"
STOP = ".stop"        # a file of this name in the out folder stops the run before its next cell
KEYS = ("targets", "benchmarks", "limit", "methods", "caches", "gate", "warmup", "out")


def load_params(path: Path, cpu: str | None = None) -> dict:
    """The ``transfer_vllm`` section of ``path``; targets / benchmarks / caches as lists, methods as a comma string,
    ``{cpu}`` in ``out`` as ``cpu`` (default: this machine's class). Raises ValueError naming a missing or unknown
    key."""
    section = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("transfer_vllm")
    if section is None:
        raise ValueError(f"{path}: no transfer_vllm section")
    if not isinstance(section, dict):
        raise TypeError(f"{path}: transfer_vllm must be a mapping, got {type(section).__name__}")
    unknown, missing = set(section) - set(KEYS), set(KEYS) - set(section)
    if unknown or missing:
        raise ValueError(f"{path}: transfer_vllm keys unknown {sorted(unknown)}, missing {sorted(missing)}")
    out = dict(section)
    for key in ("targets", "benchmarks", "caches"):
        value = out[key]
        out[key] = value.split() if isinstance(value, str) else [str(v) for v in value]
    bad = [c for c in out["caches"] if c not in ("warm", "cold")]
    if bad:
        raise ValueError(f"{path}: caches must be warm or cold, got {bad}")
    if not isinstance(out["methods"], str):
        out["methods"] = ",".join(out["methods"])
    out["out"] = str(out["out"]).format(cpu=cpu or cpu_tag())    # {cpu}: this machine's CPU class, a matrix per class
    return out


def runs(params: dict) -> list[dict]:
    """The script's environments, in run order: per toolbox state, per benchmark, every target."""
    return [{"OUT": str(params["out"]), "TARGETS": " ".join(params["targets"]), "BENCHES": bench, "FOREIGN": "stop",
             "LIMIT": str(params["limit"]), "METHODS": params["methods"], "CACHE": cache,
             "GATE": str(params["gate"]), "WARMUP": str(params["warmup"])}
            for cache in params["caches"] for bench in params["benchmarks"]]


def missing_methods(cell: Path, methods: str, limit: int, here: dict | None = None) -> str:
    """What ``transfer_cells.sh`` does with a finished cell: ``""`` keep it (it ran ``methods`` on ``limit``
    requests), ``"m1,m2"`` add the methods it lacks (``vllm-bench --add``), ``"ALL"`` run it again (another limit),
    ``"OTHER-MACHINE"`` it was measured on another CPU than ``here`` (default: this machine's
    :func:`~ooospec.runtime.backends.hardware.cpu_info`), so neither keeping nor extending it is a measurement here."""
    data = json.loads(cell.read_text())
    here = here or cpu_info()
    there = data.get("env", {}).get("cpu", {})
    if (there.get("model"), sorted(there.get("flags", []))) != (here["model"], sorted(here["flags"])):
        return "OTHER-MACHINE"
    if data["methods"]["vllm"]["n"] != int(limit):
        return "ALL"
    return ",".join(m for m in methods.split(",") if m and m not in data["order"])


def cells_of(out: Path, target: str) -> list[Path]:
    """The finished vllm-bench cells of ``target`` in ``out`` (not llama.cpp's, not the numerics)."""
    return sorted(p for p in out.glob(f"{target}_*.json") if not p.name.endswith(".llamacpp.json"))


def bound_cells(params: dict, venv: Path = Path(".venv-vllm")) -> None:
    """Each target's own near-tie bound in bf16 (``numerics_TARGET.json``, measured once on 16 requests after the
    cells' first ``limit`` of the first benchmark) and every cell of that target counted again against it: a
    mismatch at a margin the engine's two forward shapes move by is a near tie, above it a defect -- unless a probe
    (``probe_TARGET_*.json``, run here for every mismatch the bound leaves open) saw the engine alone pick the
    drafted token at that very position."""
    out = Path(params["out"])
    for target in params["targets"]:
        cells = cells_of(out, target)
        if not cells:
            continue
        bound = out / f"numerics_{target}.json"
        if not bound.exists():
            subprocess.run([str(venv / "bin/python"), "-m", "ooospec.eval.vllm.numerics", "--target", target,
                            "--dataset", params["benchmarks"][0], "--skip", str(params["limit"]), "--limit", "16",
                            "--out", str(bound)], check=True)
        limit = json.loads(bound.read_text())["bound"]
        if any(unresolved(json.loads(c.read_text()), limit) for c in cells):   # mismatches the bound leaves open
            subprocess.run([str(venv / "bin/python"), "-m", "ooospec.eval.vllm.numerics", "--probe-cells",
                            *map(str, cells), "--bound-from", str(bound)], check=True)
        probes = sorted(out.glob(f"probe_{target}_*.json"))     # numerics.probe's results, stored
        subprocess.run([sys.executable, "-m", "ooospec.eval.vllm.numerics", "--reclassify", *map(str, cells),
                        "--bound-from", str(bound), *(["--probe", *map(str, probes)] if probes else [])],
                       check=True)


def failures(out: Path) -> list[list[str]]:
    """``[target x benchmark (toolbox), first error line]`` for each failed cell without a finished JSON."""
    rows = []
    for path in sorted(out.glob("*.error.txt")):
        if path.with_name(path.name.replace(".error.txt", ".json")).exists():
            continue
        lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        errors = [ln for ln in lines[1:] if "Error" in ln or "error" in ln] or lines[1:] or ["(no output)"]
        rows.append([lines[0].lstrip("# ").split(": failed")[0] if lines else path.name, errors[-1][:160]])
    return rows


def write_report(out: Path, report_to: str = "wandb") -> str:
    """``out/table.md`` (the headline's columns, then the cells that failed), ``out/speedup.png`` and, unless
    ``report_to`` is ``none``, a W&B run logging every cell, the table and the plot. Returns the table."""
    from ooospec.eval.vllm.headline import block, load_cells
    from ooospec.eval.vllm.matrix_plot import plot_cells

    cells = load_cells(Path("."), ((str(out), "*.json"),))
    text = block(Path("."), ((str(out), "*.json"),)) if cells else "No finished cells yet."
    failed = failures(out)
    if failed:
        text += "\n\nCells that did not run (the error's last line; the whole tail in CELL.error.txt):\n\n"
        text += md_table(["cell", "error"], failed, align="ll")
    tmp = out / "table.md.partial"
    tmp.write_text(text + "\n", encoding="utf-8")
    tmp.replace(out / "table.md")
    readme = out / "README.md"
    if readme.exists() and REPORT_BEGIN in readme.read_text(encoding="utf-8"):   # the folder's README shows it too
        tmp = out / "README.md.partial"
        tmp.write_text(replace_block(readme.read_text(encoding="utf-8"), text, REPORT_BEGIN, REPORT_END),
                       encoding="utf-8")
        tmp.replace(readme)
    if cells:
        plot_cells(cells, out / "speedup.png")
        if report_to == "wandb":
            log_wandb(cells, out)
    return text


def log_wandb(cells: list[dict], out: Path) -> None:
    """One W&B run (offline unless WANDB_MODE / WANDB_API_KEY say otherwise) with a row per cell, the table and the
    plot."""
    import wandb

    from ooospec.eval.vllm.headline import HEADERS, row
    from ooospec.pipelines.tracking import configure_wandb

    configure_wandb("wandb", out, "ooo-spec")
    run = wandb.init(job_type="transfer-vllm", name=f"transfer-vllm-{out.name}", dir=str(out),
                     config={"cells": len(cells), "out": str(out)})
    try:
        rows = [[str(v) for v in row(c)] for c in cells]
        for i, cell in enumerate(cells):
            run.log({f"cell/{k}/mean_s": v["mean_s"] for k, v in cell["methods"].items()} | {"cell": i})
        run.log({"transfer_vllm/table": wandb.Table(columns=HEADERS, data=rows),
                 "transfer_vllm/speedup_plot": wandb.Image(str(out / "speedup.png"))})
    finally:
        run.finish()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ooospec.eval.vllm.matrix", description=__doc__.split("\n\n")[0])
    p.add_argument("params", type=Path,
                   help="a params file with a transfer_vllm section (eval/vllm/transfer_full.yaml)")
    p.add_argument("--report", action="store_true",
                   help="only the near-tie bounds (measured where missing) and the table, plot and W&B run")
    p.add_argument("--report-to", choices=("wandb", "none"), default="wandb")
    p.add_argument("--cpu", help="with --report: render the folder of this CPU class (default: this machine's); "
                                 "another class's bounds and probes are never measured here")
    args = p.parse_args(argv)
    params = load_params(args.params, args.cpu)
    out = Path(params["out"])
    if args.cpu and args.cpu != cpu_tag():
        if not args.report:
            p.error(f"--cpu {args.cpu}: this machine is {cpu_tag()}; a matrix is measured only on its own CPU class")
        if not out.is_dir():
            p.error(f"--cpu {args.cpu}: no folder {out}")
        print(write_report(out, args.report_to))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    if not args.report:
        for env in runs(params):
            print(f"[matrix] {env['CACHE']} {env['BENCHES']}: {env['TARGETS']}", flush=True)
            subprocess.run(["bash", str(SCRIPT)], env=os.environ | env, check=True)
            if (out / STOP).exists():
                print(f"[matrix] stopped at {out / STOP}: remove it and run again to go on", flush=True)
                return 0
    bound_cells(params)
    print(write_report(out, args.report_to))
    return 0


if __name__ == "__main__":
    sys.exit(main())
