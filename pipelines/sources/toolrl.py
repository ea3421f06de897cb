"""ToolRL SFT set (``rlla_sft.json``, Qian et al. 2025) -> records.

Raw layout (``root`` = ``<datasets>/toolrl/raw``; datasets README §9.5)::

    rlla_sft.json   -> split "sft"   (JSON array of {"instruction", "input", "output"}; 400 items)

* ``instruction`` = ToolRL's system prompt whose ``**Available Tools**`` block lists the tools as text::

      1. Name: Search Managers
      Description: Search for managers by name and retrieve their information
      Parameters: {"name": {"description": "...", "type": "string", "default": ""}}

  :func:`parse_tool_block` cuts it on ``^N. Name:`` and decodes ``Parameters`` with ``raw_decode``; each parameter
  becomes a JSON Schema property via :func:`~ooospec.pipelines.sources.pytypes.type_schema` (``str``/``string``
  -> string, ``float`` -> number, ``List[str]`` -> array of string, ``Tuple[float, float]`` -> 2-item array,
  ``str, optional`` -> string, ``Callable[...]`` -> no constraint), with the description and -- when not ``""``
  -- the ``default``.
  **Required**: no parameter is marked required. The source carries no ``required`` list (the ToolRL prompt shows
  none), and its ``default`` field is not a reliable signal: among parameters with ``default: ""`` and no
  ``, optional`` type, the gold calls omit 93 (xLAM's ``default`` is often an example value, ToolACE's ``""`` an
  absent default), so "no default => required" would reject 37 of the 346 call records.
* ``input`` = ``**Dialogue Records History**`` followed by ``<user>``/``<think>``/``<tool_call>``/``<obs>``/
  ``<response>`` blocks -> messages (user; assistant with ``content: ""`` + ``tool_calls``; tool with the ``<obs>``
  text; assistant with the ``<response>`` text). Earlier ``<think>`` blocks are dropped (generic filler in the
  multi-turn records, and reasoning is not part of the chat format here).
* ``output`` = ``<think> ... </think>`` then ``<tool_call>`` (one JSON object per line, ``{"name",
  "parameters"}``) and/or ``<response>``. Gold calls come from the first ``<tool_call>`` block **after**
  ``</think>`` (the thoughts mention ``<tool_call>`` themselves in 17 items), decoded with repeated
  ``raw_decode``. Response-only items (54) are not call examples: skipped, not rejected.

Gold values that are a string holding cut-off JSON for an array/object parameter (23 items, e.g.
``"genres": "[\"rock\""``) are rejected as ``truncated_json_value``: the intended value is lost upstream.
Gold argument values that are numeric strings for numeric parameters (and the like) are coerced to the declared
type (:func:`~ooospec.pipelines.sources.pytypes.coerce_arguments`) and listed in ``meta.coerced``.

**BFCL distractors.** 8 items list a tool whose description is identical to a BFCL function (README §9.5 quirk
4; indices 107, 166, 242, 282, 290, 320, 334, 395). They are recognised by a content fingerprint
(:func:`fingerprint`, so excerpts and reorderings still match) and get ``meta.bfcl_distractor = true`` so that
dedupe can drop them from training.

Local ids are the item's index in the array (``toolrl/sft/107``); ``meta.fingerprint`` identifies the item by
content.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ooospec.pipelines.records import MALFORMED_RECORD, Reject, call, make_record, tool
from ooospec.pipelines.sources.pytypes import coerce_arguments, type_schema

SOURCE = "toolrl"
LICENSE = "Apache-2.0 (ToolRL); upstream data: ToolACE Apache-2.0, xLAM-function-calling-60k CC-BY-4.0"
UPSTREAM = "qiancheng0/ToolRL@8cee13ec0ca72f0461da372a93a6fd8140dbb840"

UNPARSEABLE_CALL = "unparseable_call"
UNPARSEABLE_TOOLS = "unparseable_tools"
UNPARSEABLE_HISTORY = "unparseable_history"
DUPLICATE_TOOL_NAME = "duplicate_tool_name"
TRUNCATED_JSON_VALUE = "truncated_json_value"

SPLIT = "sft"
FILE = "rlla_sft.json"

# fingerprint -> index in rlla_sft.json of the 8 items listing a BFCL function doc as a distractor
BFCL_DISTRACTORS: dict[str, int] = {
    "a87e8e5c923b3bb5": 107, "e8a752d872483c68": 166, "1e064aa0b670a378": 242, "6f3f056e13ae5258": 282,
    "27240ebdbbc93bdd": 290, "e664f63a91d5590e": 320, "af466046434b75cb": 334, "3015da2358dfdca1": 395,
}

_TOOLS_RE = re.compile(r"\*\*Available Tools\*\*\n(.*?)\n\n\*\*Steps for Each Turn\*\*", re.DOTALL)
_ENTRY_RE = re.compile(r"^\d+\. Name: ", re.MULTILINE)
_BLOCK_RE = re.compile(r"<(user|think|tool_call|obs|response)>(.*?)</\1>", re.DOTALL)
_DECODER = json.JSONDecoder()


def fingerprint(item: dict) -> str:
    """First 16 hex digits of sha256(instruction NUL input NUL output): identifies an item by content."""
    text = "\x00".join([item.get("instruction", ""), item.get("input", ""), item.get("output", "")])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def param_schema(params: dict) -> dict:
    """``{param: {"description", "type", "default"}}`` -> a JSON Schema object (nothing required, see module doc).

    >>> param_schema({"ids": {"description": "IDs", "type": "List[int]", "default": ""}})
    {'type': 'object', 'properties': {'ids': {'type': 'array', 'items': {'type': 'integer'}, 'description': 'IDs'}}}
    """
    props = {}
    for name, spec in params.items():
        if not isinstance(spec, dict):
            raise TypeError(f"parameter {name!r} is {type(spec).__name__}, not an object")
        prop = type_schema(spec.get("type"))
        prop["description"] = spec.get("description", "")
        if spec.get("default", "") != "":
            prop["default"] = spec["default"]
        props[name] = prop
    return {"type": "object", "properties": props}


def parse_tool_block(instruction: str) -> list[dict]:
    """The ``**Available Tools**`` list -> record tools, in listed order."""
    m = _TOOLS_RE.search(instruction)
    if m is None:
        raise ValueError("no '**Available Tools**' ... '**Steps for Each Turn**' block")
    starts = [e.end() for e in _ENTRY_RE.finditer(m.group(1))]
    ends = [e.start() for e in _ENTRY_RE.finditer(m.group(1))][1:] + [len(m.group(1))]
    tools = []
    for s, e in zip(starts, ends):
        entry = m.group(1)[s:e]
        name, sep, rest = entry.partition("\nDescription: ")
        desc, sep2, params_text = rest.rpartition("\nParameters: ")
        if not sep or not sep2:
            raise ValueError(f"tool entry {entry[:60]!r} lacks 'Description:' or 'Parameters:'")
        params, _ = _DECODER.raw_decode(params_text.strip())
        if not isinstance(params, dict):
            raise TypeError(f"tool {name!r}: Parameters is not a JSON object")
        tools.append(tool(name.strip(), desc.strip(), param_schema(params)))
    if not tools:
        raise ValueError("empty tool list")
    return tools


def decode_calls(block: str) -> list[dict]:
    """A ``<tool_call>`` block body (JSON objects, one per line) -> ``[{"name", "arguments"}]``.

    >>> decode_calls('\\n{"name": "a", "parameters": {"x": 1}}\\n{"name": "b", "parameters": {}}\\n')
    [{'name': 'a', 'arguments': {'x': 1}}, {'name': 'b', 'arguments': {}}]
    """
    calls, pos = [], 0
    while True:
        while pos < len(block) and block[pos].isspace():
            pos += 1
        if pos >= len(block):
            return calls
        obj, pos = _DECODER.raw_decode(block, pos)
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise TypeError(f"call {len(calls)} is not an object with a string 'name'")
        args = obj.get("parameters", obj.get("arguments", {}))
        if not isinstance(args, dict):
            raise TypeError(f"call {obj['name']!r}: parameters is {type(args).__name__}, not an object")
        calls.append(call(obj["name"], args))


def truncated_json_arguments(arguments: dict, parameters: dict) -> list[str]:
    """Names of arguments whose value is a string holding a *cut-off* JSON array/object for an array/object parameter.

    23 items carry such values (``"team_members": "[{\"name\": \"Alice\""``): the nested JSON was truncated
    upstream, so the intended value is lost. They become ``truncated_json_value`` rejects rather than generic schema
    violations.

    >>> truncated_json_arguments({"g": '["rock"', "h": "x"}, {"properties": {"g": {"type": "array"}}})
    ['g']
    """
    props = parameters.get("properties", {})
    out = []
    for name, value in arguments.items():
        if (isinstance(value, str) and value[:1] in "[{" and value
                and props.get(name, {}).get("type") in ("array", "object")):
            try:
                json.loads(value)
            except ValueError:
                out.append(name)
    return out


def gold_block(output: str) -> str | None:
    """Body of the first ``<tool_call>`` block after ``</think>`` (None for a response-only output)."""
    tail = output.split("</think>", 1)[1] if "</think>" in output else output
    m = re.search(r"<tool_call>(.*?)</tool_call>", tail, re.DOTALL)
    return m.group(1) if m else None


def history_messages(text: str) -> list[dict]:
    """``**Dialogue Records History**`` blocks -> messages (``<think>`` dropped)."""
    messages: list[dict] = []
    for m in _BLOCK_RE.finditer(text):
        kind, body = m.group(1), m.group(2).strip()
        if kind == "user":
            messages.append({"role": "user", "content": body})
        elif kind == "tool_call":
            messages.append({"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in decode_calls(body)]})
        elif kind == "obs":
            messages.append({"role": "tool", "content": body})
        elif kind == "response":
            messages.append({"role": "assistant", "content": body})
    if not messages or messages[-1]["role"] not in ("user", "tool"):
        raise ValueError("history does not end with a user turn or a tool result")
    return messages


def parse_item(item: dict, idx: int) -> dict | Reject | None:
    """One array item -> record, Reject, or None (response-only: not a call example)."""
    local_id, where = str(idx), f"{FILE}[{idx}]"
    try:
        instruction, inp, output = item["instruction"], item["input"], item["output"]
    except (KeyError, TypeError) as e:
        return Reject(SOURCE, SPLIT, local_id, MALFORMED_RECORD, f"{where}: missing {e}", raw=item)
    block = gold_block(output)
    if block is None:
        return None
    try:
        calls = decode_calls(block)
    except (ValueError, TypeError) as e:  # json.JSONDecodeError is a ValueError
        return Reject(SOURCE, SPLIT, local_id, UNPARSEABLE_CALL, f"{where}: {e}"[:300], raw=item)
    try:
        tools = parse_tool_block(instruction)
    except (ValueError, TypeError) as e:
        return Reject(SOURCE, SPLIT, local_id, UNPARSEABLE_TOOLS, f"{where}: {e}"[:300], raw=item)
    names = [t["function"]["name"] for t in tools]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        return Reject(SOURCE, SPLIT, local_id, DUPLICATE_TOOL_NAME, f"{where}: tools listed twice: {dups}", raw=item)
    try:
        messages = history_messages(inp)
    except (ValueError, TypeError) as e:
        return Reject(SOURCE, SPLIT, local_id, UNPARSEABLE_HISTORY, f"{where}: {e}"[:300], raw=item)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    coerced: list[str] = []
    for i, c in enumerate(calls):
        if c["name"] in schemas:
            broken = truncated_json_arguments(c["arguments"], schemas[c["name"]])
            if broken:
                return Reject(SOURCE, SPLIT, local_id, TRUNCATED_JSON_VALUE,
                              f"{where}: call {i} ({c['name']!r}) {broken[0]}={c['arguments'][broken[0]]!r}"[:300],
                              raw=item)
            c["arguments"], notes = coerce_arguments(c["arguments"], schemas[c["name"]])
            coerced += [f"{i}.{p}" for p in notes]
    fp = fingerprint(item)
    meta: dict[str, Any] = {"fingerprint": fp}
    if coerced:
        meta["coerced"] = coerced
    if fp in BFCL_DISTRACTORS:
        meta["bfcl_distractor"] = True
    return make_record(SOURCE, SPLIT, local_id, tools, messages, calls, meta)


def parse(root: Path) -> Iterator[dict | Reject]:
    """All call records of ``rlla_sft.json``, in file order."""
    with open(Path(root) / FILE, encoding="utf-8") as f:
        items = json.load(f)
    for idx, item in enumerate(items):
        out = parse_item(item, idx)
        if out is not None:
            yield out
