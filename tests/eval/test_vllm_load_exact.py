"""``vllm-load``'s exactness without vLLM: what counts as the same answer, where token ids part, and near ties vs
defects from plain's margin there (a fake ``margins_of`` stands in for the untimed plain forward)."""

from __future__ import annotations

import argparse

import pytest

from ooospec.eval.vllm import load_exact as ex


def row(rid: str, content: str = "", calls=(), tokens=None, prompt=None) -> dict:
    return {"id": rid, "content": content, "tool_calls": [{"name": n, "arguments": a} for n, a in calls],
            "token_ids": tokens, "prompt_token_ids": prompt}


def test_identical_ignores_json_spacing_and_key_order_not_values():
    ref = [row("a", calls=[("f", '{"x": 1, "y": 2}')]), row("b", "hello"), {"id": "c", "content": None,
                                                                                "tool_calls": []}]
    got = [row("a", calls=[("f", '{"y":2,"x":1}')]), row("b", "hello!"), row("c")]
    assert ex.compare_rows(got, ref) == {"identical": pytest.approx(2 / 3), "differ": ["b"], "near_ties": 0,
                                         "defects": 0}
    broken = [row("a", calls=[("f", '{"x": 1')])]
    assert ex.compare_rows(broken, ref[:1])["differ"] == ["a"]
    assert ex.canonical(broken[0]) == ex.canonical(broken[0])      # unparsable arguments compare as text


def test_the_probe_is_plains_prompt_and_tokens_up_to_the_difference():
    ref = row("a", tokens=[5, 6, 7], prompt=[1, 2])
    assert ex.probe_of(row("a", tokens=[5, 9, 7]), ref) == (1, [1, 2, 5])
    assert ex.probe_of(row("a", tokens=[9]), ref) == (0, [1, 2])
    assert ex.probe_of(row("a", tokens=[5, 6, 7, 8]), ref) == (3, None)      # ran past plain's end: no probe
    assert ex.probe_of(row("a", tokens=[5, 6, 7]), ref) == (None, None)


def test_margins_decide_near_tie_or_defect():
    ref = row("a", "x", tokens=[5, 6, 7], prompt=[1])
    pairs = [(row("a", "y", tokens=[5, 9]), ref), (row("a", "z", tokens=[8]), ref),
             (row("a", "w", tokens=[5, 6, 7, 3]), ref), (row("a", "v"), ref), (row("a", "u", tokens=[5, 6, 7]), ref)]
    asked = []

    def margins_of(prompts):
        asked.append(prompts)
        return [0.125, 1.5]

    ex.classify(pairs, margins_of, tie_margin=0.25)
    assert asked == [[[1, 5], [1]]]                  # one call, probes of the classifiable rows only
    kinds = [r["mismatch"] for r, _ in pairs]
    assert kinds[0] == {"position": 1, "margin": 0.125, "kind": "near_tie"}
    assert kinds[1] == {"position": 0, "margin": 1.5, "kind": "defect"}
    assert kinds[2] == {"position": 3, "margin": None, "kind": "defect"}
    assert kinds[3]["kind"] == kinds[4]["kind"] == "unclassified"     # no ids; same ids parsed differently


def test_levels_are_classified_against_plain_at_the_same_level():
    plain = {"levels": [{"concurrency": 1, "stream": False, "rows": [row("a", "x", tokens=[5, 6], prompt=[1]),
                                                                      row("b", "y", tokens=[4], prompt=[2])]},
                        {"concurrency": 8, "stream": False, "rows": [row("a", "q", tokens=[5, 3], prompt=[1]),
                                                                      row("b", "y", tokens=[4], prompt=[2])]}]}
    ours = {"levels": [{"concurrency": 1, "stream": False, "rows": [row("a", "q", tokens=[5, 3]),
                                                                     row("b", "y", tokens=[4])]},
                       {"concurrency": 8, "stream": False, "rows": [row("a", "q", tokens=[5, 3]),
                                                                     row("b", "y", tokens=[4])]}]}
    runs = {"vllm": plain, "toolspec": ours}
    args = argparse.Namespace(model_dir="/m", dtype="bfloat16", tie_margin=0.25)
    assert ex.classify_levels(args, runs, 4096, margins_of=lambda prompts: [0.01] * len(prompts)) == 1
    assert ours["levels"][0]["rows"][0]["mismatch"]["kind"] == "near_tie"
    assert "mismatch" not in ours["levels"][1]["rows"][0]           # equal to plain at c = 8
    counted = ex.compare_rows(ours["levels"][0]["rows"], plain["levels"][0]["rows"])
    assert (counted["near_ties"], counted["defects"]) == (1, 0)
    assert ex.classify_levels(args, {"vllm": plain}, 4096, margins_of=None) == 0    # nothing to compare: no vLLM
