"""API-Bank (Li et al., EMNLP 2023) -> records.

Raw layout (``root`` = ``<datasets>/apibank/raw``, see datasets README §3 and §7)::

    test-data/level-1-api.json          -> split "test-l1"    (gold = ``expected_output`` text call)
    test-data/level-2-api.json          -> split "test-l2"
    test-data/level-3-batch-inf.json    -> split "test-l3"    (gold = ``output``)
    training-data/lv3-api-train.json    -> split "train-l3"
    lv1-lv2-samples/level-1-given-desc/*.jsonl     -> split "samples-l1" (one record per API turn)
    lv1-lv2-samples/level-2-toolsearcher/*.jsonl   -> split "samples-l2"
    all_apis.csv                        schema catalogue (``api_info`` = Python source, parsed with ``ast``)

Skipped on purpose (no reject): ``*-response*.json`` (reply-only, no gold call),
``level-3-batch-inf-icl.json`` and ``level-3.json`` (same steps as ``level-3-batch-inf.json``),
``lv3-train.json`` (= api-train + response-train).

Every record's ``messages`` is the dialogue so far: ``User:`` -> user, ``AI:`` -> assistant, an earlier
``API-Request: [Name(k='v')]->result`` -> an assistant message with ``tool_calls`` followed by a ``tool``
message holding the result as compact JSON. A one-line system message carries only the date context the
gold arguments depend on ("The current year is 2023." for level 1/2 and the samples, "The current time is
<TIME>." for lv3 training steps that have a ``TIME:``); the dataset's prompt template and API-description
block are not copied -- the APIs go in ``tools``.

Worked example (test-l2, ``QueryStock-level-3-1.jsonl`` turn 1)::

    input  "User: ...Microsoft on 4th February 2022?\\nAI: Sure, let me check.\\n
            API-Request: [ToolSearcher(keywords='Query Stock')]->{'name': 'QueryStock', ...}\\n
            Generate API Request:"
    gold   "API-Request: [QueryStock(stock_code='MSFT', date='2022-02-04')]"
    ->  tools    [ToolSearcher, QueryStock]      (QueryStock = the schema the ToolSearcher result returned)
        messages [system, user, assistant, assistant{tool_calls: ToolSearcher}, tool{QueryStock schema}]
        calls    [{"name": "QueryStock", "arguments": {"stock_code": "MSFT", "date": "2022-02-04"}}]
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ooospec.pipelines.records import MALFORMED_RECORD, Reject, make_record
from ooospec.pipelines.sources.apibank_text import (
    ApiSpec,
    CallParseError,
    ParsedCall,
    embedded_calls,
    parse_request,
    parse_result,
    result_content,
    spec_from_api_info,
    spec_from_dict,
    specs_from_instruction,
    specs_from_result,
    split_request_line,
    unwrap_result,
)
from ooospec.pipelines.sources.pytypes import (
    coerce_arguments,
    float_to_integer,
    jsonable,
    number_to_string,
    str_to_boolean,
    str_to_integer,
    str_to_literal,
    str_to_number,
    str_to_singleton,
)

SOURCE = "apibank"
LICENSE = "Apache-2.0"
UPSTREAM = ("AlibabaResearch/DAMO-ConvAI@1d76900822d9ecfcd6e9eb0ca64a073cb892b735; "
            "AlibabaResearch/DAMO-ConvAI@483554eae102996f5ec1f4feab4e78ef29c2a394")

UNPARSEABLE_CALL = "unparseable_call"

# split -> file under root (the test/train call-step files)
STEP_FILES: dict[str, str] = {
    "test-l1": "test-data/level-1-api.json",
    "test-l2": "test-data/level-2-api.json",
    "test-l3": "test-data/level-3-batch-inf.json",
    "train-l3": "training-data/lv3-api-train.json",
}
SAMPLE_DIRS: dict[str, str] = {
    "samples-l1": "level-1-given-desc",
    "samples-l2": "level-2-toolsearcher",
}
YEAR_CONTEXT = "The current year is 2023."  # stated by every level-1/2 prompt; gold dates depend on it
TOOL_SEARCHER = "ToolSearcher"

_TIME_RE = re.compile(r"\s*TIME:\s*(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\s*$")
_TURN_PREFIXES = ("User:", "AI:", "API-Request:", "Generate API Request:")
# gold arguments: scalars as strings, lists and dicts written as Python literals in a string, one string for a list
COERCIONS = (str_to_integer, str_to_number, str_to_boolean, str_to_literal, str_to_singleton, number_to_string,
             float_to_integer)


# ---------------------------------------------------------------- dialogue text -> messages

@dataclass
class Context:
    """A dialogue rendered as messages + the APIs whose schemas ToolSearcher results returned so far."""

    messages: list[dict] = field(default_factory=list)
    retrieved: dict[str, ApiSpec] = field(default_factory=dict)  # insertion order = retrieval order
    now: str | None = None  # lv3 training: the TIME: stamp taken off the user line
    header_specs: list[ApiSpec] = field(default_factory=list)  # level-3: the apiCode line (ToolSearcher)


def assistant_call_message(calls: list[ParsedCall], content: str = "") -> dict:
    """An earlier API call in the history: ``{"role": "assistant", "content": "", "tool_calls": [...]}``."""
    tcs = [{"type": "function", "function": {"name": c.name, "arguments": jsonable(c.arguments)}}
           for c in calls]
    return {"role": "assistant", "content": content, "tool_calls": tcs}


def _note_retrieval(ctx: Context, call_names: list[str], result: Any) -> None:
    if TOOL_SEARCHER in call_names:
        for s in specs_from_result(result):
            ctx.retrieved.setdefault(s.name, s)


def parse_input(text: str) -> Context:
    """Turn a test/train ``input`` (one turn per line) into messages.

    Lines that start with none of the turn prefixes continue the previous turn; a leading JSON line
    (level 3) is the ToolSearcher schema; ``TIME: ...`` glued to a user line (lv3 training) is cut off into
    ``ctx.now``; the final ``Generate API Request:`` line is dropped.
    """
    ctx = Context()
    turns: list[list[str]] = []
    for line in text.split("\n"):
        if line.startswith("{") and not turns:
            s = None
            try:
                s = spec_from_dict(json.loads(line))
            except json.JSONDecodeError:
                pass
            if s is not None:
                ctx.header_specs.append(s)
                continue
        if line.startswith(_TURN_PREFIXES) or not turns:
            turns.append([line])
        else:
            turns[-1].append(line)
    for lines in turns:
        turn = "\n".join(lines).strip()
        if not turn or turn.startswith("Generate API Request:"):
            continue
        if turn.startswith("User:"):
            content = turn[len("User:"):].strip()
            m = _TIME_RE.search(content)
            if m:
                ctx.now = m.group(1)
                content = content[:m.start()].rstrip()
            ctx.messages.append({"role": "user", "content": content})
        elif turn.startswith("AI:"):
            ctx.messages.append({"role": "assistant", "content": turn[len("AI:"):].strip()})
        elif turn.startswith("API-Request:"):
            calls, res_text = split_request_line(turn)
            result = parse_result(res_text)
            ctx.messages.append(assistant_call_message(calls))
            ctx.messages.append({"role": "tool", "content": result_content(result)})
            _note_retrieval(ctx, [c.name for c in calls], result)
        else:
            raise ValueError(f"unrecognised turn {turn[:80]!r}")
    return ctx


# ---------------------------------------------------------------- catalogue of level-1/2 schemas

def load_catalogue(root: Path) -> dict[str, ApiSpec]:
    """name -> schema for the level-1/2 APIs: level-1 test prompts first, then ToolSearcher results of the
    level-2 samples, then ``all_apis.csv`` ``api_info`` (first seen wins, so order is deterministic)."""
    cat: dict[str, ApiSpec] = {}
    l1 = root / STEP_FILES["test-l1"]
    l2 = root / STEP_FILES["test-l2"]
    for path in (l1, l2):
        if path.exists():
            for r in json.loads(path.read_text(encoding="utf-8")):
                for s in specs_from_instruction(r.get("instruction", "")):
                    cat.setdefault(s.name, s)
    sdir = root / "lv1-lv2-samples" / SAMPLE_DIRS["samples-l2"]
    for path in sorted(sdir.glob("*.jsonl")) if sdir.exists() else []:
        for turn in _read_turns(path):
            if turn.get("role") == "API" and turn.get("api_name") == TOOL_SEARCHER:
                for s in specs_from_result(unwrap_result(turn.get("result"))):
                    cat.setdefault(s.name, s)
    csv_path = root / "all_apis.csv"
    if csv_path.exists():
        with open(csv_path, encoding="utf-8", newline="") as f:
            for row in csv.DictReader(f):
                name = (row.get("类名") or "").strip()
                s = spec_from_api_info(name, row.get("api_info") or "") if name else None
                if s is not None:
                    cat.setdefault(name, s)
    return cat


def dialogue_tools_l1(root: Path) -> dict[str, list[ApiSpec]]:
    """Level-1 dialogue file -> the APIs its level-1 test prompts describe (union, first-seen order)."""
    out: dict[str, dict[str, ApiSpec]] = {}
    path = root / STEP_FILES["test-l1"]
    if path.exists():
        for r in json.loads(path.read_text(encoding="utf-8")):
            d = out.setdefault(r["file"], {})
            for s in specs_from_instruction(r.get("instruction", "")):
                d.setdefault(s.name, s)
    return {k: list(v.values()) for k, v in out.items()}


def _read_turns(path: Path) -> list[dict]:
    turns = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                turns.append(json.loads(line))
    return turns


# ---------------------------------------------------------------- record assembly

def _system(now: str | None) -> dict:
    return {"role": "system", "content": f"The current time is {now}." if now else YEAR_CONTEXT}


def _build(split: str, local_id: str, tools: list[ApiSpec], messages: list[dict], calls: list[ParsedCall],
           meta: dict) -> dict:
    """Coerce the gold arguments to the tool schemas and assemble the record (ingest validates it)."""
    by_name = {t.name: t for t in tools}
    out_calls, coerced, recovered = [], [], []
    for i, c in enumerate(calls):
        args = jsonable(c.arguments)
        if c.name in by_name:
            args, notes = coerce_arguments(args, by_name[c.name].parameters, COERCIONS)
            coerced += [f"{i}.{k}: {note}" if len(calls) > 1 else f"{k}: {note}" for k, note in notes.items()]
        out_calls.append({"name": c.name, "arguments": args})
        if c.recovered:
            recovered.append(c.recovered)
    meta = dict(meta)
    if coerced:
        meta["coerced"] = coerced
    if recovered:
        meta["recovered"] = sorted(set(recovered))
    return make_record(SOURCE, split, local_id, [t.to_tool() for t in tools], messages, out_calls, meta)


def _dedup_specs(specs: list[ApiSpec]) -> list[ApiSpec]:
    seen, out = set(), []
    for s in specs:
        if s.name not in seen:
            seen.add(s.name)
            out.append(s)
    return out


def _add_missing(tools: list[ApiSpec], names: list[str],
                 catalogue: dict[str, ApiSpec]) -> tuple[list[ApiSpec], list[str]]:
    """Append catalogue schemas for called APIs the dialogue never retrieved (level-2 GetUserToken etc.)."""
    have = {t.name for t in tools}
    added = []
    for n in names:
        if n not in have and n in catalogue:
            tools = tools + [catalogue[n]]
            have.add(n)
            added.append(n)
    return tools, added


def parse_step_file(root: Path, split: str, catalogue: dict[str, ApiSpec]) -> Iterator[dict | Reject]:
    """test-l1 / test-l2 / test-l3 / train-l3: one record per JSON element."""
    path = root / STEP_FILES[split]
    fname = path.name
    rows = json.loads(path.read_text(encoding="utf-8"))
    for idx, r in enumerate(rows):
        if split in ("test-l1", "test-l2"):
            local_id = f"{r['file']}#{r['id']}"
            folder = SAMPLE_DIRS["samples-l1" if split == "test-l1" else "samples-l2"]
            meta = {"dialogue": f"{folder}/{r['file']}", "turn": r["id"]}
            gold_text = r.get("expected_output", "")
        elif split == "test-l3":
            local_id = f"{r['sample_id']}#{r['api_id']}"
            meta = {"sample": f"level-3/{r['sample_id']}", "step": r["api_id"]}
            gold_text = r.get("output", "")
        else:
            local_id = f"{fname}#{idx}"
            meta = {}
            gold_text = r.get("output", "")
        where = f"{fname}[{idx}] ({local_id})"
        try:
            ctx = parse_input(r.get("input", ""))
        except (CallParseError, ValueError) as e:
            yield Reject(SOURCE, split, local_id, UNPARSEABLE_CALL, f"{where}: history: {e}"[:300], raw=r)
            continue
        try:
            calls = parse_request(gold_text)
        except CallParseError as e:
            detail = f"{where}: gold {gold_text[:120]!r}: {e}"
            yield Reject(SOURCE, split, local_id, UNPARSEABLE_CALL, detail[:300], raw=r)
            continue
        prompt_specs = specs_from_instruction(r.get("instruction", ""))
        tools = _dedup_specs(prompt_specs + ctx.header_specs + list(ctx.retrieved.values()))
        if split == "test-l2":
            called = [tc["function"]["name"] for m in ctx.messages for tc in m.get("tool_calls", [])]
            tools, added = _add_missing(tools, called + [c.name for c in calls], catalogue)
            if added:
                meta["tools_from_catalogue"] = added
        if split == "train-l3" and ctx.now:
            meta["time"] = ctx.now
        if split in ("test-l1", "test-l2"):
            system = [_system(None)]
        else:  # level 3 states no date; lv3 training has one only when the user line carries TIME:
            system = [_system(ctx.now)] if ctx.now else []
        yield _build(split, local_id, tools, system + ctx.messages, calls, meta)


def parse_sample_dir(root: Path, split: str, catalogue: dict[str, ApiSpec],
                     l1_tools: dict[str, list[ApiSpec]]) -> Iterator[dict | Reject]:
    """samples-l1 / samples-l2: one record per API turn (or per call embedded in AI text when a dialogue
    has no API turns), messages = the dialogue before it."""
    folder = SAMPLE_DIRS[split]
    for path in sorted((root / "lv1-lv2-samples" / folder).glob("*.jsonl")):
        fname = path.name
        try:
            turns = _read_turns(path)
        except json.JSONDecodeError as e:
            yield Reject(SOURCE, split, fname, MALFORMED_RECORD, f"{folder}/{fname}: {e}")
            continue
        if turns:  # SearchEngine-level-1-1.jsonl is empty: nothing to yield
            base = _dialogue_tools(split, fname, catalogue, l1_tools)
            yield from _sample_dialogue(split, f"{folder}/{fname}", turns, base, catalogue)


def _dialogue_tools(split: str, fname: str, catalogue: dict[str, ApiSpec],
                    l1_tools: dict[str, list[ApiSpec]]) -> list[ApiSpec]:
    """The APIs a sample dialogue offers from its start: ToolSearcher (level 2), else the level-1 test prompt's
    APIs, else those named in the file name (from the catalogue)."""
    if split == "samples-l2":
        return [catalogue[TOOL_SEARCHER]] if TOOL_SEARCHER in catalogue else []
    base = list(l1_tools.get(fname, []))
    if not base:
        names = fname.split("-level-")[0].split("-")
        base = [catalogue[n] for n in names if n in catalogue]
    return base


def _sample_dialogue(split: str, dialogue: str, turns: list[dict], base: list[ApiSpec],
                     catalogue: dict[str, ApiSpec]) -> Iterator[dict | Reject]:
    """The records (and rejects) of one sample dialogue ``<folder>/<file name>``, turn by turn."""
    fname = dialogue.rpartition("/")[2]
    embedded = not any(t.get("role") == "API" for t in turns)
    retrieved: dict[str, ApiSpec] = {}
    messages: list[dict] = [_system(None)]
    called: list[str] = []
    for ti, t in enumerate(turns):
        role = t.get("role")
        if role == "User":
            messages.append({"role": "user", "content": str(t.get("text", ""))})
            continue
        if role == "AI":
            text = str(t.get("text", ""))
            prefix, calls = embedded_calls(text) if embedded else (text, [])
            if not calls:
                messages.append({"role": "assistant", "content": text})
                continue
            for ci, c in enumerate(calls):
                local_id = f"{fname}#{ti}" + (f".{ci}" if len(calls) > 1 else "")
                history = messages + ([{"role": "assistant", "content": prefix}] if prefix else [])
                yield _sample_record(split, local_id, dialogue, ti, base + list(retrieved.values()), called,
                                     catalogue, history, c)
                called.append(c.name)
            messages.append(assistant_call_message(calls, content=prefix))
            continue
        if role != "API":
            yield Reject(SOURCE, split, f"{fname}#{ti}", MALFORMED_RECORD,
                         f"{dialogue} turn {ti}: unknown role {role!r}", raw=t)
            continue
        name, args = t.get("api_name"), t.get("param_dict")
        if not isinstance(name, str) or not isinstance(args, dict):
            yield Reject(SOURCE, split, f"{fname}#{ti}", UNPARSEABLE_CALL,
                         f"{dialogue} turn {ti}: api_name/param_dict missing", raw=t)
            continue
        c = ParsedCall(name, args)
        yield _sample_record(split, f"{fname}#{ti}", dialogue, ti, base + list(retrieved.values()), called,
                             catalogue, messages, c)
        called.append(name)
        result = unwrap_result(t.get("result"))
        messages.append(assistant_call_message([c]))
        messages.append({"role": "tool", "content": result_content(result)})
        if name == TOOL_SEARCHER:
            for s in specs_from_result(result):
                retrieved.setdefault(s.name, s)


def _sample_record(split: str, local_id: str, dialogue: str, turn: int, specs: list[ApiSpec],
                   called: list[str], catalogue: dict[str, ApiSpec], messages: list[dict],
                   c: ParsedCall) -> dict:
    """One sample API turn: tools = the dialogue's APIs (+ catalogue schemas of called, undescribed ones)."""
    tools = _dedup_specs(specs)
    meta: dict = {"dialogue": dialogue, "turn": turn}
    tools, added = _add_missing(tools, called + [c.name], catalogue)
    if added:
        meta["tools_from_catalogue"] = added
    return _build(split, local_id, tools, list(messages), [c], meta)


def parse(root: Path) -> Iterator[dict | Reject]:
    """All API-Bank splits, in a fixed order (see module docstring)."""
    root = Path(root)
    catalogue = load_catalogue(root)
    for split, rel in STEP_FILES.items():
        if (root / rel).exists():
            yield from parse_step_file(root, split, catalogue)
    l1_tools = dialogue_tools_l1(root)
    for split, folder in SAMPLE_DIRS.items():
        if (root / "lv1-lv2-samples" / folder).exists():
            yield from parse_sample_dir(root, split, catalogue, l1_tools)
