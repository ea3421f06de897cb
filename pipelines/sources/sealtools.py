"""Seal-Tools (Wu et al., NLPCC 2024) -> records.

Raw layout (``root`` = ``<datasets>/sealtools/raw``; datasets README §9.3)::

    dataset_for_finetune/dev.json              -> split "dev"
    dataset_for_finetune/test_in_domain.json   -> split "test-in"
    dataset_for_finetune/test_out_domain.json  -> split "test-out"
    tool.jsonl                                  catalogue (4,076 schemas), only read for quirk 2

The ``dataset_for_finetune`` form is used (not ``dev.jsonl`` & co.) because its prompt carries the 5 candidate
APIs the model chooses from (gold APIs + retrieved distractors). One JSON array item ``{"id", "conversations":
[{"from": "human", "value": prompt}, {"from": "gpt", "value": gold}]}`` becomes one record:

* ``tools``    = the prompt's ``api_list`` (a Python literal, cut with :data:`PROMPT_RE` -- the instruction has
                 unescaped inner quotes -- and read with ``ast.literal_eval``), each via :func:`seal_tool`:
                 Python-ish types (``str``/``int``/``float``/``bool``) -> JSON Schema, ``required`` kept.
* ``messages`` = ``[{"role": "user", "content": task_instruction}]`` (the fixed Seal-Tools instruction template
                 is not copied; the tools travel in ``tools``).
* ``calls``    = every gold call in order (``literal_eval`` of the gold answer). "Difficult" examples hold 2-6
                 calls that may be sequential/nested, not parallel; ``meta.responses`` keeps each call's output
                 names (``API_call_<k>``).

Quirks handled:

1. Python literals + unescaped quotes: :data:`PROMPT_RE` and ``ast.literal_eval`` (never ``json``).
2. A gold API missing from the 5-tool ``api_list`` (8 examples): its schema is appended from ``tool.jsonl`` and
   the name listed in ``meta.added_tools``.
3. Nested references: a value ``"API_call_0"`` (or text containing it) names an earlier call's output. It is kept
   as the string and listed in ``meta.references`` as ``{"call": i, "param": p, "ref": "API_call_0"}``. When the
   parameter is declared non-string (``int``), that parameter's type in *this record's* copy of the tool is widened
   to ``[<type>, "string"]`` and listed in ``meta.widened`` -- the reference cannot be typed otherwise.
4. Values typed as strings for numeric parameters (``{"age": "63"}`` for ``int``; about 2% of values) are coerced
   to the declared type (:func:`~ooospec.pipelines.sources.pytypes.coerce_value`), listed in ``meta.coerced``.
   Values that cannot be coerced (a list for a ``float``) stay and the ingest validation rejects the record.

Worked example (``dev-easy-0``)::

    api_list = [{'api_name': 'getHealthWorkforce', 'parameters': {'location': {'type': 'str', ...}, ...},
                 'required': ['location'], ...}, ... 4 distractors]
    task_instruction = "Retrieve information about the number of nurses in a specific country."
    gold = [{'api': 'getHealthWorkforce', 'parameters': {'location': 'country', 'occupation': 'nurses'},
             'responses': ['API_call_0', 'API_call_1', 'API_call_2']}]
    -> id "sealtools/dev/dev-easy-0", 5 tools, calls [{"name": "getHealthWorkforce",
       "arguments": {"location": "country", "occupation": "nurses"}}], meta.level "easy"
"""

from __future__ import annotations

import ast
import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ooospec.pipelines.records import MALFORMED_RECORD, Reject, call, make_record, tool
from ooospec.pipelines.sources.pytypes import coerce_value, type_schema

SOURCE = "sealtools"
LICENSE = "Apache-2.0"
UPSTREAM = "fairyshine/Seal-Tools@ce753ecd60ed08dd376984035de531ab8421f1c6"

UNPARSEABLE_PROMPT = "unparseable_prompt"
UNPARSEABLE_CALL = "unparseable_call"

# split -> file stem (dataset_for_finetune/<stem>.json)
SPLITS: dict[str, str] = {"dev": "dev", "test-in": "test_in_domain", "test-out": "test_out_domain"}
FINETUNE_DIR = "dataset_for_finetune"
CATALOGUE = "tool.jsonl"

PROMPT_RE = re.compile(r'api_list = (\[.*\])\ntask_instruction = "(.*)"\nOutput:', re.DOTALL)
REF_RE = re.compile(r"API_call_\d+")


def seal_tool(api: dict) -> dict:
    """One Seal-Tools API entry (``tool.jsonl`` shape) -> a record tool.

    >>> seal_tool({"api_name": "f", "api_description": "d", "parameters": {"n": {"type": "int",
    ...            "description": "x"}}, "required": ["n"]})["function"]["parameters"]
    {'type': 'object', 'properties': {'n': {'type': 'integer', 'description': 'x'}}, 'required': ['n']}
    """
    props = {}
    for name, spec in api.get("parameters", {}).items():
        prop = type_schema(spec.get("type"))
        prop["description"] = spec.get("description", "")
        for k, v in spec.items():  # annotations: unit, choices, example(s), default
            if k not in ("type", "description"):
                prop[k] = v if k != "examples" or isinstance(v, list) else [v]
        props[name] = prop
    required = [r for r in api.get("required", []) if r in props]
    return tool(api["api_name"], api.get("api_description", ""),
                {"type": "object", "properties": props, "required": required})


def split_prompt(prompt: str) -> tuple[list[dict], str]:
    """The human turn -> ``(api_list, task_instruction)``; ValueError when the layout differs."""
    m = PROMPT_RE.search(prompt)
    if m is None:
        raise ValueError("prompt does not match 'api_list = [...]\\ntask_instruction = \"...\"\\nOutput:'")
    api_list = ast.literal_eval(m.group(1))
    if not isinstance(api_list, list) or not all(isinstance(a, dict) and "api_name" in a for a in api_list):
        raise ValueError("api_list is not a list of API dicts")
    return api_list, m.group(2)


def find_references(value: Any) -> list[str]:
    """All ``API_call_<k>`` names inside a value (strings, lists, dicts)."""
    if isinstance(value, str):
        return REF_RE.findall(value)
    if isinstance(value, list):
        return [r for v in value for r in find_references(v)]
    if isinstance(value, dict):
        return [r for v in value.values() for r in find_references(v)]
    return []


def build_calls(gold: list[dict], tools: list[dict]) -> tuple[list[dict], dict]:
    """Gold list -> ``(calls, meta_part)``; widens tool params that hold references (mutates ``tools``).

    ``meta_part`` has ``responses``, and (when non-empty) ``references``, ``widened`` and ``coerced``
    (``"<call index>.<param>"`` strings).
    """
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    calls, responses, refs, widened, coerced = [], [], [], [], []
    for i, g in enumerate(gold):
        name, params = g["api"], g.get("parameters", {})
        if not isinstance(params, dict):
            raise TypeError(f"call {i} ({name}): parameters is {type(params).__name__}, not a dict")
        props = by_name.get(name, {}).get("properties", {})
        args = {}
        for p, v in params.items():
            found = find_references(v)
            refs.extend({"call": i, "param": p, "ref": r} for r in found)
            prop = props.get(p, {})
            if found:
                t = prop.get("type")
                if isinstance(t, str) and t != "string":
                    prop["type"] = [t, "string"]
                    widened.append(f"{name}.{p}")
                args[p] = v
                continue
            args[p], note = coerce_value(v, prop)
            if note:
                coerced.append(f"{i}.{p}")
        calls.append(call(name, args))
        responses.append(list(g.get("responses", [])))
    meta: dict[str, Any] = {"responses": responses}
    for key, val in (("references", refs), ("widened", sorted(set(widened))), ("coerced", coerced)):
        if val:
            meta[key] = val
    return calls, meta


def load_catalogue(root: Path) -> dict[str, dict]:
    """``tool.jsonl`` -> ``{api_name: entry}``."""
    out = {}
    with open(Path(root) / CATALOGUE, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                entry = json.loads(line)
                out[entry["api_name"]] = entry
    return out


def parse_item(item: dict, split: str, catalogue: dict[str, dict], where: str) -> dict | Reject:
    """One ``dataset_for_finetune`` item -> a record or a Reject."""
    local_id = str(item.get("id", "?"))
    try:
        conv = item["conversations"]
        prompt, answer = conv[0]["value"], conv[1]["value"]
    except (KeyError, IndexError, TypeError) as e:
        return Reject(SOURCE, split, local_id, MALFORMED_RECORD, f"{where}: {type(e).__name__}: {e}", raw=item)
    try:
        api_list, instruction = split_prompt(prompt)
    except (ValueError, SyntaxError, TypeError) as e:
        return Reject(SOURCE, split, local_id, UNPARSEABLE_PROMPT, f"{where}: {e}"[:300], raw=item)
    try:
        gold = ast.literal_eval(answer)
        if not isinstance(gold, list) or not all(isinstance(g, dict) and "api" in g for g in gold):
            raise ValueError("gold answer is not a list of {'api', 'parameters'} dicts")
    except (ValueError, SyntaxError, TypeError) as e:
        return Reject(SOURCE, split, local_id, UNPARSEABLE_CALL, f"{where}: {e}"[:300], raw=item)
    tools = [seal_tool(a) for a in api_list]
    listed = {t["function"]["name"] for t in tools}
    added = []
    for g in gold:
        if g["api"] not in listed and g["api"] in catalogue:
            tools.append(seal_tool(catalogue[g["api"]]))
            listed.add(g["api"])
            added.append(g["api"])
    tools = copy.deepcopy(tools)
    try:
        calls, meta = build_calls(gold, tools)
    except (ValueError, TypeError) as e:
        return Reject(SOURCE, split, local_id, UNPARSEABLE_CALL, f"{where}: {e}"[:300], raw=item)
    meta = {"level": local_id.split("-")[-2] if local_id.count("-") >= 2 else None} | meta
    if added:
        meta["added_tools"] = added
    messages = [{"role": "user", "content": instruction}]
    return make_record(SOURCE, split, local_id, tools, messages, calls, meta)


def parse(root: Path) -> Iterator[dict | Reject]:
    """All splits of :data:`SPLITS`, in that order, items in file order."""
    root = Path(root)
    catalogue = load_catalogue(root)
    for split, stem in SPLITS.items():
        rel = f"{FINETUNE_DIR}/{stem}.json"
        with open(root / rel, encoding="utf-8") as f:
            items = json.load(f)
        for idx, item in enumerate(items):
            yield parse_item(item, split, catalogue, f"{rel}[{idx}] id={item.get('id', '?')}")
