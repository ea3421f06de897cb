"""Text prompts for the OoO-Spec sidecar: one builder shared by training (expand_slots) and the runtime wave.

The sidecar answers three kinds of slot query (OoO-Spec, "three supervision forms"), each a plain-text prompt
whose answer is ONE compact JSON value (no spaces, ``ensure_ascii=False``) followed by EOS:

==================  =========================================  ==========================================
form                prompt shows                               completion
==================  =========================================  ==========================================
``function_index``  conversation + numbered tool signatures    the 0-based index of the tool, e.g. ``1``
``argument``        conversation + ONE function's schema       that parameter's value, e.g. ``"Paris"``,
                    + the parameter name                       or ``null`` when the function would not be
                                                               called or the argument is omitted
``direct_call``     conversation + numbered tool signatures    ``{"name":...,"arguments":{...}}``
==================  =========================================  ==========================================

At request arrival the runtime sends :func:`slot_queries` (the index query plus an argument query for EVERY
function x parameter) as one batch, greedy; :func:`join_slots` turns the answers into one call. Because the
argument queries do not wait for the function choice, the wave has no serial dependency.

Text views (compact, model-agnostic: no chat-template tokens, no ids):

* conversation: one line per message, ``role: content`` with whitespace collapsed; when longer than
  :data:`MAX_CONTEXT_CHARS` the oldest messages are dropped (``(3 earlier messages omitted)``) and an over-long
  newest message keeps its tail. Calls already made in this turn (parallel calls) follow as ``call: {...}`` lines.
* tool signature: ``name(required: type, optional?: type) - description`` with the description cut to
  :data:`MAX_DESCRIPTION_CHARS`; a type is ``string``, ``integer``, ``array[string]``, an enum
  ``"c"|"f"``, ``any`` when the schema gives none.
* function schema: the signature's first line, then one line per parameter
  ``  name (type, required|optional[, default=v]): description``.

Worked example. Messages ``[{"role": "user", "content": "Weather in Paris,\\n in celsius?"}]``, tools
``get_weather(city: string, unit?: "celsius"|"fahrenheit")`` and ``get_time(tz: string)``.
``argument_prompt(messages, tools[0], "unit")`` is::

    Task: argument
    Conversation:
    user: Weather in Paris, in celsius?
    Function:
    get_weather - Current weather for a city.
      city (string, required): City name.
      unit ("celsius"|"fahrenheit", optional, default="celsius"): Temperature unit.
    Parameter: unit
    Answer: the JSON value of "unit" if get_weather is called next, else null.

and its completion is ``"celsius"``; the same query for ``get_time``/``tz`` has completion ``null``.
``function_index_prompt(messages, tools)`` ends with::

    Tools:
    [0] get_weather(city: string, unit?: "celsius"|"fahrenheit") - Current weather for a city.
    [1] get_time(tz: string) - Current time in a time zone.
    Answer: the index of the tool to call next, as JSON.

with completion ``0``; ``direct_call_prompt`` has the same body and the completion
``{"name":"get_weather","arguments":{"city":"Paris","unit":"celsius"}}`` (arguments in schema order).
Every prompt ends with a newline; the completion carries no trailing newline (the trainer appends EOS).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Form = Literal["function_index", "argument", "direct_call"]
FORMS: tuple[Form, ...] = ("function_index", "argument", "direct_call")

MAX_CONTEXT_CHARS = 3000        # conversation view budget (characters, after whitespace collapsing)
MAX_DESCRIPTION_CHARS = 160     # per tool / parameter description
MAX_ENUM_VALUES = 12            # enum values shown in a type view, then "|..."


# ---------------------------------------------------------------- JSON helpers

def compact_json(value: Any) -> str:
    """The one serialization of sidecar answers: ``{"a":[1,"é"]}`` (no spaces, keys in their given order)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _first_json(text: str) -> Any:
    """The first JSON value at the start of ``text`` (leading whitespace and trailing text ignored)."""
    stripped = text.lstrip()
    try:
        value, _ = json.JSONDecoder().raw_decode(stripped)
    except json.JSONDecodeError as e:
        raise ValueError(f"sidecar answer is not a JSON value: {text[:80]!r} ({e.msg})") from None
    return value


def _function(tool: Mapping) -> Mapping:
    """The function dict of an OpenAI-style tool entry ``{"type": "function", "function": {...}}``."""
    return tool.get("function", tool)


def _properties(fn: Mapping) -> Mapping[str, Mapping]:
    return (fn.get("parameters") or {}).get("properties") or {}


# ---------------------------------------------------------------- text views

def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def type_view(schema: Mapping) -> str:
    """Compact type of a JSON Schema: ``string``, ``integer|null``, ``array[string]``, ``"c"|"f"``, ``any``."""
    if "enum" in schema:
        values = [compact_json(v) for v in schema["enum"][:MAX_ENUM_VALUES]]
        return "|".join(values) + ("|..." if len(schema["enum"]) > MAX_ENUM_VALUES else "")
    if "const" in schema:
        return compact_json(schema["const"])
    t = schema.get("type")
    if isinstance(t, list):
        return "|".join(str(x) for x in t)
    if t == "array" and isinstance(schema.get("items"), Mapping):
        return f"array[{type_view(schema['items'])}]"
    if t is None:
        variants = schema.get("anyOf") or schema.get("oneOf")
        return "|".join(type_view(v) for v in variants) if variants else "any"
    return str(t)


def signature_view(tool: Mapping) -> str:
    """``name(a: string, b?: integer) - description``: optional parameters carry ``?``."""
    fn = _function(tool)
    required = set((fn.get("parameters") or {}).get("required") or [])
    params = ", ".join(f"{p}{'' if p in required else '?'}: {type_view(s)}" for p, s in _properties(fn).items())
    desc = _cut(_one_line(fn.get("description") or ""), MAX_DESCRIPTION_CHARS)
    return f"{fn['name']}({params})" + (f" - {desc}" if desc else "")


def schema_view(tool: Mapping) -> str:
    """One function in detail: ``name - description`` then ``  param (type, required|optional): desc`` lines."""
    fn = _function(tool)
    required = set((fn.get("parameters") or {}).get("required") or [])
    desc = _cut(_one_line(fn.get("description") or ""), MAX_DESCRIPTION_CHARS)
    lines = [fn["name"] + (f" - {desc}" if desc else "")]
    for p, s in _properties(fn).items():
        attrs = [type_view(s), "required" if p in required else "optional"]
        if "default" in s:
            attrs.append(f"default={compact_json(s['default'])}")
        pdesc = _cut(_one_line(s.get("description") or ""), MAX_DESCRIPTION_CHARS)
        lines.append(f"  {p} ({', '.join(attrs)})" + (f": {pdesc}" if pdesc else ""))
    return "\n".join(lines)


def tool_list_view(tools: Sequence[Mapping]) -> str:
    """``[0] sig`` lines, one per tool, in request order (the index the function_index answer refers to)."""
    return "\n".join(f"[{i}] {signature_view(t)}" for i, t in enumerate(tools))


def context_view(messages: Sequence[Mapping], prior_calls: Sequence[Mapping] = ()) -> str:
    """The conversation as ``role: content`` lines, newest kept within :data:`MAX_CONTEXT_CHARS`.

    ``prior_calls`` are the calls already emitted in this assistant turn (for parallel calls the k-th call's
    queries see calls 0..k-1); they are appended as ``call: {"name":...,"arguments":...}`` lines.
    """
    lines = [f"{m['role']}: {_one_line(m['content'])}" for m in messages]
    kept: list[str] = []
    used = 0
    for line in reversed(lines):
        if used + len(line) + 1 > MAX_CONTEXT_CHARS:
            if not kept:  # the newest message alone is too long: keep its tail
                kept.append("..." + line[-(MAX_CONTEXT_CHARS - 3):])
            break
        kept.append(line)
        used += len(line) + 1
    omitted = len(lines) - len(kept)
    out = ([f"({omitted} earlier messages omitted)"] if omitted else []) + kept[::-1]
    out += [f"call: {compact_json({'name': c['name'], 'arguments': c['arguments']})}" for c in prior_calls]
    return "\n".join(out)


# ---------------------------------------------------------------- prompts

def function_index_prompt(messages: Sequence[Mapping], tools: Sequence[Mapping],
                          prior_calls: Sequence[Mapping] = ()) -> str:
    """Which tool is called next? Answer: its 0-based index in ``tools`` as JSON (``2``)."""
    return (f"Task: function_index\nConversation:\n{context_view(messages, prior_calls)}\n"
            f"Tools:\n{tool_list_view(tools)}\n"
            "Answer: the index of the tool to call next, as JSON.\n")


def argument_prompt(messages: Sequence[Mapping], tool: Mapping, parameter: str,
                    prior_calls: Sequence[Mapping] = ()) -> str:
    """The value of ``parameter`` if ``tool`` is called next, else ``null``. Raises if the tool lacks it."""
    fn = _function(tool)
    if parameter not in _properties(fn):
        raise ValueError(f"tool {fn['name']!r} has no parameter {parameter!r} "
                         f"(known: {list(_properties(fn))})")
    return (f"Task: argument\nConversation:\n{context_view(messages, prior_calls)}\n"
            f"Function:\n{schema_view(tool)}\n"
            f"Parameter: {parameter}\n"
            f"Answer: the JSON value of {json.dumps(parameter, ensure_ascii=False)} "
            f"if {fn['name']} is called next, else null.\n")


def direct_call_prompt(messages: Sequence[Mapping], tools: Sequence[Mapping],
                       prior_calls: Sequence[Mapping] = ()) -> str:
    """The whole next call as compact JSON ``{"name":...,"arguments":{...}}``."""
    return (f"Task: direct_call\nConversation:\n{context_view(messages, prior_calls)}\n"
            f"Tools:\n{tool_list_view(tools)}\n"
            'Answer: the next call as JSON {"name":...,"arguments":{...}}.\n')


# ---------------------------------------------------------------- completions (training targets)

def function_index_completion(index: int) -> str:
    return compact_json(index)


def argument_completion(value: Any) -> str:
    """``None`` (omitted / function not called) becomes ``null``."""
    return compact_json(value)


def direct_call_completion(call: Mapping, tool: Mapping) -> str:
    """The call with its arguments in schema property order (extra keys last, sorted)."""
    props = list(_properties(_function(tool)))
    args = call["arguments"]
    order = [p for p in props if p in args] + sorted(k for k in args if k not in props)
    return compact_json({"name": call["name"], "arguments": {k: args[k] for k in order}})


# ---------------------------------------------------------------- parsing sidecar answers

def parse_function_index(text: str, num_tools: int | None = None) -> int:
    """The tool index answered in ``text`` (``" 1<eos>..."`` -> 1). Raises ValueError if not a valid index."""
    value = _first_json(text)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"function_index answer must be a non-negative integer, got {text[:80]!r}")
    if num_tools is not None and value >= num_tools:
        raise ValueError(f"function_index answer {value} out of range for {num_tools} tools")
    return value


def parse_argument_value(text: str) -> Any:
    """The JSON value answered in ``text``; ``None`` means null (omit). Raises ValueError if no JSON value."""
    return _first_json(text)


def parse_direct_call(text: str) -> dict:
    """``{"name": str, "arguments": dict}`` from a direct_call answer; raises ValueError otherwise."""
    value = _first_json(text)
    if not (isinstance(value, dict) and isinstance(value.get("name"), str)
            and isinstance(value.get("arguments"), dict)):
        # ValueError like every other unusable answer: callers catch one exception type
        raise ValueError(f"direct_call answer is not a call object: {text[:80]!r}")  # noqa: TRY004
    return {"name": value["name"], "arguments": value["arguments"]}


# ---------------------------------------------------------------- the request-level wave

@dataclass(frozen=True)
class SlotQuery:
    """One prompt of the wave. ``function``/``parameter`` are None for the function_index query."""

    form: Form
    function: str | None
    parameter: str | None
    prompt: str


def slot_queries(messages: Sequence[Mapping], tools: Sequence[Mapping],
                 prior_calls: Sequence[Mapping] = ()) -> list[SlotQuery]:
    """The index query, then one argument query per (tool, parameter) in request / schema order.

    For tools ``f(a, b)`` and ``g(c)`` this is 4 queries: index, f.a, f.b, g.c.
    """
    queries = [SlotQuery("function_index", None, None, function_index_prompt(messages, tools, prior_calls))]
    for tool in tools:
        fn = _function(tool)
        for p in _properties(fn):
            queries.append(SlotQuery("argument", fn["name"], p, argument_prompt(messages, tool, p, prior_calls)))
    return queries


def join_slots(tools: Sequence[Mapping], index_text: str,
               argument_texts: Mapping[tuple[str, str], str]) -> dict | None:
    """Join the wave's answers into ``{"name", "arguments"}``; None when the index answer is unusable.

    ``argument_texts`` maps ``(function, parameter)`` to the raw answer; null or unparseable answers are
    dropped (the hint just has fewer arguments), arguments come out in schema order.
    """
    try:
        index = parse_function_index(index_text, len(tools))
    except ValueError:
        return None
    fn = _function(tools[index])
    args = {}
    for p in _properties(fn):
        text = argument_texts.get((fn["name"], p))
        if text is None:
            continue
        try:
            value = parse_argument_value(text)
        except ValueError:
            continue
        if value is not None:
            args[p] = value
    return {"name": fn["name"], "arguments": args}
