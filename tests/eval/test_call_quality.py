"""Tool-call quality of a model's plain greedy rows against gold calls (what a quantized target is compared by)."""

from __future__ import annotations

import json

import pytest

from ooospec.eval.substrate import call_quality as cq

GOLD = [{"name": "book", "arguments": {"city": "Paris", "nights": 2, "tags": ["a", "b"]}}]


def _text(calls):
    return "".join('<tool_call>\n' + json.dumps(c) + '\n</tool_call>' for c in calls)


@pytest.mark.parametrize("calls,expected", [
    (GOLD, {"function": 1, "call": 1, "args_right": 3, "args_total": 3}),
    ([{"name": "book", "arguments": {"nights": 2, "city": "Paris", "tags": ["a", "b"]}}],   # key order is free
     {"function": 1, "call": 1, "args_right": 3, "args_total": 3}),
    ([{"name": "book", "arguments": {"city": "paris", "nights": "2", "tags": ["a", "b"]}}],  # case, type matter
     {"function": 1, "call": 0, "args_right": 1, "args_total": 3}),
    ([{"name": "cancel", "arguments": {"city": "Paris", "nights": 2, "tags": ["a", "b"]}}],
     {"function": 0, "call": 0, "args_right": 0, "args_total": 3}),
    ([], {"function": 0, "call": 0, "args_right": 0, "args_total": 3}),
    (GOLD + GOLD, {"function": 1, "call": 0, "args_right": 3, "args_total": 3}),                # an extra call
])
def test_score(calls, expected):
    assert cq.score(calls, GOLD) == expected


def test_quality_parses_texts_and_averages():
    gold = {"a": GOLD, "b": GOLD}
    rows = [{"record_id": "a", "text": _text(GOLD) + "<|im_end|>"}, {"id": "b", "text": "I cannot help."}]
    assert cq.quality(rows, gold) == {"n": 2, "function": 0.5, "arguments": 0.5, "call": 0.5}
    with pytest.raises(ValueError, match="'c' has no record"):
        cq.quality([{"record_id": "c", "text": ""}], gold)


def test_rows_of_picks_the_reference(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"examples": [{"method": "vllm", "record_id": "a", "text": ""},
                                             {"method": "toolspec", "record_id": "a", "text": ""}]}))
    assert [r["method"] for r in cq.rows_of(path, None)] == ["vllm"]
    path.write_text(json.dumps({"config": {"reference": "llama.cpp"},
                                "examples": [{"method": "ar", "id": "a"}, {"method": "llama.cpp", "id": "a"}]}))
    assert [r["method"] for r in cq.rows_of(path, None)] == ["llama.cpp"]
    with pytest.raises(ValueError, match="no rows of method 'hf-greedy'"):
        cq.rows_of(path, "hf-greedy")
