"""Tool-call formats: render a conversation with a call through a chat template, tokenize, parse it back."""

from __future__ import annotations

import json

import pytest

from ooospec.runtime.formats import (
    FORMATS,
    detect_format,
    get_format,
    hermes,
    llama3_json,
    parse_any,
    plain_json,
)
from tests.runtime.toy_bpe import CHATML_TEMPLATE, HERMES_TEMPLATE, LLAMA3_TEMPLATE, with_template

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"name": "get_time", "description": "Local time.",  # bare schemas are accepted too
     "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}},
]
CALL = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}


def conversation(call: dict) -> list[dict]:
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]},
        {"role": "tool", "content": json.dumps({"temp": 21})},
        {"role": "user", "content": "And the time in Berlin?"},
    ]


CASES = [  # (format, chat template); None = no template at all (Gemma 3 base)
    ("hermes", HERMES_TEMPLATE),
    ("llama3_json", LLAMA3_TEMPLATE),
    ("json", CHATML_TEMPLATE),
    ("json", None),
    ("hermes", CHATML_TEMPLATE),
    ("llama3_json", None),
]


@pytest.mark.parametrize("name,template", CASES, ids=[f"{n}-{'none' if t is None else t[:12]}" for n, t in CASES])
def test_render_tokenize_parse_roundtrip(name, template):
    tok = with_template(template)
    fmt = get_format(name)
    prompt = fmt.render_prompt(tok, conversation(CALL), TOOLS)
    text = tok.decode(tok.encode(prompt, add_special_tokens=False))
    assert text == prompt
    assert fmt.parse_calls(text) == [CALL]
    assert parse_any(text) == [CALL]
    assert "get_time" in text  # the tools reached the prompt, by template or by fallback


def test_render_uses_the_templates_own_tool_rendering():
    prompt = hermes.render_prompt(with_template(HERMES_TEMPLATE), conversation(CALL), TOOLS)
    assert "<tools>" in prompt and prompt.endswith("<|im_start|>assistant\n")
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}' in prompt
    prompt = llama3_json.render_prompt(with_template(LLAMA3_TEMPLATE), conversation(CALL), TOOLS)
    assert '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}' in prompt


def test_fallbacks_list_tools_as_json():
    chatml = plain_json.render_prompt(with_template(CHATML_TEMPLATE), conversation(CALL), TOOLS)
    assert chatml.startswith("<|im_start|>system\nYou are a helpful assistant.\n\nYou can call")
    assert json.dumps(TOOLS[1], ensure_ascii=False) in chatml
    assert "<|im_start|>user\nTool result: {\"temp\": 21}<|im_end|>" in chatml
    plain = hermes.render_prompt(with_template(None), conversation(CALL), TOOLS)
    assert plain.startswith("System: You are a helpful assistant.")
    assert "Assistant: <tool_call>\n" in plain and plain.endswith("\n\nAssistant: ")


@pytest.mark.parametrize("template,expected", [
    (HERMES_TEMPLATE, "hermes"), (LLAMA3_TEMPLATE, "llama3_json"), (CHATML_TEMPLATE, "json"), (None, "json"),
])
def test_detect_format_reads_the_template(template, expected):
    assert detect_format(with_template(template)).NAME == expected


def test_registry():
    assert sorted(FORMATS) == ["hermes", "json", "llama3_json"]
    for name, fmt in FORMATS.items():
        assert fmt.NAME == name
        assert fmt.args_key in ("arguments", "parameters")
    with pytest.raises(KeyError, match="known"):
        get_format("xml")


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_render_call_parses_back_and_is_complete(name):
    fmt = get_format(name)
    text = fmt.render_call(CALL)
    assert text.startswith(fmt.call_prefix) and text.endswith(fmt.call_suffix)
    assert fmt.parse_calls(text) == [CALL]
    assert fmt.is_complete(text)
    assert not any(fmt.is_complete(text[:i]) for i in range(len(text) - len(fmt.call_suffix)))


# What the models emit, measured (Qwen2.5-Coder-0.5B under its own hermes template: fenced, pretty, no tags).
QWEN_CODER = ('```json\n{\n  "name": "QueryStock",\n  "arguments": {\n    "symbol": "AMZN",\n'
              '    "date": "2022-03-11"\n  }\n}\n```')
QWEN_CALL = {"name": "QueryStock", "arguments": {"symbol": "AMZN", "date": "2022-03-11"}}


@pytest.mark.parametrize("text,calls", [
    (QWEN_CODER, [QWEN_CALL]),
    ('Sure! {"name": "f", "arguments": {"s": "a } b"}} done', [{"name": "f", "arguments": {"s": "a } b"}}]),
    ('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "g", "arguments": {"x": 1}}',
     [{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"x": 1}}]),
    ('<|python_tag|>{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}',
     [{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": {}}]),
    ('[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {"b": 2}}]',
     [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {"b": 2}}]),
    ('{"type": "function", "function": {"name": "f", "arguments": "{\\"a\\": 1}"}}',
     [{"name": "f", "arguments": {"a": 1}}]),
    ('{"name": "f", "arguments": {"note": "line1\nline2"}}', [{"name": "f", "arguments": {"note": "line1\nline2"}}]),
    ("I cannot help with that.", []),
    ('{"name": "f", "arguments": {"a": ', []),
])
def test_parse_any_is_robust(text, calls):
    assert parse_any(text) == calls


def test_hermes_prefers_tagged_blocks_over_other_json():
    text = ('Let me look {"name": "decoy", "arguments": {}} up.\n'
            '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>')
    assert hermes.parse_calls(text) == [{"name": "f", "arguments": {}}]
    assert plain_json.parse_calls(text) == [{"name": "decoy", "arguments": {}}, {"name": "f", "arguments": {}}]


@pytest.mark.parametrize("fmt,text,complete", [
    (hermes, "", False),
    (hermes, "<tool_", False),
    (hermes, '<tool_call>\n{"name": "f", "arguments": {}}', False),
    (hermes, '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', True),
    (hermes, '```json\n{\n  "name": "f",\n  "arguments": {}\n', False),
    (hermes, '```json\n{\n  "name": "f",\n  "arguments": {}\n}', True),   # untagged Qwen-Coder output
    (plain_json, '{"name": "f", "arguments": {"s": "}"}', False),
    (plain_json, '{"name": "f", "arguments": {"s": "}"}}', True),
    (llama3_json, '{"name": "f", "parameters": {"s": "\\"}"}', False),
    (llama3_json, '{"name": "f", "parameters": {"s": "\\"}"}}', True),
])
def test_is_complete(fmt, text, complete):
    assert fmt.is_complete(text) is complete
