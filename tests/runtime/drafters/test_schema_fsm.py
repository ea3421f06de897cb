"""Schema FSM drafter: grammar pieces, name/key branching, validity of every draft, in-context tokenization."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from ooospec.runtime.drafters.base import DraftContext
from ooospec.runtime.drafters.call_state import parse_state
from ooospec.runtime.drafters.schema_fsm import CallGrammar, SchemaFSMDrafter, tokens_in_context
from ooospec.runtime.formats import hermes, llama3_json, plain_json
from tests.runtime.toy_bpe import toy_bpe

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"}},
        "required": ["unit", "city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}},
    {"type": "function", "function": {"name": "set_alarm", "parameters": {
        "type": "object", "properties": {
            "time": {"type": "string"}, "repeat": {"type": "boolean"}, "level": {"enum": [1, 2, 3]},
            "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["time"]}}},
    {"name": "ping", "parameters": {"type": "object", "properties": {}}},
]
SCHEMAS = {(t.get("function") or t)["name"]: (t.get("function") or t)["parameters"] for t in TOOLS}
VALIDATORS = {name: jsonschema.Draft202012Validator(schema) for name, schema in SCHEMAS.items()}

GOLD = [
    {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
    {"name": "get_weather", "arguments": {"unit": "fahrenheit", "city": "New York", "days": 3}},
    {"name": "get_time", "arguments": {"timezone": "Europe/Berlin"}},
    {"name": "set_alarm", "arguments": {"time": "07:30", "repeat": True, "level": 2, "tags": ["a", "b"]}},
    {"name": "ping", "arguments": {}},
]


def layouts(fmt, call):
    """The call text as models write it: the format's own rendering, bare compact, fenced pretty (Qwen-Coder)."""
    body = {"name": call["name"], fmt.args_key: call["arguments"]}
    return [fmt.render_call(call), json.dumps(body), "```json\n" + json.dumps(body, indent=2) + "\n```"]


def complete(grammar: CallGrammar, text: str, limit: int = 400) -> str:
    """Finish a call prefix: the grammar's first piece where it has one, a filler value where it is free."""
    st = parse_state(text)
    for _ in range(limit):
        pieces = grammar.next_pieces(st)
        if pieces:
            piece = pieces[0]
        elif st.mode == "done":
            return text
        elif st.mode == "string" and not st.is_key:
            piece = 'x"'
        elif st.mode == "value":
            piece = "1"
        elif st.mode == "literal":
            piece = " "
        elif st.mode == "arr_value_or_end":
            piece = "]"
        elif st.mode in ("comma_or_end", "key_or_end") and len(st.stack) >= 3 or (
                st.mode == "comma_or_end" and st.stack[-1].kind == "["):
            piece = "}" if st.stack[-1].kind == "{" else "]"
        else:
            raise AssertionError(f"stuck in mode {st.mode!r} after {text!r}")
        text += piece
        st.feed(piece)
    raise AssertionError(f"no end after {limit} pieces: {text!r}")


def assert_valid_call(fmt, text: str):
    calls = fmt.parse_calls(text)
    assert len(calls) == 1, text
    name, args = calls[0]["name"], calls[0]["arguments"]
    assert name in SCHEMAS, text
    VALIDATORS[name].validate(args)
    assert fmt.is_complete(text), text


@pytest.mark.parametrize("fmt", [hermes, plain_json, llama3_json], ids=lambda f: f.NAME)
def test_every_draft_keeps_a_valid_call_prefix(fmt):
    drafter = SchemaFSMDrafter(toy_bpe(), fmt, TOOLS, max_branches=6)
    grammar = drafter.grammar
    completed = set()
    for call in GOLD:
        for gold in layouts(fmt, call):
            for i in range(len(gold) + 1):
                completed.update(complete(grammar, gold[:i] + draft) for draft in drafter.propose_text(gold[:i]))
    assert len(completed) > 50
    for text in sorted(completed):
        assert_valid_call(fmt, text)


def test_name_branches_follow_the_typed_prefix():
    grammar = CallGrammar(plain_json, TOOLS)
    assert grammar.next_pieces(parse_state('{"name": "get_')) == ['weather"', 'time"']
    assert grammar.next_pieces(parse_state('{"name": "')) == ['get_weather"', 'get_time"', 'set_alarm"', 'ping"']
    assert grammar.next_pieces(parse_state('{"name": "x')) == []
    drafts = grammar.expand(parse_state('{"name": "get_'), max_branches=8)
    assert drafts == [  # depth first: the first name gets the key and enum branches while the budget lasts
        'weather", "arguments": {"city": "',
        'weather", "arguments": {"unit": "celsius", "city": "',
        'weather", "arguments": {"unit": "celsius", "days": ',
        'weather", "arguments": {"unit": "fahrenheit", "city": "',
        'weather", "arguments": {"unit": "fahrenheit", "days": ',
        'weather", "arguments": {"days": ',
        'time", "arguments": {"timezone": "',
    ]
    assert grammar.expand(parse_state('{"name": "get_'), max_branches=2) == [
        'weather", "arguments": {"city": "', 'time", "arguments": {"timezone": "']


def test_keys_required_first_then_optional_and_close():
    grammar = CallGrammar(plain_json, TOOLS)
    head = '{"name": "get_weather", "arguments": {'
    assert grammar.next_pieces(parse_state(head)) == ['"city": ', '"unit": ', '"days": ']  # required first
    assert grammar.next_pieces(parse_state(head + '"unit": "celsius"')) == [', "city": ', ', "days": ']
    assert grammar.next_pieces(parse_state(head + '"unit": "celsius", "city": "P"')) == ["}", ', "days": ']
    assert grammar.next_pieces(parse_state(head + '"unit": "cel')) == ['sius"']
    assert grammar.next_pieces(parse_state(head + '"ci')) == ['ty": ']
    assert grammar.next_pieces(parse_state(head + '"city": "Par')) == []   # free string: nothing
    alarm = '{"name": "set_alarm", "arguments": {"time": "7", "repeat": '
    assert grammar.next_pieces(parse_state(alarm)) == ["true", "false"]
    assert grammar.next_pieces(parse_state(alarm + "f")) == ["alse"]
    assert grammar.next_pieces(parse_state(alarm + "false, \"level\": ")) == ["1", "2", "3"]
    assert grammar.expand(parse_state('{"name": "ping", "arguments": {'), max_branches=1) == ["}}"]


def test_style_is_learnt_from_the_output():
    grammar = CallGrammar(hermes, TOOLS)
    pretty = '```json\n{\n  "name": "get_time",\n  "arguments": {\n    "timezone": "UTC"'
    assert grammar.expand(parse_state(pretty)) == ["\n  }\n}\n```"]
    assert grammar.expand(parse_state('```json\n{\n'))[0] == '  "name": "get_weather",\n  "arguments": {\n    "city": "'
    compact = '<tool_call>\n{"name":"get_time","arguments":{"timezone":"UTC"'
    assert grammar.expand(parse_state(compact)) == ["}}\n</tool_call>"]
    assert grammar.next_pieces(parse_state("")) == ['<tool_call>\n{', "{", "```json\n{\n  "]
    assert grammar.next_pieces(parse_state("<tool")) == ['_call>\n{']
    assert grammar.next_pieces(parse_state("I think")) == []
    assert grammar.next_pieces(parse_state('{"name": "f" oops')) == []


def test_observe_learns_the_opening():
    tok = toy_bpe()
    drafter = SchemaFSMDrafter(tok, plain_json, TOOLS, max_branches=2)
    assert drafter.propose_text("")[0].startswith('{"name": ')
    drafter.observe([1, 2], tok.encode('```json\n{\n  "name": "ping",\n  "arguments": {}\n}\n```'))
    assert drafter.propose_text("")[0].startswith('```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city"')
    fresh = SchemaFSMDrafter(tok, plain_json, TOOLS[:1], openers=drafter.grammar.openers)  # next request
    assert fresh.propose_text("")[0].startswith('```json\n{\n  "name": "get_weather"')


def test_tokens_in_context_reproduces_the_committed_tokens():
    tok = toy_bpe()
    for committed_text, cont in [('{"name"', ': "get_weather"'), ('{"name": "get_weather", ', '"arguments": {'),
                                 ('{"name": "get', '_time", "arguments": {"')]:
        committed = tok.encode(committed_text)
        ids = tokens_in_context(tok, committed, cont)
        full = tok.encode(committed_text + cont)
        if full[: len(committed)] == committed:  # no merge across the boundary: exact BPE of the joined text
            assert committed + ids == full
        assert tok.decode(committed + ids) == committed_text + cont


def test_tokens_in_context_backs_off_when_a_merge_crosses_the_boundary():
    tok = toy_bpe()
    committed = tok.encode('{"na')          # ['{"', 'n', 'a']; in context 'name' is one token
    assert tok.encode('{"name')[: len(committed)] != committed
    ids = tokens_in_context(tok, committed, 'me": "')
    assert ids == tok.encode('me": "') and tok.decode(ids) == 'me": "'


def test_propose_returns_target_tokens_for_a_committed_prefix():
    tok = toy_bpe()
    drafter = SchemaFSMDrafter(tok, plain_json, TOOLS)
    prompt = tok.encode("<|im_start|>assistant\n")
    gold = tok.encode(json.dumps(GOLD[2]))
    committed = gold[:3]                     # '{"', 'name', '":'
    ctx = DraftContext(tokens=prompt + committed, prompt_len=len(prompt), step=0)
    drafts = drafter.propose(ctx)
    assert drafts and all(isinstance(t, int) for d in drafts for t in d)
    texts = [tok.decode(committed + d) for d in drafts]
    assert all(t.startswith('{"name": "') for t in texts)
    assert any(len(d) > 3 and d == gold[3: 3 + len(d)] for d in drafts)  # the gold branch, token for token
    assert drafter.propose(DraftContext(tokens=prompt + tok.encode('{"name": "get_time", "arguments": {"timezone": "B'),
                                        prompt_len=len(prompt), step=5)) == []



def test_proposals_are_classed_by_where_the_output_stands():
    """Before the body, a draft guesses that the target calls a tool at all; inside it, the schema forces the
    structure: the budget estimates them apart (``schema_fsm/open`` vs ``schema_fsm/call``)."""
    tok = toy_bpe()
    drafter = SchemaFSMDrafter(tok, plain_json, TOOLS)
    prompt = tok.encode("<|im_start|>assistant\n")
    gold = tok.encode(json.dumps(GOLD[2]))
    kinds = []
    for committed in ([], gold[:3], gold):
        drafter.propose(DraftContext(tokens=prompt + committed, prompt_len=len(prompt), step=len(committed)))
        kinds.append(drafter.proposal_kind)
    assert kinds == ["open", "call", "after"]


QWEN_HF = Path("~/.cache/ooospec/models/qwen2.5-coder-0.5b/hf").expanduser()
# The tokens no draft covered (each cost a step of its own): only the argument values and where their strings end.
UNDRAFTED = {
    "toy_bpe": ["AMZN", '",', "2022", "-", "03", "-", "11", '"'],
    "real_bpe_65k": ["AM", "Z", "N", '",', "2022", "-", "03", "-", "11", '"'],
    "qwen2.5-coder-0.5b": ["AM", "ZN", '",\n', "2", "0", "2", "2", "-", "0", "3", "-", "1", "1", '"\n'],
}


def real_bpe_65k():
    """The real 65k byte-level BPE ``tokenizer.json`` shipped in the dev extra's ``anthropic`` wheel (no template)."""
    import importlib.util

    from transformers import PreTrainedTokenizerFast

    spec = importlib.util.find_spec("anthropic")      # the wheel's files, without importing the SDK
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the real BPE tokenizer ships in the dev extra: pip install -e '.[dev]'")
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer.json"
    return PreTrainedTokenizerFast(tokenizer_file=str(path), clean_up_tokenization_spaces=False)


@pytest.mark.parametrize("tokenizer", ["toy_bpe", "real_bpe_65k",
                                       pytest.param("qwen2.5-coder-0.5b", marks=pytest.mark.integration)])
def test_real_qwen_output_is_mostly_drafted(tokenizer):
    """The measured Qwen2.5-Coder-0.5B output: every structural token is drafted in context, exactly.

    Runs everywhere on the toy byte-level BPE (hermes template, merges across the FSM's boundaries) and on a real
    65k byte-level BPE (plain JSON: it has no chat template). Qwen's own tokenizer needs the model cache, so that
    case is an integration test:
    ``.venv/bin/python -m pytest -m integration tests/runtime/drafters/test_schema_fsm.py``."""
    from transformers import AutoTokenizer

    from ooospec.runtime.formats import detect_format
    from tests.runtime.toy_bpe import HERMES_TEMPLATE, with_template

    if tokenizer == "toy_bpe":
        tok = with_template(HERMES_TEMPLATE)
    elif tokenizer == "real_bpe_65k":
        tok = real_bpe_65k()
    elif (QWEN_HF / "DONE").is_file():
        tok = AutoTokenizer.from_pretrained(QWEN_HF)
    else:
        pytest.skip(f"qwen2.5-coder-0.5b not in the model cache ({QWEN_HF})")
    tools = [{"name": "QueryStock", "parameters": {"type": "object", "properties": {
        "symbol": {"type": "string"}, "date": {"type": "string"}}, "required": ["symbol"]}}]
    drafter = SchemaFSMDrafter(tok, detect_format(tok), tools)
    text = ('```json\n{\n  "name": "QueryStock",\n  "arguments": {\n    "symbol": "AMZN",\n'
            '    "date": "2022-03-11"\n  }\n}\n```')
    prompt = tok.encode("<|im_start|>assistant\n")
    out = tok.encode(text)
    i = steps = 0
    undrafted = []
    while i < len(out):  # greedy acceptance of the best draft, one bonus token per step
        ctx = DraftContext(tokens=prompt + out[:i], prompt_len=len(prompt), step=steps)
        best = 0
        for d in drafter.propose(ctx):
            n = 0
            while n < len(d) and i + n < len(out) and d[n] == out[i + n]:
                n += 1
            best = max(best, n)
        if i + best < len(out):
            undrafted.append(out[i + best])
        i += best + 1
        steps += 1
    assert [tok.decode([t]) for t in undrafted] == UNDRAFTED[tokenizer]
    assert steps == len(undrafted) + 1       # the last step's draft runs to the end of the call
