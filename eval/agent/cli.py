"""``ooospec agent-bench``: replay multi-step tool dialogues; stateless turns vs KV sessions vs speculative tools.

Run as::

    ooospec agent-bench --target qwen2.5-coder-0.5b --datasets apibank-l3,toolalpaca-real,toolalpaca-sim \\
        --limit 7 [--latencies 0,0.5,2] [--method toolspec] [--speculator gold|sidecar] [--sidecar-url URL] \\
        [--max-new-tokens 128] [--out results/agent_bench_<target>.json]

Dialogues, replay, variants and speculators: :mod:`ooospec.eval.agent.replay`; the target in vLLM
(``--engine vllm``): :mod:`ooospec.eval.agent.in_vllm`.

Reported per latency and variant: mean wall time per dialogue, time saved against ``stateless`` (of the summed
wall time), prompt tokens prefilled and the share saved, the speculation hit rate (hits / calls), exactness.
The JSON (``--out``) keeps every turn; the markdown table is printed and written next to it (``.md``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ooospec.eval.agent.replay import (
    DEPLOYMENT,
    HISTORY_VARIANT,
    SPECULATORS,
    VARIANTS,
    Dialogue,
    check_history_variants,
    load_dialogues,
    run_bench,
    summarize,
    write_tables,
)
from ooospec.pipelines.records import write_json
from ooospec.runtime.methods import GOLD, SERVED, SIDECAR, TOOLSPEC
from ooospec.runtime.sidecar.deployments import BENCH_GATE_CHOICES, GATE_OFF, GATE_ON

DEFAULT_DATASETS = "apibank-l3,toolalpaca-real,toolalpaca-sim"


# ----------------------------------------------------------------------------------------------- CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="registry name, local HF folder or hub id")
    p.add_argument("--datasets", default=DEFAULT_DATASETS,
                   help="comma-separated benchmark names (<name>.jsonl in --benchmark-dir) or JSONL paths of "
                        "API-Bank level-3 / ToolAlpaca records")
    p.add_argument("--benchmark-dir", type=Path, default=None,
                   help="folder of benchmark <name>.jsonl files (default: data/dedupe/eval under the working "
                        "directory, where `dvc repro dedupe` writes them)")
    p.add_argument("--limit", type=int, default=None, help="first N dialogues (by id) of each dataset")
    p.add_argument("--min-steps", type=int, default=2, help="dialogues with at least this many calls")
    p.add_argument("--latencies", default="0,0.5,2", help="simulated tool latencies in seconds, comma-separated")
    p.add_argument("--method", choices=SERVED, default=TOOLSPEC,
                   help="decoding method, the same in every variant")
    p.add_argument("--speculator", choices=SPECULATORS, default=GOLD,
                   help=f"the early guess of each call: {GOLD}: the recorded call at arrival (ceiling); {SIDECAR}: "
                        f"the sidecar's")
    p.add_argument("--sidecar-url", default=None, help="a running sidecar server; default: start the shipped adapter")
    p.add_argument("--sidecar-adapter", default=None, help="adapter to start when no --sidecar-url is given")
    p.add_argument("--sidecar-gate", choices=BENCH_GATE_CHOICES, default=GATE_OFF,
                   help=f"{GATE_ON}: each turn's wave only when its hints and the tool latency it hides pay for it "
                        f"(runtime/sidecar/gate.py, learnt online from the prior of the deployment a sidecar this "
                        f"bench starts runs in, {DEPLOYMENT.name}); {GATE_OFF}: every wave")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--speculate-top-k", type=int, default=1,
                   help="candidate calls of each guess run speculatively: the guessed call, then its wave's next "
                        "likeliest functions (function-first); each costs a tool run")
    p.add_argument("--speculate-history", type=int, default=0,
                   help="the loop's N most recent distinct earlier calls run speculatively at each turn's arrival, "
                        "in every speculating variant, and alone in the `history` variant (run when N >= 1); each "
                        "costs a tool run")
    p.add_argument("--threads", default="auto", help="torch threads: 'auto' or a number")
    p.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16", "fp16"])
    p.add_argument("--out", type=Path, default=None, help="results JSON (default results/agent_bench_<target>.json)")
    p.add_argument("--cache", default=None, help="model cache root (default $OOOSPEC_CACHE or ~/.cache/ooospec)")
    p.add_argument("--engine", choices=("transformers", "vllm"), default="transformers",
                   help="the target's engine: ours on transformers, or vLLM with ooo-spec's proposer (needs vLLM; "
                        "eval/agent/in_vllm.py: sessions = vLLM's prefix cache, the dedicated sidecar emulated)")
    from ooospec.eval.agent import in_vllm as agent_vllm

    agent_vllm.add_arguments(p)


def _latencies(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--latencies takes seconds like 0,0.5,2; got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise SystemExit(f"--latencies needs non-negative seconds, got {text!r}")
    return values


def run_cli(args: argparse.Namespace) -> int:
    if args.engine == "vllm":
        from ooospec.eval.agent import in_vllm as agent_vllm

        return agent_vllm.run(args, _dialogues(args), _latencies(args.latencies))
    import torch

    from ooospec.runtime.backends import hardware
    from ooospec.runtime.backends.models import load_target

    latencies = _latencies(args.latencies)
    check_history_variants((), args.speculate_history)
    if args.max_new_tokens < 1:
        raise SystemExit(f"--max-new-tokens must be >= 1 (got {args.max_new_tokens})")
    dialogues = _dialogues(args)
    threads = hardware.resolve_threads(args.threads)
    torch.set_num_threads(threads[0])
    torch.manual_seed(0)
    dtype = hardware.resolve_dtype(args.dtype, threads=threads[0], device="cpu")
    model, tok = load_target(args.target, dtype=dtype[0], cache=args.cache)
    out = args.out or Path("results") / f"agent_bench_{Path(args.target).stem or 'target'}.json"
    sidecar, client = _sidecar(args, threads[0]) if args.speculator == SIDECAR else (None, None)
    config = {"target": args.target, "datasets": args.datasets, "limit": args.limit, "min_steps": args.min_steps,
              "latencies": latencies, "method": args.method, "speculator": args.speculator,
              "max_new_tokens": args.max_new_tokens, "dialogues": [d.id for d in dialogues],
              "speculate_top_k": args.speculate_top_k, "speculate_history": args.speculate_history,
              "sidecar_wave": args.sidecar_wave,
              "sidecar_top_k": args.sidecar_top_k,
              "sidecar_gate": args.sidecar_gate if args.speculator == SIDECAR else None}
    env = _environment(args, threads, dtype, model, client)
    t0 = time.perf_counter()

    def save(rows: list[dict], partial: bool) -> dict:
        results = {"config": config, "env": {**env, "wall_s": time.perf_counter() - t0}, "partial": partial,
                   "summary": summarize(rows), "dialogues": rows,
                   # the wave gate's decisions (the last 256, with their estimates) and its final estimates
                   "gate": None if client is None or client.gate is None else
                   {**client.gate.summary(), "log": list(client.gate.log)}}
        write_json(out, results)
        return results

    try:
        rows = run_bench(model, tok, dialogues, latencies, method=args.method, speculator=args.speculator,
                         max_new_tokens=args.max_new_tokens, client=client, on_row=lambda rows: save(rows, True),
                         speculate_top_k=args.speculate_top_k, speculate_history=args.speculate_history,
                         variants=VARIANTS + ((HISTORY_VARIANT,) if args.speculate_history > 0 else ()))
    finally:
        if sidecar is not None:
            sidecar.stop()
    results = save(rows, False)
    write_tables(out, results["summary"])
    return 0


def _dialogues(args: argparse.Namespace) -> list[Dialogue]:
    """The dialogues of every ``--datasets`` name, in the order given (``--limit``, ``--min-steps`` each)."""
    from ooospec.runtime.paths import resolve_benchmark

    dialogues: list[Dialogue] = []
    for name in [d.strip() for d in args.datasets.split(",") if d.strip()]:
        try:
            path = resolve_benchmark(name, args.benchmark_dir)
        except FileNotFoundError as e:
            raise SystemExit(str(e)) from e
        found = load_dialogues(path, args.limit, args.min_steps)
        print(f"{name}: {len(found)} dialogues, {sum(d.steps for d in found)} calls", file=sys.stderr)
        dialogues += found
    if not dialogues:
        raise SystemExit("no dialogues to replay (check --datasets, --limit, --min-steps)")
    return dialogues


def _sidecar(args: argparse.Namespace, threads: int):
    """``--speculator sidecar``: ``(the server started for the run, or None for --sidecar-url; its client)``."""
    from ooospec.runtime.sidecar.client import SidecarClient
    from ooospec.runtime.sidecar.process import launch_sidecar

    sidecar = None
    if args.sidecar_url is None:   # DEPLOYMENT, as `ooospec bench`'s: every core, the bench's threads
        sidecar = launch_sidecar(args.sidecar_adapter, threads=threads, dtype=args.dtype)   # as the target
    client = SidecarClient(args.sidecar_url or sidecar.url, wave=args.sidecar_wave, top_k=args.sidecar_top_k)
    if args.sidecar_gate == GATE_ON:
        from ooospec.runtime.sidecar.gate import WaveGate

        client.gate = WaveGate(DEPLOYMENT.prior)   # the server shares the target's cores
    return sidecar, client


def _environment(args: argparse.Namespace, threads: tuple[int, str], dtype: tuple[str, str], model, client) -> dict:
    """The run's ``env``: the machine and versions, and with a sidecar which adapter guessed the calls and how its
    server runs."""
    from ooospec.eval.environment import environment

    env = environment(threads, dtype, args.dtype, model, None)
    if args.speculator == SIDECAR:     # which adapter guessed the calls: path, sha256 of its weights, layout
        from ooospec.eval.bench.hint_sources import HintOptions, sidecar_adapter_record
        from ooospec.runtime.sidecar.process import health

        env["sidecar_adapter"] = sidecar_adapter_record(HintOptions(sidecar_url=args.sidecar_url,
                                                                    sidecar_adapter=args.sidecar_adapter))
        served = health(client.base_url) or {}      # how the server runs: dtype, threads, its measured wave cost
        env["sidecar_server"] = {k: served.get(k) for k in ("dtype", "threads", "cpus", "calibration")}
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_cli(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

