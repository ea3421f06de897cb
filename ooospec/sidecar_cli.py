"""``ooospec sidecar``: serve the sidecar over HTTP, or predict calls for a dataset offline.

    ooospec sidecar serve [--adapter DIR] [--host 127.0.0.1] [--port 8765] [--threads T] [--cpus 1]
    ooospec sidecar predict [--adapter DIR] --dataset FILE_OR_BENCHMARK --out preds.jsonl [--threads T]

``--adapter`` defaults to the shipped adapter (``adapters/sidecar``, or ``$OOOSPEC_SIDECAR_ADAPTER``). ``predict``
writes one JSON object per record, in input order::

    {"id": ..., "call": {"name", "arguments"} | null, "direct_call": {"name", "arguments"} | null,
     "wave_s": ..., "prefill_s": ..., "decode_s": ..., "n_queries": ...}

where ``call`` joins the index and argument answers and ``direct_call`` is the direct-call answer, each validated
against the tools' schemas (invalid arguments dropped), and the wave is the one-pass wave of all the record's
queries (the direct-call query included). A benchmark name means ``data/dedupe/eval/<name>.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

BENCHMARK_DIR = Path("data/dedupe/eval")


def predict_records(sidecar, records: Iterable[Mapping]) -> Iterator[dict]:
    """One prediction row per record (see the module docstring); ``sidecar`` is a loaded
    :class:`~ooospec.runtime.sidecar.Sidecar`. The record's first call is predicted (no prior calls)."""
    from ooospec.runtime import sidecar_prompts as sp
    from ooospec.runtime.sidecar import join_answers

    for rec in records:
        wave = sp.build_wave(rec["messages"], rec["tools"], with_direct_call=True)
        result = sidecar.answer(wave)
        call = join_answers(rec["tools"], wave, result.answers)
        direct_text = next(a for q, a in zip(wave.queries, result.answers) if q.form == "direct_call")
        yield {"id": rec.get("id"),
               "call": None if call is None else {"name": call["name"], "arguments": call["arguments"]},
               # the direct call stands on its own, even when the index answer is unusable
               "direct_call": sp.checked_direct_call(rec["tools"], direct_text),
               "wave_s": result.wave_s, "prefill_s": result.prefill_s, "decode_s": result.decode_s,
               "n_queries": len(wave.queries)}


def resolve_dataset(dataset: str) -> Path:
    """A JSONL path as given, or a benchmark name -> ``data/dedupe/eval/<name>.jsonl``."""
    path = Path(dataset)
    if path.suffix != ".jsonl" and not path.is_file():
        path = BENCHMARK_DIR / f"{dataset}.jsonl"
    if not path.is_file():
        raise SystemExit(f"--dataset {dataset}: {path} not found (a JSONL file of records, or a benchmark name "
                         f"built by `dvc repro dedupe` into {BENCHMARK_DIR}/)")
    return path


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
    predict.add_argument("--dataset", required=True, help="a JSONL file of records or a benchmark name")
    predict.add_argument("--out", type=Path, required=True, help="predictions JSONL")
    predict.add_argument("--limit", type=int, default=None, help="first N records only")


def run_cli(args: argparse.Namespace) -> int:
    if args.sidecar_command == "serve":
        from ooospec.runtime.serve.sidecar_app import DEFAULT_PORT, serve

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        serve(args.adapter, host=args.host, port=args.port or DEFAULT_PORT, threads=args.threads, cpus=args.cpus,
              dtype=args.dtype)
        return 0

    from tqdm import tqdm

    from ooospec.runtime.sidecar import Sidecar

    path = resolve_dataset(args.dataset)
    with open(path, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()][: args.limit]
    sidecar = Sidecar.from_adapter(args.adapter, threads=args.threads, dtype=args.dtype)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".partial")
    rows = tqdm(predict_records(sidecar, records), total=len(records), desc=f"sidecar predict {path.name}")
    with open(tmp, "w", encoding="utf-8") as out:
        out.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    tmp.replace(args.out)
    print(f"wrote {len(records)} predictions to {args.out}")
    return 0
