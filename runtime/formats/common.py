"""Pieces every tool-call format shares: JSON scanning, call normalisation and prompt rendering.

A *call* is always ``{"name": str, "arguments": dict}`` here, whatever key the model wrote
(``arguments``, ``parameters``, or an OpenAI ``{"type": "function", "function": {...}}`` wrapper with the
arguments as a JSON string).
"""

from __future__ import annotations

import json
import re
from typing import Any

_DECODER = json.JSONDecoder(strict=False)  # strict=False: models put raw newlines inside strings


def function_schemas(tools: list[dict]) -> list[dict]:
    """The bare function schemas ``{"name", "description", "parameters"}`` of OpenAI-style or bare tools."""
    out = []
    for i, tool in enumerate(tools):
        fn = tool["function"] if tool.get("type") == "function" and "function" in tool else tool
        if not isinstance(fn.get("name"), str):
            raise TypeError(f"tool {i} has no string 'name': {json.dumps(tool)[:200]}")
        out.append(fn)
    return out


def wrap_tools(tools: list[dict]) -> list[dict]:
    """OpenAI-style ``{"type": "function", "function": schema}`` entries (what HF chat templates expect)."""
    return [{"type": "function", "function": fn} for fn in function_schemas(tools)]


def to_call(obj: Any) -> dict | None:
    """Normalise one decoded JSON value to ``{"name", "arguments"}``; None when it is not a call.

    >>> to_call({"name": "f", "parameters": {"x": 1}})
    {'name': 'f', 'arguments': {'x': 1}}
    >>> to_call({"type": "function", "function": {"name": "f", "arguments": "{\\"x\\": 1}"}})
    {'name': 'f', 'arguments': {'x': 1}}
    >>> to_call({"name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}}) is None
    True
    """
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict) and "name" not in obj:
        obj = obj["function"]
    if _is_tool_definition(obj):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = _DECODER.decode(args) if args.strip() else {}
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return {"name": name, "arguments": args}


def _is_tool_definition(obj: dict) -> bool:
    """A function *schema* (as listed in prompts), not a call: it has a description or a JSON-Schema object
    under ``parameters`` and no ``arguments``."""
    if "arguments" in obj:
        return False
    params = obj.get("parameters")
    schema_like = isinstance(params, dict) and params.get("type") == "object" and "properties" in params
    return "description" in obj or schema_like


def scan_json_values(text: str) -> list[Any]:
    """Every top-level JSON object/array embedded in ``text``, left to right (non-JSON text is skipped).

    >>> scan_json_values('sure: {"a": 1} and [2, {"b": 3}] {broken')
    [{'a': 1}, [2, {'b': 3}]]
    """
    values, i = [], 0
    while True:
        m = re.compile(r"[\[{]").search(text, i)
        if m is None:
            return values
        try:
            value, end = _DECODER.raw_decode(text, m.start())
        except json.JSONDecodeError:
            i = m.start() + 1
            continue
        values.append(value)
        i = end


def calls_in(text: str) -> list[dict]:
    """All calls in ``text``: JSON objects that look like calls, and lists of them."""
    calls = []
    for value in scan_json_values(text):
        for item in value if isinstance(value, list) else [value]:
            call = to_call(item)
            if call is not None:
                calls.append(call)
    return calls


def json_end(text: str, start: int = 0) -> int | None:
    """Index just past the first balanced JSON object/array at or after ``start``; None while still open.

    String-aware brace counting, so ``{"a": "}"}`` closes at the last brace.

    >>> json_end('x {"a": "}"} y')
    12
    >>> json_end('{"a": {"b": 1}') is None
    True
    """
    depth, in_str, esc = 0, False, False
    for i in range(start, len(text)):
        c = text[i]
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"' and depth:
            in_str = True
        elif c in "{[":
            depth += 1
        elif c in "}]" and depth:
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def dump_call(call: dict, args_key: str = "arguments") -> str:
    """The canonical one-line JSON of a call, ``{"name": ..., "<args_key>": {...}}``."""
    return json.dumps({"name": call["name"], args_key: call["arguments"]}, ensure_ascii=False)


def template_text(tokenizer) -> str:
    """The tokenizer's chat template as one string ('' when it has none; named templates joined)."""
    tpl = getattr(tokenizer, "chat_template", None)
    if isinstance(tpl, dict):
        return "\n".join(tpl.values())
    return tpl or ""


def fallback_system_prompt(tools: list[dict], prefix: str, suffix: str, args_key: str) -> str:
    """System text listing the tools as JSON, for templates that cannot render ``tools=``."""
    lines = [
        "You can call the following tools. To call one, reply with exactly",
        f'{prefix}{{"name": <tool name>, "{args_key}": <arguments as a JSON object>}}{suffix}',
        "Tools:",
    ]
    lines += [json.dumps(fn, ensure_ascii=False) for fn in function_schemas(tools)]
    return "\n".join(lines)


def _plain_messages(messages: list[dict], tools: list[dict], prefix: str, suffix: str,
                    args_key: str) -> list[dict]:
    """Rewrite a tool conversation into plain system/user/assistant messages with string content."""
    system = fallback_system_prompt(tools, prefix, suffix, args_key) if tools else ""
    out: list[dict] = []
    for msg in messages:
        role, content = msg["role"], msg.get("content") or ""
        if role == "system":
            system = f"{content}\n\n{system}" if system else content
            continue
        if role == "assistant" and msg.get("tool_calls"):
            calls = [to_call(tc) for tc in msg["tool_calls"]]
            content = (content + "\n" if content else "") + "\n".join(
                f"{prefix}{dump_call(c, args_key)}{suffix}" for c in calls if c is not None)
        elif role == "tool":
            role, content = "user", f"Tool result: {content}"
        out.append({"role": role, "content": content})
    return ([{"role": "system", "content": system}] if system else []) + out


def render_prompt(tokenizer, messages: list[dict], tools: list[dict], prefix: str, suffix: str,
                  args_key: str) -> str:
    """Render through the target's own chat template with ``tools=``; fall back when it has no tool support.

    Fallbacks (documented behaviour):
      * template mentions ``tools``: ``apply_chat_template(messages, tools=..., add_generation_prompt=True)``.
      * template without ``tools`` (e.g. SmolLM2's plain ChatML): the tools go into the system message as
        JSON lines with an example call; assistant tool calls become their call text; tool results become
        user turns ``"Tool result: ..."``; then the template renders these plain messages.
      * no template at all (e.g. Gemma 3 base): the same plain messages as ``"System: ...\\n\\nUser: ..."``
        blocks ending with ``"Assistant: "``.
    """
    tpl = template_text(tokenizer)
    if "tools" in tpl:
        return tokenizer.apply_chat_template(messages, tools=wrap_tools(tools) or None,
                                             add_generation_prompt=True, tokenize=False)
    plain = _plain_messages(messages, tools, prefix, suffix, args_key)
    if tpl:
        return tokenizer.apply_chat_template(plain, add_generation_prompt=True, tokenize=False)
    blocks = [f"{m['role'].capitalize()}: {m['content']}" for m in plain]
    return "\n\n".join(blocks + ["Assistant: "])
