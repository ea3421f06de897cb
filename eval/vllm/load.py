"""``ooospec vllm-load``: vLLM's OpenAI server under concurrent load, plain against speculative methods.

One server per method (``vllm``, plain, first: the reference; vLLM's ``ngram``, ooo-spec's ``toolspec``), the
OpenAI server with the hermes tool parser, warmed up (one untimed request), then sent the SAME ``--limit``
benchmark requests as chat completions (messages + tools, greedy) at every level: concurrency c of
``--concurrency`` x stream mode of ``--stream``, at most c in flight::

    ooospec vllm-load --target qwen2.5-coder-0.5b --dataset apibank-l1 --limit 16 --concurrency 1,2,4,8,16 \\
        --out eval/reports/vllm/load/qwen2.5-coder-0.5b_apibank-l1.json

Columns (one row per method, concurrency and stream mode)::

    req/s, out tok/s  requests, completion tokens (the server's ``usage``) / the level's wall time
    p50 s, p90 s      request latency percentiles (linear interpolation)
    TTFT p50 s        time to the first content or tool-call delta (streamed); = the latency when not streamed
    thru x            plain's wall time / this method's, same requests, same level (> 1: more throughput); with
                      ``--rounds R`` (plain, the others, plain again, R times) against the mean of the two plain
                      runs around it, and a rounds table (eval/vllm/load_rounds.py): median and range per level
    p50 x             this method's p50 latency / plain's at the same level (< 1: faster)
    identical         share of requests whose content and tool calls (name, arguments parsed as JSON) equal
                      plain's at the same level (the ids that differ are in the JSON)
    ties, defects     of the others: near ties (plain's top-2 margin at the first differing token <= --tie-margin)
                      and the rest (eval/vllm/load_exact.py; one untimed plain forward per difference)
    chain batch price ooo-spec methods: the proposer's mean chain length over the level's steps, and its last
                      pricing (batch seen, price per drafted token), from its ``ooo-spec proposer metrics`` log
                      lines: where chains shrink as the batch grows

Caveats. On 2 CPU cores batching has less to spread than on a GPU, and drafts compete with the batch for the cores
(what chain pricing is for). Batched numerics may flip a near tie, for plain decoding across levels as for a
drafter: ``ties`` and ``defects`` say which. With prefix caching on (default) every level after the first finds
the prompts cached, for every method alike; ooo-spec's drafters start each level with a fresh history
(``ooospec_history`` per level), so retrieval never drafts a request from its own output at an earlier level. The
proposer logs at a step once ``--log-interval`` has passed: after each level the bench waits that long and sends an
untimed 2-token request to log the level's last window. The JSON (each method saved
in ``<out>.rows/`` as it finishes; a rerun skips finished methods), a markdown table and each server's log
(``<stem>.<method>.server.log``) are written beside each other.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ooospec.eval.bench.data import load_examples
from ooospec.eval.vllm.load_exact import classify_levels, compare_rows
from ooospec.eval.vllm.load_rounds import bracket, render_rounds, round_summary, schedule
from ooospec.eval.vllm.load_server import (  # noqa: F401 - re-exported: the bench's own names
    KVCACHE_GB,
    MAX_MODEL_LEN,
    METRICS_MARK,
    StreamAccumulator,
    drive,
    environment_of,
    parse_metrics,
    parse_response,
    proposer_summary,
    request_body,
    run_level,
    send_chat,
    server_command,
    settle,
    wait_healthy,
)
from ooospec.eval.vllm.runs import add_engine_arguments, stop_server
from ooospec.pipelines.records import write_json
from ooospec.reporting import fmt_cell, md_table, pct
from ooospec.runtime.methods import REGISTRY, VLLM_BENCH_METHODS, VLLM_REFERENCE, drafting_with, get_method
from ooospec.runtime.paths import BENCHMARK_DIR_FLAG, resolve_benchmark

DEFAULT_METHODS = "vllm,toolspec,vllm-ngram"
# methods a load bench can serve as they are: no sidecar, no per-request hints, more than one new token
LOAD_METHODS: tuple[str, ...] = tuple(n for n in VLLM_BENCH_METHODS
                                      if not REGISTRY[n].hints and not REGISTRY[n].prefill_only)
STREAM_CHOICES = {"off": [False], "on": [True], "both": [False, True]}


def parse_concurrency(text: str) -> list[int]:
    """``--concurrency 1,2,4``: positive integers, in the order given, without repeats."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"--concurrency {text!r}: expected comma-separated integers, e.g. 1,2,4,8,16") from None
    if not values or min(values) < 1:
        raise SystemExit(f"--concurrency {text!r}: expected integers >= 1")
    return list(dict.fromkeys(values))


def parse_methods(text: str) -> list[str]:
    """``--methods`` in run order: ``vllm`` first, then the others as given (each at most once)."""
    names = list(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    bad = [m for m in names if m not in LOAD_METHODS]
    if bad:
        raise SystemExit(f"--methods: {bad} cannot run here; known: {', '.join(LOAD_METHODS)} (methods with "
                         f"hints or a sidecar are for `ooospec vllm-bench`)")
    return [VLLM_REFERENCE] + [m for m in names if m != VLLM_REFERENCE]


def validate(args) -> None:
    """Check every option before a server starts; sets ``args.order`` / ``levels`` / ``streams``."""
    args.order = parse_methods(args.methods)
    args.levels = parse_concurrency(args.concurrency)
    args.streams = STREAM_CHOICES[args.stream]
    for flag, value in (("--limit", args.limit), ("--rounds", args.rounds), ("--threads", args.threads),
                        ("--k", args.k), ("--ngram-k", args.ngram_k), ("--max-new-tokens", args.max_new_tokens)):
        if value < 1:
            raise SystemExit(f"{flag} must be >= 1, got {value}")
    if not (math.isfinite(args.log_interval) and args.log_interval > 0):
        raise SystemExit(f"--log-interval must be > 0 seconds, got {args.log_interval}")
    if not (math.isfinite(args.chain_cost_slope) and args.chain_cost_slope >= 0):
        raise SystemExit(f"--chain-cost-slope must be >= 0, got {args.chain_cost_slope}")
    if drafting_with("suffix", args.order) and importlib.util.find_spec("arctic_inference") is None:
        raise SystemExit(f"--methods: {drafting_with('suffix', args.order)[0]} needs the arctic-inference package")


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) by linear interpolation between order statistics (numpy's default)."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)      # IndexError for no values
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(rows: list[dict], wall: float) -> dict:
    """One level's numbers: wall s, requests/s, output tokens/s, p50/p90 latency, p50 TTFT."""
    tokens = sum(r.get("completion_tokens") or 0 for r in rows)
    lat = [r["latency_s"] for r in rows]
    return {"n": len(rows), "wall_s": wall, "requests_per_s": len(rows) / wall, "output_tokens": tokens,
            "output_tokens_per_s": tokens / wall, "p50_s": percentile(lat, 0.5), "p90_s": percentile(lat, 0.9),
            "ttft_p50_s": statistics.median(r["ttft_s"] for r in rows)}


def run_method(args, method: str, records: list[dict], key: str | None = None) -> dict:
    """Start ``method``'s server, warm it up, run every level; its levels (rows, wall s, proposer lines). ``key``:
    the run's name in the logs (:func:`~ooospec.eval.vllm.load_rounds.run_key`; default the method's)."""
    import httpx

    from ooospec.runtime.sidecar.process import free_port

    port = free_port()
    url, log = f"http://127.0.0.1:{port}", args.out.with_name(f"{args.out.stem}.{key or method}.server.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    engine = get_method(method).is_engine
    ids = [r["id"] for r in records]
    with open(log, "w") as sink:
        t0 = time.perf_counter()
        proc = subprocess.Popen(server_command(args, method, port), stdout=sink, stderr=subprocess.STDOUT)
        try:
            wait_healthy(url, proc, log, method)
            load_s = time.perf_counter() - t0
            warm = request_body(records[0], args.model_dir, 16, False)
            run_level(url, [warm], ["warm-up"], 1)
            if engine:
                settle(url, warm, args.log_interval)
            levels = []
            for c in args.levels:
                for stream in args.streams:
                    offset = log.stat().st_size
                    history = f"c{c}-{'stream' if stream else 'whole'}" if engine else None   # fresh per level
                    bodies = [request_body(r, args.model_dir, args.max_new_tokens, stream, history) for r in records]
                    rows, wall = run_level(url, bodies, ids, c)
                    proposer = None
                    if engine:
                        settle(url, warm, args.log_interval)
                        with open(log, "rb") as f:
                            f.seek(offset)
                            proposer = proposer_summary(parse_metrics(f.read().decode(errors="replace")))
                    levels.append({"concurrency": c, "stream": stream, "wall_s": wall, "rows": rows,
                                   "proposer": proposer})
                    print(f"[vllm-load] {key or method} c={c} stream={'on' if stream else 'off'}: {wall:.1f}s, "
                          f"{len(rows) / wall:.2f} req/s", file=sys.stderr)
        except httpx.HTTPError as e:
            raise SystemExit(f"vllm-load: a {method} request failed ({type(e).__name__}: {e}); see {log}") from e
        finally:
            stop_server(proc)
    return {"load_s": load_s, "levels": levels}


def settings_of(args, records: list[dict]) -> dict:
    """What a saved method's levels must have been run with to be reused by a rerun."""
    keys = ("target", "levels", "streams", "max_new_tokens", "prefix_caching", "threads", "dtype", "k", "ngram_k",
            "chain_cost_slope")
    # keyed only when given, so that saves from before these options stay reusable
    given = {k: getattr(args, k) for k in ("quantized", "block_size") if getattr(args, k, None)}
    return {"ids": [r["id"] for r in records], "drafter_history": "per level",
            **{k: getattr(args, k) for k in keys}, **given}


def measure(args, records: list[dict], saved: Path) -> dict[str, dict]:
    """Each run's levels (``--rounds``: :func:`~ooospec.eval.vllm.load_rounds.schedule`), saved in ``saved`` as it
    finishes; a rerun with the same settings reuses them."""
    saved.mkdir(parents=True, exist_ok=True)
    want = settings_of(args, records)
    runs = {}
    for key, method in schedule(args.order, args.rounds):
        done = saved / f"{key}.json"
        kept = json.loads(done.read_text()) if done.is_file() else None
        if kept is not None and kept.get("settings") == want:
            print(f"[vllm-load] {key}: kept from {done}", file=sys.stderr)
            runs[key] = kept
            continue
        runs[key] = {"settings": want, **run_method(args, method, records, key)}
        write_json(done, runs[key])
    return runs


def level_table(runs: dict[str, dict]) -> list[dict]:
    """Per (run, concurrency, stream): :func:`summarize`; throughput and p50 ratios against the mean of the plain
    runs that bracket the run (:func:`~ooospec.eval.vllm.load_rounds.bracket`; one round: plain's one run);
    ``identical`` against plain's first run at the same level; the chains. ``method`` is the run's key."""
    ref = {(lv["concurrency"], lv["stream"]): lv for lv in runs[VLLM_REFERENCE]["levels"]}
    sums = {run: {(lv["concurrency"], lv["stream"]): summarize(lv["rows"], lv["wall_s"]) for lv in r["levels"]}
            for run, r in runs.items()}
    out = []
    for method, run in runs.items():
        plain = bracket(method, list(runs))
        for lv in run["levels"]:
            key = (lv["concurrency"], lv["stream"])
            s = sums[method][key]
            wall, p50 = (statistics.mean(sums[p][key][k] for p in plain) for k in ("wall_s", "p50_s"))
            out.append({"method": method, "concurrency": key[0], "stream": key[1], **s,
                        "throughput_x": wall / s["wall_s"], "p50_x": s["p50_s"] / p50, "against": plain,
                        **compare_rows(lv["rows"], ref[key]["rows"]), "proposer": lv.get("proposer")})
    return out


def batch_cell(proposer: dict) -> str:
    """``mean (max)`` decoding requests per step over the level; ``-`` where the proposer's logs lack the count (the
    last metrics line's batch, often the final request alone, is not the level's)."""
    mean, largest = proposer.get("mean_batch"), proposer.get("max_batch")
    return "-" if mean is None else f"{mean:.1f} ({largest})"


def render_table(results: dict) -> str:
    headers = ["method", "c", "stream", "req/s", "out tok/s", "p50 s", "p90 s", "TTFT p50 s", "thru x", "p50 x",
               "identical", "ties", "defects", "chain", "batch", "price"]
    numbers = (("requests_per_s", "{:.2f}"), ("output_tokens_per_s", "{:.1f}"), ("p50_s", "{:.2f}"),
               ("p90_s", "{:.2f}"), ("ttft_p50_s", "{:.2f}"), ("throughput_x", "{:.2f}x"), ("p50_x", "{:.2f}x"))
    rows = []
    for lv in results["levels"]:
        prop = lv.get("proposer") or {}
        rows.append([lv["method"], lv["concurrency"], "on" if lv["stream"] else "off",
                     *(fmt_cell(lv[k], spec) for k, spec in numbers), pct(lv["identical"], "-"),
                     lv["near_ties"], lv["defects"],
                     fmt_cell(prop.get("mean_chain"), "{:.2f}"), batch_cell(prop),
                     fmt_cell(prop.get("pricing", {}).get("price"), "{:.4f}")])
    env = results["env"]
    title = (f"### vllm-load: {results['target']} on {results['dataset']} ({results['n']} requests, "
             f"{env['threads']} threads, {env['dtype']}, prefix caching {'on' if env['prefix_caching'] else 'off'}"
             + (f", {env['block_size']}-token KV blocks" if env.get("block_size") else "") + ")")
    rounds = render_rounds(round_summary(results["levels"]))
    return title + "\n\n" + md_table(headers, rows, labels=3) + ("\n\n" + rounds if rounds else "")


def slim(levels: list[dict]) -> list[dict]:
    """Levels as the results JSON keeps them: each row's prompt ids (used to classify, then done with) as their
    count, ``prompt_tokens``."""
    return [{**lv, "rows": [{k: v for k, v in r.items() if k != "prompt_token_ids"}
                            | {"prompt_tokens": len(r.get("prompt_token_ids") or [])} for r in lv["rows"]]}
            for lv in levels]


def build_results(args, records: list[dict], runs: dict[str, dict]) -> dict:
    return {"target": args.target, "dataset": args.dataset, "n": len(records), "order": list(runs),
            "levels": level_table(runs), "load_s": {m: r["load_s"] for m, r in runs.items()},
            "requests": {m: slim(r["levels"]) for m, r in runs.items()}, "env": environment_of(args)}


def add_arguments(p) -> None:
    p.add_argument("--target", required=True, help="registry name or a local HF folder")
    p.add_argument("--dataset", default="apibank-l1", help=f"benchmark name (in {BENCHMARK_DIR_FLAG}) or a JSONL path")
    p.add_argument(BENCHMARK_DIR_FLAG, type=Path, default=None)
    p.add_argument("--limit", type=int, default=16, help="first N records by id: the requests of every level")
    p.add_argument("--methods", default=DEFAULT_METHODS,
                   help=f"comma-separated, from {','.join(LOAD_METHODS)} ({VLLM_REFERENCE} always runs, first)")
    p.add_argument("--concurrency", default="1,2,4,8,16", help="requests in flight, one level each")
    p.add_argument("--rounds", type=int, default=1,
                   help="> 1: plain, then each other method, then plain again, R times (interleaved; each drafting "
                        "run against the plain runs around it: eval/vllm/load_rounds.py)")
    p.add_argument("--stream", choices=tuple(STREAM_CHOICES), default="both", help="stream mode(s) of each level")
    p.add_argument("--prefix-caching", choices=("on", "off"), default="on")
    add_engine_arguments(p)
    p.add_argument("--log-interval", type=float, default=2.0, help="seconds between the proposer's metrics lines")
    p.add_argument("--tie-margin", type=float, default=0.25, help="near-tie bound on plain's top-2 logprob margin")
    p.add_argument("--no-classify", dest="classify", action="store_false",
                   help="skip the untimed plain forwards that classify differing answers")
    p.add_argument("--out", type=Path, required=True, help="results JSON; a .md table and server logs beside it")
    p.add_argument("--cache", default=None, help="model cache folder (registry targets)")


def run_cli(args) -> int:
    from ooospec.runtime.backends.fetch import REGISTRY as MODELS
    from ooospec.runtime.backends.hardware import vllm_cpu_env
    from ooospec.runtime.backends.quantize import target_folder

    validate(args)
    records = load_examples(resolve_benchmark(args.dataset, args.benchmark_dir), args.limit)
    try:
        args.model_dir = str(target_folder(args.target, args.quantized, args.cache))
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(str(e)) from None
    if not Path(args.model_dir).is_dir():
        raise SystemExit(f"--target {args.target!r}: not a registry model ({', '.join(MODELS)}) nor a folder")
    vllm_cpu_env(args.threads, KVCACHE_GB, multiprocessing=True)
    saved = Path(str(args.out) + ".rows")
    runs = measure(args, records, saved)
    if args.classify:
        classify_levels(args, runs, MAX_MODEL_LEN)
    results = build_results(args, records, runs)
    write_json(args.out, results)
    args.out.with_suffix(".md").write_text(render_table(results) + "\n")
    shutil.rmtree(saved)
    print(render_table(results))
    return 0
