"""Hostile but realistic input: every reproducer of the robustness probe, as a regression test.

Schemas real APIs write (type lists, boolean sub-schemas, ``$ref``, malformed keywords), parsers that stay
linear on looping output, nesting that must end in ValueError rather than RecursionError, NaN answers, record
files with bad lines, and tool patterns that backtrack catastrophically.
"""

from __future__ import annotations

import json
import time

import pytest
from toy_bpe import toy_bpe

from ooospec.eval.bench import data as bench_data
from ooospec.pipelines import records as R
from ooospec.runtime import schemas
from ooospec.runtime.drafters.call_state import parse_state
from ooospec.runtime.drafters.schema_fsm import CallGrammar, SchemaFSMDrafter
from ooospec.runtime.formats import common, hermes, parse_any, plain_json
from ooospec.runtime.sidecar import prompts as sp


def T(name: str, props, required=None, **extra) -> dict:
    params = {"type": "object", "properties": props, **extra}
    if required is not None:
        params["required"] = required
    return {"type": "function", "function": {"name": name, "parameters": params}}


WEATHER = T("get_weather", {"city": {"type": "string"}}, ["city"])
NULLABLE = T("g", {"tz": {"type": ["string", "null"]}, "flag": {"type": ["boolean", "null"]}})


def drafted_steps(drafter: SchemaFSMDrafter, gold: str) -> tuple[int, int]:
    """(steps, steps whose drafts include the gold's next character) over every prefix of ``gold``."""
    steps = hits = 0
    for i in range(len(gold)):
        drafts = drafter.propose_text(gold[:i])
        steps += 1
        hits += any(d[:1] == gold[i] for d in drafts)
    return steps, hits


# ------------------------------------------------------------------ 1. schema FSM on real-world schemas


def test_nullable_type_list_does_not_switch_the_fsm_off():
    drafter = SchemaFSMDrafter(toy_bpe(), hermes, [WEATHER, NULLABLE])
    drafts = drafter.propose_text('{"name": "')  # was: TypeError (unhashable list) on every step
    assert drafts[:3] == ['get_weather", "arguments": {"city": "', 'g", "arguments": {"tz": "',
                          'g", "arguments": {"tz": null}}']
    args = '{"name": "g", "arguments": {'
    assert drafter.propose_text(args + '"tz": ')[:2] == ['"', "null}}"]
    assert drafter.grammar.next_pieces(parse_state(args + '"flag": ')) == ["true", "false", "null"]
    assert drafter.grammar.next_pieces(parse_state(args + '"flag": n')) == ["ull"]
    # the called tool is the plain one: every structural step still gets a draft
    gold = hermes.render_call({"name": "get_weather", "arguments": {"city": "Paris"}})
    steps, hits = drafted_steps(drafter, gold)
    assert steps - hits == len('Paris"')  # only the free string value (and where it ends) is undrafted


def test_boolean_and_false_sub_schemas():
    tool = T("f", {"any": True, "never": False, "n": {"type": "integer"}})
    grammar = CallGrammar(plain_json, [tool])
    head = '{"name": "f", "arguments": {'
    assert grammar.next_pieces(parse_state(head)) == ['"any": ', '"n": ', "}"]  # a false key: never drafted
    assert grammar.next_pieces(parse_state(head + '"any": ')) == []              # anything: no draft
    assert grammar.next_pieces(parse_state(head + '"n": ')) == []                # free number: no draft


PREFIXES = ["", '{"name": "', '{"name": "f", "arguments": {', '{"name": "f", "arguments": {"a": ']
# f with unusable parameters is kept as a tool with no arguments: its whole call is certain, up to ``{}``
F_NO_ARGS = [['<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', '{"name": "f", "arguments": {}}',
              '```json\n{\n  "name": "f",\n  "arguments": {}\n}\n```'],
             ['f", "arguments": {}}'], ["}}"], []]
# no usable tool at all: only the call's opening is drafted, never a name
NO_TOOLS = [['<tool_call>\n{"name": "', '{"name": "', '```json\n{\n  "name": "'], [], [], []]


@pytest.mark.parametrize("tools, expected", [
    ([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "required": None, "properties": None}}}], F_NO_ARGS),
    ([{"type": "function", "function": {"name": "f", "parameters": {"properties": [1, 2], "required": "a"}}}],
     F_NO_ARGS),
    ([T("f", {"a": {"enum": None}, "b": {"type": None}, "c": {"anyOf": "x"}})],      # keys kept, values free
     [['<tool_call>\n{"name": "f", "arguments": {"a": ', '<tool_call>\n{"name": "f", "arguments": {"b": ',
       '<tool_call>\n{"name": "f", "arguments": {"c": ', '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
       '{"name": "f", "arguments": {"a": ', '```json\n{\n  "name": "f",\n  "arguments": {\n    "a": '],
      ['f", "arguments": {"a": ', 'f", "arguments": {"b": ', 'f", "arguments": {"c": ', 'f", "arguments": {}}'],
      ['"a": ', '"b": ', '"c": ', "}}"], []]),
    ([{"type": "function", "function": {"name": "f", "parameters": "string"}}], F_NO_ARGS),
    (["not a tool", None, 3, {"function": "f"}, {"name": 5}, {"type": "function", "function": {"name": ""}},
      WEATHER],                                                                 # only get_weather survives
     [['<tool_call>\n{"name": "get_weather", "arguments": {"city": "',
       '{"name": "get_weather", "arguments": {"city": "',
       '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "'],
      ['get_weather", "arguments": {"city": "'], [], []]),                      # "f" is no tool: no drafts
    ({"not": "a list"}, NO_TOOLS),
    (None, NO_TOOLS),
], ids=["null-keywords", "list-properties", "null-enum-type", "string-parameters", "junk-tools", "dict",
        "none"])
def test_malformed_schemas_draft_only_the_usable_tools(tools, expected):
    """The constructor never raises; unusable tools and keywords are dropped, and what is left is drafted exactly."""
    drafter = SchemaFSMDrafter(toy_bpe(), hermes, tools)
    assert [drafter.propose_text(text) for text in PREFIXES] == expected


def test_ref_into_the_tools_own_defs():
    props = {"unit": {"$ref": "#/$defs/Unit"}, "loop": {"$ref": "#/$defs/A"}, "gone": {"$ref": "#/nope"}}
    tool = T("f", props, **{"$defs": {"Unit": {"enum": ["c", "f"]}, "A": {"$ref": "#/$defs/A"}}})
    grammar = CallGrammar(plain_json, [tool])
    head = '{"name": "f", "arguments": {'
    assert grammar.next_pieces(parse_state(head + '"unit": ')) == ['"c"', '"f"']
    assert grammar.next_pieces(parse_state(head + '"loop": ')) == []     # a cycle constrains nothing
    assert grammar.next_pieces(parse_state(head + '"gone": ')) == []
    assert sp.type_view(sp.tool_parameters(tool)["unit"]) == '"c"|"f"'


# Time bounds are on this thread's CPU time (time.thread_time), so a loaded CI machine cannot make them flaky.


def test_a_huge_enum_is_cheap_and_exact():
    values = [f"val{i:05d}" for i in range(10_000)]
    drafter = SchemaFSMDrafter(toy_bpe(), plain_json, [T("big", {"v": {"enum": values}}, ["v"])])
    head = '{"name": "big", "arguments": {"v": '
    drafter.propose_text(head)  # builds the value index once
    for text in [head, head + '"val0', head + '"val0123', head + '"val01234']:
        t0 = time.thread_time()
        drafts = drafter.propose_text(text)
        assert time.thread_time() - t0 < 0.05, text
    assert drafter.propose_text(head) == ['"val0']                  # common to all 10,000: certain
    assert drafter.propose_text(head + '"val0') == []                # 10,000 left, no common prefix: no guess
    assert drafts == ['"}}']                                         # one value left: drafted to the end


def test_long_values_and_prose_stay_cheap():
    drafter = SchemaFSMDrafter(toy_bpe(), plain_json, [WEATHER])
    text = "x" * 200_000 + '{"name": "get_weather", "arguments": {"city": "' + "P" * 200_000
    t0 = time.thread_time()
    assert drafter.propose_text(text) == []
    assert drafter.propose_text(text + '"') == ["}}"]
    assert time.thread_time() - t0 < 5


# ------------------------------------------------------------------ 2. sidecar prompt views, same schemas


def test_sidecar_views_take_boolean_and_nullable_schemas():
    tool = T("f", {"a": True, "b": {"type": ["string", "null"]}, "c": False})
    wave = sp.build_wave([{"role": "user", "content": "hi"}], [tool, NULLABLE])
    assert "  a (any, optional)" in wave.block and "  b (string|null, optional)" in wave.block
    assert [q.parameter for q in wave.queries[1:]] == ["a", "b", "c", "tz", "flag"]


# ------------------------------------------------------------------ 3. parse_any is linear


@pytest.mark.parametrize("text", [
    "{" * 1_000_000,
    "[" * 100_000 + "x" + "]" * 100_000,
    '{"a":' * 200_000,
    '["' * 100_000,
    '{"a": "' + "[" * 500_000,
], ids=["1MB-open-braces", "deep-broken", "open-keys", "quotes-in-brackets", "brackets-in-a-string"])
def test_parse_any_is_linear_on_unclosed_brackets(text):
    t0 = time.thread_time()
    assert parse_any(text) == []
    assert time.thread_time() - t0 < 5  # was 2.2 s for 100k braces, minutes for 1 MB


def test_parse_any_still_finds_calls_around_junk():
    call = '{"name": "f", "arguments": {"x": [1, {"y": null}]}}'
    assert parse_any("{" * 1000 + call) == [{"name": "f", "arguments": {"x": [1, {"y": None}]}}]
    assert parse_any("[" * 5000 + call + "]" * 5000) == [{"name": "f", "arguments": {"x": [1, {"y": None}]}}]
    assert parse_any('{"a": {"name": "f", "arguments": {}} oops') == [{"name": "f", "arguments": {}}]


# ------------------------------------------------------------------ 4. deep nesting is a ValueError


def test_deep_nesting_is_not_a_recursion_error():
    deep = "[" * 5000 + "]" * 5000
    assert parse_any(deep) == [] and parse_any('{"name": "f", "arguments": ' + deep + "}") == []
    with pytest.raises(ValueError):
        common.loads(deep)
    assert common.to_call({"name": "f", "arguments": '{"a": ' + deep + "}"}) is None
    for parse in (sp.parse_function_index, sp.parse_argument_value, sp.parse_direct_call):
        with pytest.raises(ValueError):
            parse(deep)
    tool = T("f", {"a": {}})
    assert sp.join_slots([tool], "0", {("f", "a"): deep}) == {"name": "f", "arguments": {}}


def test_deep_record_line_names_file_and_line(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text(json.dumps(record()) + "\n" + '{"id": ' + "[" * 100_000 + "\n")
    with pytest.raises(ValueError, match=r"deep\.jsonl:2: malformed_record: JSON nests too deep"):
        bench_data.load_examples(path)
    deep_args = record(args={"city": "Paris", "x": json.loads("[" * 200 + "]" * 200)})
    assert R.validate_record(deep_args) == (
        R.MALFORMED_RECORD, "calls[0] 'get_weather': arguments nests deeper than 64 levels")


# ------------------------------------------------------------------ 5. answers are JSON (no NaN); messages


def test_nan_and_infinity_answers_are_dropped():
    tool = T("f", {"a": {}, "b": {"type": "number"}})
    for bad in ["NaN", "Infinity", "-Infinity", "[NaN]", '{"x": Infinity}', "1e999"]:
        call = sp.join_slots([tool], "0", {("f", "a"): bad, ("f", "b"): "1.5"})
        assert call == {"name": "f", "arguments": {"b": 1.5}}, bad
        json.dumps(call, allow_nan=False)
    assert parse_any('{"name": "f", "arguments": {"a": NaN}}') == []
    assert parse_any('{"name": "f", "arguments": {"a": 1e999}}') == []


def test_parse_argument_value_rejects_overflowing_numbers():
    with pytest.raises(ValueError):
        sp.parse_argument_value("1e999")


def test_messages_without_content_and_tools_without_names():
    messages = [{"role": "user"}, {"role": "assistant", "content": None}, {"role": "user", "content": "hi"}]
    block = sp.build_wave(messages, [WEATHER]).block
    assert "user:\nassistant:\nuser: hi\n" in block and "None" not in block
    nameless = {"type": "function", "function": {"parameters": {"type": "object", "properties": {"a": {}}}}}
    assert sp.join_slots([nameless, WEATHER], "0", {}) is None
    assert sp.join_slots([nameless, WEATHER], "1", {("get_weather", "city"): '"Paris"'}) == {
        "name": "get_weather", "arguments": {"city": "Paris"}}


# ------------------------------------------------------------------ 6. load_examples: file, line, field


def record(id_="toy/test/a", args=None, **overrides) -> dict:
    rec = R.make_record("toy", "test", "a", [T("get_weather", {"city": {"type": "string"}}, ["city"])],
                        [{"role": "user", "content": "Weather in Paris?"}],
                        [R.call("get_weather", args if args is not None else {"city": "Paris"})])
    rec["id"] = id_
    rec.update(overrides)
    return rec


def write_lines(path, lines: list[str | bytes]) -> None:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))


def test_line_numbers_count_blank_lines(tmp_path):
    path = tmp_path / "r.jsonl"
    bad = record("toy/test/b", calls=[R.call("nope", {})])
    write_lines(path, [json.dumps(record()), "", "", "  ", "", json.dumps(bad)])
    unknown = r"r\.jsonl:6: record 'toy/test/b': call_unknown_tool: calls\[0\]: call 'nope' not in tools"
    with pytest.raises(ValueError, match=unknown):
        bench_data.load_examples(path)


@pytest.mark.parametrize("line,message", [
    ("[1, 2]", r":2: malformed_record: expected a JSON object per line, got a list"),
    ("3", r":2: malformed_record: expected a JSON object per line, got a number"),
    ('"text"', r":2: malformed_record: expected a JSON object per line, got a string"),
    (b'{"id": "\xff\xfe"}', r":2: malformed_record: not UTF-8 \(bytes b'\\xff\\xfe\"}' at column 9\)"),
    ('{"id": NaN}', r":2: malformed_record: not valid JSON \(NaN is not a JSON value\)"),
    ('{"id": ', r":2: malformed_record: not valid JSON \(Expecting value, column 8\)"),
])
def test_bad_lines_raise_value_error_with_file_and_line(tmp_path, line, message):
    path = tmp_path / "r.jsonl"
    write_lines(path, [json.dumps(record()), line])
    with pytest.raises(ValueError, match=r"r\.jsonl" + message):
        bench_data.load_examples(path)


@pytest.mark.parametrize("field,value,detail", [
    ("id", 7, "id: expected a non-empty string, got a number"),
    ("tools", "get_weather", "tools: expected a list, got a string"),
    ("messages", [{"role": "user"}], "messages[0].content: expected a string, got null"),
    ("messages", ["hi"], "messages[0]: expected an object {role, content}, got a string"),
    ("calls", [["get_weather"]], "calls[0]: expected an object {name, arguments}, got a list"),
    ("tools", ["get_weather"], "tools[0]: expected an object, got a string"),
    ("meta", [], "meta: expected an object, got a list"),
])
def test_wrong_typed_fields_are_named(tmp_path, field, value, detail):
    path = tmp_path / "r.jsonl"
    write_lines(path, [json.dumps(record("toy/test/b")), json.dumps(record(**{field: value}))])
    with pytest.raises(ValueError, match=r"r\.jsonl:2: .*" + detail.replace("[", r"\[").replace("]", r"\]")
                       .replace("{", r"\{").replace("}", r"\}")):
        bench_data.load_examples(path)


def test_mixed_id_types_do_not_crash_the_sort(tmp_path):
    path = tmp_path / "r.jsonl"
    write_lines(path, [json.dumps(record("toy/test/a")), json.dumps(record(1))])
    with pytest.raises(ValueError,
                       match=r"r\.jsonl:2: malformed_record: id: expected a non-empty string, got a number"):
        bench_data.load_examples(path)


def test_validate_record_never_raises_on_non_objects():
    for rec in [[], "x", 3, None, {"id": "a"}, {**record(), "calls": [None]}, {**record(), "tools": [[]]}]:
        reason, _ = R.validate_record(rec)
        assert reason in (R.MALFORMED_RECORD, R.NO_GOLD_CALL)


# ------------------------------------------------------------------ 7. ReDoS: patterns run under a time bound


def redos_record(pattern: str, value: str) -> dict:
    rec = record(args={"code": value})
    rec["tools"] = [T("get_weather", {"code": {"type": "string", "pattern": pattern}}, ["code"])]
    return rec


def test_the_probes_pattern_no_longer_hangs():
    t0 = time.thread_time()
    reason, detail = R.validate_record(redos_record("^(a+)+$", "a" * 40 + "!"))
    assert time.thread_time() - t0 < 2
    assert (reason, "does not match" in detail) == (R.CALL_SCHEMA_VIOLATION, True)  # the regex engine copes


@pytest.mark.parametrize("pattern", ["^(a|aa)+$", "^(a|a)+$"])
def test_a_catastrophic_pattern_is_reported_not_hidden(pattern):
    t0 = time.thread_time()
    reason, detail = R.validate_record(redos_record(pattern, "a" * 40 + "!"))
    assert time.thread_time() - t0 < 3  # budget 0.2 s plus the metaschema check
    assert reason == R.UNCHECKABLE_SCHEMA
    assert pattern in detail and "catastrophic backtracking" in detail
    assert R.validate_record(redos_record(pattern, "aaaa")) is None  # a value checkable in time still passes


def test_pattern_budget_is_shared_and_hints_degrade_to_accepting():
    schema = {"type": "object", "properties": {f"k{i}": {"pattern": "^(a|aa)+$"} for i in range(20)}}
    value = {f"k{i}": "a" * 40 + "!" for i in range(20)}
    t0 = time.thread_time()
    with pytest.raises(schemas.UncheckableSchema):
        schemas.first_error(value, schema)
    assert schemas.value_matches(value, schema) is True  # a hint is not filtered by what cannot be checked
    assert time.thread_time() - t0 < 3                   # 20 patterns share one 0.2 s budget per call
    assert schemas.value_matches("b", {"pattern": "^a"}) is False
    props = {"type": "object", "patternProperties": {"^(a|aa)+$": {"type": "integer"}},
             "additionalProperties": False}
    with pytest.raises(schemas.UncheckableSchema):
        schemas.first_error({"a" * 40 + "!": 1}, props)
    assert "does not match any of the regexes" in schemas.first_error({"b": 1}, props).message
