"""Fuzz suite: hypothesis against everything that reads input written by users, the web or a model.

Areas: random JSON Schemas (draft 2020-12 features real tools use, plus malformed ones) x the schema FSM with a real
byte-level BPE tokenizer; the tool-call parsers; the sidecar prompt builder and answer parsers; record loading, and
the pipeline stages' record reader (``records.load_records``) with what the stages do next. Properties: no exception
other than the documented ValueError, no call over :data:`STEP_S`, draft ids are valid token ids, and FSM drafts never
all contradict a valid call: wherever the FSM drafts, some draft agrees with the gold call's next character, so
following drafts reaches the gold text. A valid call
here validates against its tool and uses the tool's declared or required keys (keys that only
``additionalProperties`` allows are not drafted), and the branch budget covers every alternative at the
committed position (``max_branches=64``; with fewer, the FSM guesses the first alternatives).

Deterministic (``derandomize``, no example database) and bounded to about a minute on a 2-core CPU:
``python -m pytest -q tests/test_fuzz.py``; ``OOOSPEC_FUZZ_SCALE=20`` multiplies every example count. The
tokenizer is the 65k-token byte-level BPE ``tokenizer.json`` shipped in the ``anthropic==0.34.2`` wheel (dev
extra), read as a data file; the package is never imported.
"""

from __future__ import annotations

import importlib.util
import json
import os
import string
import time
from pathlib import Path

import jsonschema
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ooospec.eval.bench import data as bench_data
from ooospec.pipelines import dedupe, eval_sidecar, normalize
from ooospec.pipelines import records as R
from ooospec.runtime import schemas
from ooospec.runtime.drafters.base import DraftContext
from ooospec.runtime.drafters.schema_fsm import SchemaFSMDrafter
from ooospec.runtime.formats import hermes, llama3_json, parse_any, plain_json
from ooospec.runtime.sidecar import prompts as sp
from ooospec.runtime.tokens import common_prefix_len

STEP_S = 2.0  # time bound of any single call (they take milliseconds; CI machines are small and shared)
FORMATS = [hermes, plain_json, llama3_json]


SCALE = int(os.environ.get("OOOSPEC_FUZZ_SCALE", "1"))  # e.g. 20 for a deeper (still deterministic) run


def fuzz(max_examples: int):
    return settings(max_examples=max_examples * SCALE, derandomize=True, database=None, deadline=None,
                    print_blob=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                            HealthCheck.filter_too_much])


def timed(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, asserting it used at most :data:`STEP_S` of this thread's CPU time (CPU time, not
    wall time: other processes on a shared CI machine cannot make it fail)."""
    t0 = time.thread_time()
    out = fn(*args, **kwargs)
    assert time.thread_time() - t0 < STEP_S, f"{fn.__name__} took over {STEP_S} s of CPU"
    return out


@pytest.fixture(scope="module")
def real_bpe():
    spec = importlib.util.find_spec("anthropic")  # locates the wheel's files without importing the SDK
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the real BPE tokenizer ships in the dev extra: pip install -e '.[dev]'")
    from transformers import PreTrainedTokenizerFast

    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer.json"
    return PreTrainedTokenizerFast(tokenizer_file=str(path), clean_up_tokenization_spaces=False)


# ------------------------------------------------------------------------------------------- strategies

TEXT = st.text(alphabet=st.sampled_from(list(string.ascii_letters + string.digits + ' _-./:"\\\n\t')
                                        + ["\x1f", "é", "日", "\u2028", "😀"]), max_size=10)
NAMES = st.text(alphabet=st.sampled_from(list(string.ascii_letters + "_.-") + ['"', " ", "é"]), min_size=1,
                max_size=12)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                    st.floats(allow_nan=False, allow_infinity=False, width=32), TEXT)
JSON = st.recursive(SCALARS,
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                    max_leaves=6)


@st.composite
def schema_and_values(draw, defs: dict, depth: int = 0):
    """A property schema of a kind real tools use, and a strategy of values valid for it."""
    kinds = ["string", "nullable", "integer", "number", "boolean", "enum", "const", "true", "any", "pattern",
             "ref"] + (["anyOf", "array", "object"] if depth < 2 else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "string":
        return {"type": "string", "description": draw(TEXT)}, TEXT
    if kind == "nullable":
        base = draw(st.sampled_from(["string", "integer", "boolean", "number"]))
        values = {"string": TEXT, "integer": st.integers(-99, 99), "boolean": st.booleans(),
                  "number": st.integers(0, 9)}[base]
        return {"type": list(draw(st.permutations([base, "null"])))}, st.none() | values
    if kind == "integer":
        return {"type": "integer", "minimum": -100}, st.integers(-100, 10**9)
    if kind == "number":
        return {"type": "number"}, st.floats(allow_nan=False, allow_infinity=False) | st.integers()
    if kind == "boolean":
        return {"type": "boolean"}, st.booleans()
    if kind == "enum":
        values = draw(st.lists(SCALARS, min_size=1, max_size=6, unique_by=lambda v: (type(v), json.dumps(v))))
        return {"enum": values}, st.sampled_from(values)
    if kind == "const":
        value = draw(SCALARS)
        return {"const": value}, st.just(value)
    if kind == "true":
        return True, JSON
    if kind == "any":
        return draw(st.sampled_from([{}, {"description": "anything"}])), JSON
    if kind == "pattern":
        return {"type": "string", "pattern": "^[a-z]*$"}, st.text(alphabet="abcxyz", max_size=8)
    if kind == "ref":
        name = f"D{len(defs)}"
        defs[name] = {}  # reserved before drawing: nested refs take the next names
        defs[name], values = draw(schema_and_values(defs, depth + 1))
        return {"$ref": f"#/$defs/{name}", "description": "see $defs"}, values
    if kind == "anyOf":
        (a, va), (b, vb) = draw(schema_and_values(defs, depth + 1)), draw(schema_and_values(defs, depth + 1))
        return {"anyOf": [a, b]}, va | vb
    if kind == "array":
        items, values = draw(schema_and_values(defs, depth + 1))
        return {"type": "array", "items": items}, st.lists(values, max_size=3)
    props, args = draw(object_schema(defs, depth + 1, max_props=3))
    required = [k for k in args if k in props and draw(st.booleans())]
    return {"type": "object", "properties": props, "required": required}, st.just(args)


UNDECLARED = "undeclared!"  # "!" is not in NAMES: never a declared key


@st.composite
def object_schema(draw, defs: dict, depth: int = 0, max_props: int = 5):
    """``(properties, arguments)``: arguments hold some of the keys (and, rarely, an undeclared one), in a
    random order (a valid call need not follow the schema's order)."""
    keys = draw(st.lists(NAMES, max_size=max_props, unique=True))
    props, args = {}, {}
    for k in keys:
        props[k], values = draw(schema_and_values(defs, depth))
        if draw(st.booleans()):
            args[k] = draw(values)
    if draw(st.integers(0, 9)) == 0:
        args[UNDECLARED] = draw(SCALARS)
    return props, {k: args[k] for k in draw(st.permutations(list(args)))}


JUNK_NAMES = ("junk_tool", "bare_junk")


@st.composite
def tools_and_call(draw):
    """1-4 tools with distinct names (some malformed ones mixed in) and a valid gold call to one of them."""
    names = draw(st.lists(NAMES.filter(lambda n: n not in JUNK_NAMES), min_size=1, max_size=4, unique=True))
    tools, calls = [], []
    for name in names:
        defs: dict = {}
        props, args = draw(object_schema(defs))
        # an undeclared key is required (else the FSM does not know it: additionalProperties are not drafted)
        required = [k for k in args if k == UNDECLARED or draw(st.booleans())]
        params = {"type": "object", "properties": props, "required": required}
        if defs:
            params["$defs"] = defs
        tools.append({"type": "function", "function": {"name": name, "description": draw(TEXT),
                                                       "parameters": params}})
        calls.append({"name": name, "arguments": args})
    for junk in draw(st.lists(MALFORMED_TOOLS, max_size=2)):
        tools.insert(draw(st.integers(0, len(tools))), junk)
    i = draw(st.integers(0, len(names) - 1))
    params = tools_by_name(tools)[names[i]]
    jsonschema.Draft202012Validator.check_schema(params)
    assume(jsonschema.Draft202012Validator(params).is_valid(calls[i]["arguments"]))  # e.g. anyOf overlaps
    return tools, calls[i]


def tools_by_name(tools):
    return {t["function"]["name"]: t["function"]["parameters"] for t in tools
            if isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("name")
            and isinstance(t["function"].get("parameters"), dict)}


KEYWORDS = ["type", "properties", "required", "enum", "const", "anyOf", "oneOf", "allOf", "items", "$ref",
            "$defs", "definitions", "pattern", "additionalProperties", "description", "default", "not"]
GARBAGE_SCHEMA = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["string", "null", "object", "#/$defs/a",
                                                                       "#", "^(a|aa)+$", ["string", "null"]]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYWORDS) | NAMES, inner,
                                                                max_size=4),
    max_leaves=12)
MALFORMED_TOOLS = st.one_of(
    GARBAGE_SCHEMA,
    st.builds(lambda p: {"type": "function", "function": {"name": "junk_tool", "parameters": p}},
              GARBAGE_SCHEMA),
    st.builds(lambda p: {"name": "bare_junk", "parameters": {"type": "object", "properties": p}},
              GARBAGE_SCHEMA),
    st.just({"type": "function", "function": {"parameters": {"type": "object"}}}),   # no name
)


def layouts(fmt, call) -> list[str]:
    """The call text as models write it: the format's rendering, bare compact, fenced pretty (Qwen-Coder)."""
    body = {"name": call["name"], fmt.args_key: call["arguments"]}
    return [fmt.render_call(call), json.dumps(body, ensure_ascii=False),
            "```json\n" + json.dumps(body, ensure_ascii=False, indent=2) + "\n```"]


# ------------------------------------------------------------------------------------------- schema FSM


@fuzz(120)
@given(data=tools_and_call(), fmt=st.sampled_from(FORMATS), layout=st.integers(0, 2))
def test_fsm_drafts_never_contradict_a_valid_call(real_bpe, data, fmt, layout):
    tools, call = data
    drafter = timed(SchemaFSMDrafter, real_bpe, fmt, tools, max_branches=64)
    gold = layouts(fmt, call)[layout]
    for i in range(len(gold)):
        drafts = timed(drafter.propose_text, gold[:i])
        assert all(isinstance(d, str) and d for d in drafts)
        if drafts:
            agree = max(common_prefix_len(d, gold[i:]) for d in drafts)
            assert agree >= 1, (gold[:i], gold[i:i + 20], drafts[:4])
    # token level, with the real BPE: drafts are valid ids and decode to text continuing the committed text
    prompt = real_bpe.encode("<|im_start|>assistant\n", add_special_tokens=False)
    ids = real_bpe.encode(gold, add_special_tokens=False)
    default = SchemaFSMDrafter(real_bpe, fmt, tools)
    for k in sorted({0, 1, len(ids) // 3, len(ids) // 2, len(ids) - 1}):
        ctx = DraftContext(tokens=prompt + ids[:k], prompt_len=len(prompt), step=k)
        for d in timed(default.propose, ctx):
            assert d and all(isinstance(t, int) and 0 <= t < len(real_bpe) for t in d)


@fuzz(150)
@given(tools=st.lists(MALFORMED_TOOLS | tools_and_call().map(lambda tc: tc[0][0]), max_size=4),
       fmt=st.sampled_from(FORMATS),
       text=st.text(alphabet='{}[]":, \nabfnrtul0123456789-.e\\<>_`', max_size=60))
def test_fsm_never_raises_on_malformed_schemas_or_output(real_bpe, tools, fmt, text):
    drafter = timed(SchemaFSMDrafter, real_bpe, fmt, tools)
    head = '{"name": "junk_tool", "arguments": {'
    for prefix in (text, '{"name": "' + text, head + text, head + '"' + text):
        assert isinstance(timed(drafter.propose_text, prefix), list)
    ctx = DraftContext(tokens=real_bpe.encode(head + text, add_special_tokens=False), prompt_len=0, step=0)
    for d in timed(drafter.propose, ctx):
        assert all(isinstance(t, int) and 0 <= t < len(real_bpe) for t in d)


# ------------------------------------------------------------------------------------------- parsers

JUNK_PIECES = list('{}[]":,\\ \n0123456789-.eEtrufalsnx') + ["é", "<tool_call>", "</tool_call>", "```json",
                                                              "NaN", "Infinity", "1e999", "9" * 40]
JUNK = st.lists(st.sampled_from(JUNK_PIECES), max_size=80).map("".join)


def assert_calls(calls):
    assert isinstance(calls, list)
    for c in calls:
        assert set(c) == {"name", "arguments"} and isinstance(c["name"], str) and c["name"]
        assert isinstance(c["arguments"], dict)
        json.dumps(c, allow_nan=False)  # what the engine and the pipeline write back is JSON


CALLS = st.builds(lambda name, args: {"name": name, "arguments": args}, NAMES, st.dictionaries(TEXT, JSON, max_size=3))


@fuzz(200)
@given(text=JUNK | st.tuples(JUNK, st.sampled_from(FORMATS), CALLS, JUNK).map(
           lambda t: t[0] + t[1].render_call(t[2]) + t[3]),          # junk around a real call: parsers find calls
       repeat=st.sampled_from([1] * 9 + [300]))
def test_parsers_never_raise_and_return_calls(text, repeat):
    text = text * repeat
    for fmt in FORMATS:
        calls = timed(fmt.parse_calls, text)
        assert_calls(calls)
        assert isinstance(timed(fmt.is_complete, text), bool)
        for c in calls[:3]:  # whatever a parser returns is a call its format writes, closes and reads back
            rendered = fmt.render_call(c)
            assert timed(fmt.parse_calls, rendered) == [c], (rendered, c)
            assert fmt.is_complete(rendered)
    assert_calls(timed(parse_any, text))


@fuzz(150)
@given(name=NAMES, args=st.dictionaries(TEXT, JSON, max_size=4),
       before=st.text(alphabet=string.ascii_letters + ' "}]:,\n', max_size=30), after=JUNK)
def test_a_call_in_prose_is_found(name, args, before, after):
    call = {"name": name, "arguments": args}
    text = before + json.dumps(call, ensure_ascii=False) + after
    assert call in timed(plain_json.parse_calls, text)
    llama = before + json.dumps({"name": name, "parameters": args}) + after
    assert call in timed(llama3_json.parse_calls, llama)
    tagged = before + hermes.render_call(call) + after.replace("<tool_call>", "")
    assert call in timed(hermes.parse_calls, tagged)


# ------------------------------------------------------------------------------------------- sidecar prompts

MESSAGES = st.lists(st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool", "", 7])},
                          optional={"content": st.one_of(TEXT, st.none(), JSON, st.integers())}),
    JSON), max_size=4)
ANSWERS = st.one_of(JUNK, st.builds(json.dumps, JSON),
                    st.sampled_from(["NaN", "-Infinity", "1e999", "[" * 3000, '"\\ud800"', " 0", "1"]))


@fuzz(150)
@given(messages=MESSAGES, tools=st.lists(MALFORMED_TOOLS | tools_and_call().map(lambda tc: tc[0][0]),
                                         max_size=4), direct=st.booleans())
def test_sidecar_wave_never_raises(messages, tools, direct):
    wave = timed(sp.build_wave, messages, tools, (), direct)
    named = [t for t in tools if schemas.tool_name(t) is not None]
    assert len(wave.queries) == 1 + sum(len(sp.tool_parameters(t)) for t in named) + direct
    assert all(p.startswith(wave.block) for p in wave.prompts())


def _plain_json(value) -> bool:
    """JSON that a sidecar answer may carry: finite numbers, string keys, the JSON types only."""
    try:
        return json.loads(json.dumps(value, allow_nan=False)) == value
    except (TypeError, ValueError, RecursionError):
        return False


@fuzz(200)
@given(answer=ANSWERS, num_tools=st.integers(1, 5), value=JSON, index=st.integers(0, 4),
       call=CALLS, tail=st.sampled_from(["", "</s>", " junk", "\n{", "<|im_end|>"]))
def test_sidecar_parsers_raise_only_value_error(answer, num_tools, value, index, call, tail):
    # any answer: a ValueError, or a value of the documented type and range
    try:
        got = timed(sp.parse_function_index, answer, num_tools)
    except ValueError:
        pass
    else:
        assert type(got) is int and 0 <= got < num_tools, (answer, got)
    try:
        got = timed(sp.parse_argument_value, answer)
    except ValueError:
        pass
    else:
        assert _plain_json(got), (answer, got)
    try:
        got = timed(sp.parse_direct_call, answer)
    except ValueError:
        pass
    else:
        assert set(got) == {"name", "arguments"} and isinstance(got["name"], str)
        assert isinstance(got["arguments"], dict) and _plain_json(got), (answer, got)
    # a well-formed answer (then whatever the model wrote after it) parses to exactly its value
    if index < num_tools:
        assert timed(sp.parse_function_index, f" {index}{tail}", num_tools) == index
    else:
        with pytest.raises(ValueError, match="out of range"):
            sp.parse_function_index(str(index), num_tools)
    assert timed(sp.parse_argument_value, " " + json.dumps(value, ensure_ascii=False) + tail) == value
    assert timed(sp.parse_direct_call, json.dumps(call, ensure_ascii=False) + tail) == call


@fuzz(100)
@given(data=tools_and_call(), index=ANSWERS | st.sampled_from(["0", "1", "2"]), answers=st.lists(ANSWERS),
       direct=st.none() | ANSWERS)
def test_join_slots_returns_json_or_none(data, index, answers, direct):
    tools, _ = data
    slots = [(schemas.tool_name(t), p) for t in tools if schemas.tool_name(t) for p in sp.tool_parameters(t)]
    texts = dict(zip(slots, answers))
    call = timed(sp.join_slots, tools, index, texts, direct)
    if call is not None:
        json.dumps(call, allow_nan=False)
        declared = {p for t in tools if schemas.tool_name(t) == call["name"] for p in sp.tool_parameters(t)}
        assert set(call["arguments"]) <= declared


# ------------------------------------------------------------------------------------------- record loading

REASONS = {R.INVALID_TOOL_SCHEMA, R.CALL_UNKNOWN_TOOL, R.CALL_SCHEMA_VIOLATION, R.MALFORMED_RECORD,
           R.NO_GOLD_CALL, R.UNCHECKABLE_SCHEMA}


def _reject(name):
    raise ValueError(name)


def readable(line: bytes) -> bool:
    """What ``records.iter_jsonl`` accepts: blank, or UTF-8 JSON (no NaN/Infinity) holding an object."""
    try:
        return not line.strip() or isinstance(json.loads(line.decode("utf-8"), parse_constant=_reject), dict)
    except (ValueError, RecursionError):
        return False


@st.composite
def record_lines(draw) -> tuple[list[bytes], int | None]:
    """JSONL lines (valid, mutated, junk, blank) and the line number of the first unreadable one."""
    lines, first_bad = [], None
    for n in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["valid", "valid", "mutated", "blank", "junk"]))
        if kind == "blank":
            line = draw(st.sampled_from([b"", b"  ", b"\t"]))
        elif kind == "junk":
            line = draw(st.sampled_from([b"[1, 2]", b"3", b'"x"', b"\xff\xfe{}", b'{"id": NaN}', b"{",
                                         b"[" * 5000, b'{"a": ' + b"9" * 5000 + b"}"]))
        else:
            tools, call = draw(tools_and_call())
            messages = [{"role": "user", "content": draw(TEXT)}]
            rec = R.make_record("fuzz", "test", str(n), tools, messages, [call])
            if kind == "mutated":
                field = draw(st.sampled_from(["id", "tools", "messages", "calls", "meta", "source"]))
                rec[field] = draw(JSON | st.sampled_from([[None], [[]], [{"role": "user"}],
                                                          [{"name": call["name"], "arguments": "x"}]]))
                if draw(st.booleans()) and rec.get("tools"):
                    pattern = draw(st.sampled_from(["^(a|aa)+$", "^[a-z]+$", "(x+x+)+y"]))
                    rec["tools"] = [{"type": "function", "function": {"name": call["name"], "parameters": {
                        "type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}}}}]
                    rec["calls"] = [{"name": call["name"], "arguments": {"s": "a" * 30 + "!"}}]
            line = json.dumps(rec, ensure_ascii=draw(st.booleans())).encode()
        good = readable(line)
        if not good and first_bad is None:
            first_bad = len(lines) + 1
        lines.append(line)
    return lines, first_bad


@fuzz(60)
@given(data=record_lines())
def test_record_loading_names_the_line_and_never_crashes(tmp_path_factory, data):
    lines, first_bad = data
    path = tmp_path_factory.mktemp("fuzz") / "records.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    try:
        rows = timed(lambda: list(R.iter_jsonl(path)))
    except ValueError as e:
        assert first_bad is not None and str(e).startswith(f"{path}:{first_bad}: "), (first_bad, str(e))
        rows = []
    else:
        assert first_bad is None
    for _, rec in rows:
        bad = timed(R.validate_record, rec)
        assert bad is None or (bad[0] in REASONS and isinstance(bad[1], str))
    try:
        timed(bench_data.load_examples, path)
    except ValueError as e:
        assert str(e).startswith(f"{path}")


HOSTILE_FIELDS = [[], "hi", 7, None, {}, [None], [[]], [{"role": "user"}], [{"role": "user", "content": 5}],
                  [{"role": "assistant", "content": "", "tool_calls": "x"}],
                  [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]}],
                  [{"type": "function", "function": {"name": "f", "parameters": {
                      "type": "object", "properties": {"s": {"$ref": "#/$defs/A"}},
                      "$defs": {"A": {"$ref": "#/$defs/A"}}}}}],
                  [{"type": "function", "function": {"name": "f", "parameters": {
                      "type": "object", "properties": {"s": {"type": "string", "pattern": "^(a|aa)+$"}}}}}],
                  [{"name": "f", "arguments": {"s": "a" * 30 + "!"}}], [{"name": "f", "arguments": "x"}]]
RECORD_FIELDS = ["id", "source", "split", "tools", "messages", "calls", "meta"]


@st.composite
def record_shaped_lines(draw) -> list[bytes]:
    """Records as a stage reads them, some with fields dropped, retyped or made hostile; blank lines between."""
    lines = []
    for n in range(draw(st.integers(1, 5))):
        if draw(st.integers(0, 5)) == 0:
            lines.append(draw(st.sampled_from([b"", b" ", b"{", b"[]", b'{"id": NaN}', b"\xff"])))
            continue
        tools, call = draw(tools_and_call())
        messages = [{"role": "user", "content": draw(TEXT)}]
        if draw(st.booleans()):
            messages += [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]},
                         {"role": "tool", "content": draw(TEXT)}]
        rec = R.make_record("fuzz", "train", draw(st.sampled_from([str(n), "0"])), tools, messages, [call])
        for _ in range(draw(st.integers(0, 2))):
            field = draw(st.sampled_from(RECORD_FIELDS))
            how = draw(st.sampled_from(["drop", "retype", "hostile", "inner"]))
            if how == "drop":
                rec.pop(field, None)
            elif how == "retype":
                rec[field] = draw(JSON)
            elif how == "hostile":
                rec[field] = draw(st.sampled_from(HOSTILE_FIELDS))
            elif isinstance(rec.get(field), list) and rec[field] and isinstance(rec[field][0], dict):
                key = draw(st.sampled_from(sorted(rec[field][0]) + ["role", "arguments", "tool_calls"]))
                rec[field][0][key] = draw(JSON | st.sampled_from(HOSTILE_FIELDS))
        lines.append(json.dumps(rec, ensure_ascii=draw(st.booleans())).encode())
    return lines


@fuzz(60)
@given(lines=record_shaped_lines())
def test_record_readers_name_file_line_and_never_crash(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("fuzz") / "records.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    read = timed(R.load_records, path, "skip")          # the one reader of every stage: never raises on skip
    filled = [i for i, line in enumerate(lines, 1) if line.strip()]
    assert sorted([b.line for b in read.bad]) == [b.line for b in read.bad]
    assert len(read.rows) + len(read.bad) == len(filled)
    for b in read.bad:
        assert b.line in filled and b.reason in REASONS | {R.DUPLICATE_ID}
        assert b.message().startswith(f"{path}:{b.line}: ") and "\n" not in b.message()
    for rec in read.rows:
        assert R.validate_record(rec) is None and rec["messages"]
    try:
        timed(R.load_records, path, "fail")
    except ValueError as e:
        assert read.bad and str(e).startswith(f"{path}:{read.bad[0].line}: "), str(e)
    else:
        assert not read.bad
    # what the stages do with what the reader let through never raises
    train, evals, _ = timed(dedupe.dedupe, dedupe.DedupeParams(eval_sets={}, train_splits=("fuzz/train",)),
                            read.rows)
    assert len(train) <= len(read.rows) and not evals
    rows, skipped = timed(eval_sidecar.rows_from_records, path)
    assert skipped >= len(read.bad) and {r["record_id"] for r in rows} <= {r["id"] for r in read.rows}
    for rec in read.rows:
        trace = {"id": rec["id"], "backend": "gold", "model": "gold", "format": "hermes",
                 "text": "".join(hermes.render_call(c) for c in rec["calls"])}
        assert normalize.trace_problem(trace) is None
        try:
            timed(normalize.normalize_one, rec, trace, normalize.NormalizeParams(allow_undeclared_arguments=True))
        except normalize.Rejected as r:
            assert r.reason in normalize.REASONS
    try:
        timed(bench_data.load_examples, path)
    except ValueError as e:
        assert str(e).startswith(f"{path}")


@fuzz(100)
@given(value=JSON, schema=GARBAGE_SCHEMA)
def test_schema_views_never_raise(value, schema):
    assert isinstance(timed(schemas.type_view, schema), str)
    assert isinstance(timed(schemas.value_matches, value, schema), bool)
    assert isinstance(timed(schemas.admitted, schema), dict)
    props = timed(schemas.properties, schema)
    assert all(isinstance(k, str) for k in props) and isinstance(schemas.required(schema), list)
