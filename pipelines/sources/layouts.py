"""The layouts people publish function-calling data in, each mapped to one OpenAI chat conversation.

A mapper takes one dataset row (a dict, as ``datasets`` yields it) and returns ``{"tools", "messages"}`` in the
shape :mod:`ooospec.pipelines.sources.openai_chat` reads, or raises
:class:`~ooospec.pipelines.sources.openai_chat.BadConversation` naming the field. The records, their validation
and their rejects then come from that one module, whatever the layout.

* ``openai_chat``  ``tools`` + ``messages`` columns (JSON text is decoded; Hub exports often store it so)
* ``xlam``         xLAM / APIGen (``Salesforce/xlam-function-calling-60k``): ``query``, ``tools`` and ``answers``
                   as JSON text; parameters ``{"name": {"type": "str, optional", "description", "default"}}``
                   (Python-ish types, :mod:`~ooospec.pipelines.sources.pytypes`; a type without ``optional`` is
                   required); numeric strings for numeric parameters are converted (``meta``-free: the value the
                   schema declares).
* ``hermes``       hermes / ShareGPT (``NousResearch/hermes-function-calling-v1``): ``conversations`` of
                   ``{"from", "value"}`` (or ``{"role", "content"}``); the system turn lists the tools inside
                   ``<tools>...</tools>`` (or a ``tools`` column holds them), assistant turns call inside
                   ``<tool_call>...</tool_call>`` (JSON, or a Python dict literal), tool turns answer inside
                   ``<tool_response>``. The system turn that carries the tools is format boilerplate and is dropped.
* ``glaive``       glaive (``glaiveai/glaive-function-calling-v2``): ``system`` text with the functions as JSON
                   objects, ``chat`` text of ``USER:`` / ``ASSISTANT:`` / ``FUNCTION RESPONSE:`` turns, a call
                   written ``<functioncall> {"name": ..., "arguments": '<JSON text>'}``.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from typing import Any

from ooospec.pipelines.records import _kind
from ooospec.pipelines.sources.openai_chat import BadConversation
from ooospec.pipelines.sources.pytypes import coerce_arguments, is_optional, type_schema

_DECODER = json.JSONDecoder()


def _json_field(row: dict, name: str) -> Any:
    """A column that may hold JSON text (decoded) or the value itself."""
    if name not in row:
        raise BadConversation(f"{name}: missing column (columns: {sorted(row)[:12]})")
    value = row[name]
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (ValueError, RecursionError) as e:
            raise BadConversation(f"{name}: not JSON ({str(e)[:80]})") from None
    return value


def literal(text: str, where: str) -> Any:
    """JSON, else a Python literal (hermes data often prints dicts with single quotes)."""
    text = text.strip()
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        raise BadConversation(f"{where}: neither JSON nor a Python literal: {text[:80]!r}") from None


def json_objects(text: str) -> list[Any]:
    """Every top-level JSON value in ``text`` (objects separated by anything that is not JSON)."""
    out, pos = [], 0
    while (start := text.find("{", pos)) != -1:
        try:
            obj, pos = _DECODER.raw_decode(text, start)
        except ValueError:
            pos = start + 1
            continue
        out.append(obj)
    return out


def openai_chat_row(row: dict) -> dict:
    """``tools`` + ``messages`` columns, JSON text decoded."""
    return {"tools": _json_field(row, "tools"), "messages": _json_field(row, "messages")}


# ---------------------------------------------------------------- xlam / APIGen


def xlam_tool(entry: Any, i: int) -> dict:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise BadConversation(f"tools[{i}]: expected {{name, description, parameters}}, got {str(entry)[:80]!r}")
    params = entry.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadConversation(f"tools[{i}].parameters: expected an object, got {_kind(params)}")
    if params.get("type") == "object":           # already a JSON Schema
        schema = params
    else:
        props, required = {}, []
        for name, spec in params.items():
            if not isinstance(spec, dict):
                raise BadConversation(f"tools[{i}].parameters.{name}: expected {{type, description}}, "
                                      f"got {_kind(spec)}")
            prop = type_schema(spec.get("type"))
            prop["description"] = spec.get("description", "") if isinstance(spec.get("description"), str) else ""
            if spec.get("default") not in (None, ""):
                prop["default"] = spec["default"]
            props[name] = prop
            if not is_optional(spec.get("type")):
                required.append(name)
        schema = {"type": "object", "properties": props, **({"required": required} if required else {})}
    return {"type": "function", "function": {"name": entry["name"], "description": entry.get("description", ""),
                                             "parameters": schema}}


def xlam_row(row: dict) -> dict:
    """``query`` + ``tools`` + ``answers`` -> one user turn and one assistant turn with every answer as a call."""
    query = row.get("query")
    if not isinstance(query, str) or not query.strip():
        raise BadConversation(f"query: expected a non-empty string, got {_kind(query)}")
    raw_tools, answers = _json_field(row, "tools"), _json_field(row, "answers")
    if not isinstance(raw_tools, list):
        raise BadConversation(f"tools: expected a list, got {_kind(raw_tools)}")
    if not isinstance(answers, list):
        raise BadConversation(f"answers: expected a list, got {_kind(answers)}")
    tools = [xlam_tool(t, i) for i, t in enumerate(raw_tools)]
    schema_of = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    calls = []
    for j, a in enumerate(answers):
        if not isinstance(a, dict) or not isinstance(a.get("name"), str):
            raise BadConversation(f"answers[{j}]: expected {{name, arguments}}, got {str(a)[:80]!r}")
        args = a.get("arguments") or {}
        if isinstance(args, str):
            args = literal(args, f"answers[{j}].arguments")
        if not isinstance(args, dict):
            raise BadConversation(f"answers[{j}].arguments: expected an object, got {_kind(args)}")
        if a["name"] in schema_of:
            args, _ = coerce_arguments(args, schema_of[a["name"]])
        calls.append({"type": "function", "function": {"name": a["name"], "arguments": args}})
    return {"tools": tools, "messages": [{"role": "user", "content": query},
                                         {"role": "assistant", "content": "", "tool_calls": calls}]}


# ---------------------------------------------------------------- hermes / ShareGPT

_TOOLS_RE = re.compile(r"<tools>(.*?)</tools>", re.DOTALL)
_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_RESPONSE_RE = re.compile(r"</?tool_response>")
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "tool": "tool", "observation": "tool", "function_response": "tool", "ipython": "tool"}


def hermes_tools(text: str, where: str) -> list:
    """The tools listed inside ``<tools>...</tools>``: a JSON list, or objects one after another."""
    body = text.strip()
    try:
        value = literal(body, where)
    except BadConversation:
        value = json_objects(body)
        if not value:
            raise
    return value if isinstance(value, list) else [value]


def hermes_calls(text: str, where: str) -> tuple[str, list[dict]]:
    """An assistant turn -> (its text outside the ``<tool_call>`` blocks, its calls)."""
    calls = []
    for j, m in enumerate(_CALL_RE.finditer(text)):
        obj = literal(m.group(1), f"{where}<tool_call>[{j}]")
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise BadConversation(f"{where}<tool_call>[{j}]: expected {{name, arguments}}, got {str(obj)[:80]!r}")
        args = obj.get("arguments", obj.get("parameters")) or {}
        if isinstance(args, str):
            args = literal(args, f"{where}<tool_call>[{j}].arguments")
        calls.append({"type": "function", "function": {"name": obj["name"], "arguments": args}})
    return _CALL_RE.sub("", text).strip(), calls


def hermes_row(row: dict) -> dict:
    """``conversations`` (+ an optional ``tools`` column) -> tools and messages."""
    turns = row.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise BadConversation(f"conversations: expected a non-empty list of turns, got {_kind(turns)}")
    tools: list = _json_field(row, "tools") if row.get("tools") else []
    messages = []
    for i, turn in enumerate(turns):
        where = f"conversations[{i}]"
        if not isinstance(turn, dict):
            raise BadConversation(f"{where}: expected an object, got {_kind(turn)}")
        speaker, value = turn.get("from", turn.get("role")), turn.get("value", turn.get("content"))
        role = SHAREGPT_ROLES.get(speaker)
        if role is None or not isinstance(value, str):
            raise BadConversation(f"{where}: expected {{from: {sorted(SHAREGPT_ROLES)}, value: str}}, "
                                  f"got from={str(speaker)[:30]!r}, value {_kind(value)}")
        if role == "system" and (m := _TOOLS_RE.search(value)):
            tools = tools or hermes_tools(m.group(1), f"{where}<tools>")
            continue
        if role == "assistant":
            text, calls = hermes_calls(value, where)
            messages.append({"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})})
        elif role == "tool":
            messages.append({"role": "tool", "content": _RESPONSE_RE.sub("", value).strip()})
        else:
            messages.append({"role": role, "content": value})
    if not isinstance(tools, list) or not tools:
        raise BadConversation("tools: no <tools> block in a system turn and no tools column")
    return {"tools": tools, "messages": messages}


# ---------------------------------------------------------------- glaive

_GLAIVE_TURN_RE = re.compile(r"(?:^|\n)\s*(USER|ASSISTANT|FUNCTION RESPONSE):", re.MULTILINE)
_GLAIVE_ARGS_RE = re.compile(r"""("arguments"\s*:\s*)'(.*)'(\s*}\s*)$""", re.DOTALL)


def glaive_call(text: str, where: str) -> dict:
    """``{"name": "f", "arguments": '{"a": 1}'}`` (arguments single-quoted JSON text) -> ``{"name", "arguments"}``."""
    text = text.replace("<|endoftext|>", "").strip()
    m = _GLAIVE_ARGS_RE.search(text)
    if m:   # arguments as single-quoted JSON text: take it out as a JSON string
        text = text[:m.start()] + m.group(1) + json.dumps(m.group(2)) + m.group(3)
    obj = literal(text, where)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise BadConversation(f"{where}: expected {{name, arguments}}, got {text[:80]!r}")
    args = obj.get("arguments") or {}
    if isinstance(args, str):
        args = literal(args, f"{where}.arguments")
    return {"type": "function", "function": {"name": obj["name"], "arguments": args}}


def glaive_row(row: dict) -> dict:
    """``system`` (functions as JSON objects) + ``chat`` (USER / ASSISTANT / FUNCTION RESPONSE turns)."""
    system, chat = row.get("system"), row.get("chat")
    if not isinstance(system, str) or not isinstance(chat, str):
        raise BadConversation(f"system, chat: expected text, got {_kind(system)}, {_kind(chat)}")
    tools = [f for f in json_objects(system) if isinstance(f, dict) and "name" in f]
    if not tools:
        raise BadConversation("system: lists no function (a JSON object with a 'name')")
    marks = list(_GLAIVE_TURN_RE.finditer(chat))
    messages = []
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(chat)
        body = chat[m.end():end].strip()
        where = f"chat turn {i} ({m.group(1)})"
        if m.group(1) == "USER":
            messages.append({"role": "user", "content": body})
        elif m.group(1) == "FUNCTION RESPONSE":
            messages.append({"role": "tool", "content": body})
        elif "<functioncall>" in body:
            before, _, after = body.partition("<functioncall>")
            messages.append({"role": "assistant", "content": before.replace("<|endoftext|>", "").strip(),
                             "tool_calls": [glaive_call(after, where)]})
        else:
            messages.append({"role": "assistant", "content": body.replace("<|endoftext|>", "").strip()})
    if not messages:
        raise BadConversation("chat: no USER / ASSISTANT / FUNCTION RESPONSE turn")
    return {"tools": [{"type": "function", "function": f} for f in tools], "messages": messages}


LAYOUTS: dict[str, Callable[[dict], dict]] = {
    "openai_chat": openai_chat_row, "xlam": xlam_row, "hermes": hermes_row, "glaive": glaive_row,
}
