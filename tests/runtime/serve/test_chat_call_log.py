"""``ooospec serve``'s call log, end to end: a server with the log on answers tool-call requests (streamed and not)
from the official ``openai`` client, the log holds exactly those requests and the answers the client got, and
``ingest``'s ``openai_chat`` reader turns it back into records; with the log off nothing is written."""

from __future__ import annotations

import argparse
import json
import threading

import openai
import pytest

from ooospec.runtime.agent.chat import ChatModel
from ooospec.runtime.call_log import THREAD_NAME, CallLog
from ooospec.runtime.serve.chat_app import Limits, create_app
from tests.runtime.chat_tiny import TOOLS, USER, trained_chat_model
from tests.runtime.sidecar_servers import running_app

NAME = "tiny-qwen"
LIMITS = Limits(max_body_bytes=64 << 10, max_tokens=64, default_max_tokens=48, max_messages=16)
# (messages, stream): four conversations the tiny model answers with a call
REQUESTS = [
    (USER, False),
    ([{"role": "user", "content": "What is the weather in Paris!"}], True),
    ([{"role": "system", "content": "You are terse."}, *USER], False),
    ([{"role": "system", "content": "Réponds brièvement."}, *USER], True),
]


@pytest.fixture(scope="module")
def chat():
    model, tok = trained_chat_model()
    return ChatModel(model, tok, method="toolspec")


def ask(client: openai.OpenAI, messages: list[dict], stream: bool, **kwargs) -> dict:
    """The answer's assistant message as the client saw it, OpenAI's shape (streamed deltas put back together)."""
    request = {"model": NAME, "messages": messages, "max_tokens": 40, **kwargs}
    if not stream:
        got = client.chat.completions.create(**request).choices[0].message
        message = {"role": got.role, "content": got.content}
        calls = [tc.model_dump() for tc in got.tool_calls or ()]
        return {**message, "tool_calls": calls} if calls else message
    calls: dict[int, dict] = {}
    content = []
    for chunk in client.chat.completions.create(**request, stream=True):
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            for tc in choice.delta.tool_calls or ():
                call = calls.setdefault(tc.index, {"id": tc.id, "type": "function",
                                                   "function": {"name": "", "arguments": ""}})
                call["function"]["name"] += tc.function.name or ""
                call["function"]["arguments"] += tc.function.arguments or ""
    message = {"role": "assistant", "content": "".join(content) or None}
    return {**message, "tool_calls": [calls[i] for i in sorted(calls)]} if calls else message


def test_the_log_holds_each_answered_request_and_ingest_reads_it_back(chat, tmp_path):
    path = tmp_path / "logs" / "calls.jsonl"
    log = CallLog(path)
    answers = []
    with running_app(create_app(chat, model_name=NAME, limits=LIMITS, call_log=log)) as url, \
            openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60) as client:
        for messages, stream in REQUESTS:
            answers.append(ask(client, messages, stream, tools=TOOLS))
        ask(client, USER, False)                                      # no tools: not recorded
        with pytest.raises(openai.BadRequestError):                   # refused: not recorded
            ask(client, USER, False, tools=TOOLS, temperature=0.5)
    log.close()
    assert (log.written, log.dropped, log.failed) == (len(REQUESTS), 0, 0)

    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == len(REQUESTS)
    for line, (messages, _), answer in zip(lines, REQUESTS, answers):
        assert line["tools"] == TOOLS and line["messages"][:-1] == messages
        assert line["messages"][-1] == answer and answer["tool_calls"]
        assert line["model"] == NAME and line["source"] == "ooospec-serve" and line["log_version"] == 1
        assert line["id"].startswith("chatcmpl-") and isinstance(line["created"], int)
    assert "Réponds brièvement." in path.read_text(encoding="utf-8")     # not \\u-escaped

    openai_chat = pytest.importorskip("ooospec.pipelines.sources.openai_chat")
    from ooospec.pipelines.records import Reject

    out = list(openai_chat.parse_file(path, source="calllog", split="train"))
    assert not [r for r in out if isinstance(r, Reject)]
    assert len(out) == len(REQUESTS)
    for record, (messages, _), answer in zip(out, REQUESTS, answers):
        assert record["tools"] == TOOLS and record["source"] == "calllog" and record["split"] == "train"
        assert [{"role": m["role"], "content": m["content"]} for m in record["messages"]] == messages
        assert record["calls"] == [{"name": fn["name"], "arguments": json.loads(fn["arguments"])}
                                   for fn in (tc["function"] for tc in answer["tool_calls"])]


def test_with_the_log_off_nothing_is_written(chat, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with running_app(create_app(chat, model_name=NAME, limits=LIMITS)) as url, \
            openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60) as client:
        for messages, stream in REQUESTS[:2]:
            assert ask(client, messages, stream, tools=TOOLS)["tool_calls"]
        assert not [t for t in threading.enumerate() if t.name == THREAD_NAME]
    assert not list(tmp_path.rglob("*"))


def test_the_cli_builds_a_log_only_when_asked(tmp_path):
    from ooospec import serve_cli

    p = argparse.ArgumentParser()
    serve_cli.add_arguments(p)
    assert serve_cli.call_log(p.parse_args(["--target", "t"])) is None
    log = serve_cli.call_log(p.parse_args(["--target", "t", "--call-log", str(tmp_path / "c.jsonl"),
                                           "--call-log-max-mb", "2", "--call-log-backups", "5"]))
    try:
        assert (log.path, log.max_bytes, log.backups) == (tmp_path / "c.jsonl", 2 << 20, 5)
    finally:
        log.close()
    assert not list(tmp_path.iterdir())            # nothing recorded, no file
