"""The tool registry (validation first, errors as results) and the speculative execution cache."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ooospec.runtime.agent.tools import SpeculativeTools, ToolRegistry

CITY = {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Z][a-z]+$"},
                                         "days": {"type": "integer"}}, "required": ["city"]}


class Counter:
    """A tool implementation that counts its runs."""

    def __init__(self, result=None, error: Exception | None = None):
        self.calls: list[dict] = []
        self.result, self.error = result, error
        self.lock = threading.Lock()

    def __call__(self, args: dict):
        with self.lock:
            self.calls.append(args)
        if self.error is not None:
            raise self.error
        return self.result if self.result is not None else {"n": len(self.calls)}


class FakeClock:
    """A clock that moves only when it is advanced (by the test, or by a tool standing for its run time)."""

    def __init__(self, now: float = 10.0):
        self.now = now
        self.lock = threading.Lock()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds


class TimedTool(Counter):
    """A tool whose run takes ``run_s`` on a :class:`FakeClock`; ``ran`` is set when its latest run is over."""

    def __init__(self, clock: FakeClock, run_s: float):
        super().__init__()
        self.clock, self.run_s = clock, run_s
        self.ran = threading.Event()

    def __call__(self, args: dict):
        out = super().__call__(args)
        self.clock.advance(self.run_s)
        self.ran.set()
        return out


def test_arguments_are_validated_before_any_run():
    impl = Counter()
    reg = ToolRegistry()
    reg.register("weather", impl, parameters=CITY)
    for args, where in [({"city": "paris"}, "city"), ({}, "<root>"), ({"city": "Paris", "days": "2"}, "days")]:
        res = reg.run({"name": "weather", "arguments": args})
        assert not res.ok and res.error == "invalid_arguments" and where in json.loads(res.content)["message"]
    assert reg.run({"name": "nope", "arguments": {}}).error == "unknown_tool"
    assert reg.run({"name": "weather", "arguments": "x"}).error == "invalid_arguments"
    assert impl.calls == []
    ok = reg.run({"name": "weather", "arguments": {"city": "Paris", "days": 2}})
    assert ok.ok and ok.content == '{"n": 1}' and reg.num_runs["weather"] == 1


def test_exceptions_and_timeouts_become_error_results():
    release = threading.Event()
    reg = ToolRegistry()
    reg.register("boom", Counter(error=RuntimeError("disk on fire")))
    reg.register("stuck", lambda a: release.wait(60), timeout_s=0.1)   # runs until the test releases it
    reg.register("text", lambda a: "plain text")
    boom = reg.run({"name": "boom", "arguments": {}})
    assert (boom.ok, boom.error) == (False, "exception") and "disk on fire" in boom.content
    try:
        t0 = time.perf_counter()
        stuck = reg.run({"name": "stuck", "arguments": {}})
        waited = time.perf_counter() - t0
    finally:
        release.set()
    assert (stuck.ok, stuck.error, stuck.elapsed_s) == (False, "timeout", 0.1)
    assert waited < 30                   # gave up after its 0.1 s; the run itself would have taken 60 s
    assert reg.run({"name": "text", "arguments": {}}).content == "plain text"
    with pytest.raises(ValueError, match="http"):
        reg.register("bad", "ftp://example.com/x")
    with pytest.raises(TypeError, match="callable"):
        reg.register("bad", 42)


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        args = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        status = 500 if args.get("fail") else 200
        body = json.dumps({"echo": args}).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_http_tools_post_the_arguments():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        reg = ToolRegistry()
        reg.register("echo", f"http://127.0.0.1:{httpd.server_address[1]}/run", timeout_s=5)
        assert json.loads(reg.run({"name": "echo", "arguments": {"q": "é"}}).content) == {"echo": {"q": "é"}}
        failed = reg.run({"name": "echo", "arguments": {"fail": True}})
        assert not failed.ok and failed.error == "http" and "500" in failed.content
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)
    reg.register("down", f"http://127.0.0.1:{httpd.server_address[1]}/run", timeout_s=2)
    assert reg.run({"name": "down", "arguments": {}}).error == "http"


def test_the_timeout_counts_from_the_runs_start():
    clock, release = FakeClock(), threading.Event()
    reg = ToolRegistry(clock=clock)
    reg.register("stuck", lambda a: release.wait(60), timeout_s=30.0)
    run = reg.start({"name": "stuck", "arguments": {}})
    clock.advance(30.0)                  # the caller was busy for the whole timeout: nothing is left to wait
    try:
        t0 = time.perf_counter()
        res = reg.finish(run)
        waited = time.perf_counter() - t0
    finally:
        release.set()
    assert (res.error, res.elapsed_s) == ("timeout", 30.0)
    assert waited < 15                   # not another 30 s from the call to finish()


def test_a_hit_serves_the_speculative_run_under_the_canonical_key():
    clock = FakeClock()
    impl = TimedTool(clock, run_s=0.5)
    reg = ToolRegistry(clock=clock)
    reg.register("weather", impl, parameters=CITY, side_effect_free=True)
    spec = SpeculativeTools(reg)
    assert spec.speculate({"name": "weather", "arguments": {"days": 2.0, "city": "Paris"}})
    assert impl.ran.wait(30)             # the guess's run is over before the target's call is complete
    res = spec.resolve({"name": "weather", "arguments": {"city": "Paris", "days": 2}})   # other order, int
    assert res.hit and res.result.content == '{"n": 1}' and len(impl.calls) == 1
    assert (res.result.elapsed_s, res.wait_s) == (0.5, 0.0)      # the whole run was hidden
    miss = spec.resolve({"name": "weather", "arguments": {"city": "Rome"}})
    assert not miss.hit and (miss.result.elapsed_s, miss.wait_s) == (0.5, 0.5) and len(impl.calls) == 2
    assert spec.stats.hits == 1 and spec.stats.misses == 1 and spec.stats.saved_s == 0.5
    assert not spec.speculate({"name": "weather", "arguments": {"city": "rome"}})    # invalid: never runs
    assert spec.stats.refused_invalid == 1 and len(impl.calls) == 2


def test_a_hit_names_the_source_that_started_its_run():
    """Each run keeps the source it was started for (the first one: a later guess of the same key changes
    nothing); hits are counted per source, a miss has none."""
    reg = ToolRegistry()
    reg.register("weather", Counter(), parameters=CITY, side_effect_free=True)
    spec = SpeculativeTools(reg)
    paris, rome = ({"name": "weather", "arguments": {"city": c}} for c in ("Paris", "Rome"))
    assert spec.speculate(paris, source="history") and spec.speculate(paris) and spec.speculate(rome)
    assert spec.stats.started == 2
    assert spec.resolve(paris).source == "history" and spec.resolve(rome).source == "guess"
    assert spec.resolve({"name": "weather", "arguments": {"city": "Oslo"}}).source is None
    assert spec.stats.hits_by_source == {"history": 1, "guess": 1} and spec.stats.to_dict()["hits_by_source"]


def test_a_failed_speculation_is_not_trusted():
    impl = Counter(error=ValueError("flaky"))
    reg = ToolRegistry()
    reg.register("f", impl, side_effect_free=True)
    spec = SpeculativeTools(reg)
    spec.speculate({"name": "f", "arguments": {}})
    res = spec.resolve({"name": "f", "arguments": {}})
    assert not res.hit and spec.stats.failed_speculations == 1 and len(impl.calls) == 2


def test_a_stateful_tool_runs_exactly_as_often_as_the_target_calls_it():
    counter = Counter()
    reg = ToolRegistry()
    reg.register("increment", counter, parameters={"type": "object", "properties": {"by": {"type": "integer"}}})
    spec = SpeculativeTools(reg)
    target_calls = [{"by": 1}, {"by": 2}, {"by": 1}]
    for args in target_calls:
        assert not spec.speculate({"name": "increment", "arguments": args})   # the guess is right, still no run
        assert spec.resolve({"name": "increment", "arguments": args}).result.ok
    assert counter.calls == target_calls
    assert spec.stats.refused_side_effects == 3 and spec.stats.started == 0 and spec.stats.hits == 0
