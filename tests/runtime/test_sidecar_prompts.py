"""The sidecar prompt builder: literal views, the wave's query set, answer parsing and joining."""

import pytest

from ooospec.runtime import sidecar_prompts as sp

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


def test_argument_prompt_is_the_documented_example():
    assert sp.argument_prompt(MESSAGES, WEATHER, "unit") == (
        "Task: argument\n"
        "Conversation:\n"
        "user: Weather in Paris, in celsius?\n"
        "Function:\n"
        "get_weather - Current weather for a city.\n"
        "  city (string, required): City name.\n"
        '  unit ("celsius"|"fahrenheit", optional, default="celsius"): Temperature unit.\n'
        "Parameter: unit\n"
        'Answer: the JSON value of "unit" if get_weather is called next, else null.\n')
    assert sp.__doc__ is not None and "Task: argument" in sp.__doc__


def test_function_index_and_direct_call_prompts_list_tools_in_request_order():
    tail = ("Tools:\n"
            '[0] get_weather(city: string, unit?: "celsius"|"fahrenheit") - Current weather for a city.\n'
            "[1] get_time(tz: string) - Current time in a time zone.\n")
    fi = sp.function_index_prompt(MESSAGES, TOOLS)
    dc = sp.direct_call_prompt(MESSAGES, TOOLS)
    assert fi.startswith("Task: function_index\n") and dc.startswith("Task: direct_call\n")
    assert fi.endswith(tail + "Answer: the index of the tool to call next, as JSON.\n")
    assert tail in dc
    assert sp.function_index_prompt(MESSAGES, TOOLS[::-1]) != fi


def test_completions_are_compact_json_in_schema_order():
    call = {"name": "get_weather", "arguments": {"unit": "celsius", "city": "Paris", "x": 1}}
    assert sp.direct_call_completion(call, WEATHER) == \
        '{"name":"get_weather","arguments":{"city":"Paris","unit":"celsius","x":1}}'
    assert sp.argument_completion(None) == "null"
    assert sp.argument_completion(["Zürich", 2.5]) == '["Zürich",2.5]'
    assert sp.function_index_completion(3) == "3"


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


def test_argument_prompt_rejects_unknown_parameter():
    with pytest.raises(ValueError, match="no parameter 'units'"):
        sp.argument_prompt(MESSAGES, WEATHER, "units")


def test_slot_queries_cover_every_function_parameter_once():
    qs = sp.slot_queries(MESSAGES, TOOLS)
    assert [(q.form, q.function, q.parameter) for q in qs] == [
        ("function_index", None, None), ("argument", "get_weather", "city"),
        ("argument", "get_weather", "unit"), ("argument", "get_time", "tz")]
    assert qs[2].prompt == sp.argument_prompt(MESSAGES, WEATHER, "unit")


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
