"""Server fuzz: hypothesis-made request bodies against both apps in process (no sockets, tiny models).

JSON of random shapes and wrong types, huge lists, NaN / Infinity, lone surrogates, raw bytes. Whatever comes,
the answer is one of 200, 400, 404, 413, 422, 429 -- never a 500 -- and a 4xx has OpenAI's error shape.
"""

from __future__ import annotations

import json

import pytest
import torch
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from transformers import Qwen2Config, Qwen2ForCausalLM

from ooospec.runtime.agent.chat import ChatModel
from ooospec.runtime.serve import chat_app, sidecar_app
from ooospec.runtime.sidecar import prompts as sp
from ooospec.runtime.sidecar.wave import Sidecar
from tests.pipelines.sidecar_tiny import byte_tokenizer
from tests.runtime.chat_tiny import TOOLS
from tests.runtime.conftest import tiny_model
from tests.runtime.toy_bpe import HERMES_TEMPLATE, with_template

ALLOWED = {200, 400, 404, 413, 422, 429}
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                derandomize=True)

SURROGATES = st.sampled_from(["\ud800", "a\udfffb", "\udc00\ud800", "\ud83d\ude00"])
TEXT = st.text(max_size=20) | SURROGATES
SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(min_value=-(10**30), max_value=10**30)
           | st.floats(allow_nan=True, allow_infinity=True) | TEXT)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=6) | SURROGATES, inner, max_size=4), max_leaves=12)
HUGE = st.sampled_from([[0] * 100_000, ["a\nb"] * 5000, [[]] * 50_000, "x" * 300_000])


def field(plausible: st.SearchStrategy) -> st.SearchStrategy:
    """A request field: usually plausible, sometimes any JSON, sometimes huge."""
    return st.one_of(plausible, plausible, JSON, HUGE)


PROMPT = st.lists(st.text(min_size=1, max_size=16) | SURROGATES, min_size=1, max_size=4) | TEXT
SIDECAR_BODY = st.fixed_dictionaries({}, optional={
    "prompt": field(PROMPT), "model": field(st.sampled_from(["sidecar", "gpt-4"])),
    "max_tokens": field(st.integers(-2, 6)), "stop": field(st.lists(TEXT, max_size=3) | TEXT),
    "temperature": field(st.floats(allow_nan=True, allow_infinity=True)), "n": field(st.integers(0, 2)),
    "stream": field(st.booleans()), "echo": field(st.booleans()), "logprobs": field(st.integers(0, 2)),
    "add_special_tokens": field(st.booleans()), "best_of": field(st.integers(0, 2)),
})
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "tool", "robot"])},
                                optional={"content": TEXT | JSON, "tool_calls": JSON, "name": TEXT})
CHAT_BODY = st.fixed_dictionaries({}, optional={
    "messages": field(st.lists(MESSAGE, max_size=3)), "model": field(st.sampled_from(["tiny", "gpt-4"])),
    "tools": field(st.just(TOOLS) | st.lists(JSON, max_size=2)),
    "tool_choice": field(st.sampled_from(["auto", "none", "required",
                                          {"type": "function", "function": {"name": "get_weather"}}])),
    "max_tokens": field(st.integers(-2, 6)), "max_completion_tokens": field(st.integers(-2, 6)),
    "stream": field(st.booleans()), "stream_options": field(st.just({"include_usage": True})),
    "temperature": field(st.floats(allow_nan=True, allow_infinity=True)), "n": field(st.integers(0, 2)),
    "stop": field(st.lists(TEXT, max_size=3)), "logprobs": field(st.booleans()),
})


def one_field_off(valid: st.SearchStrategy, wild: st.SearchStrategy) -> st.SearchStrategy:
    """A valid request with one field replaced (or added) by a wild one."""
    return st.tuples(valid, wild).map(lambda vw: {**vw[0], **vw[1]})


VALID_SIDECAR = st.fixed_dictionaries({"prompt": st.lists(st.text("ab\nQ: ", min_size=2, max_size=12).filter(
    lambda t: not t[0].isspace()), min_size=1, max_size=4)}, optional={
    "max_tokens": st.integers(1, 4), "stop": st.lists(st.text(max_size=3), max_size=2), "temperature": st.just(0),
    "model": st.just("sidecar")})
VALID_CHAT = st.fixed_dictionaries({"messages": st.just([{"role": "user", "content": "What is the weather?"}])},
                                   optional={"tools": st.just(TOOLS), "max_tokens": st.integers(1, 4),
                                             "stream": st.booleans(), "model": st.just("tiny")})
SIDECAR_BODY = st.one_of(VALID_SIDECAR, one_field_off(VALID_SIDECAR, SIDECAR_BODY), SIDECAR_BODY)
CHAT_BODY = st.one_of(VALID_CHAT, one_field_off(VALID_CHAT, CHAT_BODY), CHAT_BODY)


def encoded(body) -> bytes:
    """JSON text as a client might send it: NaN / Infinity literals allowed, surrogates as \\u escapes."""
    return json.dumps(body, allow_nan=True).encode()


def check(r) -> None:
    event(f"status {r.status_code}")      # pytest --hypothesis-show-statistics shows the mix
    assert r.status_code in ALLOWED, (r.status_code, r.text[:500])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == r.status_code, err
        assert isinstance(err["message"], str) and err["type"] == "invalid_request_error"


@pytest.fixture(scope="module")
def sidecar_client():
    sidecar = Sidecar(tiny_model("llama"), byte_tokenizer(), metadata={"layout_version": sp.LAYOUT_VERSION})
    limits = sidecar_app.Limits(max_body_bytes=1 << 20, max_prompts=8, max_tokens=4)
    with TestClient(sidecar_app.create_app(sidecar, limits=limits), raise_server_exceptions=False) as c:
        yield c


@pytest.fixture(scope="module")
def chat_client():
    tok = with_template(HERMES_TEMPLATE)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, head_dim=8, attn_implementation="sdpa")
    torch.manual_seed(0)
    chat = ChatModel(Qwen2ForCausalLM(cfg).eval(), tok, method="toolspec")
    limits = chat_app.Limits(max_body_bytes=1 << 20, max_tokens=4, default_max_tokens=4)
    with TestClient(chat_app.create_app(chat, model_name="tiny", limits=limits), raise_server_exceptions=False) as c:
        yield c


@FUZZ
@given(body=SIDECAR_BODY | JSON)
def test_sidecar_server_fuzz(sidecar_client, body):
    check(sidecar_client.post("/v1/completions", content=encoded(body)))


@FUZZ
@given(body=CHAT_BODY | JSON)
def test_chat_server_fuzz(chat_client, body):
    check(chat_client.post("/v1/chat/completions", content=encoded(body)))


@settings(max_examples=50, deadline=None, derandomize=True)
@given(raw=st.binary(max_size=200))
def test_raw_bytes_fuzz(sidecar_client, chat_client, raw):
    check(sidecar_client.post("/v1/completions", content=raw))
    check(chat_client.post("/v1/chat/completions", content=raw))
