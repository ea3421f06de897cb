"""ToolAlpaca (Tang et al., 2023) evaluation sets -> records.

Raw layout (``root`` = ``<datasets>/toolalpaca/raw``, datasets README §4 and §7)::

    eval_real.json       -> split "eval-real"   (11 real APIs, 114 instructions)
    eval_simulated.json  -> split "eval-sim"    (10 simulated APIs, 100 instructions)
    public_apis.json     seed list, no examples (not read)

Each raw element is one API provider; it becomes one record per ``Instructions[i]``:

* ``tools``: every function in ``Function_Description`` (not the ``components`` key). The tool name is
  ``<API Name>.<Action>`` sanitized to an identifier (:func:`action_function_name`:
  ``"Nager.Date" + "CountryCountryInfo"`` -> ``Nager_Date_CountryCountryInfo``, ``"Améthyste" +
  "generateAvatar"`` -> ``Amethyste_generateAvatar``); ``meta["functions"]`` maps it back to
  ``"<API Name>.<Action>"``. Parameters come from the ``Parameters: {...}`` JSON in the description text;
  each value ``"Required. <type>. <desc>"`` (or ``"<type>. <desc>"`` when optional) becomes a property
  (:func:`param_to_schema`).
* ``messages``: the instruction as one user message (no system prompt).
* ``calls``: the FIRST gold step (later steps depend on earlier results); ``meta["steps"]`` holds every step,
  a step whose ``Action_Input`` cannot be recovered as ``{"name", "arguments_raw", "error"}``.

Malformed ``Action_Input`` (README §7.4): the doubled key ``"symbols": "symbols": [..]`` is repaired
(``meta["recovered"]``); placeholders such as ``${animeId from searchAnime}`` are not values, so a record
whose first step has one is rejected with ``unparseable_call`` (later placeholder steps stay raw in
``meta.steps``). A first step that is ``getDetails`` (a question to the user) or names a function missing from
``Function_Description`` (5 AviationAPI functions) is rejected too.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ooospec.pipelines.records import (
    CALL_UNKNOWN_TOOL,
    INVALID_TOOL_SCHEMA,
    MALFORMED_RECORD,
    NO_GOLD_CALL,
    Reject,
    make_record,
    tool,
)
from ooospec.pipelines.sources.pytypes import (
    coerce_arguments,
    number_to_string,
    str_to_integer,
    str_to_number,
    str_to_singleton,
    strings_to_comma_string,
)

SOURCE = "toolalpaca"
LICENSE = "Apache-2.0"
UPSTREAM = "tangqiaoyu/ToolAlpaca@189069998d64a7baf1b4a1c3c4b2e75eb9d05532"

UNPARSEABLE_CALL = "unparseable_call"
FIRST_STEP_ASKS_USER = "first_step_asks_user"
ASK_USER = "getDetails"  # eval-sim gold action that asks the user a question; no API function behind it

SPLIT_FILES: dict[str, str] = {"eval-real": "eval_real.json", "eval-sim": "eval_simulated.json"}
NOT_A_FUNCTION = "components"

_PARAMS_RE = re.compile(r"Parameters: (\{.*?\})\nOutput:", re.DOTALL)
_DOUBLED_KEY_RE = re.compile(r'"(\w+)"\s*:\s*"\1"\s*:')
_PLACEHOLDER_RE = re.compile(r"\$\{[^}]*\}?")
# gold arguments: numbers as strings and the reverse, a list of currencies for a string, one string for a list;
# the notes call every number turned into a string "number->string"
COERCIONS = (str_to_integer, str_to_number, functools.partial(number_to_string, note="number->string"),
             strings_to_comma_string, str_to_singleton)
_SCALARS = {"string": "string", "integer": "integer", "number": "number", "boolean": "boolean",
            "object": "object", "array": "array"}


class SchemaParseError(ValueError):
    """A ``Function_Description`` whose parameter block cannot be read."""


# ---------------------------------------------------------------- names

def sanitize(text: str) -> str:
    """ASCII-fold and replace every run of non-identifier characters with ``_``.

    >>> sanitize("A Bíblia Digital.getVerse"), sanitize("chucknorris.io.jokes_random_get")
    ('A_Biblia_Digital_getVerse', 'chucknorris_io_jokes_random_get')
    """
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[^0-9A-Za-z_]+", "_", ascii_text).strip("_")


def action_function_name(api: str, action: str) -> str:
    """``<API Name>.<Action>`` as a valid identifier (a leading digit gets an ``api_`` prefix: ``1Forge``)."""
    name = sanitize(f"{api}.{action}")
    return f"api_{name}" if name[:1].isdigit() else name


# ---------------------------------------------------------------- parameter text -> JSON Schema

def _match_bracket(s: str, i: int) -> int:
    """Index of the bracket closing ``s[i]`` (``[`` or ``{``), nesting-aware."""
    pairs = {"[": "]", "{": "}"}
    stack = []
    for j in range(i, len(s)):
        if s[j] in pairs:
            stack.append(pairs[s[j]])
        elif stack and s[j] == stack[-1]:
            stack.pop()
            if not stack:
                return j
    raise SchemaParseError(f"unbalanced brackets in {s[i:i + 80]!r}")


def parse_type(s: str) -> tuple[dict, str]:
    """Read one type at the start of ``s``; returns (JSON Schema, rest of the text).

    >>> parse_type("Array[string]. names")
    ({'type': 'array', 'items': {'type': 'string'}}, '. names')
    >>> parse_type("Object{id: string. The id., n: integer. How many.}. rest")[0]['properties']['n']
    {'type': 'integer', 'description': 'How many.'}
    """
    s = s.lstrip()
    m = re.match(r"[A-Za-z]+", s)
    if not m:
        raise SchemaParseError(f"no type at {s[:60]!r}")
    word, rest = m.group(0), s[m.end():]
    low = word.lower()
    if low == "array" and rest.startswith("["):
        end = _match_bracket(rest, 0)
        inner = rest[1:end].strip()
        inner = re.sub(r"[.\s]+$", "", inner)  # "Object{...}. " -> "Object{...}"
        items, _ = parse_type(inner) if inner else ({}, "")
        return {"type": "array", "items": items} if items else {"type": "array"}, rest[end + 1:]
    if low == "object" and rest.startswith("{"):
        end = _match_bracket(rest, 0)
        return _object_fields(rest[1:end]), rest[end + 1:]
    if low not in _SCALARS:
        raise SchemaParseError(f"unknown type {word!r}")
    return {"type": _SCALARS[low]}, rest


def _object_fields(body: str) -> dict:
    """``"permissionId: string. The id., permissionName: string. The name."`` -> object schema."""
    props = {}
    for part in re.split(r",\s*(?=\w+:\s)", body.strip()):
        if not part.strip():
            continue
        key, _, spec = part.partition(":")
        schema, rest = parse_type(spec)
        desc = rest.lstrip(". ").strip()
        if desc:
            schema["description"] = desc
        props[key.strip()] = schema
    return {"type": "object", "properties": props}


def param_to_schema(value: str) -> tuple[dict, bool]:
    """One ``Parameters`` value -> (property schema, required).

    >>> param_to_schema("Required. integer. The year.")
    ({'type': 'integer', 'description': 'The year.'}, True)
    >>> param_to_schema("Object.  Filters to apply.")
    ({'type': 'object', 'description': 'Filters to apply.'}, False)
    """
    s = value.strip()
    required = s.startswith("Required.")
    if required:
        s = s[len("Required."):]
    schema, rest = parse_type(s)
    desc = rest.strip()
    desc = desc[1:].strip() if desc.startswith(".") else desc
    if desc:
        schema["description"] = desc
    return schema, required


def parse_function(text: str) -> tuple[str, dict]:
    """``Function_Description`` value -> (description, parameters JSON Schema).

    Raises :class:`SchemaParseError` naming the bad parameter."""
    m = _PARAMS_RE.search(text)
    if not m:
        raise SchemaParseError("no 'Parameters: {...}\\nOutput:' block")
    try:
        raw = json.loads(m.group(1))
    except json.JSONDecodeError as e:
        raise SchemaParseError(f"Parameters block is not JSON: {e.msg}") from None
    props, required = {}, []
    for key, val in raw.items():
        if not isinstance(val, str):
            raise SchemaParseError(f"parameter {key!r}: not a string")
        try:
            props[key], req = param_to_schema(val)
        except SchemaParseError as e:
            raise SchemaParseError(f"parameter {key!r}: {e}") from None
        if req:
            required.append(key)
    params: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        params["required"] = required
    return text[:m.start()].strip(), params


# ---------------------------------------------------------------- gold steps

def split_optional(action: str) -> tuple[str, bool]:
    """``"[Optional]updateUserProfile"`` -> ``("updateUserProfile", True)`` (one eval-sim gold step)."""
    m = re.match(r"\s*\[Optional\]\s*", action)
    return (action[m.end():], True) if m else (action, False)


def parse_action_input(text: str) -> tuple[dict | None, str | None]:
    """``Action_Input`` JSON string -> (arguments or None, how it was recovered or None).

    >>> parse_action_input('{"base": "USD", "symbols": "symbols": ["EUR"]}')
    ({'base': 'USD', 'symbols': ['EUR']}, 'doubled_key')
    >>> parse_action_input('{"animeId": ${animeId from searchAnime}}')
    (None, 'placeholder')
    """
    try:
        val = json.loads(text)
        return (val, None) if isinstance(val, dict) else (None, "not_an_object")
    except json.JSONDecodeError:
        pass
    if _PLACEHOLDER_RE.search(text):
        return None, "placeholder"
    fixed = _DOUBLED_KEY_RE.sub(lambda m: f'"{m.group(1)}":', text)
    if fixed != text:
        try:
            val = json.loads(fixed)
            if isinstance(val, dict):
                return val, "doubled_key"
        except json.JSONDecodeError:
            pass
    return None, "invalid_json"


# ---------------------------------------------------------------- records

def api_tools(api: dict) -> tuple[list[dict], dict[str, str], dict[str, dict]]:
    """One API provider -> (tools, {tool name: "<API>.<Action>"}, {action: parameters}).

    Raises :class:`SchemaParseError` naming the bad function."""
    name = api["Name"]
    projection = api.get("Function_Projection") or {}
    tools, originals, params_by_action = [], {}, {}
    for action, text in api["Function_Description"].items():
        if action == NOT_A_FUNCTION:
            continue
        try:
            desc, params = parse_function(text)
        except SchemaParseError as e:
            raise SchemaParseError(f"function {action!r}: {e}") from None
        if not desc and action in projection:
            path, method = projection[action]
            desc = f"{method.upper()} {path}"
        tname = action_function_name(name, action)
        if tname in originals:
            raise SchemaParseError(f"tool name collision {tname!r}")
        originals[tname] = f"{name}.{action}"
        params_by_action[action] = params
        tools.append(tool(tname, desc, params))
    return tools, originals, params_by_action


def gold_steps(api_name: str, steps: list[dict],
               params_by_action: dict[str, dict]) -> tuple[list[dict], list[str], list[str]]:
    """Every gold step -> (``meta.steps``, recovered notes, coerced notes).

    A step whose ``Action_Input`` cannot be recovered stays raw: ``{"name", "arguments_raw", "error"}``."""
    out_steps, recovered, coerced = [], [], []
    for si, st in enumerate(steps):
        action, optional = split_optional(st.get("Action", ""))
        tname = action_function_name(api_name, action) if action else ""
        args, how = parse_action_input(st.get("Action_Input", ""))
        if args is None:
            out_steps.append({"name": tname, "arguments_raw": st.get("Action_Input", ""), "error": how})
            continue
        if action in params_by_action:
            args, notes = coerce_arguments(args, params_by_action[action], COERCIONS)
            coerced += [f"{si}.{k}: {note}" for k, note in notes.items()]
        if how:
            recovered.append(f"{si}:{how}")
        out_steps.append({"name": tname, "arguments": args})
        if optional:
            out_steps[-1]["optional"] = True
    return out_steps, recovered, coerced


def first_step_fault(step: dict, parsed: dict, params_by_action: dict[str, dict]) -> tuple[str, str] | None:
    """Why the first gold ``step`` (``parsed`` by :func:`gold_steps`) cannot be the record's call:
    ``(reject reason, detail)``, or None."""
    action = split_optional(step.get("Action", ""))[0]
    if action == ASK_USER:
        return FIRST_STEP_ASKS_USER, f"first gold step is {ASK_USER} (asks the user, not an API call)"
    if action not in params_by_action:
        return CALL_UNKNOWN_TOOL, f"{action!r} is not in the API's Function_Description"
    if "arguments" not in parsed:
        return UNPARSEABLE_CALL, f"first Action_Input {parsed['arguments_raw'][:120]!r}"
    return None


def parse_file(path: Path, split: str) -> Iterator[dict | Reject]:
    """One evaluation file: a record per instruction of every API provider (see module docstring)."""
    fname = path.name
    for ai, api in enumerate(json.loads(path.read_text(encoding="utf-8"))):
        api_name = api.get("Name", f"#{ai}")
        key = sanitize(api_name)
        instructions, answers = api.get("Instructions") or [], api.get("Golden_Answers") or []
        if len(instructions) != len(answers):
            yield Reject(SOURCE, split, key, MALFORMED_RECORD,
                         f"{fname} API {api_name!r}: {len(instructions)} instructions, "
                         f"{len(answers)} answers")
            continue
        try:
            tools, originals, params_by_action = api_tools(api)
        except (SchemaParseError, KeyError) as e:
            for i in range(len(instructions)):
                yield Reject(SOURCE, split, f"{key}#{i}", INVALID_TOOL_SCHEMA,
                             f"{fname} API {api_name!r}: {e}")
            continue
        for i, (instruction, steps) in enumerate(zip(instructions, answers)):
            raw = {"instruction": instruction, "Golden_Answers": steps}
            fault = (NO_GOLD_CALL, "empty Golden_Answers") if not steps else None
            if fault is None:
                out_steps, recovered, coerced = gold_steps(api_name, steps, params_by_action)
                fault = first_step_fault(steps[0], out_steps[0], params_by_action)
            if fault is not None:
                yield Reject(SOURCE, split, f"{key}#{i}", fault[0],
                             f"{fname} API {api_name!r} instruction {i}: {fault[1]}", raw=raw)
                continue
            meta: dict[str, Any] = {"api": api_name, "functions": originals, "steps": out_steps}
            if recovered:
                meta["recovered"] = recovered
            if coerced:
                meta["coerced"] = coerced
            first = out_steps[0]
            yield make_record(SOURCE, split, f"{key}#{i}", tools, [{"role": "user", "content": instruction}],
                              [{"name": first["name"], "arguments": first["arguments"]}], meta)


def parse(root: Path) -> Iterator[dict | Reject]:
    """Both evaluation splits, ``eval-real`` then ``eval-sim``."""
    root = Path(root)
    for split, fname in SPLIT_FILES.items():
        if (root / fname).exists():
            yield from parse_file(root / fname, split)
