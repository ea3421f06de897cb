"""``ooospec serve``: the OpenAI-compatible chat completions server (tools, streaming) on the speculative engine.

    ooospec serve --target qwen2.5-coder-0.5b [--method toolspec|ooospec|ar] [--sidecar http://127.0.0.1:8765]
                  [--host 127.0.0.1] [--port 8000] [--threads auto] [--dtype auto]
                  [--call-log PATH [--call-log-max-mb 256] [--call-log-backups 3]]

``--method`` defaults to ``ooospec`` with ``--sidecar`` (hints from that running sidecar server, e.g. ``ooospec
sidecar serve``), ``toolspec`` without. Sessions keep each conversation's KV across its turns (``--max-sessions``)
and a prefix cache keeps shared system + tools blocks (``--prefix-cache-mb``); ``--no-sessions`` prefills every
request whole. ``--call-log`` appends each finished request that showed tools (its tools, messages and the answer)
to a JSON-lines file, rotated by size (:mod:`ooospec.runtime.call_log`); off by default. See
:mod:`ooospec.runtime.serve.chat_app` for the protocol and the limits.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from ooospec.runtime.call_log import DEFAULT_BACKUPS, DEFAULT_MAX_BYTES, CallLog
from ooospec.runtime.methods import OOOSPEC, SERVED, TOOLSPEC, default_served, get_method
from ooospec.runtime.sidecar import deployments


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="registry name (ooospec models list), local HF folder or hub id")
    p.add_argument("--method", choices=SERVED, default=None,
                   help=f"decoding method (default: {OOOSPEC} with --sidecar, else {TOOLSPEC}); output is greedy "
                        f"either way")
    p.add_argument("--sidecar", default=None, metavar="URL",
                   help=f"a running sidecar server (ours or vLLM) for method {OOOSPEC}, e.g. http://127.0.0.1:8765")
    p.add_argument("--sidecar-gate", choices=deployments.SERVE_GATE_CHOICES, default=deployments.GATE_OFF,
                   help="send each wave only as far as it is expected to pay, starting from this deployment's prior ("
                        + "; ".join(f"{n}: {deployments.DEPLOYMENTS[n].summary}" for n in deployments.SERVE_DEPLOYMENTS)
                        + f"); {deployments.GATE_OFF}: always the full wave")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback; no authentication)")
    p.add_argument("--port", type=int, default=None, help="port (default 8000)")
    p.add_argument("--served-name", default=None, help="the model name clients send (default: --target)")
    p.add_argument("--threads", default="auto", help="torch threads: 'auto' (the cores this process may use) or N")
    p.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16", "fp16"],
                   help="target weights (auto: bf16 where the CPU multiplies it natively and faster, else fp32)")
    p.add_argument("--max-sessions", type=int, default=8, help="conversations whose KV is kept (LRU)")
    p.add_argument("--prefix-cache-mb", type=int, default=512, help="memory for shared system + tools blocks")
    p.add_argument("--no-sessions", dest="sessions", action="store_false",
                   help="prefill every request from scratch (stateless)")
    p.add_argument("--cache", type=Path, default=None, help="model cache root (default $OOOSPEC_CACHE)")
    p.add_argument("--call-log", type=Path, default=None, metavar="PATH",
                   help="append each finished request with tools (tools, messages, the answer's calls) to this "
                        "JSON-lines file, for `ingest` (off by default; prompts may hold personal data)")
    p.add_argument("--call-log-max-mb", type=int, default=DEFAULT_MAX_BYTES >> 20, metavar="N",
                   help="rotate the call log before it grows past N MiB (default %(default)s)")
    p.add_argument("--call-log-backups", type=int, default=DEFAULT_BACKUPS, metavar="K",
                   help="rotated call logs kept: PATH.1 ... PATH.K (default %(default)s)")
    p.add_argument("--limit", action="append", default=[], metavar="KEY=VALUE",
                   help="override a request limit (repeatable), e.g. --limit max_tokens=4096; the keys are the "
                        "fields of runtime/serve/chat_app.py's Limits (the README's Reliability table)")


def run_cli(args: argparse.Namespace) -> int:
    from ooospec.runtime.agent.chat import ChatModel
    from ooospec.runtime.agent.session import PrefixCache, SessionStore
    from ooospec.runtime.backends.hardware import resolve_threads
    from ooospec.runtime.backends.models import load_target
    from ooospec.runtime.serve.admission import override_limits
    from ooospec.runtime.serve.chat_app import DEFAULT_PORT, Limits, serve
    from ooospec.runtime.sidecar.client import SidecarClient

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    method = args.method or default_served(with_sidecar=bool(args.sidecar))
    if get_method(method).uses_sidecar and not args.sidecar:
        raise SystemExit(f"--method {method} needs --sidecar URL (start one with `ooospec sidecar serve`)")
    try:
        limits = override_limits(Limits(), args.limit)
    except ValueError as e:
        raise SystemExit(str(e)) from e
    if args.call_log is not None and (args.call_log_max_mb < 1 or args.call_log_backups < 0):
        raise SystemExit(f"--call-log-max-mb {args.call_log_max_mb} (>= 1) / --call-log-backups "
                         f"{args.call_log_backups} (>= 0)")
    try:
        threads = resolve_threads(args.threads)[0]
    except ValueError as e:
        raise SystemExit(f"--threads: {e}") from e
    model, tok = load_target(args.target, dtype=args.dtype, threads=threads, cache=args.cache)
    sessions = None
    if args.sessions:
        sessions = SessionStore(model, max_sessions=args.max_sessions,
                                prefix_cache=PrefixCache(max_bytes=max(args.prefix_cache_mb, 1) << 20))
    gate = None
    if args.sidecar and args.sidecar_gate != deployments.GATE_OFF:
        from ooospec.runtime.sidecar.gate import WaveGate

        gate = WaveGate(deployments.DEPLOYMENTS[args.sidecar_gate].prior)
    sidecar = SidecarClient(args.sidecar, gate=gate) if args.sidecar else None
    chat = ChatModel(model, tok, method=method, sidecar=sidecar, sessions=sessions)
    serve(chat, model_name=args.served_name or args.target, host=args.host, port=args.port or DEFAULT_PORT,
          limits=limits, call_log=call_log(args))
    return 0


def call_log(args: argparse.Namespace) -> CallLog | None:
    """The call log ``--call-log`` asks for, or None (the default: nothing written, no thread)."""
    if args.call_log is None:
        return None
    return CallLog(args.call_log, max_bytes=args.call_log_max_mb << 20, backups=args.call_log_backups)
