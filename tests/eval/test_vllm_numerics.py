"""The vLLM near-tie bound: margins in two forward shapes compared, and stored cells counted again against it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ooospec.eval.vllm import numerics

ROOT = Path(__file__).resolve().parents[2]


def test_top2_margin_reads_logprob_objects_and_floats():
    class LP:
        def __init__(self, logprob):
            self.logprob = logprob

    assert numerics.top2_margin({1: LP(-0.1), 2: LP(-1.6), 3: LP(-3.0)}) == pytest.approx(1.5)
    assert numerics.top2_margin({1: -0.5, 2: -0.75}) == pytest.approx(0.25)
    assert numerics.top2_margin({1: -0.5}) is None and numerics.top2_margin(None) is None


def test_swings_line_up_output_positions_with_the_scored_prompt():
    decoded = [{7: -0.1, 8: -1.1}, {9: -0.2, 4: -0.4}]
    scored = [None, {5: -1.0, 6: -2.0}, {7: -0.3, 8: -0.9}, {4: -0.3, 9: -0.35}]   # prompt of 2, then the output
    got = numerics.swings(decoded, scored, prompt_len=2)
    assert [round(s, 3) for s, _ in got] == [0.4, 0.15] and [f for _, f in got] == [False, True]


def test_summarize_takes_the_largest_swing_at_least_the_floor():
    stats = numerics.summarize([(0.1, False), (0.9, True), (0.05, False)])
    assert stats["bound"] == 0.9 and stats["top1_flips"] == 1 and stats["positions"] == 3
    assert numerics.summarize([(0.01, False)])["bound"] == numerics.MIN_BOUND
    with pytest.raises(ValueError, match="nothing measured"):
        numerics.summarize([])


def cell() -> dict:
    rows = [{"method": "toolspec", "record_id": "a", "mismatch": {"position": 3, "margin": 0.5625, "kind": "defect"}},
            {"method": "toolspec", "record_id": "b", "mismatch": {"position": 1, "margin": 0.125, "kind": "near_tie"}},
            {"method": "toolspec", "record_id": "c"},
            {"method": "toolspec", "record_id": "d", "mismatch": {"position": 2, "margin": 1.5, "kind": "defect"}}]
    return {"examples": rows, "env": {}, "methods": {"vllm": {"near_ties": 0, "defects": 0},
                                                      "toolspec": {"near_ties": 1, "defects": 2}}}


def test_reclassify_counts_against_the_measured_bound_and_records_it():
    out = numerics.reclassify(cell(), 0.9, "numerics.json")
    # 0.5625 is within 0.9; 1.5 is not
    assert out["methods"]["toolspec"] == {"near_ties": 2, "defects": 1, "unclassified": 0}
    assert out["env"]["tie_margin"] == {"value": 0.9, "from": "numerics.json"}
    assert [r.get("mismatch", {}).get("kind") for r in out["examples"]] == ["near_tie", "near_tie", None, "defect"]


def test_the_reclassify_command_rewrites_cells_atomically(tmp_path):
    bound = tmp_path / "numerics.json"
    bound.write_text(json.dumps({"bound": 0.6}))
    path = tmp_path / "cell.json"
    path.write_text(json.dumps(cell()))
    assert numerics.main(["--reclassify", str(path), "--bound-from", str(bound)]) == 0
    assert json.loads(path.read_text())["methods"]["toolspec"] == {"near_ties": 2, "defects": 1, "unclassified": 0}
    assert not list(tmp_path.glob("*.partial"))
    with pytest.raises(SystemExit):
        numerics.main(["--reclassify", str(path)])


@pytest.mark.parametrize("table_name", ["{stem}.json.md", "{stem}.md"])   # via .partial (the matrix) / direct
def test_reclassify_rewrites_the_cells_own_table_too(tmp_path, table_name):
    # a real cell of the full matrix: SmolLM2 in bf16, where every drafting method (vLLM's ngram too) leaves plain's
    # one-token path, some at margins above bf16's default bound
    src = ROOT / "eval/reports/transfer/vllm-full/xeon-amx/smollm2-135m_bfcl-simple-python_warm.json"
    path = tmp_path / src.name
    path.write_text(src.read_text(encoding="utf-8"))
    table = tmp_path / table_name.format(stem=src.stem)
    table.write_text("stale\n")
    bound = tmp_path / "numerics.json"
    bound.write_text(json.dumps({"bound": 1.0}))
    assert numerics.main(["--reclassify", str(path), "--bound-from", str(bound)]) == 0
    text = table.read_text(encoding="utf-8")
    assert text.startswith("smollm2-135m on bfcl-simple-python")
    rows = [ln for ln in text.splitlines() if ln.startswith("| toolspec |")]
    cell = json.loads(path.read_text())
    open_ = sum(1 for r in cell["examples"] if r["method"] == "toolspec" and r.get("mismatch")
                and (r["mismatch"]["margin"] is None or r["mismatch"]["margin"] > 1.0))
    assert rows and rows[0].rstrip().endswith(f"| {open_} |")     # its defects column, counted against 1.0
    assert open_ < sum(1 for r in cell["examples"] if r["method"] == "toolspec" and r.get("mismatch"))


def probe(method_token: str, **shapes) -> dict:
    return {"record": "a", "result": {"position": 3, "plain_token": "x", "method_token": method_token, **shapes}}


def test_a_probe_that_sees_the_engine_pick_the_drafted_token_makes_that_mismatch_a_near_tie():
    flipped = probe("y", one_forward_at_pos={"x": -1.33, "y": -1.21}, prefill_to_3_then_decode={"x": -0.5, "y": -2.0})
    held = probe("y", one_forward_at_pos={"x": -0.5, "y": -2.0})
    assert numerics.engine_flip(flipped) == ("a", 3) and numerics.engine_flip(held) is None
    out = numerics.reclassify(cell(), 0.25, "numerics.json", {("a", 3): ("toolspec", "probe")})
    kinds = [r.get("mismatch", {}) for r in out["examples"]]
    assert kinds[0] == {"position": 3, "margin": 0.5625, "kind": "near_tie", "by": "probe"}
    assert kinds[3]["kind"] == "defect"                       # another record: the bound decides
    assert out["methods"]["toolspec"] == {"near_ties": 2, "defects": 1, "unclassified": 0}
    assert out["env"]["tie_margin"]["engine_flips"] == [["a", 3]]
    again = numerics.reclassify(out, 0.25, "numerics.json")   # without the probe: counted by the bound again
    assert again["examples"][0]["mismatch"] == {"position": 3, "margin": 0.5625, "kind": "defect"}


def test_a_probe_that_measures_plain_s_lead_within_the_bound_makes_a_near_tie_by_its_margin():
    # plain's logprob re-run took another path earlier (margin unknown); the probe, along plain's own path, sees the
    # two tokens tied exactly in bf16 -- the engine's argmax broke the tie towards plain, the verify batch the other way
    tied = probe("y", one_forward_at_pos={"x": -1.9755, "y": -1.9755}, prefill_to_3_then_decode={"x": -1.98, "y": -2.1})
    assert numerics.engine_flip(tied) is None and numerics.probe_margin(tied) == pytest.approx(0.12)
    assert numerics.probe_near_tie(tied, 0.25) == "probe margin" and numerics.probe_near_tie(tied, 0.1) is None
    led = probe("y", one_forward_at_pos={"x": -0.5, "y": -1.0})
    assert numerics.probe_near_tie(led, 0.25) is None                         # plain leads by 0.5: still a defect
    assert numerics.probe_margin(probe("y", one_forward_at_pos={"x": -0.5, "z": -0.6})) is None   # y not in top 2
    assert numerics.probe_near_tie(probe("y", one_forward_at_pos={"x": -0.6, "y": -0.5}), 0.0) == "probe"


def test_a_probe_applies_only_to_rows_that_left_plain_with_the_probed_token():
    c = cell()
    c["examples"][0].update(tokens=[1, 2, 3, 7])
    c["examples"].append({"method": "vllm-ngram", "record_id": "a", "tokens": [1, 2, 3, 8],
                          "mismatch": {"position": 3, "margin": None, "kind": "defect"}})
    c["methods"]["vllm-ngram"] = {"near_ties": 0, "defects": 1}
    out = numerics.reclassify(c, 0.25, "numerics.json", {("a", 3): ("toolspec", "probe margin")})
    assert out["examples"][0]["mismatch"]["by"] == "probe margin"
    assert out["examples"][-1]["mismatch"]["kind"] == "defect"                # another token at that position
    assert out["env"]["tie_margin"]["probe_margins"] == [["a", 3]] and "engine_flips" not in out["env"]["tie_margin"]


def test_a_probe_asks_the_engine_alone_four_ways_and_its_result_reads_as_an_engine_flip(monkeypatch):
    """:func:`numerics.probe` on a fake engine whose one-forward scoring picks the drafted token: the stored result
    marks that mismatch an engine flip; the same engine picking plain's token everywhere marks none."""
    import sys
    import types
    from types import SimpleNamespace

    calls = []

    class SamplingParams:
        def __init__(self, **kw):
            self.kw = kw

    def lp(top, other):
        return {top: SimpleNamespace(logprob=-0.1), other: SimpleNamespace(logprob=-0.4)}

    class LLM:
        def __init__(self, flip_in_prefill):
            self.flip = flip_in_prefill

        def generate(self, prompts, sp, use_tqdm=False):
            ids = prompts[0]["prompt_token_ids"]
            calls.append((len(ids), sp.kw))
            if sp.kw.get("prompt_logprobs"):      # plain's output scored in one forward
                scored = [None] * len(ids)
                scored[-1] = lp(9 if self.flip else 3, 3 if self.flip else 9)
                return [SimpleNamespace(prompt_logprobs=scored)]
            n = sp.kw["max_tokens"]
            return [SimpleNamespace(outputs=[SimpleNamespace(logprobs=[lp(3, 9)] * n)])]

    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = SamplingParams
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    tok = SimpleNamespace(decode=lambda ids: f"t{ids[0]}")
    plain, other = [1, 2, 3, 4, 5, 6], [1, 2, 9]
    result = numerics.probe(LLM(True), tok, [7, 7], plain, other, 2)
    assert result["position"] == 2 and result["plain_token"] == "t3" and result["method_token"] == "t9"
    assert set(result) >= {"one_forward_at_pos", "prefill_to_2_then_decode", "prefill_to_0_then_decode"}
    assert calls[0] == (2 + 3, {"temperature": 0, "max_tokens": 1, "prompt_logprobs": 2})     # prompt + plain[:3]
    assert numerics.engine_flip({"record": "r", "result": result}) == ("r", 2)
    assert numerics.engine_flip({"record": "r", "result": numerics.probe(LLM(False), tok, [7, 7], plain, other, 2)}) \
        is None
