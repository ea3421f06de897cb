"""``ooospec sidecar``: serve the sidecar over HTTP, or predict calls for a dataset offline.

    ooospec sidecar serve [--adapter DIR] [--host 127.0.0.1] [--port 8765] [--threads T] [--cpus 1]
                          [--prefix-cache-tokens 16384] [--no-calibrate] [--engine auto|transformers|llama.cpp|vllm]
    ooospec sidecar predict [--adapter DIR] --dataset FILE_OR_BENCHMARK --out preds.jsonl [--threads T]
                            [--prefix-cache-tokens N [--warm-tools]] [--engine auto|transformers|llama.cpp|vllm]
                            [--wave all|function-first [--top-k 2] [--min-prob 0.1]]

``--adapter`` defaults to ``$OOOSPEC_SIDECAR_ADAPTER``, else the shipped adapter (:mod:`ooospec.runtime.paths`).
``predict`` writes one JSON object per record, in input order::

    {"id": ..., "call": {"name", "arguments"} | null, "direct_call": {"name", "arguments"} | null,
     "wave_s": ..., "prefill_s": ..., "decode_s": ..., "n_queries": ..., "block_tokens": ..., "cached_tokens": ...,
     "index_s": ... | null, "functions": [...] | null, "answers": {"index": "0", "get_weather.city": ..., "call": ...}}

where ``call`` joins the index and argument answers and ``direct_call`` is the direct-call answer, each validated
against the tools' schemas (invalid arguments dropped), and ``answers`` holds every raw answer by query name. With
``--wave all`` (the default) the wave is the one-pass wave of all the record's queries (the direct-call query
included; ``index_s`` and ``functions`` null). With ``--wave function-first`` (:mod:`ooospec.runtime.sidecar.protocol`)
it is two waves on the same block: the index query (``index_s`` its seconds; with ``--top-k`` > 1 the first
token's top logprobs add candidates of at least ``--min-prob``, listed in ``functions``, greedy first), then the
candidates' argument queries and the direct-call query; ``call`` is the greedy candidate's, and the timings, query
and token counts are both waves' sums (without ``--prefix-cache-tokens`` the second wave prefills the block
again). ``--engine`` picks the sidecar's backend (:func:`~ooospec.runtime.sidecar.engines.load_sidecar`).

Every ``--dataset`` line must be a valid record (:func:`ooospec.pipelines.records.load_records`); a bad one stops
the command with ``file:line``, the reason and the field, before any prediction is written. A benchmark name
means ``<name>.jsonl`` in ``--benchmark-dir`` (default ``data/dedupe/eval`` under the working directory).

What a wave costs where toolboxes repeat: ``--prefix-cache-tokens N`` keeps the block KV across records (as the
server does), and ``--warm-tools`` prefills each record's toolbox (its block with the leading system messages
and no turn yet) before its wave, untimed; the summary line gives the median prefill / wave seconds and the
median share of block tokens served from the cache.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from ooospec.runtime import schemas
from ooospec.runtime.paths import BENCHMARK_DIR_FLAG, resolve_benchmark
from ooospec.runtime.sidecar import prompts as sp
from ooospec.runtime.sidecar import protocol as sw
from ooospec.runtime.sidecar.engines import ENGINE_CHOICES
from ooospec.runtime.sidecar.gate_decision import query_name


def predict_records(sidecar, records: Iterable[Mapping], warm_tools: bool = False, wave: str = "all",
                    top_k: int = 2, min_prob: float = 0.1) -> Iterator[dict]:
    """One prediction row per record (see the module docstring); ``sidecar`` is a loaded
    :class:`~ooospec.runtime.sidecar.wave.Sidecar` (waves in its adapter's layout). The record's first call is predicted
    (no prior calls). ``warm_tools``: prefill each record's toolbox into the sidecar's prefix cache first.
    ``wave``: ``"all"`` or ``"function-first"`` (with ``top_k`` candidate tools of at least ``min_prob``)."""
    for rec in records:
        layout = getattr(sidecar, "layout", sp.LAYOUT_VERSION)    # the adapter's layout
        if warm_tools:
            sidecar.prefill(sp.shared_block(sp.toolbox_messages(rec["messages"]), rec["tools"], layout=layout))
        if wave == "function-first":
            yield _predict_function_first(sidecar, rec, layout, top_k, min_prob)
        else:
            yield _predict_all(sidecar, rec, layout)


def _row(rec: Mapping, call: dict | None, direct_text: str, results: list, waves: list, **extra) -> dict:
    """A prediction row from the record's waves and their results (timings and counts added up)."""
    def total(name: str):
        return sum(getattr(r, name) for r in results)

    return {"id": rec.get("id"),
            "call": None if call is None else {"name": call["name"], "arguments": call["arguments"]},
            # the direct call stands on its own, even when the index answer is unusable
            "direct_call": sp.checked_direct_call(rec["tools"], direct_text),
            "wave_s": total("wave_s"), "prefill_s": total("prefill_s"), "decode_s": total("decode_s"),
            "n_queries": sum(len(w.queries) for w in waves), "block_tokens": total("block_tokens"),
            "cached_tokens": total("cached_tokens"), "index_s": None, "functions": None, **extra,
            "answers": {query_name(q): a for w, r in zip(waves, results) for q, a in zip(w.queries, r.answers)}}


def _predict_all(sidecar, rec: Mapping, layout: int) -> dict:
    """The one-pass wave of every query, the direct call included."""
    wave = sp.build_wave(rec["messages"], rec["tools"], with_direct_call=True, layout=layout)
    result = sidecar.answer(wave)
    call = sp.join_answers(rec["tools"], wave, result.answers)
    direct_text = next(a for q, a in zip(wave.queries, result.answers) if q.form == "direct_call")
    return _row(rec, call, direct_text, [result], [wave])


def _predict_function_first(sidecar, rec: Mapping, layout: int, top_k: int, min_prob: float) -> dict:
    """The index wave, then the candidates' argument queries and the direct-call query on the same block."""
    tools = rec["tools"]
    first = sw.index_wave(rec["messages"], tools, layout=layout)
    index = sidecar.answer(first, logprobs=sw.TOP_LOGPROBS if top_k > 1 else 0,
                           max_new_tokens=sw.index_tokens(len(tools)))
    top = index.top_logprobs    # per query, per generated token: token text -> logprob
    try:
        alternatives = top[0][0] if top_k > 1 else None
    except (TypeError, LookupError):
        alternatives = None
    candidates = sw.function_candidates(index.answers[0], alternatives, len(tools), top_k=top_k, min_prob=min_prob)
    functions = [name for name in (schemas.tool_name(tools[i]) for i in candidates) if name is not None]
    second = sw.argument_wave(rec["messages"], tools, functions, with_direct_call=True, layout=layout)
    result = sidecar.answer(second)
    calls = sw.join_function_first(tools, candidates, second, result.answers)
    direct_text = next(a for q, a in zip(second.queries, result.answers) if q.form == "direct_call")
    return _row(rec, calls[0] if calls else None, direct_text, [index, result], [first, second],
                index_s=index.wave_s, functions=functions)


def _cpus(text: str) -> list[int]:
    try:
        return [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cpus takes core ids like 0 or 0,1; got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sidecar_command", metavar="{serve,predict}", required=True)
    serve = sub.add_parser("serve", help="OpenAI-compatible /v1/completions server answering waves in one pass")
    predict = sub.add_parser("predict", help="predict each record's call with the in-process sidecar")
    for p in (serve, predict):
        p.add_argument("--adapter", type=Path, default=None, help="adapter folder (default: the shipped one)")
        p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
        p.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16", "fp16"],
                       help="sidecar weights (auto: bf16 where the CPU multiplies it natively, else fp32)")
        p.add_argument("--engine", default="auto", choices=ENGINE_CHOICES,
                       help="what answers the waves: transformers, llama.cpp (the base's registry GGUF + the adapter "
                            "as a llama.cpp LoRA), vllm (an in-process vLLM engine, the adapter merged into its "
                            "base), or auto (default: the fastest installed here, measured once per machine and "
                            "cached)")
        p.add_argument("--gpu-memory", type=float, default=None, metavar="FRACTION",
                       help="--engine vllm on a GPU: the share of its memory the sidecar's engine takes "
                            "(vLLM's gpu_memory_utilization; default vLLM's 0.9, so leave room for a target on the "
                            "same GPU, e.g. 0.15)")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default loopback; no authentication)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8765)")
    serve.add_argument("--cpus", type=_cpus, default=None, help="pin the server to these cores, e.g. 1 or 0,1")
    serve.add_argument("--limit", action="append", default=[], metavar="KEY=VALUE",
                       help="override a request limit (repeatable), e.g. --limit max_prompts=256; the keys are the "
                            "fields of runtime/serve/sidecar_app.py's Limits (the README's Reliability table)")
    serve.add_argument("--prefix-cache-tokens", type=int, default=None, metavar="N",
                       help="block KV kept for later waves, in tokens (LRU; default 16384, 0 = off): a tools-first "
                            "adapter then prefills a seen toolbox once")
    serve.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                       help="skip the start-up wave that measures this machine's wave cost (reported in /health "
                            "for clients' wave gates; without it they keep their built-in prior)")
    predict.add_argument("--dataset", required=True, help="a JSONL file of records or a benchmark name")
    predict.add_argument(BENCHMARK_DIR_FLAG, type=Path, default=None,
                         help="folder of benchmark <name>.jsonl files (default: data/dedupe/eval under the working "
                              "directory)")
    predict.add_argument("--out", type=Path, required=True, help="predictions JSONL")
    predict.add_argument("--limit", type=int, default=None, help="first N records only")
    predict.add_argument("--prefix-cache-tokens", type=int, default=0, metavar="N",
                         help="keep block KV across records, in tokens (as the server does; default 0 = off)")
    predict.add_argument("--warm-tools", action="store_true",
                         help="prefill each record's toolbox before its wave, untimed (needs --prefix-cache-tokens)")
    predict.add_argument("--wave", default="all", choices=sw.WAVE_MODES,
                         help="all: one wave of every query; function-first: the index query, then only the "
                              "candidate tools' argument queries (runtime/sidecar/protocol.py)")
    predict.add_argument("--top-k", type=int, default=2, help="function-first: candidate tools at most (default 2)")
    predict.add_argument("--min-prob", type=float, default=0.1,
                         help="function-first: probability a candidate besides the greedy one needs (default 0.1)")


def run_cli(args: argparse.Namespace) -> int:
    if args.sidecar_command == "serve":
        return _serve(args)
    return _predict(args)


def _serve(args: argparse.Namespace) -> int:
    """``serve``: the sidecar's HTTP server, until it is stopped."""
    from ooospec.runtime.serve.admission import override_limits
    from ooospec.runtime.serve.sidecar_app import DEFAULT_PORT, DEFAULT_PREFIX_CACHE_TOKENS, Limits, serve

    try:
        limits = override_limits(Limits(), args.limit)
    except ValueError as e:
        raise SystemExit(str(e)) from e
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cache_tokens = DEFAULT_PREFIX_CACHE_TOKENS if args.prefix_cache_tokens is None else args.prefix_cache_tokens
    if cache_tokens < 0:
        raise SystemExit(f"--prefix-cache-tokens must be >= 0, got {cache_tokens}")
    serve(args.adapter, host=args.host, port=args.port or DEFAULT_PORT, threads=args.threads, cpus=args.cpus,
          dtype=args.dtype, limits=limits, prefix_cache_tokens=cache_tokens,
          calibrate=args.calibrate, engine=args.engine, gpu_memory=args.gpu_memory)
    return 0


def _predict(args: argparse.Namespace) -> int:
    """``predict``: every record's prediction row into ``--out``, then the count and the cost summary."""
    from tqdm import tqdm

    path, records = _dataset_records(args)
    sidecar = _predict_sidecar(args)
    rows = tqdm(predict_records(sidecar, records, args.warm_tools, args.wave, args.top_k, args.min_prob),
                total=len(records),
                desc=f"sidecar predict {path.name}")
    done = _write_rows(rows, args.out)
    print(f"wrote {len(records)} predictions to {args.out}")
    if done:
        print(cost_line(done))
    return 0


def _dataset_records(args: argparse.Namespace) -> tuple[Path, list]:
    """``predict``'s ``(dataset file, records)`` (``--limit`` first), every line validated and the options checked
    before the model loads: a problem is a one-line SystemExit naming the file:line or the flag."""
    from ooospec.pipelines.records import load_records

    try:
        path = resolve_benchmark(args.dataset, args.benchmark_dir)
    except FileNotFoundError as e:
        raise SystemExit(str(e)) from e
    try:  # every line is validated before the model loads: a bad one is a one-line error naming file:line
        records = load_records(path, "fail", what="--dataset records").rows[: args.limit]
    except ValueError as e:
        raise SystemExit(f"ooospec sidecar predict: {e}") from None
    if args.prefix_cache_tokens < 0 or (args.warm_tools and not args.prefix_cache_tokens):
        raise SystemExit("--prefix-cache-tokens must be >= 0, and > 0 with --warm-tools")
    try:
        sw.check_wave_options(args.wave, args.top_k, args.min_prob)
    except ValueError as e:
        raise SystemExit(f"ooospec sidecar predict: {e} (--wave/--top-k/--min-prob)") from None
    return path, records


def _predict_sidecar(args: argparse.Namespace):
    """``predict``'s in-process sidecar (``--engine``), with a prefix cache of ``--prefix-cache-tokens`` if any."""
    from ooospec.runtime.sidecar.engines import load_sidecar

    sidecar = load_sidecar(args.adapter, threads=args.threads, dtype=args.dtype, engine=args.engine,
                           gpu_memory=args.gpu_memory)
    if args.prefix_cache_tokens:
        from ooospec.runtime.agent.session import PrefixCache

        sidecar.prefix_cache = PrefixCache(max_tokens=args.prefix_cache_tokens)
    return sidecar


def _write_rows(rows: Iterable[dict], out_path: Path) -> list[dict]:
    """``rows`` as JSONL at ``out_path``, all or nothing (written beside it, then renamed; Ctrl-C included);
    the rows written."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".partial")
    done: list[dict] = []
    try:
        with open(tmp, "w", encoding="utf-8") as out:
            for row in rows:
                done.append(row)
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
        tmp.replace(out_path)
    except BaseException:  # no half-written predictions left behind (Ctrl-C included)
        tmp.unlink(missing_ok=True)
        raise
    return done


def cost_line(rows: list[dict]) -> str:
    """``median prefill 0.123 s, wave 0.456 s, block 380 tokens, 72% of them cached (N records)``."""
    from statistics import median

    share = median(r["cached_tokens"] / r["block_tokens"] if r["block_tokens"] else 0.0 for r in rows)
    return (f"median prefill {median(r['prefill_s'] for r in rows):.3f} s, wave {median(r['wave_s'] for r in rows):.3f}"
            f" s, block {median(r['block_tokens'] for r in rows):.0f} tokens, {share:.0%} of them cached "
            f"({len(rows)} records)")
