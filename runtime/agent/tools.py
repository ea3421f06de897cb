"""Tools the runtime can run: a registry, argument validation, and the speculative execution cache.

A :class:`ToolRegistry` maps a tool name to a Python callable (``fn(arguments: dict) -> Any``) or an HTTP
endpoint (the arguments are POSTed as JSON, the response body is the result), each declared
``side_effect_free`` or not (default: not). Every run validates the arguments against the tool's JSON schema
first (:func:`ooospec.runtime.schemas.value_matches`, patterns under a time budget) and never raises: an unknown
tool, invalid arguments, a timeout, an exception or an HTTP error becomes a :class:`ToolResult` with ``ok=False``
and a short JSON error as its content, which the model reads like any tool result::

    registry = ToolRegistry()
    registry.register("get_weather", lambda a: {"temp_c": 21}, parameters=schema, side_effect_free=True)
    registry.register("send_email", "http://127.0.0.1:9000/send", parameters=schema2, timeout_s=5)
    registry.run({"name": "get_weather", "arguments": {"city": "Paris"}}).content   # '{"temp_c": 21}'

:class:`SpeculativeTools` is the speculative execution cache: when an early guess of the
call is ready (the sidecar's joined call, usually long before the target's call is complete), :meth:`speculate`
starts it in the background -- only if the tool is side-effect free and the arguments validate -- and caches it
under the call's canonical key (:func:`ooospec.runtime.calls.call_key`: key order, JSON whitespace and number
forms do not matter, strings do). When the target's committed call is parsed, :meth:`resolve` returns the cached
result if the keys are equal (waiting for the rest of the run if it is still going), and runs the real call
otherwise. A tool that is not side-effect free never runs on a guess, so it runs exactly as often as the target
calls it. A speculative run that failed is not trusted: the real call runs. Each run is started for a ``source``
(who guessed it: the sidecar's wave, the conversation's earlier calls, ...), and a hit says which one it was
(:attr:`Resolution.source`, :attr:`SpeculationStats.hits_by_source`).

A timed-out callable cannot be stopped in Python: its thread runs on in the background (daemon) and its
result is discarded.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ooospec.runtime import schemas
from ooospec.runtime.calls import call_key

logger = logging.getLogger(__name__)

ErrorKind = Literal["unknown_tool", "invalid_arguments", "timeout", "exception", "http"]
MAX_HTTP_RESPONSE_BYTES = 1 << 20
GUESS, HISTORY = "guess", "history"   # speculation sources: a turn's early guess (the sidecar's call), an earlier call


@dataclass(frozen=True)
class ToolResult:
    """One run's outcome. ``content`` is what the tool message carries (JSON ``{"error": ...}`` on failure)."""

    name: str
    content: str
    ok: bool
    error: ErrorKind | None = None
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[[dict], Any]          # the implementation; an HTTP endpoint is wrapped into one
    parameters: Any = None             # JSON schema of the arguments object; None = any object
    side_effect_free: bool = False
    timeout_s: float = 30.0
    endpoint: str | None = None        # the URL, for an HTTP tool


@dataclass(frozen=True)
class ToolRun:
    """A started run: its future :class:`ToolResult`, when it started and how long it may take."""

    future: Future
    started_at: float
    timeout_s: float
    name: str = ""


def _error(name: str, kind: ErrorKind, message: str, elapsed_s: float = 0.0) -> ToolResult:
    content = json.dumps({"error": kind, "message": message[:500]}, ensure_ascii=False)
    return ToolResult(name, content, False, kind, elapsed_s)


def to_content(value: Any) -> str:
    """A tool's return value as message text: strings as they are, bytes as UTF-8, anything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return json.dumps(value, ensure_ascii=False, default=str)


def http_tool(url: str, timeout_s: float) -> Callable[[dict], str]:
    """A callable that POSTs the arguments as JSON to ``url`` and returns the response body (at most 1 MB).

    Raises ValueError for a URL that is not ``http(s)://host...``; the callable raises on a non-2xx answer.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"tool endpoint must be an http(s) URL, got {url!r}")

    def post(arguments: dict) -> str:
        body = json.dumps(arguments, ensure_ascii=False).encode()
        req = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:   # the scheme is checked above
            raw = resp.read(MAX_HTTP_RESPONSE_BYTES + 1)
        if len(raw) > MAX_HTTP_RESPONSE_BYTES:
            raise ValueError(f"response over {MAX_HTTP_RESPONSE_BYTES} bytes")
        return raw.decode("utf-8", errors="replace")

    return post


class ToolRegistry:
    """Tools by name (see the module docstring). ``clock`` times runs and timeouts (tests pass a fake one)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.tools: dict[str, Tool] = {}
        self.num_runs: dict[str, int] = {}     # name -> runs started (speculative ones included)
        self._lock = threading.Lock()

    def register(self, name: str, impl: Callable[[dict], Any] | str, *, parameters: Any = None,
                 side_effect_free: bool = False, timeout_s: float = 30.0) -> Tool:
        """Add a tool: ``impl`` is a callable taking the arguments dict, or an ``http(s)://`` endpoint URL.

        Args:
            parameters: the JSON schema its arguments must validate against (an OpenAI tool's ``parameters``).
            side_effect_free: True only if running it twice, or for a call the model never makes, is harmless
                (reads, searches); only such tools run on a guess.
            timeout_s: a run that takes longer gives a ``timeout`` error result.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"tool name must be a non-empty string, got {name!r}")
        if timeout_s <= 0:
            raise ValueError(f"tool {name!r}: timeout_s must be > 0, got {timeout_s}")
        if isinstance(impl, str):
            tool = Tool(name, http_tool(impl, timeout_s), parameters, side_effect_free, timeout_s, endpoint=impl)
        elif callable(impl):
            tool = Tool(name, impl, parameters, side_effect_free, timeout_s)
        else:
            raise TypeError(f"tool {name!r}: impl must be a callable or an http(s) URL, got {type(impl).__name__}")
        self.tools[name] = tool
        self.num_runs.setdefault(name, 0)
        return tool

    def check(self, call: Mapping[str, Any]) -> ToolResult | None:
        """The error result a run of ``call`` would give before running anything, or None when it may run."""
        name = call.get("name")
        if name not in self.tools:
            return _error(str(name), "unknown_tool", f"no tool {str(name)[:80]!r} (known: {sorted(self.tools)[:20]})")
        args = call.get("arguments")
        if not isinstance(args, dict):
            return _error(name, "invalid_arguments", f"arguments must be an object, got {type(args).__name__}")
        schema = self.tools[name].parameters
        if schema is not None and not schemas.value_matches(args, schema):
            return _error(name, "invalid_arguments", _why_invalid(args, schema))
        return None

    def start(self, call: Mapping[str, Any]) -> ToolRun:
        """Validate and start ``call`` in a background thread (a run that may not start is already finished
        with its error result). :meth:`finish` waits for it under the tool's timeout."""
        fut: Future = Future()
        bad = self.check(call)
        if bad is not None:
            fut.set_result(bad)
            return ToolRun(fut, self.clock(), 0.0)
        tool = self.tools[call["name"]]
        args = dict(call["arguments"])
        with self._lock:
            self.num_runs[tool.name] += 1

        clock = self.clock

        def work() -> None:
            t0 = clock()
            try:
                content = to_content(tool.fn(args))
                result = ToolResult(tool.name, content, True, None, clock() - t0)
            except urllib.error.URLError as e:
                result = _error(tool.name, "http", f"{tool.endpoint}: {e}", clock() - t0)
            except Exception as e:  # noqa: BLE001 - a failing tool is a result, never a crash
                result = _error(tool.name, "exception", f"{type(e).__name__}: {e}", clock() - t0)
            fut.set_result(result)

        run = ToolRun(fut, clock(), tool.timeout_s, tool.name)
        threading.Thread(target=work, name=f"tool-{tool.name}", daemon=True).start()
        return run

    def finish(self, run: ToolRun) -> ToolResult:
        """Wait for a started run up to its tool's timeout (counted from its start); a late run is a timeout."""
        if run.future.done():
            return run.future.result()
        left = run.timeout_s - (self.clock() - run.started_at)
        try:
            return run.future.result(timeout=max(left, 0.0))
        except FutureTimeout:
            return _error(run.name, "timeout", f"no result within {run.timeout_s:g} s", run.timeout_s)

    def run(self, call: Mapping[str, Any]) -> ToolResult:
        """Validate, run and wait for ``call``; never raises (see the module docstring)."""
        return self.finish(self.start(call))


def _why_invalid(args: dict, schema: Any) -> str:
    try:
        err = schemas.first_error(args, schema)
    except Exception as e:  # noqa: BLE001 - value_matches already said no; keep its verdict
        return f"arguments do not match the schema ({type(e).__name__})"
    if err is None:
        return "arguments do not match the schema"
    path = "/".join(str(p) for p in err.absolute_path) or "<root>"
    return f"arguments at {path}: {err.message[:300]}"


@dataclass
class SpeculationStats:
    guesses: int = 0             # speculate() calls
    started: int = 0             # speculative runs started
    refused_side_effects: int = 0    # guesses of tools that are not side-effect free (never run)
    refused_invalid: int = 0     # guesses that are unknown tools or fail validation (never run)
    hits: int = 0                # resolve() served from a speculative run
    misses: int = 0              # resolve() ran the real call
    failed_speculations: int = 0     # key matched but the speculative run failed: the real call ran
    saved_s: float = 0.0         # on hits: the tool time the caller did not wait (run time - time waited)
    hits_by_source: dict[str, int] = field(default_factory=dict)   # hits per speculate(source=...)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Resolution:
    result: ToolResult
    hit: bool
    wait_s: float                # how long resolve() waited for the result
    source: str | None = None    # a hit: the source its speculative run was started for


class SpeculativeTools:
    """The speculative execution cache over a :class:`ToolRegistry` (see the module docstring).

    Thread-safe: guesses usually arrive on another thread (the sidecar client's) than the target's calls.
    At most ``max_entries`` speculative runs are cached (oldest dropped); :meth:`clear` drops them all (e.g.
    at the start of an agent turn, when earlier guesses are stale).
    """

    def __init__(self, registry: ToolRegistry, max_entries: int = 64):
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.registry = registry
        self.max_entries = max_entries
        self._cache: OrderedDict[str, tuple[ToolRun, str]] = OrderedDict()    # key -> (run, its source)
        self._lock = threading.Lock()
        self.stats = SpeculationStats()

    def speculate(self, call: Mapping[str, Any], source: str = GUESS) -> bool:
        """Start ``call`` in the background if its tool is side-effect free and its arguments validate;
        ``source``: who guessed it (the first source to start a key keeps it).

        Returns True when a run for this call's key is now cached (started now or before).
        """
        with self._lock:
            self.stats.guesses += 1
            try:
                key = call_key(call)
            except TypeError:
                self.stats.refused_invalid += 1
                return False
            if key in self._cache:
                return True
            if self.registry.check(call) is not None:
                self.stats.refused_invalid += 1
                return False
            if not self.registry.tools[call["name"]].side_effect_free:
                self.stats.refused_side_effects += 1
                return False
            self._cache[key] = (self.registry.start(call), source)
            self.stats.started += 1
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
            return True

    def resolve(self, call: Mapping[str, Any]) -> Resolution:
        """The result for the target's committed ``call``: the speculative run's on a key match, else a real run."""
        clock = self.registry.clock
        t0 = clock()
        try:
            key = call_key(call)
        except TypeError:
            key = None
        with self._lock:
            cached = self._cache.get(key) if key is not None else None
        if cached is not None:
            run, source = cached
            result = self.registry.finish(run)
            if result.ok:
                wait = clock() - t0
                with self._lock:
                    self.stats.hits += 1
                    self.stats.hits_by_source[source] = self.stats.hits_by_source.get(source, 0) + 1
                    self.stats.saved_s += max(result.elapsed_s - wait, 0.0)
                return Resolution(result, True, wait, source)
            with self._lock:
                self.stats.failed_speculations += 1
        result = self.registry.run(call)
        with self._lock:
            self.stats.misses += 1
        return Resolution(result, False, clock() - t0)

    def clear(self) -> None:
        """Drop every cached speculative run (runs in flight finish in the background, unused)."""
        with self._lock:
            self._cache.clear()
