"""Hostile ``extra_args`` cost a request its drafts at most: each is refused in bounded time (a counted fault), the
request keeps vLLM's greedy output, and the proposer goes on serving the next normal request."""

from __future__ import annotations

import json
import time

import pytest

from ooospec.runtime.decoding import ToolSpecDrafters
from ooospec.runtime.vllm import xargs
from ooospec.runtime.vllm.proposer import ChainProposer, ProposerConfig
from tests.runtime.chat_tiny import CALL_TEXT, TOOLS, USER, trained_chat_model
from tests.runtime.vllm_plugin.test_chain import chain_decode, greedy


def nested_schema(depth: int, kind: str = "object") -> str:
    """A tool whose parameters nest ``depth`` levels of objects (or arrays), as JSON text built without recursion."""
    if kind == "object":
        inner = '{"type": "object", "properties": {"a": ' * depth + '{"type": "string"}' + "}}" * depth
    else:
        inner = '{"type": "array", "items": ' * depth + '{"type": "string"}' + "}" * depth
    return ('[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", '
            '"properties": {"city": ' + inner + '}, "required": ["city"]}}}]')


def nested_list(depth: int) -> list:
    out: list = []
    for _ in range(depth):
        out = [{"type": "function", "function": {"name": "f", "parameters": out}}]
    return out


def many_tools(n: int) -> str:
    return json.dumps([{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}}
                       for i in range(n)])


FOUR_MB_TOOLS = json.dumps(TOOLS * (4_000_000 // len(json.dumps(TOOLS)) + 1))

# case -> (extra args besides the normal tools and messages, the fault it must count)
HOSTILE = {
    "tools_4mb": ({"ooospec_tools": FOUR_MB_TOOLS}, "ooospec_tools"),
    "tools_10000_functions": ({"ooospec_tools": many_tools(10_000)}, "ooospec_tools"),
    "schema_10000_objects_deep": ({"ooospec_tools": nested_schema(10_000)}, "ooospec_tools"),
    "schema_10000_arrays_deep": ({"ooospec_tools": nested_schema(10_000, "array")}, "ooospec_tools"),
    "schema_5000_deep_list": ({"ooospec_tools": nested_list(5000)}, "ooospec_tools"),
    "tools_a_dict": ({"ooospec_tools": json.dumps(TOOLS[0])}, "ooospec_tools"),
    "tools_a_number": ({"ooospec_tools": 7}, "ooospec_tools"),
    "tools_a_set": ({"ooospec_tools": {"get_weather"}}, "ooospec_tools"),
    "tools_not_json": ({"ooospec_tools": "[{"}, "ooospec_tools"),
    "messages_a_string": ({"ooospec_messages": "What is the weather?"}, "ooospec_messages"),
    "messages_json_string": ({"ooospec_messages": '"hello"'}, "ooospec_messages"),
    "hint_a_list": ({"ooospec_hint": ["<tool_call>"]}, "ooospec_hint"),
    "hint_bytes": ({"ooospec_hint": CALL_TEXT.encode()}, "ooospec_hint"),
    "hint_huge": ({"ooospec_hint": CALL_TEXT * 10_000}, "ooospec_hint"),
    "schedule_a_number": ({"ooospec_hint_schedule": 3.5}, "ooospec_hint_schedule"),
    "schedule_nonsense": ({"ooospec_hint_schedule": '[[1], "x", {"a": 2}]'}, "ooospec_hint_schedule"),
    "schedule_bad_calls": ({"ooospec_hint_schedule": '[[0, [{"name": 3, "arguments": []}]]]'},
                           "ooospec_hint_schedule"),
    "schedule_nan": ({"ooospec_hint_schedule": '[["nan", []]]'}, "ooospec_hint_schedule"),
    "history_a_list": ({"ooospec_history": ["a"]}, "ooospec_history"),
    "switch_not_off": ({"ooospec": 0}, "ooospec"),
    "unknown_key": ({"ooospec_tool": "[]"}, "unknown"),
}


@pytest.fixture(scope="module")
def served():
    """``(model, tok, prompt, greedy reference, proposer)``: one proposer serves every case in turn."""
    model, tok = trained_chat_model()
    prompt = tok(tok.apply_chat_template(USER, tools=TOOLS, add_generation_prompt=True, tokenize=False),
                 add_special_tokens=False)["input_ids"]
    proposer = ChainProposer(tok, vocab_size=len(tok), max_len=16, config=ProposerConfig(method="ooospec"))
    return model, tok, prompt, greedy(model, prompt, 30), proposer


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_extra_args_cost_the_request_its_drafts_at_most(served, case):
    model, _, prompt, ref, proposer = served
    extra, fault = HOSTILE[case]
    before = proposer.faults.get(fault, 0)
    t0 = time.perf_counter()
    proposer.start(f"{case}-probe", len(prompt), {"ooospec_messages": json.dumps(USER), **extra})
    assert time.perf_counter() - t0 < 2.0, "refusing a value must not take long"
    proposer.requests.pop(f"{case}-probe")
    out, _ = chain_decode(model, prompt, 30, proposer, case, {"ooospec_messages": json.dumps(USER), **extra})
    assert out == ref
    assert proposer.faults[fault] == before + 2
    normal = {"ooospec_tools": json.dumps(TOOLS), "ooospec_messages": json.dumps(USER)}
    out, _ = chain_decode(model, prompt, 30, proposer, f"{case}-next", normal)   # the next request is served
    assert out == ref


def test_a_toolbox_too_big_keeps_the_request_independent_drafters(served):
    model, _, prompt, ref, proposer = served
    chain_decode(model, prompt, 30, proposer, "teach", {"ooospec_tools": json.dumps(TOOLS)})
    state = proposer.start("big", len(prompt), {"ooospec_tools": many_tools(10_000)})
    assert [d.name for d in state.drafters] == ["retrieval", "pld"]         # no FSM, the rest still drafts
    proposer.requests.pop("big")
    out, forwards = chain_decode(model, prompt, 30, proposer, "big", {"ooospec_tools": many_tools(10_000)})
    assert out == ref and forwards < 30                                        # retrieval of the taught call


def test_an_fsm_that_cannot_be_built_costs_the_request_its_fsm(served, monkeypatch):
    model, _, prompt, ref, proposer = served

    def too_deep(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    before = proposer.faults.get("schema_fsm", 0)
    monkeypatch.setattr(ToolSpecDrafters, "for_request", too_deep)
    out, forwards = chain_decode(model, prompt, 30, proposer, "fsm", {"ooospec_tools": json.dumps(TOOLS),
                                                                      "ooospec_hint": CALL_TEXT})
    assert out == ref and proposer.faults["schema_fsm"] == before + 1
    assert forwards < 30                          # the hints still drafted
    monkeypatch.undo()
    out, _ = chain_decode(model, prompt, 30, proposer, "fsm-next", {"ooospec_tools": json.dumps(TOOLS)})
    assert out == ref


def test_hints_that_cannot_be_built_cost_the_request_its_hints(served, monkeypatch):
    model, _, prompt, ref, proposer = served
    before = proposer.faults.get("hints", 0)
    monkeypatch.setattr(proposer.fmt, "parse_calls", lambda text: 1 / 0)
    out, _ = chain_decode(model, prompt, 30, proposer, "hints", {"ooospec_hint": CALL_TEXT})
    assert out == ref and proposer.faults["hints"] == before + 1


def test_an_extra_args_that_is_not_a_mapping_is_a_fault(served):
    model, _, prompt, ref, proposer = served
    before = proposer.faults.get("extra_args", 0)
    out, _ = chain_decode(model, prompt, 30, proposer, "list", ["ooospec_tools"])
    assert out == ref and proposer.faults["extra_args"] == before + 1


# ------------------------------------------------------------------------------------------ parse (pure)


def test_parse_reads_every_key():
    schedule = [[0.5, [{"name": "f", "arguments": {"x": 1}}]]]
    args = xargs.parse({"ooospec_tools": json.dumps(TOOLS), "ooospec_messages": USER, "ooospec_hint": "h",
                        "ooospec_hint_schedule": json.dumps(schedule), "ooospec_history": "t1", "other": {1}})
    assert (args.tools, args.messages, args.hint, args.history, args.off) == (TOOLS, USER, "h", "t1", False)
    assert args.schedule == [(0.5, [{"name": "f", "arguments": {"x": 1}}])] and args.faults == []
    assert xargs.parse(None) == xargs.RequestArgs()


def test_opting_out_reads_nothing_else():
    args = xargs.parse({"ooospec": "off", "ooospec_tools": FOUR_MB_TOOLS, "ooospec_hint": 3})
    assert args.off and args.tools == [] and args.hint is None and args.faults == []


def test_a_long_value_is_refused_before_it_is_decoded(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("decoded")

    monkeypatch.setattr(xargs.json, "loads", never)
    args = xargs.parse({"ooospec_tools": FOUR_MB_TOOLS, "ooospec_messages": "x" * (xargs.MAX_XARG_CHARS + 1)})
    assert args.tools == [] and args.messages is None
    assert [k for k, _ in args.faults] == ["ooospec_tools", "ooospec_messages"]
    assert all(f"more than {xargs.MAX_XARG_CHARS}" in why and len(why) < 200 for _, why in args.faults)


def test_json_list_bounds_depth_without_recursing():
    assert xargs.json_list("[[[1]]]") == [[[1]]]
    assert xargs.json_list(nested_list(10)) == nested_list(10)
    for deep in ("[" * 100_000 + "]" * 100_000, nested_schema(xargs.MAX_XARG_DEPTH)):
        with pytest.raises(ValueError, match="nests deeper"):
            xargs.json_list(deep)
    with pytest.raises(ValueError, match="nests deeper"):
        xargs.json_list(nested_list(100_000))
    with pytest.raises(TypeError, match="got dict"):
        xargs.json_list('{"a": 1}')


def test_fault_texts_stay_short():
    for case, (extra, _) in HOSTILE.items():
        for _, why in xargs.parse(extra).faults:
            assert len(why) < 300, case
