"""Pieces every tool-call format shares: JSON scanning, call normalisation and prompt rendering.

A *call* is always ``{"name": str, "arguments": dict}`` here, whatever key the model wrote
(``arguments``, ``parameters``, or an OpenAI ``{"type": "function", "function": {...}}`` wrapper with the
arguments as a JSON string).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_DEPTH = 100  # JSON nesting a parsed value may have; a deeper value is skipped like any non-JSON text


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} overflows a float")
    return value


# strict=False: models put raw newlines inside strings; NaN / Infinity / 1e999 are not JSON values
_DECODER = json.JSONDecoder(strict=False, parse_constant=_reject_constant, parse_float=_finite_float)


def function_schemas(tools: list[dict]) -> list[dict]:
    """The bare function schemas ``{"name", "description", "parameters"}`` of OpenAI-style or bare tools.

    Raises TypeError for a tool that is not an object or has no string ``name``.
    """
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise TypeError(f"tool {i} is a {type(tool).__name__}, not an object: {str(tool)[:200]}")
        fn = tool["function"] if tool.get("type") == "function" and "function" in tool else tool
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise TypeError(f"tool {i} has no string 'name': {json.dumps(tool, default=str)[:200]}")
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
            args = loads(args) if args.strip() else {}
        except ValueError:
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


_WS = re.compile(r"[ \t\n\r]*")
# string body after the opening quote: unambiguous (each loop turn starts at a backslash), so linear even
# when it fails; raw control characters are allowed (strict=False)
_STRING_BODY = re.compile(r'[^"\\]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\]*)*')
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
# a bracket that can open JSON at all: "{" before a key or "}", "[" before a value or "]" (the rest is skipped
# at C speed, so prose or a model looping on "{" costs no Python-level scan)
_OPENER = re.compile(r'\{(?=[ \t\n\r]*["}])|\[(?=[ \t\n\r]*[-0-9tfn"\[\]{])')
_KEY_OR_END, _KEY, _COLON, _VALUE_OR_END, _VALUE, _COMMA_OR_END = range(6)


def _scan(text: str, start: int, closes: dict[int, int], broken: set[int]) -> tuple[int | None, int]:
    """Check the JSON syntax of the object/array opening at ``start``, without recursion.

    Returns ``(end, stop)``: ``end`` is just past the value (None when it is not JSON or nests deeper than
    :data:`MAX_DEPTH`) and ``stop`` is the last position read. Every container met on the way is recorded:
    ``closes[open] = end`` for those that closed, ``broken`` for those still open when the syntax failed
    (a fresh scan from them would fail at the same place), so no bracket is scanned twice from the outside.
    """
    n = len(text)
    stack = [(start, text[start] == "{")]
    expect = _KEY_OR_END if stack[0][1] else _VALUE_OR_END
    i = start + 1
    while True:
        i = _WS.match(text, i).end()
        if i >= n:
            break
        c = text[i]
        is_object = stack[-1][1]
        if expect == _COLON:
            if c != ":":
                break
            i, expect = i + 1, _VALUE
        elif expect == _COMMA_OR_END and c == ",":
            i, expect = i + 1, (_KEY if is_object else _VALUE)
        elif c == ("}" if is_object else "]") and expect in (_KEY_OR_END, _VALUE_OR_END, _COMMA_OR_END):
            opened, _ = stack.pop()
            i += 1
            closes[opened] = i
            if not stack:
                return i, i
            expect = _COMMA_OR_END
        elif c == '"' and expect in (_KEY_OR_END, _KEY, _VALUE, _VALUE_OR_END):
            end = _STRING_BODY.match(text, i + 1).end()
            if end >= n or text[end] != '"':
                i = end
                break
            i, expect = end + 1, (_COLON if expect in (_KEY_OR_END, _KEY) else _COMMA_OR_END)
        elif expect not in (_VALUE, _VALUE_OR_END):
            break
        elif c in "{[":
            if len(stack) >= MAX_DEPTH:
                break
            stack.append((i, c == "{"))
            i, expect = i + 1, (_KEY_OR_END if c == "{" else _VALUE_OR_END)
        else:
            m = _NUMBER.match(text, i)
            if m is not None:
                i = m.end()
            elif text.startswith(("true", "null"), i):
                i += 4
            elif text.startswith("false", i):
                i += 5
            else:
                break
            expect = _COMMA_OR_END
    broken.update(pos for pos, _ in stack)
    return None, min(i, n)


def scan_json_values(text: str) -> list[Any]:
    """Every top-level JSON object/array embedded in ``text``, left to right (non-JSON text is skipped).

    Linear time: each bracket is checked by one syntax scan (:func:`_scan`) that also settles the brackets
    nested in it, so an unclosed ``"{" * 100_000`` is read once, not once per bracket. Values nesting deeper
    than :data:`MAX_DEPTH`, and ``NaN`` / ``Infinity`` / overflowing numbers, are not JSON here. A scan that
    would read the text more than 8 times over in total stops (only contrived text gets there).

    >>> scan_json_values('sure: {"a": 1} and [2, {"b": 3}] {broken')
    [{'a': 1}, [2, {'b': 3}]]
    """
    values: list[Any] = []
    closes: dict[int, int] = {}
    broken: set[int] = set()
    budget = 8 * len(text) + 4096
    i = 0
    for m in _OPENER.finditer(text):
        p = m.start()
        if p < i or p in broken:
            continue
        end = closes.get(p)
        if end is None:
            end, stop = _scan(text, p, closes, broken)
            budget -= stop - p
            if end is None:
                if budget < 0:
                    break
                continue
        try:
            value, _ = _DECODER.raw_decode(text, p)
        except (ValueError, RecursionError):  # NaN, an overflowing float, an integer past int_max_str_digits
            continue
        values.append(value)
        i = end
    return values


def first_value(text: str) -> Any:
    """The JSON value at the start of ``text`` (leading whitespace skipped, any text after it ignored), in
    bounded depth. Raises ValueError when there is none, it holds NaN / Infinity / an overflowing number, or it
    nests deeper than :data:`MAX_DEPTH` (never RecursionError).

    >>> first_value(' {"a": [1, 2]} and more')
    {'a': [1, 2]}
    """
    return _first(text)[0]


def _first(text: str) -> tuple[Any, int]:
    start = _WS.match(text).end()
    if start < len(text) and text[start] in "{[":
        end, _ = _scan(text, start, {}, set())
        if end is None:
            raise ValueError(f"not a JSON value within depth {MAX_DEPTH}: {text[start:start + 80]!r}")
    try:
        return _DECODER.raw_decode(text, start)
    except RecursionError:
        raise ValueError(f"JSON nests too deep: {text[start:start + 80]!r}") from None


def loads(text: str) -> Any:
    """``json.loads`` in bounded depth: the one JSON value that ``text`` holds (whitespace around it allowed).

    Raises ValueError when it is not exactly one JSON value, holds NaN / Infinity, or nests deeper than
    :data:`MAX_DEPTH` (never RecursionError).
    """
    value, end = _first(text)
    if _WS.match(text, end).end() != len(text):
        raise ValueError(f"extra text after the JSON value: {text[end:end + 80]!r}")
    return value


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


def renderers(prefix: str, suffix: str, args_key: str):
    """A format module's ``(render_prompt, render_call)`` from its call syntax::

        render_prompt, render_call = common.renderers(call_prefix, call_suffix, args_key)

    ``render_prompt(tokenizer, messages, tools)`` is :func:`render_prompt` (fallbacks included);
    ``render_call(call)`` is the exact text of one call, prefix and suffix included.
    """

    def format_prompt(tokenizer, messages: list[dict], tools: list[dict]) -> str:
        return render_prompt(tokenizer, messages, tools, prefix, suffix, args_key)

    def format_call(call: dict) -> str:
        return prefix + dump_call(call, args_key) + suffix

    format_prompt.__name__, format_call.__name__ = "render_prompt", "render_call"
    return format_prompt, format_call
