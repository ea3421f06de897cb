"""Hostile input to the two HTTP servers: every row of the probe as a regression test.

Tiny models built in code; every test is bounded in time (a slow forward hook stands in for a big model).
Rows: 1 lone surrogate, 2 giant lists validated in bounded time, 3 the wave's work bounded, 4 a non-streamed chat
turn stops when its client leaves, 9 NaN, 10 half-sent / slow / idle connections; and shutdown within seconds.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.parse

import httpx
import pytest
import torch
from pydantic import BaseModel
from transformers import Qwen2Config, Qwen2ForCausalLM

from ooospec.runtime.agent.chat import ChatModel
from ooospec.runtime.serve import chat_app, sidecar_app
from ooospec.runtime.serve.admission import parse_body
from ooospec.runtime.serve.http import RequestError
from ooospec.runtime.sidecar import prompts as sp
from ooospec.runtime.sidecar.wave import Sidecar
from tests.pipelines.sidecar_tiny import byte_tokenizer
from tests.runtime.conftest import tiny_model
from tests.runtime.sidecar_servers import running_server
from tests.runtime.toy_bpe import HERMES_TEMPLATE, with_template

USER = [{"role": "user", "content": "What is the weather in Paris?"}]


class Body(BaseModel):
    prompt: str | list[str]
    temperature: float | None = None


def refused(body: bytes, status: int = 400, **max_items) -> str:
    with pytest.raises(RequestError) as info:
        parse_body(body, Body, max_items)
    assert info.value.status == status
    return info.value.message


def assert_openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status, err
    return err


# ------------------------------------------------------------------------------------------ parse_body


def test_parse_body_rejects_what_is_not_finite_json_text():
    assert "surrogate" in refused(b'{"prompt": "\\ud800"}')                       # row 1: legal JSON, not text
    assert "surrogate" in refused(b'{"prompt": ["ok", "a\\udfffb"]}')
    assert parse_body(b'{"prompt": "\\ud83d\\ude00"}', Body, {}).prompt == "\U0001F600"   # a pair is fine
    for number in (b"NaN", b"Infinity", b"-Infinity", b"1e999"):                      # row 9
        refused(b'{"prompt": "x", "temperature": %s}' % number)
    assert "not UTF-8" in refused(b'{"prompt": "\xed\xa0\x80"}')                     # a surrogate in raw bytes
    assert "JSON object" in refused(b"[1, 2]")
    assert "not valid JSON" in refused(b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")


def test_a_giant_list_is_refused_before_pydantic_sees_it(monkeypatch):
    body = json.dumps({"prompt": [0] * 2_000_000}).encode()                  # row 2: 6 MB of wrong-typed items
    validated = []
    real = Body.model_validate.__func__

    def counting(cls, obj, *a, **kw):
        validated.append(len(obj.get("prompt", ())))
        return real(cls, obj, *a, **kw)

    monkeypatch.setattr(Body, "model_validate", classmethod(counting))
    assert "2000000 items, over the limit of 1024" in refused(body, prompt=1024)
    assert validated == []                                                   # refused before pydantic saw it
    assert "invalid request: prompt" in refused(json.dumps({"prompt": [0] * 1024}).encode(), prompt=1024)
    assert validated == [1024]                                               # within the limit: pydantic judges


# ------------------------------------------------------------------------------------------ servers


def slow_forwards(model, seconds: float) -> tuple[list, object]:
    """Count the model's forwards and make each take ``seconds``; returns ``(forwards, hook)``."""
    forwards: list[int] = []

    def hook(module, args, kwargs):
        forwards.append(1)
        time.sleep(seconds)

    return forwards, model.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.fixture(scope="module")
def random_chat() -> ChatModel:
    """A random tiny Qwen2 behind the hermes template: it rambles on until ``max_tokens``."""
    tok = with_template(HERMES_TEMPLATE)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, head_dim=8, attn_implementation="sdpa",
                      max_position_embeddings=4096)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = None
    return ChatModel(model, tok, method="ar")


@pytest.fixture(scope="module")
def sidecar() -> Sidecar:
    return Sidecar(tiny_model("llama"), byte_tokenizer(), metadata={"layout_version": sp.LAYOUT_VERSION})


SIDECAR_LIMITS = sidecar_app.Limits(max_tokens=200, body_timeout_s=0.5)
CHAT_LIMITS = chat_app.Limits(max_tokens=1000, body_timeout_s=0.5)


@pytest.fixture(scope="module")
def sidecar_server(sidecar):
    with running_server(sidecar_app.create_app(sidecar, limits=SIDECAR_LIMITS), keep_alive_s=0.5) as (url, _, _):
        yield url


@pytest.fixture(scope="module")
def chat_server(random_chat):
    app = chat_app.create_app(random_chat, model_name="tiny", limits=CHAT_LIMITS)
    with running_server(app, keep_alive_s=0.5) as (url, _, _):
        yield url


def test_lone_surrogate_and_nan_get_openai_errors(sidecar_server, chat_server):
    with httpx.Client(timeout=30) as http:
        def post(url: str, path: str, body: bytes) -> httpx.Response:
            return http.post(url + path, content=body, headers={"Content-Type": "application/json"})

        err = assert_openai_error(post(sidecar_server, "/v1/completions", b'{"prompt": "a\\nb\\ud800"}'), 400)
        assert "surrogate" in err["message"]                                                        # row 1
        assert_openai_error(post(chat_server, "/v1/chat/completions",
                                 b'{"messages": [{"role": "user", "content": "\\udc00"}]}'), 400)
        for body in (b'{"prompt": "a\\nb", "temperature": NaN}', b'{"prompt": "a\\nb", "temperature": -1}'):
            assert_openai_error(post(sidecar_server, "/v1/completions", body), 400)                   # row 9
        for t in (b"NaN", b"Infinity", b"1e400", b"-0.5"):
            body = b'{"messages": [{"role": "user", "content": "hi"}], "temperature": %s}' % t
            assert_openai_error(post(chat_server, "/v1/chat/completions", body), 400)


@pytest.mark.parametrize("which", ["sidecar", "chat"])
def test_giant_lists_get_a_fast_400_and_health_keeps_answering(which, sidecar_server, chat_server):
    """Row 2: a 4 MB body of 2M ints in ``prompt`` (sidecar) / ``stop`` (chat)."""
    url, path, field = ((sidecar_server, "/v1/completions", "prompt") if which == "sidecar"
                        else (chat_server, "/v1/chat/completions", "stop"))
    body = json.dumps({"prompt": "a\nb", "messages": USER, field: [0] * 2_000_000}, separators=(",", ":")).encode()
    assert len(body) < 4 << 20                         # under both servers' body limits
    health_s: list[float] = []

    def poll_health() -> None:
        with httpx.Client(timeout=10) as h:
            for _ in range(10):
                t = time.perf_counter()
                h.get(url + "/health")
                health_s.append(time.perf_counter() - t)

    with httpx.Client(timeout=30) as http:
        poller = threading.Thread(target=poll_health)
        t0 = time.perf_counter()
        poller.start()
        r = http.post(url + path, content=body, headers={"Content-Type": "application/json"})
        elapsed = time.perf_counter() - t0
        poller.join()
    assert "2000000 items, over the limit" in assert_openai_error(r, 400)["message"]
    assert elapsed < 5.0 and max(health_s) < 2.0, (elapsed, health_s)


def test_a_wave_of_many_distinct_prompts_is_refused_before_any_forward(sidecar):
    """Row 3: 1024 distinct 4-word prompts (60 KB) once took >10 min and 5 GB; now a 400 at admission."""
    limits = sidecar_app.Limits()                       # the defaults
    forwards, hook = slow_forwards(sidecar.model, 0.0)
    prompts = [f"shared block\nalpha beta gamma {i}" for i in range(1024)]
    try:
        with running_server(sidecar_app.create_app(sidecar, limits=limits)) as (url, _, _), \
                httpx.Client(timeout=30) as http:
            t0 = time.perf_counter()
            r = http.post(url + "/v1/completions", json={"prompt": prompts, "max_tokens": 16})
            assert time.perf_counter() - t0 < 5.0
            assert "query tokens" in assert_openai_error(r, 400)["message"]
            r = http.post(url + "/v1/completions", json={"prompt": prompts[:65], "max_tokens": 512})
            assert "max_tokens x prompts" in assert_openai_error(r, 400)["message"]
        assert not forwards
        tight = sidecar_app.Limits(max_forward_logits=40 * sidecar.model.config.vocab_size)
        with running_server(sidecar_app.create_app(sidecar, limits=tight)) as (url, _, _), \
                httpx.Client(timeout=30) as http:      # 8 answers x (1 + 6 draft nodes) = 56 nodes per forward
            r = http.post(url + "/v1/completions", json={"prompt": prompts[:8], "max_tokens": 4})
            assert "logits of one forward" in assert_openai_error(r, 400)["message"]
            assert http.post(url + "/v1/completions", json={"prompt": prompts[:2], "max_tokens": 4}).is_success
    finally:
        hook.remove()


def send_and_leave(url: str, path: str, body: dict) -> None:
    parts = urllib.parse.urlsplit(url)
    data = json.dumps(body).encode()
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as s:
        s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                  % (path.encode(), len(data)) + data)
        time.sleep(0.5)                                 # the work has started


def wait_idle(url: str, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        h = httpx.get(url + "/health", timeout=5).json()
        if h["running"] == 0 or time.monotonic() > deadline:
            return h
        time.sleep(0.05)


def test_a_non_streamed_chat_turn_stops_when_its_client_leaves(random_chat, chat_server):
    """Row 4: it once decoded on for 110 s; now it stops at its next token, like the streamed case."""
    forwards, hook = slow_forwards(random_chat.model, 0.02)
    try:
        send_and_leave(chat_server, "/v1/chat/completions", {"messages": USER, "max_tokens": 1000})
        assert forwards
        assert wait_idle(chat_server)["running"] == 0
        n = len(forwards)
        time.sleep(0.3)
        assert len(forwards) == n < 200, n              # stopped long before 1000 tokens
    finally:
        hook.remove()
    r = httpx.post(chat_server + "/v1/chat/completions", json={"messages": USER, "max_tokens": 3}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("which", ["sidecar", "chat"])
def test_shutdown_ends_running_work_within_seconds(which, sidecar, random_chat):
    """Row 3 (SIGTERM once ignored for 33 s): past the grace period the running work stops at its next forward."""
    if which == "sidecar":
        model, app = sidecar.model, sidecar_app.create_app(sidecar, limits=SIDECAR_LIMITS)
        path, body = "/v1/completions", {"prompt": ["shared\nq1", "shared\nq2"], "max_tokens": 200}
    else:
        model, app = random_chat.model, chat_app.create_app(random_chat, model_name="tiny", limits=CHAT_LIMITS)
        path, body = "/v1/chat/completions", {"messages": USER, "max_tokens": 1000}
    forwards, hook = slow_forwards(model, 0.05)
    try:
        with running_server(app, grace_s=0.5) as (url, server, thread):
            client = threading.Thread(target=lambda: httpx.post(url + path, json=body, timeout=30), daemon=True)
            client.start()
            deadline = time.monotonic() + 10
            while not forwards and time.monotonic() < deadline:
                time.sleep(0.02)
            t0 = time.perf_counter()
            server.should_exit = True                  # what uvicorn's SIGTERM handler does
            thread.join(10)
            assert not thread.is_alive() and time.perf_counter() - t0 < 3.0
            n = len(forwards)
            time.sleep(0.3)
            assert len(forwards) == n < 60, n
    finally:
        hook.remove()


def raw_exchange(url: str, data: bytes, wait_s: float) -> bytes:
    """Send ``data``, then read what the server answers within ``wait_s`` (b"" when it closes silently)."""
    parts = urllib.parse.urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=wait_s) as s:
        s.sendall(data)
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except TimeoutError:
            chunks.append(b"<still open>")
        return b"".join(chunks)


def test_half_sent_slow_and_idle_connections(sidecar_server, chat_server, caplog):
    """Row 10: one log line per aborted request, no traceback; slow bodies get 408; idle connections close."""
    head = b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    with caplog.at_level(logging.INFO):
        for url, path in ((sidecar_server, b"/v1/completions"), (chat_server, b"/v1/chat/completions")):
            parts = urllib.parse.urlsplit(url)
            with socket.create_connection((parts.hostname, parts.port), timeout=5) as s:   # half-sent, then gone
                s.sendall(head % path + b'{"prompt": ')
                time.sleep(0.1)
            t0 = time.perf_counter()
            answer = raw_exchange(url, head % path + b'{"prompt": ', 5.0)                 # slow: never finishes
            assert answer.startswith(b"HTTP/1.1 408") and time.perf_counter() - t0 < 3.0, answer[:200]
            assert b'"code":408' in answer
            t0 = time.perf_counter()
            assert raw_exchange(url, b"", 5.0) == b"" and time.perf_counter() - t0 < 3.0   # idle: closed
            assert raw_exchange(url, b"POST / HT", 5.0) == b"" and time.perf_counter() - t0 < 6.0
        time.sleep(0.3)
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]
    aborted = [r.getMessage() for r in caplog.records if r.getMessage().startswith("aborted")]
    assert len(aborted) == 4 and sum("499" in m for m in aborted) == 2, aborted


def test_limits_are_overridden_from_the_command_line():
    from ooospec.runtime.serve import chat_app, sidecar_app
    from ooospec.runtime.serve.admission import override_limits

    limits = override_limits(sidecar_app.Limits(), ["max_prompts=256", "body-timeout-s=2.5"])
    assert (limits.max_prompts, limits.body_timeout_s) == (256, 2.5)
    assert limits.max_tokens == sidecar_app.Limits().max_tokens
    assert override_limits(chat_app.Limits(), []) == chat_app.Limits()
    for item, message in [("max_prompt=3", "KEY one of .*max_prompts"), ("max_prompts", "expected KEY=VALUE"),
                          ("max_prompts=1.5", "'1.5' is not an int"), ("body_timeout_s=nan", "finite and > 0"),
                          ("max_tokens=0", "finite and > 0")]:
        with pytest.raises(ValueError, match=message):
            override_limits(sidecar_app.Limits(), [item])


def test_the_serve_clis_refuse_a_bad_limit_before_loading_anything():
    from ooospec import cli

    with pytest.raises(SystemExit, match="--limit 'max_tokenz=1': expected KEY=VALUE"):
        cli.main(["serve", "--target", "nowhere", "--limit", "max_tokenz=1"])
    with pytest.raises(SystemExit, match="--limit max_prompts: 'x' is not an int"):
        cli.main(["sidecar", "serve", "--limit", "max_prompts=x"])
