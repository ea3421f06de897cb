"""Send one sidecar wave per request, in the background; the target polls for the hint bank and never waits.

At request arrival -- never before -- :meth:`SidecarClient.submit` starts a daemon thread that builds the wave
with the shared builder (:func:`~ooospec.runtime.sidecar.prompts.build_wave`), sends it as ONE
OpenAI-compatible ``POST /v1/completions`` (one prompt per slot query; our server,
:mod:`ooospec.runtime.serve.sidecar_app`, or vLLM serving the adapter), joins the answers into a call
(:func:`~ooospec.runtime.sidecar.prompts.join_answers`, schema-checked), renders its text views and tokenizes them with
the TARGET's tokenizer into a :class:`~ooospec.runtime.drafters.hints.HintBank`. The caller gets a :class:`HintRequest`
at once; its :meth:`~HintRequest.poll` returns the bank when it is ready and None before (and forever after any
failure but a function-first stage 2's). Every step is timed; every failure has a kind (:data:`ErrorKind`) and
only costs the hints.

    client = SidecarClient("http://127.0.0.1:8765")
    req = client.submit(messages, tools, fmt=fmt, tokenizer=target_tokenizer)     # returns at once
    engine = make_engine(model, [fsm, retrieval, HintDrafter(req), pld], eos_token_ids=[...])
    result = engine.generate(prompt_ids, 256)
    req.cancel(); req.stats()        # arrival/submit/sent/response/ready times, bytes, error kind, the call

``wave="function-first"`` asks in two stages instead (:mod:`ooospec.runtime.sidecar.protocol`): the index query
alone, whose answer (and its first token's top logprobs) names up to ``top_k`` candidate tools and publishes an
EARLY bank of their names at once, then only the candidates' argument queries, whose joined calls replace it.
Stage 2 failing keeps the early bank; a :class:`~ooospec.runtime.drafters.hints.HintDrafter` takes the final bank when
it comes. ``wave="all"`` (the default) is the one-pass wave above. The stats add ``early_t``, ``index_s`` and
``functions``; ``wave_s`` spans both stages.

Bounds: connect timeout, a total deadline for the response (a watchdog closes the socket, so a server that
trickles bytes cannot hold the thread), and a response size cap (default 1 MB). Starting and stopping a sidecar
server process is :mod:`ooospec.runtime.sidecar.process`.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any

from ooospec.runtime.drafters.hints import HintBank
from ooospec.runtime.sidecar import prompts as sp
from ooospec.runtime.sidecar.gate import WaveGate
from ooospec.runtime.sidecar.gate_decision import WaveDecision
from ooospec.runtime.sidecar.outcome import outcome_of
from ooospec.runtime.sidecar.prompts import join_answers
from ooospec.runtime.sidecar.protocol import (
    ErrorKind,
    WaveFailure,
    WaveMode,
    check_wave_options,
    parse_response,
    run_function_first,
)

logger = logging.getLogger(__name__)

@dataclass
class RequestStats:
    """One request's sidecar timeline and outcome. Times are ``time.perf_counter()`` seconds (None: not reached)."""

    arrival_t: float                  # the request's arrival, as given to submit()
    submit_t: float | None = None     # the background thread starts building the wave
    sent_t: float | None = None       # writing the (first) HTTP request begins
    response_t: float | None = None   # the whole (last) response body is read
    ready_t: float | None = None      # the (final) hint bank is ready for poll()
    early_t: float | None = None      # function-first: the early bank (candidate names) is ready for poll()
    index_s: float | None = None      # function-first: stage 1 (the index query) sent -> response read
    functions: list[str] = field(default_factory=list)   # function-first: the candidate tools, greedy first
    n_queries: int = 0                # queries sent (function-first: both stages')
    request_bytes: int = 0
    response_bytes: int = 0           # HTTP body
    payload_bytes: int = 0            # the answers' text (UTF-8), the semantic payload without protocol
    build_s: float = 0.0              # this process's own work: wave texts + JSON + join + views + tokenize
    error: ErrorKind | None = None
    error_detail: str = ""
    call: dict | None = None          # the joined call ({"name", "arguments"}), when there is one
    num_views: int = 0
    server: dict = field(default_factory=dict)   # the server's "ooospec" object (our server) or {}
    decision: dict | None = None      # the wave gate's record (WaveDecision.to_dict()), when a gate decided

    @property
    def wave_s(self) -> float | None:
        """Sent -> (last) response read: the sidecar's answer latency as the client sees it."""
        return None if self.sent_t is None or self.response_t is None else self.response_t - self.sent_t

    @property
    def ready_s(self) -> float | None:
        """Arrival -> bank ready."""
        return None if self.ready_t is None else self.ready_t - self.arrival_t

    def to_dict(self) -> dict:
        return {**asdict(self), "wave_s": self.wave_s, "ready_s": self.ready_s}


class HintRequest:
    """One request's sidecar wave in flight, a :class:`~ooospec.runtime.drafters.hints.CallGuess`. ``poll()`` never
    blocks; see the module docstring."""

    def __init__(self, arrival: float, gate: WaveGate | None = None, decision: WaveDecision | None = None,
                 messages: Sequence[Any] = ()):
        self._stats = RequestStats(arrival_t=arrival, decision=None if decision is None else decision.to_dict())
        self.gate, self.decision, self.messages = gate, decision, messages
        self._bank: HintBank | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None
        self._abort: ErrorKind | None = None
        self.thread: threading.Thread | None = None

    def poll(self) -> HintBank | None:
        """The bank once ready, else None (also after any failure, except a function-first request's early bank,
        which stays). Returns at once; a function-first request's bank may change once (early -> final)."""
        return self._bank

    @property
    def done(self) -> bool:
        """The background work has ended (bank ready or failed)."""
        return self._done.is_set()

    def wait(self, timeout: float) -> HintBank | None:
        """Block up to ``timeout`` seconds for the outcome (scripts and tests; the engine never calls this)."""
        self._done.wait(timeout)
        return self._bank

    def wait_call(self, timeout: float) -> dict | None:
        """Block up to ``timeout`` seconds for the joined call (None: none came, or not yet)."""
        self._done.wait(timeout)
        return self._stats.call

    def cancel(self) -> None:
        """Abandon the wave: close its connection now; the bank will not become ready."""
        self._interrupt("cancelled")

    def stats(self) -> RequestStats:
        return self._stats

    def report(self, result, hint_stats, calls: Sequence[Mapping] = ()) -> dict | None:
        """The request is over: teach the gate (if any) what it cost and saved; returns the gate's record.

        Args:
            result: the engine's result (None when generation failed: nothing is learnt).
            hint_stats: the request's :class:`~ooospec.runtime.drafters.hints.HintStats` (with the result).
            calls: the calls the target wrote, ``{"name", "arguments"}`` (the verbatim rates of argument slots).
        """
        if self.gate is None or self.decision is None:
            return None
        if result is not None:
            self.gate.observe(outcome_of(self.decision, result, hint_stats, self._stats, calls, self.messages))
        return self._stats.decision

    def observe_tool(self, tool_s: float, hit: bool | None) -> None:
        """An agent loop ran the tool of this request's call for ``tool_s`` s; ``hit``: the joined call was that
        call (None: no joined call was ready). Teaches the gate (if any) what a wave is worth in tool latency
        hidden; only a ``slots`` wave joins a call, so only those count toward the hit rate."""
        if self.gate is None or self.decision is None:
            return
        self.gate.observe_tool(self.decision.key, tool_s, hit if self.decision.kind == "slots" else None)

    def _interrupt(self, kind: ErrorKind) -> None:
        with self._lock:
            if self._done.is_set() or self._abort is not None:
                return
            self._abort = kind
            conn = self._conn
        if conn is not None and conn.sock is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)   # wakes a blocked connect/recv in the worker thread
            except OSError:
                pass

    def _set_conn(self, conn: http.client.HTTPConnection | None) -> None:
        with self._lock:
            self._conn = conn

    def _publish(self, bank: HintBank, final: bool = True) -> None:
        """``bank`` is what poll() returns from now on (``ready_t``, or ``early_t`` when not ``final``); raises
        :class:`WaveFailure` when the wave was interrupted first."""
        with self._lock:
            if self._abort is not None:
                raise WaveFailure(self._abort, "interrupted before the bank was ready")
            self._bank = bank
            setattr(self._stats, "ready_t" if final else "early_t", time.perf_counter())


class SidecarClient:
    """Sends waves to a sidecar server at ``base_url`` (``http://host:port``; POST ``/v1/completions``).

    Args:
        base_url: server root, e.g. ``http://127.0.0.1:8765`` (our server) or ``http://127.0.0.1:8000`` (vLLM).
        model: the served model name (``--lora-modules sidecar=DIR`` on vLLM).
        max_tokens: per answer (the longest slot answer the wave waits for).
        connect_timeout: seconds to establish the connection.
        timeout: seconds from submit to the whole response (then the socket is closed: ``"timeout"``).
        max_response_bytes: a larger response is dropped (``"too_large"``).
        with_direct_call: also ask the direct-call query; its call (when valid and different) joins the bank.
        gate: a :class:`~ooospec.runtime.sidecar.gate.WaveGate` deciding per request whether the wave pays, and which
            queries (None = always the full wave). Report each finished request back with
            :meth:`HintRequest.report`.
        layout: the prompt layout to build waves in (:data:`~ooospec.runtime.sidecar.prompts.LAYOUTS`; the one the
            served adapter learned). None = ask the server's ``GET /health`` once, before the first wave: our
            server reports its adapter's ``layout_version``; a server that reports none (vLLM) gets
            :data:`~ooospec.runtime.sidecar.prompts.LAYOUT_VERSION`, or ``fallback_layout`` when given (the
            layout of the adapter that server serves, e.g. :func:`adapter_layout` of the shipped one). The answer
            is cached (an unreachable server is asked again next wave).
        fallback_layout: the layout for a server that reports none (vLLM serving our adapter as a LoRA).
        wave: ``"all"`` (the one-pass wave) or ``"function-first"`` (two stages; the module docstring).
        top_k, min_prob: function-first: argument queries for at most ``top_k`` candidate tools, the alternatives
            to the greedy index at least ``min_prob`` likely (``top_k`` 1: no logprobs are asked).
    """

    def __init__(self, base_url: str, *, model: str = sp.SERVED_NAME, max_tokens: int = 48,
                 connect_timeout: float = 2.0, timeout: float = 60.0, max_response_bytes: int = 1 << 20,
                 with_direct_call: bool = False,
                 gate: WaveGate | None = None, layout: int | None = None, fallback_layout: int | None = None,
                 wave: WaveMode = "all", top_k: int = 2, min_prob: float = 0.1):
        url = urllib.parse.urlsplit(base_url)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"sidecar url must be http://host:port, got {base_url!r}")
        if connect_timeout <= 0 or timeout <= 0 or max_response_bytes < 1 or max_tokens < 1:
            raise ValueError("connect_timeout, timeout, max_response_bytes and max_tokens must be positive")
        check_wave_options(wave, top_k, min_prob)
        self.host, self.port = url.hostname, url.port or 80
        self.base_url = base_url.rstrip("/")
        self.path = url.path.rstrip("/") + "/v1/completions"
        self.health_path = url.path.rstrip("/") + "/health"
        self.model, self.max_tokens = model, max_tokens
        self.connect_timeout, self.timeout = connect_timeout, timeout
        self.max_response_bytes = max_response_bytes
        self.with_direct_call = with_direct_call
        self.gate = gate
        self.layout = None if layout is None else sp.check_layout(layout)
        self.fallback_layout = sp.LAYOUT_VERSION if fallback_layout is None else sp.check_layout(fallback_layout)
        self.server_prefix_cache = False     # the server keeps block KV across waves (its /health says so)
        self.wave, self.top_k, self.min_prob = wave, top_k, min_prob
        self.logprobs_refused = False        # function-first: the server answered 400 to "logprobs" (asked no more)
        self._layout_lock = threading.Lock()

    def submit(self, messages: Sequence[Any], tools: Sequence[Any], *, fmt: ModuleType, tokenizer,
               prior_calls: Sequence[Mapping] = (), arrival: float | None = None) -> HintRequest:
        """Start the wave for this request in a daemon thread and return at once.

        Args:
            messages, tools, prior_calls: the request (``prior_calls``: calls already made in this turn).
            fmt: the target's format module (``runtime/formats``), for the call-syntax view.
            tokenizer: the TARGET's tokenizer (views are tokenized with it, in the background thread; HF fast
                tokenizers encode and decode from two threads safely as long as nobody changes their
                truncation/padding settings meanwhile, so don't call it with ``truncation=``/``padding=``
                while a wave is in flight).
            arrival: ``time.perf_counter()`` when the request arrived (default: now); kept in the stats.

        With a gate, the wave is built here (string work, well under a millisecond for tens of slots) and the gate
        picks what to send; a skipped request is done at once and its ``poll()`` stays None.
        """
        arrival = time.perf_counter() if arrival is None else arrival
        wave = None
        if self.gate is not None:
            try:
                layout = self.server_layout()     # asks the server once per client: the wave is built here
            except WaveFailure as e:
                req = HintRequest(arrival)
                req._stats.error, req._stats.error_detail = e.kind, e.detail
                req._done.set()
                return req
            t0 = time.perf_counter()
            decision = self.gate.decide(sp.build_wave(messages, tools, prior_calls, self.with_direct_call, layout),
                                        tools)
            req = HintRequest(arrival, self.gate, decision, messages)
            req._stats.build_s = time.perf_counter() - t0
            if decision.wave is None:
                req._done.set()
                return req
            wave = decision.wave
        else:
            req = HintRequest(arrival)
        req.thread = threading.Thread(target=self._run, args=(req, messages, tools, prior_calls, fmt, tokenizer, wave),
                                      name="sidecar-wave", daemon=True)
        req.thread.start()
        return req

    def prefill(self, messages: Sequence[Any], tools: Sequence[Any], prior_calls: Sequence[Mapping] = (), *,
                wait: bool = False, only_if_pays: bool = False) -> threading.Thread | bool:
        """Have the server prefill this request's block now, so that a later wave sharing its beginning prefills
        only the rest (the server's prefix cache; e.g. a tools-first toolbox before requests arrive, or an agent's
        conversation while a tool runs). One prompt, the block + the index query, ``max_tokens=1``.

        Runs in a daemon thread (returned) unless ``wait``, then returns whether the server answered 200.
        Failures are logged and cost nothing else; the gate (if any) learns that the server holds the block.
        ``only_if_pays`` (an agent's idle window while a tool runs): with a gate, prefill only when the gate would
        send this tool set a wave and expects the prefill to end within the tool's latency
        (:meth:`~ooospec.runtime.sidecar.gate.WaveGate.prefill_pays`); else nothing is sent (False).
        """
        def run() -> bool:
            try:
                block = sp.shared_block(messages, tools, prior_calls, self.server_layout())
                if only_if_pays and self.gate is not None and not self.gate.prefill_pays(block, tools):
                    return False
                body = json.dumps({"model": self.model, "prompt": [block + sp.INDEX_QUERY], "max_tokens": 1,
                                   "temperature": 0, "add_special_tokens": False}, ensure_ascii=False).encode()
                self._post(HintRequest(time.perf_counter()), body)
            except WaveFailure as e:
                logger.info("sidecar prefill failed (%s): %s", e.kind, e.detail)
                return False
            except Exception as e:  # never reaches the caller
                logger.warning("sidecar prefill failed: %r", e, exc_info=True)
                return False
            if self.gate is not None:
                self.gate.remember(block)
            return True

        if wait:
            return run()
        thread = threading.Thread(target=run, name="sidecar-prefill", daemon=True)
        thread.start()
        return thread

    # -------------------------------------------------------------------------- the background thread

    def _run(self, req: HintRequest, messages, tools, prior_calls, fmt, tokenizer, wave: sp.Wave | None) -> None:
        st = req._stats
        st.submit_t = time.perf_counter()
        build_s = st.build_s
        watchdog = threading.Timer(self.timeout, req._interrupt, args=("timeout",))
        watchdog.daemon = True
        watchdog.start()
        try:
            health_s = 0.0
            if wave is None:
                t_health = time.perf_counter()
                layout = self.server_layout(req)        # the server's /health, the first time only
                health_s = time.perf_counter() - t_health
                wave = sp.build_wave(messages, tools, prior_calls, self.with_direct_call, layout)
            if self.wave == "function-first":
                st.build_s = build_s + time.perf_counter() - st.submit_t - health_s
                run_function_first(self, req, tools, fmt, tokenizer, wave)
                return
            st.n_queries = len(wave.queries)
            body = json.dumps({"model": self.model, "prompt": wave.prompts(), "max_tokens": self.max_tokens,
                               "temperature": 0, "add_special_tokens": False}, ensure_ascii=False).encode()
            st.request_bytes = len(body)
            st.build_s = build_s + time.perf_counter() - st.submit_t - health_s
            raw = self._post(req, body)
            t0 = time.perf_counter()
            answers, server = parse_response(raw, len(wave.queries))
            st.server = server
            st.payload_bytes = sum(len(a.encode()) for a in answers)
            call = join_answers(tools, wave, answers)
            if call is None:
                raise WaveFailure("no_call", "the answers join into no call (function index unusable)")
            calls = [{"name": call["name"], "arguments": call["arguments"]}]
            direct = call.get("direct_call")
            if direct is not None and direct != calls[0]:
                calls.append(direct)
            st.call = calls[0]
            bank = HintBank.from_calls(calls, fmt, tokenizer)
            st.num_views = len(bank.views)
            st.build_s += time.perf_counter() - t0
            req._publish(bank)
        except WaveFailure as e:
            st.error, st.error_detail = e.kind, e.detail
        except Exception as e:  # a sidecar bug must never reach the target
            logger.warning("sidecar wave failed: %r", e, exc_info=True)
            st.error, st.error_detail = "internal", repr(e)[:300]
        finally:
            watchdog.cancel()
            req._done.set()

    def server_layout(self, req: HintRequest | None = None) -> int:
        """The layout to build waves in: ``layout`` when given, else the server's (``GET /health``, asked once and
        cached; :data:`~ooospec.runtime.sidecar.prompts.LAYOUT_VERSION` when it reports none or is unreachable,
        the latter not cached). Raises :class:`WaveFailure` (``bad_response``) when the server reports a layout this
        client cannot build."""
        with self._layout_lock:      # concurrent first waves ask once
            if self.layout is not None:
                return self.layout
            try:
                raw = self._get_health(req)
            except (OSError, http.client.HTTPException) as e:
                logger.info("sidecar /health unreachable (%r): layout %d for now", e, self.fallback_layout)
                return self.fallback_layout
            try:
                health = json.loads(raw) if raw is not None else None
            except (ValueError, RecursionError):
                health = None
            found = health.get("layout_version") if isinstance(health, dict) else None
            self.server_prefix_cache = bool(isinstance(health, dict) and health.get("prefix_cache"))
            if self.gate is not None:
                self.gate.server_prefix_cache = self.server_prefix_cache
                if isinstance(health, dict) and isinstance(health.get("calibration"), dict):
                    self.gate.calibrate(health["calibration"])     # this machine's wave cost, not the prior's
            if found is None:
                self.layout = self.fallback_layout
            else:
                try:
                    self.layout = sp.check_layout(found)
                except ValueError as e:
                    raise WaveFailure("bad_response", f"/health: {e}") from None
            return self.layout

    def _get_health(self, req: HintRequest | None) -> bytes | None:
        """The body of ``GET /health`` (None: not 200, or over ``max_response_bytes``); raises OSError /
        HTTPException when unreachable. A wave's watchdog and cancel() interrupt it like the POST."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.connect_timeout)
        if req is not None:
            req._set_conn(conn)
        try:
            conn.connect()
            conn.sock.settimeout(self.timeout)
            conn.request("GET", self.health_path, headers={"Accept": "application/json"})
            resp = conn.getresponse()
            raw = resp.read(self.max_response_bytes + 1)
            return raw if resp.status == 200 and len(raw) <= self.max_response_bytes else None
        finally:
            if req is not None:
                req._set_conn(None)
            conn.close()

    def _post(self, req: HintRequest, body: bytes) -> bytes:
        """POST the wave; the response body (at most ``max_response_bytes``). Raises :class:`WaveFailure`."""
        st = req._stats
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.connect_timeout)
        req._set_conn(conn)
        try:
            try:
                conn.connect()
            except OSError as e:
                raise WaveFailure(req._abort or "connect", f"{self.host}:{self.port}: {e!r}") from None
            if req._abort is not None:       # interrupted while connecting
                raise WaveFailure(req._abort, "interrupted while connecting")
            conn.sock.settimeout(self.timeout)
            try:
                st.sent_t = time.perf_counter()    # before the write: the server may read it before we return
                conn.request("POST", self.path, body=body,
                             headers={"Content-Type": "application/json", "Accept": "application/json"})
                resp = conn.getresponse()
                length = resp.getheader("Content-Length")
                if length is not None and length.isdigit() and int(length) > self.max_response_bytes:
                    raise WaveFailure("too_large", f"Content-Length {length} > {self.max_response_bytes}")
                chunks, total = [], 0
                while True:
                    chunk = resp.read(65536)
                    if not chunk:
                        break
                    total += len(chunk)
                    if total > self.max_response_bytes:
                        raise WaveFailure("too_large", f"response over {self.max_response_bytes} bytes")
                    chunks.append(chunk)
                if req._abort is not None:     # the watchdog or cancel() closed the socket mid-body
                    raise WaveFailure(req._abort, f"interrupted after {total} bytes")
                if length is not None and length.isdigit() and total != int(length):
                    raise WaveFailure("closed", f"body ended after {total} of {length} bytes")
            except WaveFailure:
                raise
            except TimeoutError as e:
                raise WaveFailure(req._abort or "timeout", repr(e)) from None
            except (http.client.HTTPException, OSError) as e:
                raise WaveFailure(req._abort or "closed", repr(e)[:300]) from None
            st.response_t = time.perf_counter()
            raw = b"".join(chunks)
            st.response_bytes = len(raw)
            if resp.status != 200:
                raise WaveFailure("http_status", f"HTTP {resp.status}: {raw[:200]!r}")
            return raw
        finally:
            req._set_conn(None)
            conn.close()


def adapter_layout(adapter: str | os.PathLike | None = None) -> int:
    """The prompt layout an adapter folder learned (its ``sidecar.json`` ``layout_version``; default the shipped
    adapter's), so a client of a server that does not report one (vLLM) builds the waves that adapter reads."""
    from ooospec.runtime.paths import sidecar_adapter_dir

    found = sp.read_metadata(sidecar_adapter_dir(adapter), strict=False).get("layout_version")
    return sp.LAYOUT_VERSION if found is None else sp.check_layout(found)
