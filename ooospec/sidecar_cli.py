"""``ooospec sidecar``: serve the sidecar over HTTP, or predict calls for a dataset offline.

    ooospec sidecar serve [--adapter DIR] [--host 127.0.0.1] [--port 8765] [--threads T] [--cpus 1]
    ooospec sidecar predict [--adapter DIR] --dataset FILE_OR_BENCHMARK --out preds.jsonl [--threads T]

``--adapter`` defaults to ``$OOOSPEC_SIDECAR_ADAPTER``, else the shipped adapter (:mod:`ooospec.runtime.paths`).
``predict`` writes one JSON object per record, in input order::

    {"id": ..., "call": {"name", "arguments"} | null, "direct_call": {"name", "arguments"} | null,
     "wave_s": ..., "prefill_s": ..., "decode_s": ..., "n_queries": ...}

where ``call`` joins the index and argument answers and ``direct_call`` is the direct-call answer, each validated
against the tools' schemas (invalid arguments dropped), and the wave is the one-pass wave of all the record's
queries (the direct-call query included). Every ``--dataset`` line must be a valid record
(:func:`ooospec.pipelines.records.load_records`); a bad one stops the command with ``file:line``, the reason and
the field, before any prediction is written. A benchmark name means ``<name>.jsonl`` in ``--benchmark-dir``
(default ``data/dedupe/eval`` under the working directory).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from ooospec.runtime.paths import BENCHMARK_DIR_FLAG, resolve_benchmark


def predict_records(sidecar, records: Iterable[Mapping]) -> Iterator[dict]:
    """One prediction row per record (see the module docstring); ``sidecar`` is a loaded
    :class:`~ooospec.runtime.sidecar.Sidecar` (waves in its adapter's layout). The record's first call is predicted
    (no prior calls)."""
    from ooospec.runtime import sidecar_prompts as sp

    for rec in records:
        wave = sp.build_wave(rec["messages"], rec["tools"], with_direct_call=True,
                             layout=getattr(sidecar, "layout", sp.LAYOUT_VERSION))   # the adapter's layout
        result = sidecar.answer(wave)
        call = sp.join_answers(rec["tools"], wave, result.answers)
        direct_text = next(a for q, a in zip(wave.queries, result.answers) if q.form == "direct_call")
        yield {"id": rec.get("id"),
               "call": None if call is None else {"name": call["name"], "arguments": call["arguments"]},
               # the direct call stands on its own, even when the index answer is unusable
               "direct_call": sp.checked_direct_call(rec["tools"], direct_text),
               "wave_s": result.wave_s, "prefill_s": result.prefill_s, "decode_s": result.decode_s,
               "n_queries": len(wave.queries)}


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
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default loopback; no authentication)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8765)")
    serve.add_argument("--cpus", type=_cpus, default=None, help="pin the server to these cores, e.g. 1 or 0,1")
    serve.add_argument("--limit", action="append", default=[], metavar="KEY=VALUE",
                       help="override a request limit (repeatable), e.g. --limit max_prompts=256; the keys are the "
                            "fields of runtime/serve/sidecar_app.py's Limits (the README's Reliability table)")
    predict.add_argument("--dataset", required=True, help="a JSONL file of records or a benchmark name")
    predict.add_argument(BENCHMARK_DIR_FLAG, type=Path, default=None,
                         help="folder of benchmark <name>.jsonl files (default: data/dedupe/eval under the working "
                              "directory)")
    predict.add_argument("--out", type=Path, required=True, help="predictions JSONL")
    predict.add_argument("--limit", type=int, default=None, help="first N records only")


def run_cli(args: argparse.Namespace) -> int:
    if args.sidecar_command == "serve":
        from ooospec.runtime.serve.admission import override_limits
        from ooospec.runtime.serve.sidecar_app import DEFAULT_PORT, Limits, serve

        try:
            limits = override_limits(Limits(), args.limit)
        except ValueError as e:
            raise SystemExit(str(e)) from e
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        serve(args.adapter, host=args.host, port=args.port or DEFAULT_PORT, threads=args.threads, cpus=args.cpus,
              dtype=args.dtype, limits=limits)
        return 0

    from tqdm import tqdm

    from ooospec.pipelines.records import load_records
    from ooospec.runtime.sidecar import Sidecar

    try:
        path = resolve_benchmark(args.dataset, args.benchmark_dir)
    except FileNotFoundError as e:
        raise SystemExit(str(e)) from e
    try:  # every line is validated before the model loads: a bad one is a one-line error naming file:line
        records = load_records(path, "fail", what="--dataset records").rows[: args.limit]
    except ValueError as e:
        raise SystemExit(f"ooospec sidecar predict: {e}") from None
    sidecar = Sidecar.from_adapter(args.adapter, threads=args.threads, dtype=args.dtype)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".partial")
    rows = tqdm(predict_records(sidecar, records), total=len(records), desc=f"sidecar predict {path.name}")
    try:
        with open(tmp, "w", encoding="utf-8") as out:
            out.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        tmp.replace(args.out)
    except BaseException:  # no half-written predictions left behind (Ctrl-C included)
        tmp.unlink(missing_ok=True)
        raise
    print(f"wrote {len(records)} predictions to {args.out}")
    return 0
