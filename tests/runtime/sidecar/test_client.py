"""The sidecar client against local stand-in servers: the wave goes out after arrival, as one request; every
fault (down, slow, hanging, closing, invalid JSON, wrong function, unknown tool, wrong types, megabytes) costs
only the hints: the engine's output equals AR and generate() never waits. Plus the server-process launcher."""

from __future__ import annotations

import math
import sys
import threading
import time

import pytest

from ooospec.runtime.decoding import build_engine, make_engine
from ooospec.runtime.drafters.hints import HintDrafter, render_views, tokenize_views
from ooospec.runtime.drafters.pld import PromptLookupDrafter
from ooospec.runtime.formats import hermes
from ooospec.runtime.sidecar import prompts as sp
from ooospec.runtime.sidecar import protocol as sw
from ooospec.runtime.sidecar.client import SidecarClient, parse_response
from ooospec.runtime.sidecar.gate_decision import WaveDecision, query_name
from ooospec.runtime.sidecar.process import free_port, start_server
from tests.pipelines.sidecar_tiny import byte_tokenizer
from tests.runtime.conftest import tiny_model
from tests.runtime.sidecar_servers import HANG_S, MESSAGES, TOOLS, StandIn

GOOD = ["0", '"Paris"', '"celsius"', "null"]          # index, get_weather.city, get_weather.unit, get_time.tz
N_NEW = 24


@pytest.fixture(scope="module")
def target():
    """``(model, tokenizer, prompt ids, AR output)``: a tiny float64 target with a byte tokenizer."""
    model, tok = tiny_model("llama"), byte_tokenizer()
    prompt = tok("user: Weather in Paris, in celsius?\nassistant: ", add_special_tokens=False)["input_ids"]
    return model, tok, prompt, build_engine("ar", model).generate(prompt, N_NEW).tokens


def run_target(target, req):
    """Decode with [hints(req), PLD] while the wave is in flight; returns (tokens, drafter)."""
    model, _, prompt, _ = target
    drafter = HintDrafter(req)
    result = make_engine(model, [drafter, PromptLookupDrafter()]).generate(prompt, N_NEW)
    return result.tokens, drafter


def test_wave_is_one_request_sent_after_arrival(target):
    _, tok, _, _ = target
    with StandIn("good", GOOD) as server:
        client = SidecarClient(server.url, max_tokens=32)
        assert server.received == []                   # building a client sends nothing
        arrival = time.perf_counter()
        req = client.submit(MESSAGES, TOOLS, fmt=hermes, tokenizer=tok, arrival=arrival)
        bank = req.wait(10)
    st = req.stats()
    assert bank is not None and st.error is None, st.error_detail
    assert len(server.received) == 1                   # ONE request for the whole wave
    received_t, body = server.received[0]
    assert arrival == st.arrival_t <= st.submit_t <= st.sent_t <= received_t <= st.response_t <= st.ready_t
    assert body == {"model": "sidecar", "prompt": sp.build_wave(MESSAGES, TOOLS).prompts(), "max_tokens": 32,
                    "temperature": 0, "add_special_tokens": False}
    call = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
    assert st.call == call and st.n_queries == 4
    assert bank.views == {k: tuple(v) for k, v in tokenize_views(render_views(call, hermes), tok).items()}
    assert st.payload_bytes == sum(len(a) for a in GOOD) and st.response_bytes > st.payload_bytes
    assert st.request_bytes > 0 and st.build_s > 0 and st.wave_s > 0 and st.ready_s > 0
    assert st.to_dict()["ready_s"] == st.ready_s


def test_submit_returns_at_once_and_poll_never_blocks(target):
    _, tok, _, _ = target
    gate = threading.Event()
    with StandIn("good", GOOD, gate=gate) as server:   # answers only once the gate opens
        req = SidecarClient(server.url).submit(MESSAGES, TOOLS, fmt=hermes, tokenizer=tok)
        assert req.poll() is None and not req.done     # submit did not wait for the answer
        req.cancel()
        assert req.wait(5) is None and req.done
    assert req.stats().error == "cancelled"


FAULTS = [
    # (stand-in mode, answers, client keywords, expected error kind, expected call)
    ("good", GOOD, {}, None, {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}),
    ("slow", GOOD, {}, None, {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}),
    ("good", ["1", '"Paris"', '"celsius"', '"Europe/Paris"'], {}, None,                     # a wrong function
     {"name": "get_time", "arguments": {"tz": "Europe/Paris"}}),
    ("good", ["7", '"Paris"', "null", "null"], {}, "no_call", None),                       # an unknown tool
    ("good", ["0", "42", '"kelvin"', "null"], {}, None, {"name": "get_weather", "arguments": {}}),  # wrong types
    ("hanging", GOOD, {"timeout": 0.5}, "timeout", None),
    ("trickle", GOOD, {"timeout": 0.5}, "timeout", None),
    ("close", GOOD, {}, "closed", None),
    ("invalid_json", GOOD, {}, "bad_json", None),
    ("wrong_count", GOOD, {}, "bad_response", None),
    ("http_500", GOOD, {}, "http_status", None),
    ("megabytes", GOOD, {}, "too_large", None),
    ("megabytes_unannounced", GOOD, {}, "too_large", None),
]


@pytest.mark.parametrize("mode, answers, kw, error, call", FAULTS,
                         ids=["good", "slow", "wrong_function", "unknown_tool", "wrong_types", "hanging", "trickle",
                              "close", "invalid_json", "wrong_count", "http_500", "megabytes", "megabytes_nolength"])
def test_faults_cost_only_the_hints(target, mode, answers, kw, error, call):
    _, tok, _, ar = target
    gate = threading.Event()                           # the stand-in answers only after the target has finished
    with StandIn(mode, answers, gate=gate) as server:
        req = SidecarClient(server.url, **kw).submit(MESSAGES, TOOLS, fmt=hermes, tokenizer=tok)
        tokens, drafter = run_target(target, req)
        assert tokens == ar
        assert drafter.stats().ready_step is None and drafter.stats().num_polls >= 1
        if error != "timeout":                         # the client's own deadline is the only early end of a wave:
            assert not req.done                        # the target finished without waiting for the sidecar
        gate.set()
        req.wait(60)
        req.cancel()
    st = req.stats()
    assert req.done and st.error == error, st.error_detail
    assert st.call == call
    assert (req.poll() is not None) == (error is None)
    if error is None:                                  # the same bank, ready from the first step: still AR
        tokens, drafter = run_target(target, req)
        assert tokens == ar and drafter.stats().ready_step == 0 and drafter.stats().num_views > 0


def test_sidecar_down(target):
    _, tok, _, ar = target
    req = SidecarClient(f"http://127.0.0.1:{free_port()}").submit(MESSAGES, TOOLS, fmt=hermes, tokenizer=tok)
    tokens, _ = run_target(target, req)
    assert tokens == ar
    assert req.wait(10) is None and req.stats().error == "connect"


def test_the_engine_finishes_long_before_a_hanging_sidecar(target):
    _, tok, _, ar = target
    with StandIn("hanging", GOOD) as server:
        req = SidecarClient(server.url, timeout=HANG_S * 2).submit(MESSAGES, TOOLS, fmt=hermes, tokenizer=tok)
        tokens, drafter = run_target(target, req)
        assert tokens == ar and not req.done           # finished while the stand-in still hangs (for HANG_S)
        assert drafter.stats().ready_step is None
        req.cancel()
        assert req.wait(5) is None
    assert req.stats().error == "cancelled"


def test_parse_response_checks_the_shape():
    assert parse_response(b'{"choices": [{"index": 1, "text": "b"}, {"index": 0, "text": "a"}]}', 2) == (
        ["a", "b"], {})
    for bad in [b'[]', b'{"choices": {}}', b'{"choices": [{"index": 0, "text": 1}]}',
                b'{"choices": [{"index": 0, "text": "a"}, {"index": 0, "text": "b"}]}',
                b'{"choices": [{"index": true, "text": "a"}]}']:
        with pytest.raises(Exception, match="choice|expected"):
            parse_response(bad, 2 if b"}, {" in bad else 1)
    with pytest.raises(Exception, match="Expecting|JSON"):
        parse_response(b"{", 1)


def test_client_rejects_bad_urls():
    with pytest.raises(ValueError, match="http://host:port"):
        SidecarClient("ftp://127.0.0.1:1")
    with pytest.raises(ValueError, match="positive"):
        SidecarClient("http://127.0.0.1:1", timeout=0)


# ------------------------------------------------------------------------------------------ the launcher

HEALTH_SERVER = """
import sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
time.sleep(float(sys.argv[2]))
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"status": "ok"}'
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_start_server_waits_for_health_and_stops(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with start_server([sys.executable, "-c", HEALTH_SERVER, str(port), "0.3"], url, startup_timeout=30,
                      log_path=tmp_path / "log") as proc:
        assert proc.popen.poll() is None and proc.url == url
    assert proc.popen.poll() is not None               # stopped on exit


def test_start_server_reports_an_early_exit_and_a_timeout(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RuntimeError, match="(?s)code 3.*no adapter here"):
        start_server([sys.executable, "-c", "import sys; print('no adapter here'); sys.exit(3)"], url,
                     log_path=tmp_path / "a.log")
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError, match="/health"):
        start_server([sys.executable, "-c", "import time; time.sleep(60)"], url, startup_timeout=0.5,
                     log_path=tmp_path / "b.log")
    assert time.perf_counter() - t0 < 15


# ------------------------------------------------------------------------------------------ function-first waves

NEWS = {"type": "function", "function": {"name": "get_news", "parameters": {
    "type": "object", "properties": {"topic": {"type": "string"}}}}}
PING = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}
TOOLS3 = [*TOOLS, NEWS]
WEATHER_CALL = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
# the index answer's first token: "0" greedy, " 2" (p 0.2) a candidate, "1" (p 0.02) too unlikely, "7" out of range
TOP = {"0": math.log(0.7), " 2": math.log(0.2), "1": math.log(0.02), "7": math.log(0.05), "x": math.log(0.03)}


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_function_first_publishes_the_names_then_the_candidates_calls():
    tok, hold = byte_tokenizer(), threading.Event()
    with StandIn("by_query", hold=hold, top_logprobs=TOP) as server:       # stage 2 waits for the test
        client = SidecarClient(server.url, max_tokens=32, wave="function-first", top_k=3, min_prob=0.1)
        req = client.submit(MESSAGES, TOOLS3, fmt=hermes, tokenizer=tok)
        wait_for(lambda: req.poll() is not None and len(server.received) == 2)
        early, st = req.poll(), req.stats()
        assert early.calls == [{"name": "get_weather", "arguments": {}}, {"name": "get_news", "arguments": {}}]
        assert not req.done and st.ready_t is None and st.early_t is not None and st.call is None
        assert st.functions == ["get_weather", "get_news"] and st.index_s > 0
        hold.set()
        bank = req.wait(10)
    assert st.error is None, st.error_detail
    (t1, stage1), (t2, stage2) = server.received
    block = sp.shared_block(MESSAGES, TOOLS3, layout=sp.LAYOUT_VERSION)
    assert stage1 == {"model": "sidecar", "prompt": [block + "Query: tool index\n"], "max_tokens": 1,
                      "temperature": 0, "add_special_tokens": False, "logprobs": 5}
    assert stage2 == {"model": "sidecar", "max_tokens": 32, "temperature": 0, "add_special_tokens": False,
                      "prompt": sw.argument_wave(MESSAGES, TOOLS3, ["get_weather", "get_news"]).prompts()}
    assert server.queries[1] == ["Query: get_weather.city", "Query: get_weather.unit", "Query: get_news.topic"]
    assert bank.calls == [WEATHER_CALL, {"name": "get_news", "arguments": {}}]     # topic answered null
    assert st.call == WEATHER_CALL and st.n_queries == 4
    assert st.sent_t <= t1 <= t2 <= st.response_t and st.early_t <= st.ready_t
    assert st.wave_s > st.index_s > 0
    assert st.server["n_forwards"] == 4 and st.server["prefill_s"] == pytest.approx(0.02)   # both stages'


@pytest.mark.parametrize("top, top_k, asks_logprobs", [
    (None, 2, True),                  # the server gave no logprobs
    ("garbage", 2, True),             # or a malformed object
    ([{"2": -0.1}], 2, True),
    ({"2": -0.01}, 1, False),         # top_k 1: none asked
])
def test_function_first_falls_back_to_the_greedy_function(top, top_k, asks_logprobs):
    with StandIn("by_query", top_logprobs=top) as server:
        req = SidecarClient(server.url, wave="function-first", top_k=top_k).submit(MESSAGES, TOOLS3, fmt=hermes,
                                                                                   tokenizer=byte_tokenizer())
        bank = req.wait(10)
    st = req.stats()
    assert st.error is None and st.functions == ["get_weather"], st.error_detail
    assert ("logprobs" in server.received[0][1]) == asks_logprobs
    assert server.queries[1] == ["Query: get_weather.city", "Query: get_weather.unit"]
    assert bank.calls == [WEATHER_CALL] and st.call == WEATHER_CALL


def test_function_first_stage_two_failure_keeps_the_early_bank():
    with StandIn("by_query", later_mode="http_500") as server:
        req = SidecarClient(server.url, wave="function-first").submit(MESSAGES, TOOLS, fmt=hermes,
                                                                      tokenizer=byte_tokenizer())
        bank = req.wait(10)
    st = req.stats()
    assert len(server.received) == 2 and st.error == "http_status" and "500" in st.error_detail
    assert bank is req.poll() and bank.calls == [{"name": "get_weather", "arguments": {}}]
    assert st.call is None and st.ready_t is None and st.early_t is not None


def test_function_first_cancel_between_the_stages_keeps_the_early_bank():
    hold = threading.Event()
    with StandIn("by_query", hold=hold) as server:
        req = SidecarClient(server.url, wave="function-first").submit(MESSAGES, TOOLS, fmt=hermes,
                                                                      tokenizer=byte_tokenizer())
        wait_for(lambda: len(server.received) == 2)
        req.cancel()
        assert req.wait(5) is not None and req.done
    assert req.stats().error == "cancelled" and req.poll().calls == [{"name": "get_weather", "arguments": {}}]


def test_function_first_tool_without_parameters_needs_one_request():
    with StandIn("by_query") as server:                # index "0": ping, whose {} call is complete
        req = SidecarClient(server.url, wave="function-first").submit(MESSAGES, [PING, *TOOLS], fmt=hermes,
                                                                      tokenizer=byte_tokenizer())
        bank = req.wait(10)
    st = req.stats()
    assert len(server.received) == 1 and st.error is None
    assert bank.calls == [{"name": "ping", "arguments": {}}] and st.call == {"name": "ping", "arguments": {}}
    assert st.ready_t == st.early_t is not None and st.n_queries == 1


def test_function_first_over_one_tool_asks_no_index():
    """One tool: nothing to choose, so no stage 1 (its round trip and forward bought only the name): one request,
    the arguments; the early bank (the name) is out before it is sent. A tool without parameters needs none."""
    weather = TOOLS[0]
    with StandIn("by_query") as server:
        req = SidecarClient(server.url, wave="function-first").submit(MESSAGES, [weather], fmt=hermes,
                                                                      tokenizer=byte_tokenizer())
        bank = req.wait(10)
    st = req.stats()
    assert st.error is None, st.error_detail
    assert [q for qs in server.queries for q in qs] == ["Query: get_weather.city", "Query: get_weather.unit"]
    assert len(server.received) == 1 and st.n_queries == 2 and st.index_s is None
    assert bank.calls == [WEATHER_CALL] and st.functions == ["get_weather"]
    assert st.early_t <= st.sent_t <= st.response_t <= st.ready_t and st.wave_s > 0
    with StandIn("by_query") as server:
        req = SidecarClient(server.url, wave="function-first").submit(MESSAGES, [PING], fmt=hermes,
                                                                      tokenizer=byte_tokenizer())
        assert req.wait(10).calls == [{"name": "ping", "arguments": {}}]
    assert server.received == [] and req.stats().error is None


def test_function_first_asks_a_server_that_refuses_logprobs_without_them():
    with StandIn("by_query", refuse_logprobs=True) as server:
        client = SidecarClient(server.url, wave="function-first")
        first = client.submit(MESSAGES, TOOLS, fmt=hermes, tokenizer=byte_tokenizer())
        first.wait(10)
        second = client.submit(MESSAGES, TOOLS, fmt=hermes, tokenizer=byte_tokenizer())
        second.wait(10)
    assert [("logprobs" in body) for _, body in server.received] == [True, False, False, False, False]
    assert client.logprobs_refused and first.stats().call == second.stats().call == WEATHER_CALL


class FixedGate:
    """A wave gate that always decides ``kind``; ``slots`` keeps the index and get_weather.city only."""

    server_prefix_cache = False

    def __init__(self, kind: str):
        self.kind = kind

    def decide(self, wave, tools):
        kept = wave.queries[:1] if self.kind == "index" else wave.queries[:2]
        return WaveDecision(self.kind, 0.0, 0.0, tuple(query_name(q) for q in kept), (), {}, "key",
                            wave=sp.Wave(wave.block, kept))


@pytest.mark.parametrize("kind, stage2, call", [
    ("index", None, {"name": "get_weather", "arguments": {}}),
    ("slots", ["Query: get_weather.city"], {"name": "get_weather", "arguments": {"city": "Paris"}}),
])
def test_function_first_keeps_the_gates_decision(kind, stage2, call):
    with StandIn("by_query", top_logprobs={"1": math.log(0.4)}) as server:
        client = SidecarClient(server.url, wave="function-first", gate=FixedGate(kind))
        req = client.submit(MESSAGES, TOOLS, fmt=hermes, tokenizer=byte_tokenizer())
        bank = req.wait(10)
    st = req.stats()
    assert st.error is None and st.decision["decision"] == kind, st.error_detail
    assert server.queries[1:] == ([] if stage2 is None else [stage2])       # get_time.tz was not kept
    assert st.functions == ["get_weather", "get_time"] and st.call == call and bank.calls[0] == call


def test_client_rejects_bad_wave_options():
    for kw in ({"wave": "some"}, {"top_k": 0}, {"min_prob": -0.1}):
        with pytest.raises(ValueError, match="wave|top_k|min_prob"):
            SidecarClient("http://127.0.0.1:1", **kw)
