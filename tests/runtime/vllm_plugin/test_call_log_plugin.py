"""The plugin's call log, on a stand-in for vLLM 0.32's ``OpenAIServingChat`` (no vLLM here): what it records for
a whole answer and for a stream read to its end, and what it leaves out (no tools, errors, a client that left)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import pytest
from pydantic import BaseModel

from ooospec.runtime.call_log import CallLog
from ooospec.runtime.vllm import plugin

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
PARIS = {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
HISTORY = [{"role": "user", "content": "Weather in Paris, then Oslo?"},
           {"role": "assistant", "content": None, "tool_calls": [PARIS]},
           {"role": "tool", "tool_call_id": "call_0", "content": '{"temp_c": 21}'}]
ARGS = '{"city": "Oslo"}'


class ToolParam(BaseModel):                  # vLLM's ChatCompletionToolsParam: a pydantic model per tool
    type: str = "function"
    function: dict


@dataclass
class Request:                               # the fields of vLLM's ChatCompletionRequest the wrapper reads
    messages: list
    tools: list | None
    stream: bool = False


# vLLM's response classes, as far as the wrapper reads them
@dataclass
class Function:
    name: str
    arguments: str


@dataclass
class ToolCall:
    id: str
    function: Function


@dataclass
class Message:
    content: str | None
    tool_calls: list = field(default_factory=list)


@dataclass
class Choice:
    message: Message


@dataclass
class Response:
    id: str
    model: str
    choices: list


@dataclass
class ErrorResponse:
    error: dict


def sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def chunk(delta: dict, finish: str | None = None) -> str:
    return sse({"id": "chatcmpl-s", "object": "chat.completion.chunk", "model": "qwen",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


class ServingChat:
    """``create_chat_completion`` as vLLM 0.32 answers it (serving.py): the rendering rewrites the history's
    tool-call arguments into dicts in place, then a ``ChatCompletionResponse``, an ``ErrorResponse`` or an SSE
    generator (role chunk, the call's name, its argument fragments, the finish, ``[DONE]``)."""

    fail = False

    async def create_chat_completion(self, request: Request, raw_request=None):
        for message in request.messages:
            for tc in message.get("tool_calls") or ():
                tc["function"]["arguments"] = json.loads(tc["function"]["arguments"])
        if self.fail:
            return ErrorResponse({"message": "bad", "code": 400})
        if request.stream:
            return self.stream()
        calls = [ToolCall("chatcmpl-tool-1", Function("get_weather", ARGS))]
        return Response("chatcmpl-1", "qwen", [Choice(Message(None, calls))])

    async def stream(self):
        yield chunk({"role": "assistant", "content": ""})
        yield chunk({"tool_calls": [{"index": 0, "id": "chatcmpl-tool-1", "type": "function",
                                     "function": {"name": "get_weather"}}]})
        for piece in ('{"city": ', '"Oslo"}'):
            yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
        yield chunk({}, "tool_calls")
        yield "data: [DONE]\n\n"


@pytest.fixture
def served(tmp_path):
    """``(serving, log path, opened)``: the stand-in with its method wrapped as the plugin wraps vLLM's."""
    opened: list[CallLog] = []

    def open_log() -> CallLog:
        if not opened:
            opened.append(CallLog(tmp_path / "calls.jsonl"))
        return opened[0]

    class Serving(ServingChat):
        pass

    wrapper = lambda f: plugin.wrap_create_chat_completion(f, Response, open_log)
    assert plugin._patch(Serving, "create_chat_completion", wrapper)
    wrapped = Serving.create_chat_completion
    assert plugin._patch(Serving, "create_chat_completion", wrapper) and Serving.create_chat_completion is wrapped
    yield Serving(), tmp_path / "calls.jsonl", opened
    for log in opened:
        log.close()


def request(stream: bool = False, tools=True) -> Request:
    """A request as vLLM validated it from the JSON body (a tool's set fields are the ones the client sent)."""
    return Request(json.loads(json.dumps(HISTORY)), [ToolParam(**t) for t in TOOLS] if tools else None, stream)


async def read_all(stream) -> list[str]:
    return [event async for event in stream]


def logged(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_whole_answer_and_a_stream_are_recorded_alike(served):
    serving, path, opened = served
    whole = asyncio.run(serving.create_chat_completion(request()))
    assert isinstance(whole, Response)
    events = asyncio.run(read_all(asyncio.run(serving.create_chat_completion(request(stream=True)))))
    assert events[-1] == "data: [DONE]\n\n" and len(events) == 6          # the stream passes through unchanged
    opened[0].close()
    first, second = logged(path)
    answer = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "chatcmpl-tool-1", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}]}
    for line, rid in ((first, "chatcmpl-1"), (second, "chatcmpl-s")):
        assert line["tools"] == TOOLS                                     # as sent, not as pydantic dumps it
        assert line["messages"] == [*HISTORY, answer]                     # the history before vLLM rewrote it
        assert (line["model"], line["source"], line["id"]) == ("qwen", "vllm", rid)


def test_what_is_not_recorded(served):
    serving, path, opened = served

    async def leave_after_the_first_chunk():
        stream = await serving.create_chat_completion(request(stream=True))
        await stream.__anext__()
        await stream.aclose()                                             # the client went away

    asyncio.run(leave_after_the_first_chunk())
    assert isinstance(asyncio.run(serving.create_chat_completion(request(tools=False))), Response)
    serving.fail = True
    assert isinstance(asyncio.run(serving.create_chat_completion(request())), ErrorResponse)
    assert not opened and not path.exists()                               # the log is not even opened


def test_a_stream_that_fails_is_not_recorded():
    answer = plugin.StreamedAnswer()
    for event in (chunk({"role": "assistant", "content": ""}),
                  sse({"error": {"message": "Internal server error", "code": 500}}), "data: [DONE]\n\n"):
        answer.feed(event)
    assert not answer.complete
    text = plugin.StreamedAnswer()
    for event in (chunk({"content": "It is "}), chunk({"content": "21 C."}, "stop"), "data: [DONE]\n\n"):
        text.feed(event)
    assert text.complete and text.answer() == {"role": "assistant", "content": "It is 21 C."}


def test_call_log_settings():
    assert plugin.call_log_settings({}) is None and plugin.call_log_settings({"OOOSPEC_CALL_LOG": " "}) is None
    assert plugin.call_log_settings({"OOOSPEC_CALL_LOG": "/x/c.jsonl"}) == {
        "path": "/x/c.jsonl", "max_bytes": 256 << 20, "backups": 3}
    assert plugin.call_log_settings({"OOOSPEC_CALL_LOG": "c", "OOOSPEC_CALL_LOG_MAX_MB": "1",
                                     "OOOSPEC_CALL_LOG_BACKUPS": "0"}) == {"path": "c", "max_bytes": 1 << 20,
                                                                            "backups": 0}
    for env, bad in (("OOOSPEC_CALL_LOG_MAX_MB", "0"), ("OOOSPEC_CALL_LOG_MAX_MB", "1.5"),
                     ("OOOSPEC_CALL_LOG_BACKUPS", "-1")):
        with pytest.raises(ValueError, match=env):
            plugin.call_log_settings({"OOOSPEC_CALL_LOG": "c", env: bad})


def test_without_vllm_nothing_is_patched(tmp_path, caplog):
    assert not plugin.install_call_log({"path": str(tmp_path / "c.jsonl"), "max_bytes": 1 << 20, "backups": 1})
    assert "does not import" in caplog.text and not list(tmp_path.iterdir())
