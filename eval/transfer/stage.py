"""The ``transfer`` DVC stage: ONE frozen sidecar, every target x benchmark x method, and the report people read.

Run as::

    dvc repro transfer                # the small default matrix of params.yaml (one target, two benchmarks, minutes)
    python -m ooospec.eval.transfer data/transfer eval/reports/transfer metrics/transfer.json   # what DVC runs

The ``full`` matrix (every registry target on every benchmark; about two hours on the 2-core CPU box) is a named
params set, ``eval/transfer/full.yaml`` (the default section with :data:`~ooospec.eval.transfer.params.FULL`'s keys
changed), written to its own folders so that the small default of ``dvc repro`` never overwrites it::

    nohup python -m ooospec.eval.transfer data/transfer-full eval/reports/transfer/full metrics/transfer-full.json \
        --params eval/transfer/full.yaml > transfer_full.log 2>&1 &

(:func:`~ooospec.eval.transfer.params.full_command` returns exactly this; every report prints the command that made
it). The same matrix with a warm toolbox (every method's system + tools block cached before the clock starts, the
agent case) is the named set ``eval/transfer/warm.yaml`` (:func:`~ooospec.eval.transfer.params.named_command`),
written to ``data/transfer-warm`` and ``eval/reports/transfer/warm``. The wave gate (``transfer.sidecar_gate``, on
by default) sends each request's sidecar wave only as far as it pays. Each cell (a target on a
benchmark, every method interleaved per example as ``ooospec bench`` does) is its own JSON file under
``data/transfer/cells/``, rewritten after every example; a stopped or crashed run resumes where it stopped when the
same command is run again (the cell files survive ``dvc repro``: the output is ``persist``), losing at most the
example in flight
(:mod:`ooospec.eval.transfer.cell`). ``-S transfer.resume=false`` starts every cell over.

A wave the client cancels stops at the server's next decode step (the server watches for the disconnect), and
before every timed call the stage still waits, untimed, until the server is idle (:func:`wait_idle`): a wave left
over from one method never slows the next one down.

What runs. Per target: ``ar`` and stock ``hf-greedy`` always, then ``transfer.methods`` -- ``pld``, ``hf-pld``,
``hf-assisted`` (only where ``transfer.assistants`` names a same-vocabulary draft model for the target; elsewhere
it is left out and the report says so, never replaced by a fallback), ``toolspec``, ``ooospec`` (hints from the
ONE sidecar adapter ``transfer.sidecar_adapter``, served once for the whole matrix, deployed as
``transfer.sidecar_deploy``, see :mod:`ooospec.runtime.sidecar.deployments`) and ``ooospec-gold`` (gold hints at time
zero: the ceiling, a diagnostic column). Every metric is :mod:`ooospec.runtime.metrics`'s.

Outputs::

    data/transfer/cells/<target>/<benchmark>.json   per cell: every row, summaries, key, sessions (resumable)
    data/transfer/wandb/                            the offline W&B run (unless WANDB_MODE / WANDB_API_KEY say online)
    eval/reports/transfer/transfer.json             the stage's JSON: everything the reports show, and no more
    eval/reports/transfer/transfer.md, .html, speedup.png, plots/speedup.json   (eval/transfer/report.py)
    metrics/transfer.json                           per-cell headline numbers for `dvc metrics diff`
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import logging
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ooospec.eval.bench import harness, hint_sources
from ooospec.eval.bench.data import load_examples
from ooospec.eval.bench.methods import build_methods, eos_ids
from ooospec.eval.bench.ooospec_method import summarize_hints
from ooospec.eval.bench.summaries import json_safe
from ooospec.eval.environment import environment
from ooospec.eval.transfer import cell as transfer_cell
from ooospec.eval.transfer.params import (
    NAMED_SETS,
    TransferParams,
    full_command,
    load_params,
    named_command,
    regenerate_command,
)
from ooospec.pipelines.params import as_dict
from ooospec.pipelines.records import write_json
from ooospec.runtime import methods as registry
from ooospec.runtime import metrics
from ooospec.runtime.methods import BASELINE, HF_REFERENCE, OOOSPEC, TOOLSPEC
from ooospec.runtime.paths import PACKAGE_ROOT, resolve_benchmark
from ooospec.runtime.sidecar.process import wait_idle
from ooospec.runtime.sidecar.prompts import read_metadata

if TYPE_CHECKING:
    from typing_extensions import Self

logger = logging.getLogger(__name__)

# the code a measurement depends on: a change here starts stored cells over (see transfer_cell)
MEASURED_CODE = ("runtime", "eval/bench/harness.py", "eval/bench/methods.py", "eval/bench/data.py",
                 "eval/bench/hint_sources.py", "eval/bench/peers.py", "eval/bench/method_api.py",
                 "eval/bench/ooospec_method.py")
HEADER_KEYS = ("target", "benchmark", "env", "target_info", "notes")


# ------------------------------------------------------------------------------------------ fingerprints


def slug(name: str) -> str:
    """A file-name-safe form of a target or benchmark name (``Qwen/Qwen2.5-0.5B`` -> ``Qwen_Qwen2.5-0.5B``)."""
    out = "".join(c if c.isalnum() or c in "._-" else "_" for c in name.strip("/"))
    return out or "_"


def code_fingerprint(root: Path = PACKAGE_ROOT) -> str:
    """sha256 (16 hex) over the measured code (:data:`MEASURED_CODE`): the runtime and the bench harness."""
    h = hashlib.sha256()
    for entry in MEASURED_CODE:
        path = root / entry
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for f in files:
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def vocab_fingerprint(tokenizer) -> str:
    """sha256 (16 hex) of a tokenizer's vocabulary: equal fingerprints mean the same token ids."""
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def sidecar_info(adapter: Path) -> dict:
    """What the report says about the ONE sidecar: its base, size of training, weights and tokenizer fingerprints."""
    from transformers import AutoTokenizer

    meta = read_metadata(adapter, strict=False)
    weights = adapter / "adapter_model.safetensors"
    tok = AutoTokenizer.from_pretrained(str(adapter))
    return {"adapter": str(adapter), "base": meta.get("base"), "base_model_id": meta.get("base_model_id"),
            "requests_trained": meta.get("requests_trained"),
            "weights": hashlib.sha256(weights.read_bytes()).hexdigest()[:16] if weights.is_file() else None,
            "tokenizer": vocab_fingerprint(tok), "vocab_size": len(tok)}


def target_info(model, tokenizer, fmt, sidecar: dict | None) -> dict:
    """Facts about a target that decide how much hints can help it (read by the report's transfer notes)."""
    from ooospec.runtime.formats.common import template_text

    tpl = template_text(tokenizer)
    tok_fp = vocab_fingerprint(tokenizer)
    return {"model_type": model.config.model_type, "num_params": sum(p.numel() for p in model.parameters()),
            "chat_template": "tools" if "tools" in tpl else "plain" if tpl else "none", "format": fmt.NAME,
            "vocab_size": len(tokenizer), "tokenizer": tok_fp,
            "same_tokenizer_as_sidecar": None if sidecar is None else tok_fp == sidecar["tokenizer"]}


# ---------------------------------------------------------------------------------------------- the matrix


def target_methods(params: TransferParams, target: str) -> tuple[list[str], list[str]]:
    """``(methods in run order, notes)`` for one target: ``ar`` and ``hf-greedy`` first; ``hf-pld`` and
    ``hf-assisted`` left out (with a note) where the toolbox is warm, ``hf-assisted`` also where no draft model is
    configured for the target."""
    names, notes = list(params.methods), []
    if params.warm_tools:
        for name in [n for n in names if not registry.REGISTRY[n].warm_starts]:
            names.remove(name)
            notes.append(f"{name} left out: transformers' prompt lookup / assisted generation cannot start from a "
                         "cached prefix (it feeds the whole prompt on top of it; warm_tools)")
    if target not in params.assistants:
        for name in registry.drafting_with("assistant", names):
            names.remove(name)
            notes.append(f"{name} left out for {target}: no same-vocabulary draft model "
                         f"(transfer.assistants names one for {sorted(params.assistants) or 'no target'})")
    return list(dict.fromkeys([BASELINE, HF_REFERENCE, *names])), notes


def cell_key(params: TransferParams, target: str, benchmark: str, methods: Sequence[str], machine: dict,
             sidecar: dict | None, code: str) -> dict:
    """The conditions a cell's rows were measured under (stored rows are reused only under an equal key)."""
    return {"target": target, "benchmark": benchmark, "methods": list(methods),
            "max_new_tokens": params.max_new_tokens, "warmup": params.warmup, "pld_tokens": params.pld_tokens,
            "assistant": params.assistants.get(target) if registry.drafting_with("assistant", methods) else None,
            "sidecar": ({"weights": sidecar["weights"], "deployment": params.sidecar_deploy,
                         "gate": params.sidecar_gate}
                        if sidecar is not None and registry.uses_sidecar(methods) else None),
            "warm_tools": params.warm_tools,
            "dtype": machine["dtype"], "threads": machine["threads"], "cpu": machine["cpu"], "code": code}


def compact_cell(cell: dict) -> dict:
    """A cell as the stage JSON keeps it: rows without their token ids and texts (the cell files keep those)."""
    rows = [{k: v for k, v in r.items() if k not in ("tokens", "text")} for r in cell["examples"]]
    return {**{k: cell[k] for k in HEADER_KEYS}, "methods": cell["methods"], "examples": rows,
            "limit": cell["limit"], "sessions": cell["sessions"], "methods_run": cell["key"]["methods"]}


def target_summary(cells: Sequence[dict]) -> dict:
    """One target's pooled figures over its cells: its own call accuracy (``ar`` rows) and the share of its answers
    that hold no call and ran into the token budget, each method's speedup (ratio of mean times over all its
    examples), hint gain over ``toolspec``
    (ratio of mean times over the same examples: ``ooospec`` and its gold-hint ceiling), and the sidecar's hints
    pooled (:func:`~ooospec.eval.bench.ooospec_method.summarize_hints`, plus wave latency and the sidecar's call
    accuracy over every request and over the calls that arrived). Keys are absent where the methods did not run."""
    rows = [r for c in cells for r in c["examples"]]
    by = {m: [r for r in rows if r["method"] == m] for m in {r["method"] for r in rows}}
    ar = by[BASELINE]
    out: dict = {"examples": len(ar), "call": metrics.call_accuracy([r["call_score"] for r in ar]),
                 # answers that hold no call and ran into the token budget (rambling or repeating text)
                 "budget_without_call": sum(r["stop_reason"] == "max_new_tokens" and not r["call_score"]["parsed"]
                                            for r in ar) / len(ar)}
    mean = {m: statistics.fmean(r["time_s"] for r in rs) for m, rs in by.items()}
    out["mean_s"] = mean
    out["speedup"] = {m: metrics.speedup(mean[BASELINE], t) for m, t in mean.items()}
    if TOOLSPEC in mean:
        for m in registry.HINT_METHODS:
            if m in mean:
                out[f"{m}_gain"] = metrics.speedup(mean[TOOLSPEC], mean[m])
                out[f"{m}_saved_s"] = mean[TOOLSPEC] - mean[m]
    hinted = [r for r in by.get(OOOSPEC, []) if r.get("hints")]
    if hinted:
        waves = [r["hints"]["wave_s"] for r in hinted if r["hints"].get("wave_s") is not None]
        scores = [r["sidecar_call_score"] for r in hinted if r.get("sidecar_call_score")]
        arrived = [sc for sc in scores if sc["parsed"]]
        out["hints"] = {
            **summarize_hints(hinted),
            "mean_wave_s": statistics.fmean(waves) if waves else None,
            "sidecar_call": metrics.call_accuracy(scores) if scores else None,          # over every request
            "sidecar_call_arrived": metrics.call_accuracy(arrived) if arrived else None,   # over calls that came
        }
    return out


def cell_metrics(cell: dict) -> dict:
    """The headline numbers of one cell for ``metrics/transfer.json``."""
    base = cell["methods"][BASELINE]
    out = {"examples": base["n"], "call": base["call"]["call"]}
    for name, s in cell["methods"].items():
        lo, hi = s["speedup_median_ci"]
        out[name] = {"speedup": s["speedup"], "speedup_median": s["speedup_median"], "speedup_ci_lo": lo,
                     "speedup_ci_hi": hi, "decode_speedup": s["decode_speedup"], "mat": s["mat"],
                     "exact_rate": s["exact_rate"]}
        if s.get("hints"):
            out[name]["hints_used"] = s["hints"]["used"]
            out[name]["hints_ready_before_end"] = s["hints"]["ready_before_end"]
    return out


# ----------------------------------------------------------------------------------------------- the run


def _annotate_sidecar_scores(cell: dict, records: Mapping[str, dict]) -> None:
    for row in cell["examples"]:
        score = transfer_cell.sidecar_call_score(row, records[row["id"]])
        if score is not None:
            row["sidecar_call_score"] = score


class SidecarServer:
    """The ONE sidecar for the whole matrix: started when the first cell that runs ``ooospec`` needs it, stopped at
    the end (``with``). :meth:`settle` is the harness' untimed wait between calls (see :func:`wait_idle`)."""

    def __init__(self, params: TransferParams, bench_threads: int):
        self.params, self.bench_threads = params, bench_threads
        self.process, self._hints = None, None

    @property
    def hints(self):
        """The hint source for ``build_methods`` (starts the server on first use)."""
        if self._hints is None:
            options = hint_sources.HintOptions(sidecar_adapter=self.params.sidecar_adapter,
                                               sidecar_deploy=self.params.sidecar_deploy, dtype=self.params.dtype,
                                               sidecar_gate=self.params.sidecar_gate,
                                               warm_tools=self.params.warm_tools)
            self.process, self._hints = hint_sources.start_hints(options, self.bench_threads)
        return self._hints

    def settle(self) -> None:
        if self.process is not None:
            wait_idle(self.process.url)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            self.process.stop()


@dataclass
class LoadedTarget:
    """A target loaded with its methods, ready to measure cells."""

    model: Any
    tokenizer: Any
    fmt: Any
    factories: dict
    env: dict
    info: dict

    def measure(self, params: TransferParams, records: Sequence[dict], on_example, settle) -> dict:
        return harness.run_bench(self.model, self.tokenizer, records, self.factories, fmt=self.fmt,
                               max_new_tokens=params.max_new_tokens, warmup=params.warmup, on_example=on_example,
                               roofline=self.env["roofline"], settle=settle, warm_tools=params.warm_tools)


def load(params: TransferParams, target: str, methods: Sequence[str], machine: dict, sidecar: dict | None,
         server: SidecarServer, roofline: dict | None) -> LoadedTarget:
    """Load ``target`` (and its hf-assisted draft model) and build its methods."""
    from ooospec.eval.bench.peers import same_vocab
    from ooospec.runtime.backends.models import load_target
    from ooospec.runtime.formats import detect_format

    logger.info("loading %s", target)
    model, tokenizer = load_target(target, dtype=machine["dtype"])
    assistant = None
    if registry.drafting_with("assistant", methods):
        assistant, _ = load_target(params.assistants[target], dtype=machine["dtype"])
        if not same_vocab(model, assistant):
            raise ValueError(f"transfer.assistants: {params.assistants[target]!r} does not share {target!r}'s "
                             f"vocabulary; remove that entry")
    fmt = detect_format(tokenizer)
    factories, _ = build_methods(
        [m for m in methods if m not in (BASELINE, HF_REFERENCE)], model, tokenizer,
        eos_token_ids=eos_ids(model, tokenizer), pld_tokens=params.pld_tokens, assistant=assistant,
        hints=server.hints if registry.uses_sidecar(methods) else None)
    assert list(factories) == list(methods), (list(factories), methods)
    threads = (machine["threads"], machine["threads_reason"])
    env = {**environment(threads, (machine["dtype"], machine["dtype_reason"]), params.dtype, model, roofline),
           "deployment": params.sidecar_deploy if registry.uses_sidecar(methods) else None,
           "sidecar_gate": params.sidecar_gate if registry.uses_sidecar(methods) else None,
           "warm_tools": params.warm_tools}
    return LoadedTarget(model, tokenizer, fmt, factories, env, target_info(model, tokenizer, fmt, sidecar))


def run_target(params: TransferParams, target: str, benchmarks: Mapping[str, list[dict]], cells_dir: Path, *,
               machine: dict, sidecar: dict | None, code: str, server: SidecarServer) -> list[dict]:
    """Every cell of one target (loaded only when some cell has examples left); returns the compact cells."""
    from ooospec.runtime.backends import hardware
    from ooospec.runtime.formats import get_format

    methods, notes = target_methods(params, target)
    plan = []
    for b, records in benchmarks.items():
        path = cells_dir / "cells" / slug(target) / f"{slug(Path(b).stem)}.json"
        key = cell_key(params, target, b, methods, machine, sidecar, code)
        stored = transfer_cell.read_cell(path) if params.resume else None
        plan.append((b, records, path, key, stored if transfer_cell.is_complete(stored, key, [r["id"] for r in records])
                     else None))
    loaded = None
    if any(stored is None for *_, stored in plan):
        roofline = hardware.roofline(machine["dtype"], machine["threads"]) if params.roofline else None
        loaded = load(params, target, methods, machine, sidecar, server, roofline)
    cells = []
    for b, records, path, key, stored in plan:
        if stored is not None:           # complete: re-summarized from its rows, nothing measured
            header, fmt = {k: stored[k] for k in HEADER_KEYS}, get_format(stored["target_info"]["format"])
            measure = None
        else:
            header = {"target": target, "benchmark": b, "env": loaded.env, "target_info": loaded.info, "notes": notes}
            fmt = loaded.fmt

            def measure(todo, on_example, loaded=loaded):
                return loaded.measure(params, todo, on_example, server.settle)
        logger.info("cell %s x %s", target, b)
        cell = transfer_cell.run_cell(path, key, records, measure, header=header, fmt=fmt, seed=params.seed,
                                      num_resamples=params.bootstrap_resamples, resume=params.resume)
        _annotate_sidecar_scores(cell, {r["id"]: r for r in records})
        cells.append(compact_cell(cell))
    del loaded
    gc.collect()
    return cells


def run(params: TransferParams, cells_dir: Path, report_dir: Path, metrics_path: Path,
        params_path: Path | None = None) -> dict:
    """Run (or resume) the matrix, then write the stage JSON, the reports, the metrics and the W&B run.

    Returns the stage JSON (``eval/reports/transfer/transfer.json``).
    """
    import torch

    from ooospec.runtime.backends import hardware

    t_start = time.perf_counter()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    threads = hardware.resolve_threads(params.threads)
    torch.set_num_threads(threads[0])
    torch.manual_seed(params.seed)
    dtype = hardware.resolve_dtype(params.dtype, threads=threads[0], device="cpu")
    machine = {"cpu": hardware.cpu_info()["model"], "threads": threads[0], "threads_reason": threads[1],
               "dtype": dtype[0], "dtype_reason": dtype[1]}
    logger.info("threads %d (%s); dtype %s (%s)", threads[0], threads[1], dtype[0], dtype[1])
    benchmarks = {b: load_examples(resolve_benchmark(b), params.limit) for b in params.benchmarks}
    adapter = Path(params.sidecar_adapter)
    if registry.uses_sidecar(params.methods) and not (adapter / "adapter_config.json").is_file():
        raise FileNotFoundError(
            f"transfer.sidecar_adapter {adapter}: no adapter there (adapter_config.json missing). Export the shipped "
            f"one (`ooospec export RUN adapters/sidecar`), or point the stage at another, e.g. "
            f"`dvc exp run -S transfer.sidecar_adapter=models/sidecar/adapter`; or leave ooospec out of "
            f"transfer.methods")
    sidecar = sidecar_info(adapter) if registry.uses_sidecar(params.methods) else None
    code = code_fingerprint()
    cells: list[dict] = []
    with SidecarServer(params, threads[0]) as server:
        for target in params.targets:
            cells += run_target(params, target, benchmarks, cells_dir, machine=machine, sidecar=sidecar, code=code,
                                server=server)
    results = stage_results(params, cells, machine=machine, code=code, sidecar=sidecar, started=started,
                            wall_s=time.perf_counter() - t_start, params_path=params_path)
    paths = write_outputs(results, report_dir, metrics_path)
    if params.report_to == "wandb":
        log_wandb(results, cells_dir / "wandb", report_dir)
    logger.info("wrote %s", ", ".join(str(p) for p in paths))
    return results


def stage_results(params: TransferParams, cells: Sequence[dict], *, machine: dict, code: str, sidecar: dict | None,
                  started: str, wall_s: float, params_path: Path | None = None) -> dict:
    """The stage's JSON from its compact cells: params, the commands that reproduce it, machine, sidecar, cells,
    and per target its facts (:func:`target_info`) and pooled figures (:func:`target_summary`)."""
    return json_safe({
        "params": as_dict(params), "params_file": str(params_path) if params_path else None,
        "command": (named_command(str(params_path)) if params_path is not None and str(params_path) in NAMED_SETS
                    else regenerate_command(params)),
        "full_command": full_command(), "started": started,
        "wall_s": wall_s, "machine": machine, "code": code, "sidecar": sidecar, "cells": list(cells),
        # the cells' own measuring time over every session (a resumed matrix spans several runs of the stage)
        "measured_s": sum(x.get("wall_s") or 0.0 for c in cells for x in c["sessions"]),
        "resumed_cells": sum(len(c["sessions"]) > 1 for c in cells),
        "targets": {t: {"info": next(c["target_info"] for c in cells if c["target"] == t),
                        "summary": target_summary([c for c in cells if c["target"] == t])} for t in params.targets},
    })


def write_outputs(results: dict, report_dir: Path, metrics_path: Path) -> list[Path]:
    """``transfer.json``, the reports (:func:`ooospec.eval.transfer.report.write_reports`) and the DVC metrics."""
    from ooospec.eval.transfer import report as transfer_report

    write_json(report_dir / "transfer.json", results)
    write_json(metrics_path, json_safe({
        "wall_s": results["wall_s"], "examples": sum(c["methods"][BASELINE]["n"] for c in results["cells"]),
        "cells": {f"{c['target']}/{Path(c['benchmark']).stem}": cell_metrics(c) for c in results["cells"]}}))
    return [report_dir / "transfer.json", metrics_path, *transfer_report.write_reports(results, report_dir)]


def log_wandb(results: dict, wandb_dir: Path, report_dir: Path) -> None:
    """One W&B run with the report's tables, its plots and the HTML page; offline unless the user set
    ``WANDB_MODE`` or ``WANDB_API_KEY``."""
    import wandb

    from ooospec.eval.transfer import tables as transfer_tables
    from ooospec.pipelines.tracking import configure_wandb

    configure_wandb("wandb", wandb_dir.parent, "ooo-spec")
    run = wandb.init(job_type="transfer", name=f"transfer-{results['started']}", config=results["params"],
                     dir=str(wandb_dir.parent))
    try:
        logged = {f"transfer/{t.slug}": wandb.Table(columns=t.headers, data=[[c.text for c in row] for row in t.rows])
                  for t in transfer_tables.tables(results)}
        logged["transfer/report"] = wandb.Html(str(report_dir / "transfer.html"))
        logged["transfer/speedup_plot"] = wandb.Image(str(report_dir / "speedup.png"))
        run.log(logged)
        run.summary.update({"wall_s": results["wall_s"], "machine": results["machine"]})
    finally:
        run.finish()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ooospec.eval.transfer", description=__doc__.splitlines()[0])
    parser.add_argument("cells_dir", type=Path, help="per-cell results and the W&B run (data/transfer)")
    parser.add_argument("report_dir", type=Path, help="transfer.json and the reports (eval/reports/transfer)")
    parser.add_argument("metrics", type=Path, help="metrics JSON for dvc (metrics/transfer.json)")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="params file (section transfer)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    params = load_params(args.params)
    results = run(params, args.cells_dir, args.report_dir, args.metrics, params_path=args.params)
    print(f"transfer: {len(results['cells'])} cells in {results['wall_s']:.0f} s; "
          f"report {args.report_dir / 'transfer.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
