"""Where a speculative server loses under load: the same requests at one concurrency on a plain server, then on a
``toolspec`` server with every request opted out (``ooospec: "off"``: vLLM's spec path, no drafts) and drafting,
interleaved, then on a plain server again::

    python -m ooospec.eval.vllm.load_probe --target qwen2.5-coder-0.5b --quantized w8a8-rtn --concurrency 16 \\
        --reps 3 --out eval/reports/cpu/quantized/<cpu>/load-probe.json

Each server is warmed up (one request, then the level once, untimed: the prompts cached), then timed ``--reps``
times per variant; every drafting rep gets a fresh drafter history (as :mod:`ooospec.eval.vllm.load` gives each
level). If ``off`` runs as fast as plain, the spec path costs nothing by itself and a loss is the drafts'; the
proposer's last metrics line (its step-cost fit ``a, b_row, b_draft`` and the draft switch's rates) says which.
Timed like the load bench (wall time of the level); the same caveats (2 cores, nothing else running).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from pathlib import Path

from ooospec.eval.bench.data import load_examples
from ooospec.eval.vllm import load_server as server
from ooospec.eval.vllm.runs import add_engine_arguments, stop_server
from ooospec.pipelines.records import write_json
from ooospec.runtime.methods import get_method
from ooospec.runtime.paths import BENCHMARK_DIR_FLAG, resolve_benchmark

OPTED_OUT = {"ooospec": "off"}


def bodies_of(args, records: list[dict], history: str | None, extra: dict | None) -> list[dict]:
    """The level's requests; ``history``: a fresh drafter history; ``extra``: more ``vllm_xargs``."""
    out = []
    for r in records:
        body = server.request_body(r, args.model_dir, args.max_new_tokens, False, history)
        if extra:
            body["vllm_xargs"] = {**body.get("vllm_xargs", {}), **extra}
        out.append(body)
    return out


def serve(args, method: str, records: list[dict], variants: list[tuple[str, dict | None]], walls: dict) -> str:
    """Start ``method``'s server, warm it, time each variant ``args.reps`` times (interleaved); its log's path."""
    from ooospec.runtime.sidecar.process import free_port

    port = free_port()
    url, log = f"http://127.0.0.1:{port}", args.out.with_name(f"{args.out.stem}.{method}.server.log")
    ids = [r["id"] for r in records]
    c = max(args.levels)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as sink:
        proc = subprocess.Popen(server.server_command(args, method, port), stdout=sink, stderr=subprocess.STDOUT)
        try:
            server.wait_healthy(url, proc, log, method)
            server.run_level(url, [server.request_body(records[0], args.model_dir, 16, False)], ["warm-up"], 1)
            server.run_level(url, bodies_of(args, records, None, None), ids, c)     # the prompts cached
            for rep in range(args.reps):
                for name, extra in variants:
                    history = f"probe-{name}-{rep}" if get_method(method).is_engine else None
                    _, wall = server.run_level(url, bodies_of(args, records, history, extra), ids, c)
                    walls.setdefault(name, []).append(round(wall, 3))
                    print(f"[load-probe] {name} rep {rep}: {wall:.2f}s", flush=True)
        finally:
            stop_server(proc)
    return str(log)


def last_metrics(log: str) -> dict | None:
    """The proposer's last ``ooo-spec proposer metrics`` line in ``log``."""
    found = server.parse_metrics(Path(log).read_text(errors="replace"))
    return found[-1] if found else None


def summary(walls: dict[str, list[float]]) -> dict:
    """Median wall per variant, and each against the mean of the two plain servers' medians (> 1: slower)."""
    med = {k: statistics.median(v) for k, v in walls.items()}
    plain = statistics.fmean(med[k] for k in ("plain-before", "plain-after") if k in med)
    return {k: {"median_s": round(m, 3), "x_plain_wall": round(m / plain, 3)} for k, m in med.items()}


def parse_args(argv=None) -> argparse.Namespace:
    """The probe's flags (a load bench's, at one concurrency); sets what :mod:`~.load_server` reads."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="registry name or a local HF folder")
    p.add_argument("--dataset", default="apibank-l1", help=f"benchmark name (in {BENCHMARK_DIR_FLAG}) or a JSONL path")
    p.add_argument(BENCHMARK_DIR_FLAG, type=Path, default=None)
    p.add_argument("--limit", type=int, default=16, help="first N records by id: the level's requests")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    p.add_argument("--stream", choices=("off",), default="off", help="not streamed (the only mode probed)")
    p.add_argument("--reps", type=int, default=3, help="timed runs of each variant")
    p.add_argument("--log-interval", type=float, default=2.0, help="seconds between the proposer's metrics lines")
    p.add_argument("--prefix-caching", choices=("on", "off"), default="on")
    add_engine_arguments(p)
    p.add_argument("--out", type=Path, required=True, help="results JSON; the servers' logs beside it")
    p.add_argument("--cache", default=None, help="model cache folder (registry targets)")
    args = p.parse_args(argv)
    for flag, value in (("--limit", args.limit), ("--concurrency", args.concurrency), ("--reps", args.reps)):
        if value < 1:
            p.error(f"{flag} must be >= 1, got {value}")
    args.levels, args.streams, args.rounds = [args.concurrency], [False], 1
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from ooospec.runtime.backends.hardware import vllm_cpu_env
    from ooospec.runtime.backends.quantize import target_folder

    records = load_examples(resolve_benchmark(args.dataset, args.benchmark_dir), args.limit)
    args.model_dir = str(target_folder(args.target, args.quantized, args.cache))
    vllm_cpu_env(args.threads, server.KVCACHE_GB, multiprocessing=True)
    walls: dict[str, list[float]] = {}
    serve(args, "vllm", records, [("plain-before", None)], walls)
    log = serve(args, "toolspec", records, [("toolspec-off", OPTED_OUT), ("toolspec", None)], walls)
    serve(args, "vllm", records, [("plain-after", None)], walls)
    result = {"settings": {"target": args.target, "quantized": args.quantized, "dataset": args.dataset,
                           "limit": args.limit, "concurrency": max(args.levels), "reps": args.reps,
                           "threads": args.threads},
              "environment": server.environment_of(args), "walls_s": walls, "summary": summary(walls),
              "proposer": last_metrics(log)}
    write_json(args.out, result)
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
