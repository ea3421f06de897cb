"""The chat server against the official ``openai`` client, on 127.0.0.1 (a tiny target that knows one tool
conversation, :mod:`tests.runtime.chat_tiny`); the server is stopped when the module ends."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from ooospec.runtime.agent.chat import ChatModel
from ooospec.runtime.agent.session import PrefixCache, SessionStore
from ooospec.runtime.serve.chat_app import Limits, create_app
from tests.runtime.chat_tiny import ANSWER, RESULT, TOOLS, USER, trained_chat_model
from tests.runtime.sidecar_servers import running_app

NAME = "tiny-qwen"
LIMITS = Limits(max_body_bytes=64 << 10, max_tokens=64, default_max_tokens=48, max_messages=16)


@pytest.fixture(scope="module")
def server():
    model, tok = trained_chat_model()
    chat = ChatModel(model, tok, method="toolspec", sessions=SessionStore(model, prefix_cache=PrefixCache()))
    with running_app(create_app(chat, model_name=NAME, limits=LIMITS)) as url:
        yield url, chat


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def _tool_reply(call_id: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": RESULT}


def test_two_turn_tool_conversation(client, server):
    assert [m.id for m in client.models.list().data] == [NAME]
    first = client.chat.completions.create(model=NAME, messages=USER, tools=TOOLS)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (tc,) = choice.message.tool_calls
    assert tc.type == "function" and tc.id.startswith("call_") and tc.function.name == "get_weather"
    assert json.loads(tc.function.arguments) == {"city": "Paris"}
    assert first.usage.prompt_tokens > 0 and first.usage.completion_tokens > 0

    messages = USER + [choice.message.model_dump(exclude_none=True), _tool_reply(tc.id)]
    second = client.chat.completions.create(model=NAME, messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == ANSWER and second.choices[0].finish_reason == "stop"
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < second.usage.prompt_tokens and second.model_extra["ooospec"]["session"] == "session"


def test_two_turn_tool_conversation_streaming(client):
    chunks = list(client.chat.completions.create(model=NAME, messages=USER, tools=TOOLS, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(tc.index, tc.function.name, json.loads(tc.function.arguments)) for tc in calls] == \
        [(0, "get_weather", {"city": "Paris"})]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    call = {"id": calls[0].id, "type": "function",
            "function": {"name": calls[0].function.name, "arguments": calls[0].function.arguments}}
    messages = USER + [{"role": "assistant", "content": None, "tool_calls": [call]}, _tool_reply(call["id"])]
    stream = client.chat.completions.create(model=NAME, messages=messages, tools=TOOLS, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ANSWER
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens_details.cached_tokens > 0


def test_text_streams_as_it_is_decoded(client):
    """Without tools the text comes in several deltas (the model's answer to a conversation it never saw is
    whatever it is; only the protocol is checked)."""
    chunks = list(client.chat.completions.create(model=NAME, messages=USER, stream=True, max_tokens=12))
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(deltas) >= 2 and chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_tool_choice(client):
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = client.chat.completions.create(model=NAME, messages=USER, tools=TOOLS, max_tokens=40, tool_choice=choice)
        assert r.choices[0].message.tool_calls[0].function.name == "get_weather", choice
    r = client.chat.completions.create(model=NAME, messages=USER, tools=TOOLS, max_tokens=8, tool_choice="none")
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason in ("stop", "length")
    for bad, match in [({"type": "function", "function": {"name": "nope"}}, "not among the request's tools"),
                       ({"type": "function", "function": "x"}, "tool_choice must be")]:
        with pytest.raises(openai.BadRequestError, match=match):
            client.chat.completions.create(model=NAME, messages=USER, tools=TOOLS, tool_choice=bad)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"model": "gpt-4o"}, openai.NotFoundError, "does not exist"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, openai.BadRequestError, "role"),
    ({"messages": []}, openai.BadRequestError, "messages"),
    ({"messages": [{"role": "user", "content": "x"}] * 17}, openai.BadRequestError, "17 items, over the limit of 16"),
    ({"temperature": 0.7}, openai.BadRequestError, "greedily"),
    ({"max_tokens": 10**6}, openai.BadRequestError, "max_tokens"),
    ({"max_tokens": 0}, openai.BadRequestError, "max_tokens"),
    ({"n": 2}, openai.BadRequestError, "n > 1"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, openai.BadRequestError, "name"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
        "function": {"name": "f", "arguments": "{not json"}}]}]}, openai.BadRequestError, "tool_calls"),
    ({"messages": [{"role": "user", "content": "x" * (70 << 10)}]}, openai.APIStatusError, "over the limit"),
])
def test_bad_requests_get_4xx_and_the_server_keeps_serving(client, kwargs, error, match):
    request = {"model": NAME, "messages": USER, "tools": TOOLS, **kwargs}
    with pytest.raises(error, match=match) as info:
        client.chat.completions.create(**request)
    assert 400 <= info.value.status_code < 500
    assert client.chat.completions.create(model=NAME, messages=USER, tools=TOOLS).choices[0].message.tool_calls


def test_malformed_bodies(server):
    url = server[0] + "/v1/chat/completions"
    with httpx.Client(timeout=30) as http:
        for body, status in [(b"{not json", 400), (b"[1, 2]", 400), (b'{"messages": "hi"}', 400),
                             (b"x" * (65 << 10), 413)]:
            r = http.post(url, content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == status and r.json()["error"]["code"] == status, body[:20]
        assert http.get(server[0] + "/health").json()["status"] == "ok"
