"""The sidecar client against local stand-in servers: the wave goes out after arrival, as one request; every
fault (down, slow, hanging, closing, invalid JSON, wrong function, unknown tool, wrong types, megabytes) costs
only the hints: the engine's output equals AR and generate() never waits. Plus the server-process launcher."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from ooospec.runtime import sidecar_prompts as sp
from ooospec.runtime.formats import hermes
from ooospec.runtime.hints import HintDrafter, render_views, tokenize_views
from ooospec.runtime.methods import REGISTRY, make_engine
from ooospec.runtime.pld import PromptLookupDrafter
from ooospec.runtime.sidecar_client import SidecarClient, parse_response
from ooospec.runtime.sidecar_process import free_port, start_server
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
    return model, tok, prompt, REGISTRY["ar"](model).generate(prompt, N_NEW).tokens


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
