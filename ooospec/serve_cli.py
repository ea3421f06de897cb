"""``ooospec serve``: the OpenAI-compatible chat completions server (tools, streaming) on the speculative engine.

    ooospec serve --target qwen2.5-coder-0.5b [--backend auto|hf|llama.cpp] [--method toolspec|ooospec|ar]
                  [--sidecar http://127.0.0.1:8765] [--host 127.0.0.1] [--port 8000] [--threads auto] [--dtype auto]
                  [--n-ctx 4096] [--call-log PATH [--call-log-max-mb 256] [--call-log-backups 3]]

``--backend`` picks what runs the target (:func:`ooospec.runtime.backends.models.resolve_backend`; the choice and
its reason are logged at start-up): ``auto`` (the default) takes llama.cpp -- the GGUF's own quantized weights --
for a registry name or a ``.gguf`` file when llama-cpp-python imports and ``--dtype`` is auto, else hf
(transformers); ``hf`` and ``llama.cpp`` insist, and a choice that cannot run (llama.cpp on an HF folder or
without its bindings, ``--dtype`` with llama.cpp, ``--n-ctx`` with hf) stops at start-up. Every served method,
sessions, the prefix cache and streaming run on both; llama.cpp's context is fixed at ``--n-ctx`` tokens, and a
request whose prompt and ``max_tokens`` do not fit it gets 400.

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

from ooospec.runtime.backends import BACKEND_CHOICES
from ooospec.runtime.call_log import DEFAULT_BACKUPS, DEFAULT_MAX_BYTES, CallLog
from ooospec.runtime.methods import OOOSPEC, SERVED, TOOLSPEC, default_served, get_method
from ooospec.runtime.sidecar import deployments

logger = logging.getLogger(__name__)

DEFAULT_N_CTX = 4096     # llama.cpp's context when --n-ctx is not given


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True,
                   help="registry name (ooospec models list), .gguf file, local HF folder or hub id")
    p.add_argument("--backend", choices=BACKEND_CHOICES, default="auto",
                   help="what runs the target: 'auto' (default) = llama.cpp (the GGUF's quantized weights) for a "
                        "registry name or .gguf when llama-cpp-python is installed and --dtype is auto, else hf "
                        "(transformers); the choice and its reason are logged at start-up")
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
    p.add_argument("--threads", default="auto",
                   help="torch (hf) or llama.cpp threads: 'auto' (the cores this process may use) or N")
    p.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16", "fp16"],
                   help="hf backend's weights (auto: bf16 where the CPU multiplies it natively and faster, else fp32); "
                        "a dtype other than auto selects hf under --backend auto")
    p.add_argument("--n-ctx", type=int, default=None, metavar="N",
                   help=f"llama.cpp backend: tokens its context holds, prompt + answer (default {DEFAULT_N_CTX}); "
                        "a request that does not fit gets 400")
    p.add_argument("--max-sessions", type=int, default=8,
                   help="conversations whose KV is kept (LRU; llama.cpp keeps a copy of each one not running)")
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
    from ooospec.runtime.backends.hardware import resolve_threads
    from ooospec.runtime.serve.admission import override_limits
    from ooospec.runtime.serve.chat_app import DEFAULT_PORT, Limits, serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    method = served_method(args)
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
    chat = build_chat(args, method, threads)
    serve(chat, model_name=args.served_name or args.target, host=args.host, port=args.port or DEFAULT_PORT,
          limits=limits, call_log=call_log(args))
    return 0


def served_method(args: argparse.Namespace) -> str:
    """``--method``, or its default; SystemExit when it needs a ``--sidecar`` that is not given."""
    method = args.method or default_served(with_sidecar=bool(args.sidecar))
    if get_method(method).uses_sidecar and not args.sidecar:
        raise SystemExit(f"--method {method} needs --sidecar URL (start one with `ooospec sidecar serve`)")
    return method


def choose_backend(args: argparse.Namespace) -> tuple[str, str]:
    """``(backend, why)``: ``--backend`` resolved for ``--target`` (``auto``: what
    :func:`~ooospec.runtime.backends.models.resolve_backend` picks). SystemExit naming the flag when the choice
    cannot run here, or when a flag only the other backend reads was given."""
    from ooospec.runtime.backends.models import resolve_backend

    try:
        backend, why = resolve_backend(args.backend, args.target, "cpu", args.dtype)
    except (ValueError, RuntimeError) as e:
        raise SystemExit(f"--backend {args.backend}: {e}") from e
    if backend == "llama.cpp" and args.dtype != "auto":
        raise SystemExit(f"--dtype {args.dtype}: the llama.cpp backend runs the GGUF's own weights; leave --dtype "
                         "auto, or use --backend hf")
    if backend == "hf" and args.n_ctx is not None:
        raise SystemExit(f"--n-ctx sets the llama.cpp backend's context, but the backend is hf ({why}); the hf "
                         "cache grows as needed")
    if args.n_ctx is not None and args.n_ctx < min_n_ctx():
        raise SystemExit(f"--n-ctx {args.n_ctx}: at least {min_n_ctx()} (the context the forward cost is measured "
                         "on, runtime/backends/cost_model.py)")
    return backend, why


def min_n_ctx() -> int:
    """The smallest llama.cpp context the engine runs in: the forward-cost calibration's (cached tokens + the
    widest timed forward), measured at the first request of a drafting method."""
    from ooospec.runtime.backends.cost_model import CALIBRATION_CONTEXT, QUERY_SIZES

    return CALIBRATION_CONTEXT + max(QUERY_SIZES)


def load_served_target(args: argparse.Namespace, threads: int | None):
    """``(model, tokenizer)`` on the backend :func:`choose_backend` picks (logged with its reason); llama.cpp's
    context holds ``--n-ctx`` tokens and its tie margin is measured at load, not in the first request."""
    from ooospec.runtime.backends.models import load_llamacpp_target, load_target

    backend, why = choose_backend(args)
    logger.info("backend %s (%s)", backend, why)
    if backend == "hf":
        return load_target(args.target, dtype=args.dtype, threads=threads, cache=args.cache, backend="hf")
    model, tok = load_llamacpp_target(args.target, threads=threads, cache=args.cache,
                                      n_ctx=args.n_ctx or DEFAULT_N_CTX)
    logger.info("llama.cpp context: %d tokens (--n-ctx)", model.n_ctx)
    return model, tok


def build_chat(args: argparse.Namespace, method: str, threads: int | None):
    """The :class:`~ooospec.runtime.agent.chat.ChatModel` ``ooospec serve`` serves: the target on its backend, the
    sessions and prefix cache (unless ``--no-sessions``), the sidecar client with its gate."""
    from ooospec.runtime.agent.chat import ChatModel
    from ooospec.runtime.agent.session import PrefixCache, SessionStore
    from ooospec.runtime.sidecar.client import SidecarClient

    model, tok = load_served_target(args, threads)
    sessions = None
    if args.sessions:
        sessions = SessionStore(model, max_sessions=args.max_sessions,
                                prefix_cache=PrefixCache(max_bytes=max(args.prefix_cache_mb, 1) << 20))
    gate = None
    if args.sidecar and args.sidecar_gate != deployments.GATE_OFF:
        from ooospec.runtime.sidecar.gate import WaveGate

        gate = WaveGate(deployments.DEPLOYMENTS[args.sidecar_gate].prior)
    sidecar = SidecarClient(args.sidecar, gate=gate) if args.sidecar else None
    return ChatModel(model, tok, method=method, sidecar=sidecar, sessions=sessions)


def call_log(args: argparse.Namespace) -> CallLog | None:
    """The call log ``--call-log`` asks for, or None (the default: nothing written, no thread)."""
    if args.call_log is None:
        return None
    return CallLog(args.call_log, max_bytes=args.call_log_max_mb << 20, backups=args.call_log_backups)
