"""The sidecar's contract: literal views, the wave's query set, tokenization, answer parsing and joining, metadata;
and that it (and the client built on it) imports without torch."""

import json
import subprocess
import sys

import pytest

from ooospec.runtime.sidecar import prompts as sp

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "City name."},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius",
                 "description": "Temperature unit."}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone.",
    "parameters": {"type": "object", "required": ["tz"], "properties": {"tz": {"type": "string"}}}}}
TOOLS = [WEATHER, TIME]
MESSAGES = [{"role": "user", "content": "Weather in Paris,\n in celsius?"}]


BLOCK = ("Conversation:\n"
         "user: Weather in Paris, in celsius?\n"
         "Tools:\n"
         "[0] get_weather - Current weather for a city.\n"
         "  city (string, required): City name.\n"
         '  unit ("celsius"|"fahrenheit", optional, default="celsius"): Temperature unit.\n'
         "[1] get_time - Current time in a time zone.\n"
         "  tz (string, required)\n")


def test_wave_is_the_documented_example():
    wave = sp.build_wave(MESSAGES, TOOLS, with_direct_call=True, layout=2)
    assert wave.block == BLOCK
    assert [(q.form, q.function, q.parameter, q.text) for q in wave.queries] == [
        ("function_index", None, None, "Query: tool index\n"),
        ("argument", "get_weather", "city", "Query: get_weather.city\n"),
        ("argument", "get_weather", "unit", "Query: get_weather.unit\n"),
        ("argument", "get_time", "tz", "Query: get_time.tz\n"),
        ("direct_call", None, None, "Query: call\n")]
    assert wave.prompts()[1] == BLOCK + "Query: get_weather.city\n"
    doc = sp.__doc__
    assert doc is not None and "[0] get_weather - Current weather for a city." in doc and "Query: tool index" in doc
    call = {"name": "get_weather", "arguments": {"unit": "celsius", "city": "Paris"}}
    assert sp.gold_answers(wave.queries, TOOLS, call) == [
        "0", '"Paris"', '"celsius"', "null", '{"name":"get_weather","arguments":{"city":"Paris","unit":"celsius"}}']
    with pytest.raises(ValueError, match="not one of the tools"):
        sp.gold_answers(wave.queries, TOOLS, {"name": "nope", "arguments": {}})


def test_block_is_shared_and_depends_on_tool_order():
    a = sp.build_wave(MESSAGES, TOOLS)
    assert len({p[: len(a.block)] for p in a.prompts()}) == 1
    assert sp.build_wave(MESSAGES, TOOLS[::-1]).block != a.block
    assert sp.build_wave(MESSAGES, TOOLS, with_direct_call=False).queries[-1].form == "argument"


def test_answers_are_compact_json_in_schema_order():
    call = {"name": "get_weather", "arguments": {"unit": "celsius", "city": "Paris", "x": 1}}
    assert sp.direct_call_answer(call, WEATHER) == \
        '{"name":"get_weather","arguments":{"city":"Paris","unit":"celsius","x":1}}'
    assert sp.argument_answer(None) == "null"
    assert sp.argument_answer(["Zürich", 2.5]) == '["Zürich",2.5]'
    assert sp.function_index_answer(3) == "3"
    with pytest.raises(ValueError):
        sp.argument_answer(float("nan"))


def test_type_view():
    assert sp.type_view({"type": "array", "items": {"type": "integer"}}) == "array[integer]"
    assert sp.type_view({"type": ["string", "null"]}) == "string|null"
    assert sp.type_view({"anyOf": [{"type": "string"}, {"type": "number"}]}) == "string|number"
    assert sp.type_view({}) == "any"
    many = sp.type_view({"enum": list(range(20))})
    assert many.endswith("|...") and many.count("|") == sp.MAX_ENUM_VALUES


def test_context_view_keeps_newest_messages_and_prior_calls():
    long = [{"role": "user", "content": "x" * 1000}, {"role": "assistant", "content": "y" * 1000},
            {"role": "user", "content": "z" * 1500}]
    view = sp.context_view(long, prior_calls=[{"name": "f", "arguments": {"a": 1}}])
    lines = view.split("\n")
    assert lines[0] == "(1 earlier messages omitted)"
    assert lines[1].startswith("assistant: y") and lines[2].startswith("user: z")
    assert lines[-1] == 'call: {"name":"f","arguments":{"a":1}}'
    huge = sp.context_view([{"role": "user", "content": "a" * 10 + "b" * 5000}])
    assert len(huge) == sp.MAX_CONTEXT_CHARS and huge.startswith("...") and huge.endswith("b")


def test_argument_query_rejects_unknown_parameter():
    with pytest.raises(ValueError, match="no parameter 'units'"):
        sp.argument_query(WEATHER, "units")


def test_malformed_tools_and_messages_never_crash_the_builder():
    odd = [{"type": "function", "function": {"name": "n", "parameters": {"properties": {"a": True, "b": {
        "type": ["string", "null"]}}, "required": None}}},
           {"function": {"description": "no name"}}, "not a tool"]
    wave = sp.build_wave([{"role": "user"}, {"role": "user", "content": None}, {"content": [{"t": 1}]}], odd)
    assert [q.parameter for q in wave.queries if q.form == "argument"] == ["a", "b"]
    assert "  a (any, optional)" in wave.block and "  b (string|null, optional)" in wave.block
    assert "[2] ?" in wave.block


@pytest.mark.parametrize("text,value", [("1", 1), (" 0<|im_end|>garbage", 0), ("2\n3", 2)])
def test_parse_function_index(text, value):
    assert sp.parse_function_index(text, num_tools=3) == value


@pytest.mark.parametrize("text", ["", "one", "-1", "1.5", "true", "3"])
def test_parse_function_index_rejects(text):
    with pytest.raises(ValueError):
        sp.parse_function_index(text, num_tools=3)


def test_parse_argument_value_and_direct_call():
    assert sp.parse_argument_value('"Paris"</s>') == "Paris"
    assert sp.parse_argument_value("null") is None
    assert sp.parse_argument_value(' {"a":[1,2]} trailing') == {"a": [1, 2]}
    with pytest.raises(ValueError):
        sp.parse_argument_value('"unterminated')
    assert sp.parse_direct_call('{"name":"f","arguments":{}}') == {"name": "f", "arguments": {}}
    with pytest.raises(ValueError):
        sp.parse_direct_call('{"name":"f"}')


def test_join_slots_drops_null_and_unparseable_answers():
    answers = {("get_weather", "city"): '"Paris"', ("get_weather", "unit"): "null",
               ("get_time", "tz"): '"UTC"'}
    assert sp.join_slots(TOOLS, "0", answers) == {"name": "get_weather", "arguments": {"city": "Paris"}}
    answers[("get_weather", "unit")] = '"celsius'
    assert sp.join_slots(TOOLS, "0", answers)["arguments"] == {"city": "Paris"}
    assert sp.join_slots(TOOLS, "1", answers) == {"name": "get_time", "arguments": {"tz": "UTC"}}
    assert sp.join_slots(TOOLS, "7", answers) is None


def test_join_slots_validates_values_against_the_schema_and_rejects_nan():
    answers = {("get_weather", "city"): "3", ("get_weather", "unit"): '"kelvin"'}
    assert sp.join_slots(TOOLS, "0", answers) == {"name": "get_weather", "arguments": {}}
    assert sp.join_slots(TOOLS, "0", {("get_weather", "city"): "NaN"})["arguments"] == {}
    with pytest.raises(ValueError, match="within depth"):
        sp.parse_argument_value("[" * 100_000)
    direct = '{"name":"get_time","arguments":{"tz":"UTC","bogus":1}}'
    assert sp.join_slots(TOOLS, "1", {}, direct)["direct_call"] == {"name": "get_time", "arguments": {"tz": "UTC"}}


@pytest.mark.parametrize("module", ["ooospec.runtime.sidecar.prompts", "ooospec.runtime.sidecar.client",
                                    "ooospec.runtime.sidecar.process"])
def test_the_contract_and_the_client_import_without_torch(module):
    code = f"import sys; import {module}; assert 'torch' not in sys.modules, 'torch was imported'"
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_encode_wave_tokenizes_block_and_queries_apart():
    def char_tokenizer(texts, add_special_tokens=False):   # one id per character, a BOS when asked
        bos = [1] if add_special_tokens else []
        ids = [bos + [ord(c) for c in t] for t in ([texts] if isinstance(texts, str) else texts)]
        return {"input_ids": ids[0] if isinstance(texts, str) else ids}

    wave = sp.build_wave(MESSAGES, TOOLS)
    block, queries = sp.encode_wave(char_tokenizer, wave)
    assert block == [ord(c) for c in wave.block]             # no special tokens
    assert [block + q for q in queries] == [[ord(c) for c in p] for p in wave.prompts()]
    assert sp.encode_wave(char_tokenizer, sp.Wave("b\n", ())) == ([ord("b"), ord("\n")], [])


def test_metadata_records_the_layout_and_refuses_another(tmp_path):
    (tmp_path / sp.METADATA_FILE).write_text(json.dumps({**sp.layout_metadata(), "base": "b"}))
    assert sp.read_metadata(tmp_path) == {"layout_version": sp.LAYOUT_VERSION, "base": "b"}
    (tmp_path / sp.METADATA_FILE).write_text(json.dumps({"base": "b"}))
    with pytest.raises(sp.LayoutMismatch, match="layout None"):
        sp.read_metadata(tmp_path)
