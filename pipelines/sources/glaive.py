"""Glaive function-calling demos (LLaMA-Factory's 300-conversation en/zh excerpts) -> records.

Raw layout (``root`` = ``<datasets>/glaive_toolcall/raw``; datasets README §9.4)::

    glaive_toolcall_en_demo.json   -> split "en"
    glaive_toolcall_zh_demo.json   -> split "zh"   (meta.lang = "zh")

Each file is a JSON array of ShareGPT conversations ``{"conversations": [{"from": "human"|"gpt"|"function_call"|
"observation", "value": str}, ...], "tools": str}``. ``tools`` is a JSON *string* of OpenAI-style function docs
(``""`` for plain chat) and a ``function_call`` turn's value is a JSON *string* ``{"name", "arguments"}`` -- both
need a second ``json.loads`` (quirk 1; an ``arguments`` that is itself a string is decoded a third time).

**One record per ``function_call`` turn**: ``messages`` = the conversation before that turn (``human`` -> user,
``gpt`` -> assistant, an earlier ``function_call`` -> assistant with ``content: ""`` and ``tool_calls``,
``observation`` -> tool with the raw observation text), ``calls`` = that one call (Glaive never has parallel calls).
Conversations without tools yield nothing, and turns that are not calls are not records (neither is a Reject).
Local ids are ``<conversation index>-t<turn index>``; ``meta.dialogue`` = ``glaive/<split>/<conversation index>``
ties sibling records of one conversation together (en and zh are partly translations of each other, quirk 3 --
dedupe should treat them as near-duplicates).

Worked example (en conversation 0)::

    human "Hi, I have some ingredients ..."; gpt "Of course! ..."; human "I have chicken, bell peppers, and rice."
    function_call '{"name": "search_recipes", "arguments": {"ingredients": ["chicken", "bell peppers", "rice"]}}'
    -> id "glaive/en/0-t3", messages [user, assistant, user],
       calls [{"name": "search_recipes", "arguments": {"ingredients": ["chicken", "bell peppers", "rice"]}}]
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ooospec.pipelines.records import MALFORMED_RECORD, Reject, call, make_record, tool

SOURCE = "glaive"
LICENSE = "Apache-2.0"
UPSTREAM = "hiyouga/LLaMA-Factory@ff6d4d12eeb035d6ce06805a5733dd7b29f2ac30"

UNPARSEABLE_CALL = "unparseable_call"
UNPARSEABLE_TOOLS = "unparseable_tools"

SPLITS: dict[str, str] = {"en": "glaive_toolcall_en_demo.json", "zh": "glaive_toolcall_zh_demo.json"}
LANG: dict[str, str] = {"zh": "zh"}
ROLE = {"human": "user", "gpt": "assistant", "observation": "tool"}


def decode_call(value: str) -> dict:
    """A ``function_call`` turn's value -> ``{"name", "arguments": dict}`` (double / triple JSON decoding).

    >>> decode_call('{"name": "f", "arguments": "{\\\\"x\\\\": 1}"}')
    {'name': 'f', 'arguments': {'x': 1}}
    """
    obj = json.loads(value)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise TypeError("function_call value is not an object with a string 'name'")
    args: Any = obj.get("arguments", {})
    if isinstance(args, str):
        args = json.loads(args) if args.strip() else {}
    if not isinstance(args, dict):
        raise TypeError(f"arguments is {type(args).__name__}, not an object")
    return call(obj["name"], args)


def decode_tools(value: str) -> list[dict]:
    """The ``tools`` string -> record tools (``[]`` for ``""``)."""
    if not value or not value.strip():
        return []
    docs = json.loads(value)
    if not isinstance(docs, list):
        raise TypeError("tools is not a JSON list")
    return [tool(d["name"], d.get("description", ""), d.get("parameters") or {"type": "object", "properties": {}})
            for d in docs]


def tool_call_message(c: dict) -> dict:
    """An earlier call as an assistant message (``content`` empty, OpenAI ``tool_calls``)."""
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}]}


def parse_conversation(conv: dict, split: str, idx: int, where: str) -> Iterator[dict | Reject]:
    """All call records of one conversation, in turn order."""
    try:
        tools = decode_tools(conv.get("tools", ""))
    except (ValueError, KeyError, TypeError) as e:
        yield Reject(SOURCE, split, str(idx), UNPARSEABLE_TOOLS, f"{where}: {type(e).__name__}: {e}", raw=conv)
        return
    if not tools:
        return
    turns = conv.get("conversations")
    if not isinstance(turns, list):
        yield Reject(SOURCE, split, str(idx), MALFORMED_RECORD, f"{where}: 'conversations' is not a list", raw=conv)
        return
    meta: dict[str, Any] = {"dialogue": f"{SOURCE}/{split}/{idx}"}
    if split in LANG:
        meta["lang"] = LANG[split]
    messages: list[dict] = []
    for t, turn in enumerate(turns):
        frm, value = turn.get("from"), turn.get("value")
        local_id = f"{idx}-t{t}"
        if not isinstance(value, str):
            yield Reject(SOURCE, split, local_id, MALFORMED_RECORD, f"{where} turn {t}: value is not a string")
            return
        if frm == "function_call":
            try:
                c = decode_call(value)
            except (ValueError, TypeError) as e:
                yield Reject(SOURCE, split, local_id, UNPARSEABLE_CALL, f"{where} turn {t}: {e}"[:300], raw=turn)
                return  # later turns depend on this call
            yield make_record(SOURCE, split, local_id, copy.deepcopy(tools), copy.deepcopy(messages), [c], dict(meta))
            messages.append(tool_call_message(c))
        elif frm in ROLE:
            messages.append({"role": ROLE[frm], "content": value})
        else:
            yield Reject(SOURCE, split, local_id, MALFORMED_RECORD, f"{where} turn {t}: unknown role {frm!r}")
            return


def parse(root: Path) -> Iterator[dict | Reject]:
    """Both splits of :data:`SPLITS`, conversations in file order."""
    root = Path(root)
    for split, fname in SPLITS.items():
        with open(root / fname, encoding="utf-8") as f:
            convs = json.load(f)
        for idx, conv in enumerate(convs):
            yield from parse_conversation(conv, split, idx, f"{fname}[{idx}]")
