"""OpenAI chat conversations (what OpenAI-compatible servers and clients log) -> records, and records' messages
back to the wire (:func:`openai_messages`).

One conversation is one JSON object (a line of a JSON-lines file, or a row that a layout mapper of
:mod:`ooospec.pipelines.sources.layouts` turned into one)::

    {"tools": [{"type": "function", "function": {"name", "description", "parameters": <JSON Schema>}}, ...],
     "messages": [{"role": "system" | "developer" | "user" | "assistant" | "tool", "content": str | null | [parts],
                   "tool_calls": [{"id", "type": "function", "function": {"name", "arguments": "<JSON text>"}}]}],
     "conversation_id": ...}       # optional: what ties the lines of one conversation together

**One record per assistant turn that calls tools**: ``messages`` = the conversation before that turn, ``calls`` =
that turn's calls (several calls in one turn stay one record). A line written by ooo-spec's call log
(:mod:`ooospec.runtime.call_log`; it carries ``log_version``) is one request: only its LAST message is the target's
answer, the earlier assistant turns are what the client sent back, so only the last turn becomes a record.

Normalization (so that the same conversation logged twice is the same record): ``arguments`` JSON text is decoded
to an object; ``content: null`` becomes ``""``; a list of text parts is joined; ``developer`` is ``system`` and the
legacy ``function`` role is ``tool``; call ids, ``tool_call_id`` and ``name`` on messages are dropped. A tool
without ``parameters`` takes no arguments (OpenAI's meaning: ``{"type": "object", "properties": {}}``).

What is wrong with a conversation is a :class:`~ooospec.pipelines.records.Reject` whose detail names the field
(``messages[3].tool_calls[0].function.arguments: not JSON ...``); schema validation of tools and calls happens
once, in the ingest stage, as for every source.

**Conversation key** (``meta.dialogue``, what ``dedupe`` and ``expand_slots`` keep on one side of a split): the
object's ``conversation_id`` (or ``metadata.conversation_id`` / ``session_id``) when it has one, else a hash of
its tools and its first user message -- the requests of one agent conversation share both.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ooospec.pipelines.records import (
    MALFORMED_RECORD,
    Reject,
    _decode_line,
    _kind,
    call,
    make_record,
)
from ooospec.runtime.calls import canonical_json, norm_text

LICENSE = "as declared by the user"
ROLE_ALIASES = {"developer": "system", "function": "tool"}
KNOWN_ROLES = ("system", "user", "assistant", "tool")
ID_FIELDS = ("conversation_id", "session_id", "dialogue_id")
NOT_JSON = "not_json"
UNSUPPORTED_CONTENT = "unsupported_content"
RAW_KEEP_CHARS = 2000      # a reject keeps at most this much of a hostile item


class BadConversation(ValueError):
    """What is wrong with one conversation; the message names the field."""


# ---------------------------------------------------------------- pure mapping


def _text(content: Any, where: str) -> str:
    """A message's content as text: ``None`` -> ``""``, text parts joined; anything else is a BadConversation."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else _kind(part)
                raise BadConversation(f"{where}.content[{i}]: only text parts are kept, got {str(kind)[:40]!r}")
        return "".join(parts)
    raise BadConversation(f"{where}.content: expected a string, text parts or null, got {_kind(content)}")


def decode_arguments(arguments: Any, where: str) -> dict:
    """A call's ``arguments`` (JSON text, as OpenAI sends it, or an object) -> an object.

    >>> decode_arguments('{"city": "Paris"}', "x")
    {'city': 'Paris'}
    >>> decode_arguments("", "x")
    {}
    """
    if isinstance(arguments, str):
        if not arguments.strip():
            return {}
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError) as e:
            raise BadConversation(f"{where}: not JSON ({str(e)[:80]})") from None
    if arguments is None:
        return {}
    if not isinstance(arguments, dict):
        raise BadConversation(f"{where}: expected a JSON object, got {_kind(arguments)}")
    return arguments


def tool_calls_of(message: dict, where: str) -> list[dict]:
    """An assistant message's calls as ``[{"name", "arguments": dict}]`` (``[]`` when it calls none)."""
    raw = message.get("tool_calls")
    if raw is None and isinstance(message.get("function_call"), dict):   # the legacy single-call field
        raw = [{"type": "function", "function": message["function_call"]}]
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadConversation(f"{where}.tool_calls: expected a list, got {_kind(raw)}")
    calls = []
    for j, tc in enumerate(raw):
        fn = tc.get("function", tc) if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadConversation(f"{where}.tool_calls[{j}].function.name: expected a non-empty string")
        calls.append(call(fn["name"], decode_arguments(fn.get("arguments"), f"{where}.tool_calls[{j}].function"
                                                                           ".arguments")))
    return calls


def normalize_message(message: Any, i: int) -> tuple[dict, list[dict]]:
    """One message -> (the record's message, the calls it makes). Raises BadConversation naming the field."""
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise BadConversation(f"{where}: expected an object {{role, content}}, got {_kind(message)}")
    role = ROLE_ALIASES.get(message.get("role"), message.get("role"))
    if role not in KNOWN_ROLES:
        raise BadConversation(f"{where}.role: expected one of {list(KNOWN_ROLES)}, got {str(role)[:40]!r}")
    out = {"role": role, "content": _text(message.get("content"), where)}
    calls = tool_calls_of(message, where) if role == "assistant" else []
    if calls:
        out["tool_calls"] = [{"type": "function", "function": c} for c in calls]
    return out, calls


def normalize_tool(entry: Any, i: int) -> dict:
    """One tools entry (``{"type": "function", "function": {...}}`` or the bare function) -> the record's tool."""
    fn = entry.get("function", entry) if isinstance(entry, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise BadConversation(f"tools[{i}]: expected {{\"type\": \"function\", \"function\": {{\"name\": str, "
                              f"\"parameters\": {{...}}}}}}, got {str(entry)[:80]!r}")
    params = fn.get("parameters")
    if params is None:
        params = {"type": "object", "properties": {}}
    desc = fn.get("description")
    return {"type": "function", "function": {"name": fn["name"], "description": desc if isinstance(desc, str) else "",
                                             "parameters": params}}


def conversation_key(obj: dict, tools: list[dict], messages: list[dict]) -> str:
    """What ties the requests of one conversation together (see the module doc); 16 hex digits."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    for holder in (obj, meta):
        for name in ID_FIELDS:
            if isinstance(holder.get(name), (str, int)) and not isinstance(holder.get(name), bool):
                return "id:" + str(holder[name])
    first_user = next((m["content"] for m in messages if m["role"] == "user"), "")
    digest = hashlib.sha256((canonical_json(tools) + "\x00" + norm_text(first_user)).encode("utf-8"))
    return digest.hexdigest()[:16]


def conversation_records(obj: Any, source: str, local_id: str,
                         split_of: Callable[[str], str]) -> Iterator[dict | Reject]:
    """One conversation object -> its call records (see the module doc), or one Reject naming the field.

    ``split_of(conversation key) -> split`` puts every record of the conversation on one side.
    """
    try:
        if not isinstance(obj, dict):
            raise BadConversation(f"expected an object {{tools, messages}}, got {_kind(obj)}")
        if not isinstance(obj.get("tools"), list):
            raise BadConversation(f"tools: expected a list of tools, got {_kind(obj.get('tools'))}")
        if not isinstance(obj.get("messages"), list) or not obj["messages"]:
            raise BadConversation(f"messages: expected a non-empty list, got {_kind(obj.get('messages'))}")
        tools = [normalize_tool(t, i) for i, t in enumerate(obj["tools"])]
        turns = [normalize_message(m, i) for i, m in enumerate(obj["messages"])]
    except BadConversation as e:
        yield Reject(source, "?", local_id, MALFORMED_RECORD, str(e)[:300], raw=keep_raw(obj))
        return
    messages = [m for m, _ in turns]
    key = conversation_key(obj, tools, messages)
    split = split_of(key)
    meta = {"dialogue": f"{source}:{key}"}
    last_only = "log_version" in obj        # a call-log line: only its last turn is the target's answer
    for t, (_, calls) in enumerate(turns):  # a turn without calls (a text answer) is no call example
        if calls and (not last_only or t == len(turns) - 1):
            yield make_record(source, split, f"{local_id}#t{t}", tools, messages[:t], calls, dict(meta))


def keep_raw(obj: Any) -> Any:
    """What a reject keeps of a hostile item: the item, or its first :data:`RAW_KEEP_CHARS` characters."""
    text = json.dumps(obj, ensure_ascii=False, default=repr)
    return obj if len(text) <= RAW_KEEP_CHARS else text[:RAW_KEEP_CHARS] + f"... ({len(text)} characters)"


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


# ---------------------------------------------------------------- files


def parse_file(path: str | Path, source: str, split: str | Callable[[str], str] = "train", *,
               label: str | None = None, limit: int | None = None) -> Iterator[dict | Reject]:
    """Records of one JSON-lines file of conversations, in line order (blank lines skipped).

    A line that is not UTF-8 / JSON / an object becomes a Reject naming ``file:line``; so does a conversation
    whose field is wrong; the rest of the file still lands. ``split`` is a split name or ``split_of(key)``;
    ``label`` (default: the file name) is how local ids name the file (``<label>:<line>#t<turn>``); ``limit``
    stops after that many non-blank lines. The generator returns the number of non-blank lines it read.
    """
    path = Path(path)
    label = label or path.name
    split_of = split if callable(split) else (lambda _key, s=split: s)
    read = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if limit is not None and read >= limit:
                break
            if raw.strip():
                read += 1
            where = f"{label}:{lineno}"
            try:
                obj = _decode_line(raw, lineno)
            except ValueError as e:
                yield Reject(source, "?", where, NOT_JSON, f"{path}:{lineno}: {e}",
                             raw=raw[:RAW_KEEP_CHARS].decode("utf-8", "replace"))
                continue
            if obj is None:
                continue
            for item in conversation_records(obj, source, where, split_of):
                if isinstance(item, Reject):
                    item = Reject(item.source, item.split, item.local_id, item.reason, f"{path}:{lineno}: "
                                  f"{item.detail}", raw=item.raw)
                yield item
    return read
