"""OpenAI chat messages, both ways: the wire shape clients send -> the shape records and chat templates take
(:func:`normalize_messages`), and back (:func:`openai_messages`).

The chat server and the agent replay normalize every request with it; ``ingest`` reads call logs and OpenAI chat
JSON lines with it (``pipelines/sources/openai_chat.py``); the vLLM benches send records with
:func:`openai_messages`.

May import: only :mod:`ooospec.runtime.formats.common` (formats are the bottom layer).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ooospec.runtime.formats import common


def normalize_messages(messages: Sequence[Any]) -> list[dict]:
    """OpenAI chat messages as the records and chat templates take them; raises ValueError naming the message.

    ``content`` None becomes ``""``, a list of text parts is joined; an assistant's ``tool_calls`` become
    ``[{"type": "function", "function": {"name", "arguments": dict}}]`` (arguments given as a JSON string are
    parsed). Keys other than role / content / tool_calls / name / tool_call_id are dropped.
    """
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise ValueError(f"messages[{i}]: expected an object, got {type(msg).__name__}")  # noqa: TRY004
        role = msg.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise ValueError(f"messages[{i}].role: expected system, user, assistant or tool, got {str(role)[:40]!r}")
        norm: dict[str, Any] = {"role": "system" if role == "developer" else role,
                                "content": _text_content(msg.get("content"), i)}
        for key in ("name", "tool_call_id"):
            if isinstance(msg.get(key), str):
                norm[key] = msg[key]
        if role == "assistant" and msg.get("tool_calls"):
            norm["tool_calls"] = [_tool_call(tc, i, j) for j, tc in enumerate(msg["tool_calls"])]
        out.append(norm)
    return out


def _text_content(content: Any, i: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"messages[{i}].content[{j}]: only text parts are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise ValueError(f"messages[{i}].content: expected a string or a list of text parts")


def _tool_call(tc: Any, i: int, j: int) -> dict:
    call = common.to_call(tc) if isinstance(tc, dict) else None
    if call is None:
        raise ValueError(f"messages[{i}].tool_calls[{j}]: expected {{\"type\": \"function\", \"function\": "
                         f"{{\"name\", \"arguments\"}}}} with arguments a JSON object (or its JSON text)")
    return {"type": "function", "function": call}


def openai_messages(messages: list[dict]) -> list[dict]:
    """A record's messages as OpenAI's API takes them: tool calls ``{id, type, function: {name, arguments as
    JSON text}}`` (records keep the arguments as objects, and may keep bare ``{name, arguments}`` calls), each tool
    result answering the call before it by id."""
    out, last_ids = [], []
    for i, msg in enumerate(messages):
        msg = dict(msg)
        if msg.get("tool_calls"):
            calls = []
            for j, tc in enumerate(msg["tool_calls"]):
                fn = tc.get("function", tc)
                text = fn["arguments"] if isinstance(fn["arguments"], str) else json.dumps(fn["arguments"])
                calls.append({"id": f"call_{i}_{j}", "type": "function", "function": {"name": fn["name"],
                                                                                      "arguments": text}})
            msg["tool_calls"], last_ids = calls, [c["id"] for c in calls]
        elif msg["role"] == "tool" and "tool_call_id" not in msg and last_ids:
            msg["tool_call_id"] = last_ids.pop(0)
        out.append(msg)
    return out
