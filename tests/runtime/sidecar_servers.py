"""Local servers for the sidecar tests (loopback only, every one stopped by its context manager).

* :func:`running_app` serves an ASGI app (our sidecar app) with uvicorn in a thread.
* :class:`StandIn` is a stdlib HTTP server that speaks the completions protocol badly on purpose: slow,
  hanging, closing the connection, invalid JSON, wrong answers, megabytes of output.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HANG_S = 20.0      # a hanging stand-in answers nothing for this long (or until it is stopped)


@contextlib.contextmanager
def running_server(app, keep_alive_s: float = 5.0, grace_s: float = 3.0):
    """Serve ``app`` on 127.0.0.1 (a free port) in a thread, configured as ``ooospec serve`` runs it
    (:func:`~ooospec.runtime.serve.http.server_config`); yields ``(url, server, thread)``; stops it on exit."""
    import uvicorn

    from ooospec.runtime.serve.http import server_config

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = server_config(app, host="127.0.0.1", port=port, keep_alive_s=keep_alive_s, grace_s=grace_s)
    config.lifespan = "off"
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", server, thread
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@contextlib.contextmanager
def running_app(app, **config):
    """:func:`running_server`, yielding only the base url."""
    with running_server(app, **config) as (url, _, _):
        yield url


class StandIn:
    """A fake sidecar answering ``POST /v1/completions`` according to ``mode`` (see ``_Handler.answer``).

    ``answers``: the texts a good server returns (mode ``by_query``: :data:`ANSWERS_BY_QUERY` by each prompt's
    query line, with :data:`SERVER_STATS`). ``received`` records
    ``(time.perf_counter(), request JSON)`` per request. With a ``gate``, every answer waits until the test sets
    it (or the server stops), so a test knows the client cannot have had an answer before that. ``GET /health``
    answers ``health`` (default ``{"status": "ok"}``, no layout: like vLLM) and is counted in ``health_gets``.

    Two-stage (function-first) waves: ``later_mode`` answers the second and later requests instead of ``mode``;
    with ``hold`` they wait until the test sets it (or the server stops). A request asking ``logprobs`` gets
    ``top_logprobs`` (whatever it is, malformed included) as its first choice's first token's top logprobs (none
    when None), or, with ``refuse_logprobs``, HTTP 400 naming them (as our server did before it had them).
    """

    def __init__(self, mode: str, answers: list[str] | None = None, gate: threading.Event | None = None, *,
                 later_mode: str | None = None, hold: threading.Event | None = None, top_logprobs=None,
                 refuse_logprobs: bool = False):
        self.mode, self.answers, self.gate = mode, answers or [], gate
        self.later_mode, self.hold = later_mode, hold
        self.top_logprobs, self.refuse_logprobs = top_logprobs, refuse_logprobs
        self.received: list[tuple[float, dict]] = []
        self.health: dict = {"status": "ok"}
        self.health_gets = 0
        self.stop_event = threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.standin = self
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def queries(self) -> list[list[str]]:
        """The query lines of every request received, in order."""
        return [[query_line(p) for p in req["prompt"]] for _, req in self.received]

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        for event in (self.gate, self.hold):
            if event is not None:
                event.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


def completion(texts: list[str], server_stats: dict | None = None) -> dict:
    out = {"id": "cmpl-x", "object": "text_completion", "created": 0, "model": "sidecar",
           "choices": [{"index": i, "text": t, "finish_reason": "stop"} for i, t in enumerate(texts)],
           "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}
    if server_stats is not None:
        out["ooospec"] = server_stats
    return out


# A request with two tools, and what a good sidecar answers to each slot query of its wave (by the query's line)
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"},
                                         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string"}}}}},
]
MESSAGES = [{"role": "user", "content": "Weather in Paris, in celsius?"}]
ANSWERS_BY_QUERY = {"Query: tool index": "0", "Query: get_weather.city": '"Paris"',
                    "Query: get_weather.unit": '"celsius"', "Query: get_time.tz": "null"}
SERVER_STATS = {"prefill_s": 0.01, "decode_s": 0.01, "n_forwards": 2, "block_tokens": 100, "query_tokens": 10}


def query_line(prompt: str) -> str:
    """The last line of a wave prompt: its slot query (``Query: get_weather.city``)."""
    return prompt.rstrip("\n").rsplit("\n", 1)[-1]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        st: StandIn = self.server.standin
        st.health_gets += 1
        self._send(200, json.dumps(st.health).encode())

    def do_POST(self) -> None:
        st: StandIn = self.server.standin
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        st.received.append((time.perf_counter(), req))
        later = len(st.received) > 1
        if st.gate is not None:
            st.gate.wait()
        if later and st.hold is not None:
            st.hold.wait()
        if st.refuse_logprobs and req.get("logprobs"):
            self._send(400, b'{"error": {"message": "stream, echo, logprobs are not supported"}}')
            return
        self.answer(st, req, st.later_mode if later and st.later_mode else st.mode)

    def _send(self, status: int, body: bytes, length: bool = True) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if length:
            self.send_header("Content-Length", str(len(body)))
        else:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def answer(self, st: StandIn, req: dict, mode: str) -> None:
        n = len(req["prompt"])
        good = json.dumps(completion(st.answers)).encode()
        if mode == "good":
            self._send(200, good)
        elif mode == "by_query":                       # each prompt answered by its query line
            texts = [ANSWERS_BY_QUERY.get(query_line(p), "null") for p in req["prompt"]]
            out = completion(texts, SERVER_STATS)
            if req.get("logprobs") and st.top_logprobs is not None:
                out["choices"][0]["logprobs"] = {"tokens": [texts[0][:1]], "top_logprobs": [st.top_logprobs]}
            self._send(200, json.dumps(out).encode())
        elif mode == "slow":
            st.stop_event.wait(1.0)
            self._send(200, good)
        elif mode == "hanging":
            st.stop_event.wait(HANG_S)
        elif mode == "close":
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
        elif mode == "invalid_json":
            self._send(200, b'{"choices": [{"index": 0, "text": "0"')
        elif mode == "wrong_count":
            self._send(200, json.dumps(completion(st.answers[:-1])).encode())
        elif mode == "http_500":
            self._send(500, b'{"error": {"message": "boom"}}')
        elif mode == "megabytes":                      # announced by Content-Length
            self._send(200, json.dumps(completion(["x" * (3 << 20)] * n)).encode())
        elif mode == "megabytes_unannounced":          # no Content-Length: read until close
            self._send(200, json.dumps(completion(["x" * (3 << 20)] * n)).encode(), length=False)
            self.close_connection = True
        elif mode == "trickle":                        # one byte at a time, never finishing in time
            self.send_response(200)
            self.send_header("Content-Length", str(len(good)))
            self.end_headers()
            for b in good:
                if st.stop_event.wait(0.2):
                    return
                self.wfile.write(bytes([b]))
                self.wfile.flush()
        else:
            raise ValueError(mode)
