"""``ooospec bench``: time speculative decoding methods against greedy AR, honestly, in one process.

Run as::

    ooospec bench --target qwen2.5-coder-0.5b --dataset apibank-l1 --methods ar,pld,toolspec,hf-pld \\
        --limit 30 [--threads auto] [--dtype auto] [--out results/bench.json] [--report-dir reports/bench]

The command line only: it checks the flags, loads the target, turns the flags into calls of the harness
(:mod:`ooospec.eval.bench.harness`: what is measured and the rows; the methods, examples, summaries,
environment and hint sources in the modules it names), and prints and writes the results (tables and plots:
:mod:`ooospec.eval.bench.report`).

``--dtype auto`` (default) takes bf16 only where the CPU multiplies it natively and a probe finds it faster, fp32
otherwise (:func:`ooospec.runtime.backends.hardware.resolve_dtype`); ``--threads auto`` (default) the cores this process
may use. Both choices and their reasons go into ``env`` of the results JSON.

The roofline. ``env.roofline`` holds the CPU, its ISA flags that matter, and this machine's measured roofs for the
run's dtype and threads (:func:`ooospec.runtime.backends.hardware.roofline`, cached): peak matmul FLOP/s and memory
bytes/s; each method's summary gives the target's achieved rates as fractions of them.

Hints. Method ``ooospec`` takes its hints from ``--hints``: ``sidecar`` (default; ``env.sidecar_adapter`` records
the adapter that made them: its path, the sha256 of its ``adapter_model.safetensors`` and its ``sidecar.json``
``layout_version``), ``gold`` (the gold call) or ``oracle`` (the call the target itself writes: ``ar``'s output of the
same request), the last two at time zero. ``ooospec-gold`` and ``ooospec-oracle`` are those ceilings as methods of
their own, so one run can compare them with the sidecar::

    ooospec bench --target qwen2.5-coder-0.5b --dataset apibank-l1 --methods ar,ooospec,ooospec-gold,ooospec-oracle

``--sidecar-wave function-first`` (``--sidecar-top-k``, ``--sidecar-min-prob``) has the sidecar client ask the
index query first and then only the candidate tools' argument queries (:mod:`ooospec.runtime.sidecar.protocol`); each
row's ``hints`` then carries ``index_s`` (stage 1), ``early_s`` (the early bank, from arrival) and ``functions``.

``--out`` is rewritten after every example with ``"partial": true`` (the rows so far and their summary), and a
last time with ``"partial": false``; a run that is stopped early keeps what it measured.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from ooospec.eval.bench import report as bench_report
from ooospec.eval.bench.data import load_examples, record_ids_of
from ooospec.eval.bench.harness import run_bench
from ooospec.eval.bench.hint_sources import HintOptions, sidecar_adapter_record, start_hints
from ooospec.eval.bench.llamacpp_peers import PEERS as LLAMACPP_PEERS
from ooospec.eval.bench.methods import build_methods, eos_ids
from ooospec.eval.environment import backend_env, environment
from ooospec.pipelines.records import write_json
from ooospec.runtime import methods
from ooospec.runtime.backends import BACKEND_CHOICES, hardware
from ooospec.runtime.paths import BENCHMARK_DIR_FLAG, resolve_benchmark
from ooospec.runtime.sidecar import deployments
from ooospec.runtime.sidecar.prompts import SERVED_NAME
from ooospec.runtime.sidecar.protocol import WAVE_MODES


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``ooospec bench``: what runs and on what (:func:`add_run_arguments`), what is written, and the
    sidecar of method ``ooospec`` (:func:`add_sidecar_arguments`)."""
    add_run_arguments(p)
    p.add_argument("--out", type=Path, default=None,
                   help="results JSON (default results/bench_<target>_<dataset>.json)")
    p.add_argument("--report-dir", type=Path, default=None, help="also write table.md and bench.png here")
    p.add_argument("--no-roofline", dest="roofline", action="store_false",
                   help="skip the peak FLOP/s and bandwidth probes (cached after the first run on a machine)")
    p.add_argument("--cache", default=None, help="model cache root (default $OOOSPEC_CACHE or ~/.cache/ooospec)")
    add_sidecar_arguments(p.add_argument_group("ooospec (sidecar hints)"))


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The target, its backend and threads, the benchmark's examples, the methods and how they are timed."""
    p.add_argument("--target", required=True, help="registry name, local HF folder, .gguf or hub id")
    p.add_argument("--dataset", required=True,
                   help=f"benchmark name (<name>.jsonl in {BENCHMARK_DIR_FLAG}) or a path to a JSONL file of records")
    p.add_argument(BENCHMARK_DIR_FLAG, type=Path, default=None,
                   help="folder of benchmark <name>.jsonl files (default: data/dedupe/eval under the working "
                        "directory, where `dvc repro dedupe` writes them)")
    p.add_argument("--methods", default=",".join(methods.DEFAULT_BENCH_METHODS),
                   help=f"comma-separated, from {','.join(methods.BENCH_METHODS)} ({methods.BASELINE} and the "
                        f"backend's stock greedy reference always run)"),
    p.add_argument("--limit", type=int, default=None, help="first N examples by id (default: all)")
    p.add_argument("--sample", type=int, default=None,
                   help="a random N of the examples (seed 0, kept in id order), before --limit")
    p.add_argument("--ids-from", type=Path, default=None,
                   help="only the records named by these request rows' record_id (e.g. --dataset "
                        "data/dedupe/train.jsonl --ids-from data/slots/heldout.jsonl: the sidecar's heldout records)")
    p.add_argument("--threads", default="auto",
                   help="torch threads for every method: 'auto' (the cores this process may use) or a number")
    p.add_argument("--device", default="cpu",
                   help="the HF backend's device: cpu (default) or cuda[:N] (the engine syncs on every step's argmax, "
                        "so wall times include the GPU's work)")
    p.add_argument("--backend", choices=BACKEND_CHOICES, default="auto",
                   help="the target's backend: 'auto' = llama.cpp (the GGUF's quantized weights) for a registry "
                        "name or .gguf on the CPU when llama-cpp-python is installed and --dtype is auto, else hf")
    p.add_argument("--dtype", choices=hardware.DTYPE_CHOICES, default="auto",
                   help="hf backend: 'auto' = bf16 where the CPU multiplies it natively and faster, else fp32 "
                        "(bf16/fp16 on CUDA); a dtype other than auto selects the hf backend under --backend auto")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--assistant", default=None, help="draft model for hf-assisted (same vocabulary as the target)")
    p.add_argument("--pld-tokens", type=int, default=10, help="prompt_lookup_num_tokens of the HF PLD peers")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls per method before timing")
    p.add_argument("--warm-tools", action="store_true",
                   help="prefill each request's system + tools block before the clock starts, for every method "
                        "alike (an agent's toolbox, cached); default: cold, every call prefills its whole prompt")


def add_sidecar_arguments(g) -> None:
    """Method ``ooospec``'s hints: their source, the sidecar server, its deployment, gate and wave."""
    g.add_argument("--hints", choices=tuple(methods.HINT_SOURCES), default=methods.SIDECAR,
                   help=f"method {methods.OOOSPEC}'s hints: "
                        + "; ".join(f"{h.name}: {h.summary}" for h in methods.HINT_SOURCES.values()))
    g.add_argument("--sidecar-url", default=None,
                   help="an already running sidecar server (ours or vLLM: http://127.0.0.1:8000); default: start the "
                        "shipped adapter for the run and stop it after")
    g.add_argument("--sidecar-model", default=SERVED_NAME, help="served model name (vLLM: the --lora-modules name)")
    g.add_argument("--sidecar-adapter", default=None,
                   help="adapter folder to serve (default: $OOOSPEC_SIDECAR_ADAPTER, else the shipped one)")
    g.add_argument("--sidecar-deploy", choices=deployments.BENCH_DEPLOYMENTS, default=deployments.DEFAULT_DEPLOYMENT,
                   help="where the sidecar runs next to the target (runtime/sidecar/deployments.py): " + "; ".join(
                       f"{n}: {deployments.DEPLOYMENTS[n].summary}" for n in deployments.BENCH_DEPLOYMENTS))
    g.add_argument("--sidecar-gate", choices=deployments.BENCH_GATE_CHOICES, default=deployments.GATE_OFF,
                   help=f"{deployments.GATE_ON}: send each request's wave only when its expected saving beats its "
                        f"cost, cut to the queries that pay (runtime/sidecar/gate.py), starting from the prior of the "
                        f"--sidecar-deploy deployment (the bench places the sidecar, so the deployment is known); "
                        f"{deployments.GATE_OFF}: always the full wave")
    g.add_argument("--sidecar-wave", choices=WAVE_MODES, default="all",
                   help="all: one wave of every query; function-first: the index query, then only the candidate "
                        "tools' argument queries (runtime/sidecar/protocol.py)")
    g.add_argument("--sidecar-top-k", type=int, default=2, help="function-first: candidate tools at most")
    g.add_argument("--sidecar-min-prob", type=float, default=0.1,
                   help="function-first: probability a candidate besides the greedy one needs")
    g.add_argument("--sidecar-engine", choices=("transformers", "llama.cpp", "auto"), default="transformers",
                   help="what answers the waves of the sidecar server the bench starts (ooospec sidecar serve "
                        "--engine)")


def default_out(target: str, dataset: str) -> Path:
    """``results/bench_<target name>_<dataset name>.json``."""
    return Path("results") / f"bench_{Path(target).stem or 'target'}_{Path(dataset).stem}.json"


def hint_options(args: argparse.Namespace) -> HintOptions:
    """``--hints`` and ``--sidecar-*`` (and ``--dtype``, the sidecar server's too) as :class:`HintOptions`."""
    return HintOptions(source=args.hints, sidecar_url=args.sidecar_url, sidecar_model=args.sidecar_model,
                       sidecar_adapter=args.sidecar_adapter, sidecar_deploy=args.sidecar_deploy,
                       sidecar_gate=args.sidecar_gate == deployments.GATE_ON, dtype=args.dtype,
                       warm_tools=args.warm_tools, sidecar_wave=args.sidecar_wave, sidecar_top_k=args.sidecar_top_k,
                       sidecar_min_prob=args.sidecar_min_prob, sidecar_engine=args.sidecar_engine)


def run_cli(args: argparse.Namespace) -> int:
    from ooospec.runtime.backends.models import gguf_path_of, load_llamacpp_target, load_target, resolve_backend
    from ooospec.runtime.formats import detect_format

    if args.max_new_tokens < 1:
        raise SystemExit(f"--max-new-tokens must be >= 1 (got {args.max_new_tokens})")
    try:
        threads = hardware.resolve_threads(args.threads)
    except ValueError as e:
        raise SystemExit(f"--threads: {e}") from e
    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    try:
        dataset = resolve_benchmark(args.dataset, args.benchmark_dir)
    except FileNotFoundError as e:
        raise SystemExit(str(e)) from e
    records = load_examples(dataset, args.limit, sample=args.sample,
                            ids=record_ids_of(args.ids_from) if args.ids_from else None)
    out = args.out or default_out(args.target, args.dataset)
    torch.set_num_threads(threads[0])
    torch.manual_seed(0)
    try:
        backend = resolve_backend(args.backend, args.target, args.device, args.dtype)
    except (ValueError, RuntimeError) as e:
        raise SystemExit(f"--backend {args.backend}: {e}") from e
    gguf = gguf_path_of(args.target, args.cache) if backend[0] == "llama.cpp" or any(
        n in LLAMACPP_PEERS for n in names) else None
    if backend[0] == "llama.cpp":
        model, tokenizer = load_llamacpp_target(args.target, threads=threads[0], cache=args.cache)
        dtype = (model.weight_type, "the GGUF's own weights (llama.cpp)")
    else:
        dtype = hardware.resolve_dtype(args.dtype, threads=threads[0], device=args.device)
        model, tokenizer = load_target(args.target, dtype=dtype[0], cache=args.cache, device=args.device)
    print(f"threads {threads[0]} ({threads[1]}); backend {backend[0]} ({backend[1]}); dtype {dtype[0]} ({dtype[1]})",
          file=sys.stderr)
    assistant = None
    if args.assistant and methods.drafting_with("assistant", names):
        assistant, _ = load_target(args.assistant, dtype=dtype[0], cache=args.cache, device=args.device)
    fmt = detect_format(tokenizer)
    sidecar_proc, hints = None, None
    if methods.uses_sidecar(names):
        sidecar_proc, hints = start_hints(hint_options(args), threads[0])
    try:
        return _run_with(args, names, records, out, threads, dtype, backend, gguf, model, tokenizer, assistant, fmt,
                         hints)
    finally:
        if sidecar_proc is not None:
            sidecar_proc.stop()


def _run_with(args, names, records, out, threads, dtype, backend, gguf, model, tokenizer, assistant, fmt,
              hints) -> int:
    try:
        factories, notes = build_methods(names, model, tokenizer, eos_token_ids=eos_ids(model, tokenizer),
                                         pld_tokens=args.pld_tokens, assistant=assistant, hints=hints, gguf=gguf,
                                         threads=threads[0])
    except ValueError as e:
        raise SystemExit(f"--methods: {e}") from e
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    # the roofs are torch probes: bf16/fp32 matmul peak and memory bandwidth (the llama.cpp rows use fp32's peak)
    roof_dtype = dtype[0] if backend[0] == "hf" else "fp32"
    roof = hardware.roofline(roof_dtype, threads[0]) if args.roofline and args.device == "cpu" else None
    env = environment(threads, dtype, args.dtype, model, roof)
    env.update(backend_env(backend, model))
    # the adapter behind method ooospec's sidecar hints: path, sha256 of its weights, layout (None: no sidecar)
    env["sidecar_adapter"] = sidecar_adapter_record(hint_options(args)) if methods.uses_sidecar(names) else None
    config = {"target": args.target, "dataset": args.dataset, "methods": list(factories), "limit": args.limit,
              "backend": backend[0], "reference": methods.REFERENCES[backend[0]],
              "gguf": None if gguf is None else str(gguf),
              "max_new_tokens": args.max_new_tokens, "format": fmt.NAME, "assistant": args.assistant,
              "pld_tokens": args.pld_tokens, "warmup": args.warmup, "warm_tools": args.warm_tools,
              "hints": args.hints if methods.uses_sidecar(names) else None,
              "sidecar": ({"url": args.sidecar_url, "adapter": args.sidecar_adapter, "deployment": args.sidecar_deploy,
                           "gate": args.sidecar_gate, "wave": args.sidecar_wave, "top_k": args.sidecar_top_k,
                           "min_prob": args.sidecar_min_prob, "engine": args.sidecar_engine}
                          if methods.uses_sidecar(names) and args.hints == methods.SIDECAR else None)}
    t0 = time.perf_counter()

    def save(results: dict, partial: bool) -> dict:
        """Write ``out`` (after every example too, marked ``partial``, so a long run that dies keeps its rows)."""
        run_env = {**env, "loadavg_end": list(os.getloadavg()), "wall_s": time.perf_counter() - t0}
        results = {**results, "env": run_env, "notes": notes, "config": config, "partial": partial}
        write_json(out, results)
        return results

    try:
        results = run_bench(model, tokenizer, records, factories, fmt=fmt, max_new_tokens=args.max_new_tokens,
                            warmup=args.warmup, on_example=lambda partial: save(partial, True),
                            roofline=roof if backend[0] == "hf" else None,   # torch roofs do not bound llama.cpp
                            warm_tools=args.warm_tools)
    except ValueError as e:
        if "--warm-tools" in str(e):
            raise SystemExit(str(e)) from e
        raise
    results = save(results, False)
    print(bench_report.markdown_table(results))
    print(f"wrote {out}")
    if args.report_dir is not None:
        paths = bench_report.write_report(results, args.report_dir)
        print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0
