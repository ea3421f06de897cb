"""Function-first waves, pure parts: the two stages' texts, the candidate tools read from top logprobs, the join.
(The client's two stages against stand-in servers are in test_client.py.)"""

import math

import pytest

from ooospec.runtime.sidecar import prompts as sp
from ooospec.runtime.sidecar import protocol as sw
from tests.runtime.sidecar.test_prompts import MESSAGES, TIME, WEATHER

NEWS = {"type": "function", "function": {"name": "get_news", "parameters": {
    "type": "object", "properties": {"topic": {"type": "string"}, "limit": {"type": "integer"}}}}}
PING = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}
TOOLS = [WEATHER, TIME, NEWS]


def lp(p: float) -> float:
    return math.log(p)


@pytest.mark.parametrize("index_text, top, num_tools, top_k, min_prob, expected", [
    # greedy first, then the alternatives >= min_prob, most probable first; non-digits and out-of-range ignored
    ("0", {"0": lp(0.6), " 2": lp(0.2), "1": lp(0.05), "x": lp(0.1), "7": lp(0.1)}, 3, 3, 0.1, [0, 2]),
    ("1", {"1": lp(0.4), "0": lp(0.2), "2": lp(0.3)}, 3, 3, 0.1, [1, 2, 0]),
    ("1", {"1": lp(0.4), "0": lp(0.2), "2": lp(0.3)}, 3, 2, 0.1, [1, 2]),          # top_k in all
    ("1", {"1": lp(0.4), "0": lp(0.2), "2": lp(0.3)}, 3, 1, 0.1, [1]),             # top_k 1: greedy only
    ("1", {"1": lp(0.4), "0": lp(0.2), "2": lp(0.3)}, 3, 3, 0.25, [1, 2]),         # min_prob
    ("2", {"1": lp(0.06), " 1": lp(0.06)}, 3, 3, 0.1, [2, 1]),                     # "1" and " 1" add up
    ("0", {"0": 0.0, "1": lp(0.3)}, 3, 3, 0.1, [0, 1]),
    ("1<eos>", {"0": lp(0.5)}, 3, 2, 0.1, [1, 0]),                                 # trailing text after the index
    ("0", {"12": lp(0.5), "1 ": lp(0.3), "": lp(0.1)}, 13, 3, 0.1, [0, 1]),        # a token of two digits: not one
    ("12", {"1": lp(0.9), "3": lp(0.2)}, 13, 3, 0.1, [12, 3]),                     # the greedy's own first digit
    ("2", None, 3, 3, 0.1, [2]),                                                   # a server that gave none
    ("2", "garbage", 3, 3, 0.1, [2]),                                              # malformed: greedy only
    ("2", [{"1": lp(0.9)}], 3, 3, 0.1, [2]),
    ("2", {"1": "x", "0": True, 1: lp(0.9), "2": float("nan")}, 3, 3, 0.0, [2]),
    ("7", {"0": lp(0.9)}, 3, 3, 0.1, []),                                          # unusable greedy index: none
    ("x", {"0": lp(0.9)}, 3, 3, 0.1, []),
    ("", None, 3, 3, 0.1, []),
])
def test_function_candidates(index_text, top, num_tools, top_k, min_prob, expected):
    assert sw.function_candidates(index_text, top, num_tools, top_k=top_k, min_prob=min_prob) == expected


def test_function_candidates_rejects_top_k_below_one():
    with pytest.raises(ValueError, match="top_k"):
        sw.function_candidates("0", None, 3, top_k=0, min_prob=0.1)


@pytest.mark.parametrize("layout", sorted(sp.LAYOUTS))
def test_the_two_stages_share_build_waves_block(layout):
    full = sp.build_wave(MESSAGES, TOOLS, with_direct_call=True, layout=layout)
    first = sw.index_wave(MESSAGES, TOOLS, layout=layout)
    assert first.block == full.block and first.prompts() == full.prompts()[:1]
    assert [q.form for q in first.queries] == ["function_index"]
    second = sw.argument_wave(MESSAGES, TOOLS, ["get_news", "get_weather", "nope"], layout=layout)
    assert second.block == full.block
    assert [(q.form, q.function, q.parameter) for q in second.queries] == [   # tool order, not the order asked
        ("argument", "get_weather", "city"), ("argument", "get_weather", "unit"),
        ("argument", "get_news", "topic"), ("argument", "get_news", "limit")]
    assert second.prompts()[0] == full.block + "Query: get_weather.city\n"
    direct = sw.argument_wave(MESSAGES, TOOLS, ["get_time"], with_direct_call=True, layout=layout)
    assert [q.text for q in direct.queries] == ["Query: get_time.tz\n", "Query: call\n"]
    assert sw.argument_wave(MESSAGES, [PING, *TOOLS], ["ping"], layout=layout).queries == ()


def test_select_arguments_keeps_what_the_gate_kept():
    full = sp.build_wave(MESSAGES, TOOLS)
    cut = sp.Wave(full.block, tuple(q for q in full.queries if q.parameter != "unit"))   # the gate dropped unit
    assert [q.text for q in sw.select_arguments(cut, ["get_weather"]).queries] == ["Query: get_weather.city\n"]


def test_join_function_first_joins_one_call_per_candidate_greedy_first():
    wave = sw.argument_wave(MESSAGES, TOOLS, ["get_weather", "get_news"], with_direct_call=True)
    answers = ['"Paris"', '"kelvin"', '"rain"', "3",
               '{"name":"get_time","arguments":{"tz":"UTC","bogus":1}}']
    calls = sw.join_function_first(TOOLS, [2, 0], wave, answers)
    assert calls == [
        {"name": "get_news", "arguments": {"topic": "rain", "limit": 3},
         "direct_call": {"name": "get_time", "arguments": {"tz": "UTC"}}},
        {"name": "get_weather", "arguments": {"city": "Paris"}}]                    # "kelvin" is not in the enum
    no_direct = sw.join_function_first(TOOLS, [0, 2], wave.__class__(wave.block, wave.queries[:-1]), answers[:-1])
    assert [c["name"] for c in no_direct] == ["get_weather", "get_news"] and "direct_call" not in no_direct[0]
    assert sw.join_function_first(TOOLS, [], wave, answers) == []
    unnamed = [{"type": "function", "function": {"parameters": {}}}, *TOOLS]
    assert [c["name"] for c in sw.join_function_first(unnamed, [0, 1], wave, answers)] == ["get_weather"]


def test_first_top_logprobs_tolerates_anything():
    good = b'{"choices": [{"index": 0, "text": "0", "logprobs": {"top_logprobs": [{"0": -0.1, "1": -2.5}]}}]}'
    assert sw.first_top_logprobs(good) == {"0": -0.1, "1": -2.5}
    for bad in [b"{", b"[]", b'{"choices": []}', b'{"choices": [{"text": "0", "logprobs": null}]}',
                b'{"choices": [{"logprobs": {"top_logprobs": []}}]}',
                b'{"choices": [{"logprobs": {"top_logprobs": ["x"]}}]}']:
        assert sw.first_top_logprobs(bad) is None


def test_merged_server_adds_numbers():
    a = {"prefill_s": 0.5, "n_forwards": 2, "shared_block": True, "note": "a"}
    b = {"prefill_s": 0.25, "n_forwards": 3, "shared_block": True, "extra": 1}
    assert sw.merged_server(a, b) == {"prefill_s": 0.75, "n_forwards": 5, "shared_block": True, "note": "a",
                                      "extra": 1}


@pytest.mark.parametrize("kw, match", [({"wave": "some"}, "wave"), ({"top_k": 0}, "top_k"),
                                       ({"top_k": 1.5}, "top_k"), ({"min_prob": 1.5}, "min_prob"),
                                       ({"min_prob": "0.1"}, "min_prob")])
def test_check_wave_options(kw, match):
    sw.check_wave_options(wave="function-first", top_k=2, min_prob=0.1)
    with pytest.raises(ValueError, match=match):
        sw.check_wave_options(**{"wave": "function-first", "top_k": 2, "min_prob": 0.1, **kw})


def test_stage_one_asks_one_token_per_digit_an_index_can_have():
    assert [sw.index_tokens(n) for n in (0, 1, 10, 11, 100, 101)] == [1, 1, 1, 2, 2, 3]
