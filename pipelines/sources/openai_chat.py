"""OpenAI chat conversations (what OpenAI-compatible servers and clients log) -> records.

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

Messages are normalized as the chat server normalizes a request (:func:`~ooospec.runtime.formats.messages.
normalize_messages`: ``arguments`` JSON text decoded to an object, ``content: null`` -> ``""``, text parts joined,
``developer`` -> ``system``), then call ids, ``tool_call_id`` and ``name`` are dropped, so that the same
conversation logged twice is the same record. A tool without ``parameters`` takes no arguments (OpenAI's meaning:
``{"type": "object", "properties": {}}``).

What is wrong with a conversation is a :class:`~ooospec.pipelines.records.Reject` whose detail names the field
(``messages[3].tool_calls[0].function.arguments: not JSON ...``); schema validation of tools and calls happens
once, in the ingest stage, as for every source.

**Conversation key** (``meta.dialogue``, what ``dedupe`` and ``expand_slots`` keep on one side of a split): the
object's ``conversation_id`` (or ``metadata.conversation_id`` / ``session_id``) when it has one, else a hash of its
first user message (normalized) -- the requests of one agent conversation share it, and so do two conversations that
open with the same request, which therefore never straddle a split either (``dedupe`` would remove the training
one as a leak).
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
    make_record,
)
from ooospec.runtime.calls import norm_text
from ooospec.runtime.formats.messages import normalize_messages

LICENSE = "as declared by the user"
ID_FIELDS = ("conversation_id", "session_id", "dialogue_id")
NOT_JSON = "not_json"
RAW_KEEP_CHARS = 2000      # a reject keeps at most this much of a hostile item


class BadConversation(ValueError):
    """What is wrong with one conversation; the message names the field."""


# ---------------------------------------------------------------- pure mapping


def normalize_message(message: dict) -> tuple[dict, list[dict]]:
    """One message normalized by :func:`~ooospec.runtime.formats.messages.normalize_messages` -> (the record's
    message, without ``name`` / ``tool_call_id``, and the calls it makes)."""
    out = {k: v for k, v in message.items() if k in ("role", "content", "tool_calls")}
    return out, [tc["function"] for tc in out.get("tool_calls", ())]


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


def conversation_key(obj: dict, messages: list[dict]) -> str:
    """What ties the requests of one conversation together (see the module doc): ``id:<its id>``, else 16 hex
    digits of the hash of its first user message."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    for holder in (obj, meta):
        for name in ID_FIELDS:
            if isinstance(holder.get(name), (str, int)) and not isinstance(holder.get(name), bool):
                return "id:" + str(holder[name])
    first_user = next((m["content"] for m in messages if m["role"] == "user"), messages[0]["content"])
    return hashlib.sha256(norm_text(first_user).encode("utf-8")).hexdigest()[:16]


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
        turns = [normalize_message(m) for m in normalize_messages(obj["messages"])]
    except (BadConversation, ValueError) as e:
        yield Reject(source, "?", local_id, MALFORMED_RECORD, str(e)[:300], raw=keep_raw(obj))
        return
    messages = [m for m, _ in turns]
    key = conversation_key(obj, messages)
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
