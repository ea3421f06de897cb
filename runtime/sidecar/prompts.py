"""The sidecar's contract: what training, the sidecar server and its client must agree on, in one torch-free module.

* layout: the texts of a request's shared block and its slot queries (:func:`build_wave`, :data:`LAYOUTS`,
  :data:`LAYOUT_VERSION` the default);
* tokenization: block and queries tokenized apart (:func:`encode_wave`);
* answers: their one serialization (:func:`~ooospec.runtime.calls.compact_json`), the gold answers
  (:func:`gold_answers`) and parsing;
* joining: a wave's answers into one call (:func:`join_slots`, :func:`join_answers`);
* adapter metadata: ``sidecar.json`` records the layout an adapter learned (:func:`read_metadata` returns it and
  refuses one this module cannot build).

``expand_slots`` builds its rows, ``train_sidecar`` packs them (:mod:`ooospec.pipelines.packing`), the sidecar
(:mod:`ooospec.runtime.sidecar.wave`, :mod:`ooospec.runtime.serve.sidecar_app`) answers waves, and the client
(:mod:`ooospec.runtime.sidecar.client`) builds and joins them -- all with this module. It imports no torch
(``tests/runtime/sidecar/test_prompts.py`` checks), so a client process never loads a model stack.

Layout 2, "context first": every query of a request shares ONE block of text -- the conversation, then every tool
with its parameters -- followed by a short per-slot query line. The block is
byte-identical for all queries of a request, so its KV is computed once: the runtime's wave
(:mod:`ooospec.runtime.sidecar.wave`) prefills the block and decodes every answer as a branch of one tree, and
training packs a request's block and all its query/answer segments into one sequence
(:mod:`ooospec.pipelines.packing`). An adapter records the layout it was trained on; the runtime builds that one.

Layouts (:data:`LAYOUTS`): 2 "context first" (above) and 3 "tools first" (the default, :data:`LAYOUT_VERSION`, and
the shipped adapter's: the same two sections in the other order, tools then conversation; same views, query lines
and answers). An agent keeps one toolbox across thousands of requests, so a tools-first block starts with text that
repeats across requests (a server may reuse its KV; this module only builds the texts). Every builder takes a
``layout`` argument (default :data:`LAYOUT_VERSION`).

Each answer is ONE compact JSON value (no spaces, ``ensure_ascii=False``) followed by EOS:

==================  ==========================  ==========================================================
form                query line                  answer
==================  ==========================  ==========================================================
``function_index``  ``Query: tool index``       the 0-based index of the tool in the block's list, e.g. ``1``
``argument``        ``Query: <tool>.<param>``   that parameter's value, e.g. ``"Paris"``, or ``null`` when
                                                that tool is not called next or the argument is omitted
``direct_call``     ``Query: call``             ``{"name":...,"arguments":{...}}`` (arguments in schema order)
==================  ==========================  ==========================================================

At request arrival the runtime builds :func:`build_wave` (the index query plus an argument query for EVERY
tool x parameter; the direct-call query optionally) and answers all of it in one pass; :func:`join_slots`
turns the answers into one call. The argument queries do not wait for the function choice: no serial
dependency. The cheaper "function-first" mode asks the same block in two stages, the index query, then the
argument queries of the few candidate tools only (:mod:`ooospec.runtime.sidecar.protocol`: its waves, candidates, join).

Views (compact, model-agnostic: no chat-template tokens, no ids; every line is stripped of trailing spaces so
that ``block + query`` tokenizes as ``block`` then ``query`` under byte-level BPE):

* conversation: one line per message, ``role: content`` with whitespace collapsed; when longer than
  :data:`MAX_CONTEXT_CHARS` the oldest messages are dropped (``(3 earlier messages omitted)``) and an over-long
  newest message keeps its tail. Calls already made in this turn (parallel calls) follow as ``call: {...}``.
* tools: ``[i] name - description`` (cut to :data:`MAX_DESCRIPTION_CHARS`), then one line per parameter
  ``  name (type, required|optional[, default=v]): description``. A type is ``string``, ``integer|null``,
  ``array[string]``, an enum ``"c"|"f"`` (at most :data:`MAX_ENUM_VALUES` values), ``any`` when the schema
  gives none or is unusable.

Worked example. Messages ``[{"role": "user", "content": "Weather in Paris,\\n in celsius?"}]``, tools
``get_weather(city: string, unit?: "celsius"|"fahrenheit")`` and ``get_time(tz: string)``. The block of layout 2
("context first") is the first eight lines below, from ``Conversation:`` to ``tz``; the block of layout 3 ("tools
first", the default) is the same two sections in the other order, the last eight lines, from ``Tools:`` on::

    Conversation:
    user: Weather in Paris, in celsius?
    Tools:
    [0] get_weather - Current weather for a city.
      city (string, required): City name.
      unit ("celsius"|"fahrenheit", optional, default="celsius"): Temperature unit.
    [1] get_time - Current time in a time zone.
      tz (string, required)
    Conversation:
    user: Weather in Paris, in celsius?

In both layouts the wave's queries are ``Query: tool index\\n`` (answer ``0``), ``Query: get_weather.city\\n``
(``"Paris"``), ``Query: get_weather.unit\\n`` (``"celsius"``) and ``Query: get_time.tz\\n`` (``null``); the
direct-call query ``Query: call\\n`` answers ``{"name":"get_weather","arguments":{"city":"Paris","unit":"celsius"}}``.
A full prompt is ``block + query``; the answer follows it directly (no trailing newline; EOS ends it).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ooospec.runtime import schemas
from ooospec.runtime.calls import compact_json
from ooospec.runtime.formats.common import first_value

Form = Literal["function_index", "argument", "direct_call"]
FORMS: tuple[Form, ...] = ("function_index", "argument", "direct_call")
WAVE_FORMS: tuple[Form, ...] = ("function_index", "argument")   # what the runtime asks at request arrival

LAYOUTS: dict[int, str] = {2: "context first", 3: "tools first"}   # every layout this module builds
LAYOUT_VERSION = 3              # the default layout: what new training uses and the shipped adapter learned (a new
                                # text change is a new layout)
MAX_CONTEXT_CHARS = 3000        # conversation view budget (characters, after whitespace collapsing)
MAX_DESCRIPTION_CHARS = 120     # per tool / parameter description
MAX_ENUM_VALUES = 12            # enum values shown in a type view, then "|..."

INDEX_QUERY = "Query: tool index\n"
CALL_QUERY = "Query: call\n"


# ---------------------------------------------------------------- JSON helpers

def first_json(text: str) -> Any:
    """The first JSON value at the start of ``text`` (leading whitespace and trailing text ignored).

    Raises ValueError when there is none, when it holds NaN / Infinity / an overflowing number, or nests deeper
    than :data:`~ooospec.runtime.formats.common.MAX_DEPTH` (the formats' one bounded JSON reader), and when
    ``text`` is not a string (a missing answer: None), like any other unusable answer.
    """
    if not isinstance(text, str):
        # ValueError like every other unusable answer: callers catch one exception type
        raise ValueError(f"sidecar answer must be a string, got {type(text).__name__}")  # noqa: TRY004
    try:
        return first_value(text)
    except ValueError as e:
        raise ValueError(f"sidecar answer is not a JSON value: {text[:80]!r} ({e})") from None


# ---------------------------------------------------------------- tool access (tolerant of malformed schemas)

def tool_parameters(tool: Any) -> dict[str, Any]:
    """``{parameter: sub-schema}`` in declaration order; ``{}`` for a tool without usable parameters."""
    return schemas.properties(schemas.tool_function(tool).get("parameters"))


def tool_required(tool: Any) -> list[str]:
    return schemas.required(schemas.tool_function(tool).get("parameters"))


# ---------------------------------------------------------------- text views

def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _description(obj: Any) -> str:
    desc = obj.get("description") if isinstance(obj, Mapping) else None
    return _cut(_one_line(desc), MAX_DESCRIPTION_CHARS) if isinstance(desc, str) else ""


def type_view(schema: Any) -> str:
    """Compact type of a JSON Schema: ``string``, ``integer|null``, ``array[string]``, ``"c"|"f"``, ``any``.

    Boolean and malformed schemas read as ``any`` (they constrain nothing a view can show).
    """
    return schemas.type_view(schemas.normalize(schema), MAX_ENUM_VALUES)


def parameter_line(name: str, schema: Any, required: bool) -> str:
    """``  name (type, required|optional[, default=v]): description``."""
    attrs = [type_view(schema), "required" if required else "optional"]
    if isinstance(schema, Mapping) and "default" in schema:
        try:
            attrs.append(f"default={compact_json(schema['default'])}")
        except (TypeError, ValueError):
            pass
    desc = _description(schema)
    return f"  {_one_line(name)} ({', '.join(attrs)})" + (f": {desc}" if desc else "")


def tool_view(index: int, tool: Any) -> str:
    """``[i] name - description`` and its parameter lines."""
    fn = schemas.tool_function(tool)
    desc = _description(fn)
    required = set(tool_required(tool))
    lines = [f"[{index}] {_one_line(schemas.tool_name(tool) or '?')}" + (f" - {desc}" if desc else "")]
    lines += [parameter_line(p, s, p in required) for p, s in tool_parameters(tool).items()]
    return "\n".join(lines)


def tools_view(tools: Sequence[Any]) -> str:
    """Every tool in request order (the index the function_index answer refers to), with its parameters."""
    return "\n".join(tool_view(i, t) for i, t in enumerate(tools))


def _message_text(message: Any) -> str:
    if not isinstance(message, Mapping):
        return f"?: {_one_line(message)}"
    content = message.get("content")
    if content is None:
        content = ""
    elif not isinstance(content, str):   # e.g. a list of content parts: show it as JSON, never crash
        content = json.dumps(content, ensure_ascii=False, default=str)
    return f"{_one_line(message.get('role', '?'))}: {_one_line(content)}".rstrip()


def context_view(messages: Sequence[Any], prior_calls: Sequence[Mapping] = ()) -> str:
    """The conversation as ``role: content`` lines, newest kept within :data:`MAX_CONTEXT_CHARS`.

    ``prior_calls`` are the calls already emitted in this assistant turn (for parallel calls the k-th call's
    queries see calls 0..k-1); they are appended as ``call: {"name":...,"arguments":...}`` lines.
    """
    lines = [_message_text(m) for m in messages]
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


def toolbox_messages(messages: Sequence[Any]) -> list[Any]:
    """The leading system messages: what a toolbox's block holds before any turn (``--warm-tools`` prefills it)."""
    n = next((i for i, m in enumerate(messages) if not isinstance(m, Mapping) or m.get("role") != "system"),
             len(messages))
    return list(messages[:n])


def check_layout(layout: Any) -> int:
    """``layout`` when it is one of :data:`LAYOUTS`; raises ValueError otherwise."""
    if isinstance(layout, bool) or layout not in LAYOUTS:
        raise ValueError(f"unknown sidecar prompt layout {layout!r}; known: "
                         + ", ".join(f"{k} ({v})" for k, v in LAYOUTS.items()))
    return layout


def shared_block(messages: Sequence[Any], tools: Sequence[Any], prior_calls: Sequence[Mapping] = (),
                 layout: int = LAYOUT_VERSION) -> str:
    """The block every query of a request shares: the conversation and the numbered tools with parameters, in
    the order of ``layout`` (2: conversation first, 3: tools first). Raises ValueError for an unknown layout."""
    context = f"Conversation:\n{context_view(messages, prior_calls)}\n"
    toolbox = f"Tools:\n{tools_view(tools)}\n"
    return toolbox + context if check_layout(layout) == 3 else context + toolbox


def argument_query(tool: Any, parameter: str) -> str:
    """``Query: <tool>.<parameter>\\n``. Raises ValueError if the tool lacks the parameter."""
    params = tool_parameters(tool)
    if parameter not in params:
        raise ValueError(f"tool {schemas.tool_name(tool)!r} has no parameter {parameter!r} (known: {list(params)})")
    return f"Query: {_one_line(schemas.tool_name(tool) or '?')}.{_one_line(parameter)}\n"


# ---------------------------------------------------------------- answers (training targets)

def function_index_answer(index: int) -> str:
    return compact_json(index)


def argument_answer(value: Any) -> str:
    """``None`` (omitted / function not called) becomes ``null``."""
    return compact_json(value)


def direct_call_answer(call: Mapping, tool: Any) -> str:
    """The call with its arguments in schema property order (extra keys last, sorted)."""
    props = list(tool_parameters(tool))
    args = call["arguments"]
    order = [p for p in props if p in args] + sorted(k for k in args if k not in props)
    return compact_json({"name": call["name"], "arguments": {k: args[k] for k in order}})


def gold_answers(queries: Sequence[SlotQuery], tools: Sequence[Any], call: Mapping) -> list[str]:
    """The answer each query should get when the next call is ``call`` (``{"name", "arguments"}``).

    Raises ValueError when ``call`` names no tool of ``tools``.
    """
    names = [schemas.tool_name(t) for t in tools]
    if call["name"] not in names:
        raise ValueError(f"call names {call['name']!r}, not one of the tools {names[:8]}")
    index = names.index(call["name"])
    out = []
    for q in queries:
        if q.form == "function_index":
            out.append(function_index_answer(index))
        elif q.form == "direct_call":
            out.append(direct_call_answer(call, tools[index]))
        else:
            out.append(argument_answer(call["arguments"].get(q.parameter) if q.function == call["name"] else None))
    return out


# ---------------------------------------------------------------- the request-level wave

@dataclass(frozen=True)
class SlotQuery:
    """One query of a wave. ``function``/``parameter`` are None for the index and direct-call queries."""

    form: Form
    function: str | None
    parameter: str | None
    text: str               # the query line(s) that follow the shared block


@dataclass(frozen=True)
class Wave:
    """A request's shared block and its slot queries; ``prompts()`` are the full texts (block + query)."""

    block: str
    queries: tuple[SlotQuery, ...]

    def prompts(self) -> list[str]:
        return [self.block + q.text for q in self.queries]


def build_wave(messages: Sequence[Any], tools: Sequence[Any], prior_calls: Sequence[Mapping] = (),
               with_direct_call: bool = False, layout: int = LAYOUT_VERSION) -> Wave:
    """The index query, one argument query per (tool, parameter) in request / schema order, then optionally the
    direct-call query.

    For tools ``f(a, b)`` and ``g(c)`` this is 4 queries: index, f.a, f.b, g.c (+ call). Tools without a usable
    name are listed in the block (their index still counts) but get no argument queries. ``layout`` orders the
    block (:func:`shared_block`); the queries are the same in every layout.
    """
    block = shared_block(messages, tools, prior_calls, layout)
    queries = [SlotQuery("function_index", None, None, INDEX_QUERY)]
    for tool in tools:
        name = schemas.tool_name(tool)
        if name is None:
            continue
        for p in tool_parameters(tool):
            queries.append(SlotQuery("argument", name, p, argument_query(tool, p)))
    if with_direct_call:
        queries.append(SlotQuery("direct_call", None, None, CALL_QUERY))
    return Wave(block, tuple(queries))


def encode_wave(tokenizer, wave: Wave) -> tuple[list[int], list[list[int]]]:
    """``(block_ids, [query_ids])``: the block and each query tokenized apart, no special tokens.

    A prompt's ids are ``block_ids + query_ids[i]``, in training (:mod:`ooospec.pipelines.packing`) and in the
    sidecar's wave alike; ``tokenizer`` is any Hugging Face tokenizer (called, never imported here).
    """
    block = tokenizer(wave.block, add_special_tokens=False)["input_ids"]
    queries = tokenizer([q.text for q in wave.queries], add_special_tokens=False)["input_ids"] if wave.queries else []
    return list(block), [list(q) for q in queries]


# ---------------------------------------------------------------- parsing sidecar answers

def parse_function_index(text: str, num_tools: int | None = None) -> int:
    """The tool index answered in ``text`` (``" 1<eos>..."`` -> 1). Raises ValueError if not a valid index."""
    value = first_json(text)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"function_index answer must be a non-negative integer, got {text[:80]!r}")
    if num_tools is not None and value >= num_tools:
        raise ValueError(f"function_index answer {value} out of range for {num_tools} tools")
    return value


def parse_argument_value(text: str) -> Any:
    """The JSON value answered in ``text``; ``None`` means null (omit). Raises ValueError if no JSON value."""
    return first_json(text)


def parse_direct_call(text: str) -> dict:
    """``{"name": str, "arguments": dict}`` from a direct_call answer; raises ValueError otherwise."""
    value = first_json(text)
    if not (isinstance(value, dict) and isinstance(value.get("name"), str)
            and isinstance(value.get("arguments"), dict)):
        # ValueError like every other unusable answer: callers catch one exception type
        raise ValueError(f"direct_call answer is not a call object: {text[:80]!r}")  # noqa: TRY004
    return {"name": value["name"], "arguments": value["arguments"]}


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


def join_slots(tools: Sequence[Any], index_text: str, argument_texts: Mapping[tuple[str, str], str],
               direct_call_text: str | None = None) -> dict | None:
    """Join a wave's answers into ``{"name", "arguments"}``; None when the index answer is unusable.

    ``argument_texts`` maps ``(function, parameter)`` to the raw answer. Null, unparseable or schema-invalid
    values are dropped (the hint just has fewer arguments); arguments come out in schema order. With
    ``direct_call_text`` the result also carries ``"direct_call"``: that answer parsed, validated against its
    tool (dropping invalid arguments), or None.
    """
    try:
        index = parse_function_index(index_text, len(tools))
    except ValueError:
        return None
    name = schemas.tool_name(tools[index])
    if name is None:
        return None
    args = {}
    for p, schema in tool_parameters(tools[index]).items():
        text = argument_texts.get((name, p))
        if text is None:
            continue
        try:
            value = parse_argument_value(text)
        except ValueError:
            continue
        if value is not None and _finite(value) and schemas.value_matches(value, schema):
            args[p] = value
    call: dict = {"name": name, "arguments": args}
    if direct_call_text is not None:
        call["direct_call"] = checked_direct_call(tools, direct_call_text)
    return call


def join_answers(tools: Sequence[Any], wave: Wave, answers: Sequence[str]) -> dict | None:
    """:func:`join_slots` over a wave's answers, given in the wave's query order."""
    index_text, direct, args = "", None, {}
    for q, a in zip(wave.queries, answers):
        if q.form == "function_index":
            index_text = a
        elif q.form == "direct_call":
            direct = a
        else:
            args[(q.function, q.parameter)] = a
    return join_slots(tools, index_text, args, direct)


def checked_direct_call(tools: Sequence[Any], text: str) -> dict | None:
    """A direct-call answer parsed and checked against ``tools``: unknown tool -> None, invalid or null arguments
    dropped (the same validation :func:`join_slots` applies to slot answers)."""
    try:
        call = parse_direct_call(text)
    except ValueError:
        return None
    tool = next((t for t in tools if schemas.tool_name(t) == call["name"]), None)
    if tool is None:
        return None
    params = tool_parameters(tool)
    args = {p: v for p, v in call["arguments"].items()
            if p in params and v is not None and _finite(v) and schemas.value_matches(v, params[p])}
    return {"name": call["name"], "arguments": args}


# ---------------------------------------------------------------- adapter metadata

SERVED_NAME = "sidecar"          # the model name a sidecar server answers to (vLLM: --lora-modules sidecar=DIR)
METADATA_FILE = "sidecar.json"   # next to the adapter: layout version, base, data/metrics summary


class LayoutMismatch(ValueError):
    """The adapter was trained on another prompt layout than this runtime builds."""


def layout_metadata(layout: int = LAYOUT_VERSION) -> dict[str, int]:
    """The part of ``sidecar.json`` the layout depends on: ``{"layout_version": layout}``."""
    return {"layout_version": check_layout(layout)}


def read_metadata(adapter_dir: str | os.PathLike, *, strict: bool = True) -> dict:
    """The adapter's ``sidecar.json``, whose ``layout_version`` is the layout to build its prompts with; raises
    :class:`LayoutMismatch` unless that is one of :data:`LAYOUTS`. ``strict=False``: as it is, unchecked, and
    ``{}`` for a file that is missing or not a JSON object (a report describing whatever folder it was given)."""
    path = Path(adapter_dir) / METADATA_FILE
    if not strict:
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return meta if isinstance(meta, dict) else {}
    if not path.is_file():
        raise FileNotFoundError(f"{adapter_dir}: no {METADATA_FILE}; is this a sidecar adapter folder "
                                "(made by `python -m ooospec.pipelines.train_sidecar`)?")
    meta = json.loads(path.read_text(encoding="utf-8"))
    found = meta.get("layout_version")
    if isinstance(found, bool) or found not in LAYOUTS:
        raise LayoutMismatch(
            f"{adapter_dir}: the adapter was trained on sidecar prompt layout {found!r}, but this runtime builds "
            f"layouts {sorted(LAYOUTS)} only; its answers would be meaningless. Retrain it "
            "(`dvc repro train_sidecar`) or use an ooo-spec release that builds that layout.")
    return meta
