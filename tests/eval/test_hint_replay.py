"""The hint replay: suffix matching walked over a target's own output, every proposal verified in full."""

from __future__ import annotations

import json

import pytest

from ooospec.eval.bench.hint_replay import Summary, bank_of, main, replay, replay_report, source_calls, to_markdown
from ooospec.runtime.drafters.hints import HintBank
from ooospec.runtime.formats import hermes
from tests.pipelines.sidecar_tiny import byte_tokenizer


def test_replay_docstring_example():
    r = replay([5, 6, 7, 8], HintBank({"v": [5, 6, 7, 8]}))
    assert (r.steps, r.proposals, r.accepted) == (2, [(1, 3)], 3)


def test_replay_counts_wrong_continuations_as_proposals_with_nothing_accepted():
    bank = HintBank({"v": [1, 2, 9, 9]})
    r = replay([1, 2, 3, 4], bank)
    # i=0: no suffix; i=1: [1] -> [2, 9, 9]: 2 accepted, 3 rejected; i=3 ([1,2,3]): 3 is in no view -> no proposal
    assert r.proposals == [(1, 1)] and r.steps == 3 and r.output_tokens == 4
    assert replay([1, 2, 3], None).steps == 3                          # no bank: one token per step


CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}


def _report(tmp_path, text: str, tok, gold=CALL, real=None):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    rows = [{"id": "r#0", "method": "ar", "tokens": ids, "text": text},
            {"id": "r#0", "method": "ooospec-gold", "tokens": ids, "hints": {"call": gold}},
            {"id": "r#0", "method": "toolspec", "tokens": ids}]
    if real is not None:
        rows.append({"id": "r#0", "method": "ooospec", "tokens": ids, "hints": {"call": real}})
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"config": {"target": "t", "format": "hermes", "dataset": "d"}, "examples": rows}))
    return path


def test_sources_and_view_sets_on_a_report(tmp_path):
    tok = byte_tokenizer()
    text = '<tool_call>\n{"name": "get_weather", "arguments": {\n  "city": "Paris"\n}}\n</tool_call>'
    path = _report(tmp_path, text, tok, real={"name": "get_time", "arguments": {}})
    calls = source_calls({"ar": {"tokens": tok(text)["input_ids"]}, "ooospec": {"hints": None}}, hermes, tok)
    assert calls["oracle"] == [CALL] and calls["gold"] is None and calls["real"] is None
    out = replay_report(path, tok, hermes, {"base": ("format",), "all": None})
    # the target printed the "mixed" view: every view together carries it further than its own format alone
    assert out["all"]["oracle"]["accepted_per_request"] > out["base"]["oracle"]["accepted_per_request"]
    assert out["all"]["oracle"]["tokens_per_step"] > 4
    assert out["all"]["gold"] == out["all"]["oracle"]                 # the gold call is the one it wrote
    assert out["all"]["real"]["accepted_per_request"] < out["all"]["gold"]["accepted_per_request"]
    md = to_markdown({"d (t)": out}, "cmd")
    assert "Regenerate: `cmd`" in md and md.count("\n| `d (t)` |") == 6


def test_no_call_gives_no_bank_and_summary_buckets():
    assert bank_of([], hermes, byte_tokenizer(), None) is None
    s = Summary()
    r = replay([5, 6, 7, 8, 5, 6, 7, 8], HintBank({"v": [5, 6, 7, 8, 5, 6, 7, 8]}))
    s.add(r, True)
    row = s.row()
    assert row["requests"] == 1 and row["with_call"] == 1
    assert sum(c["proposals"] for c in row["by_match"].values()) == len(r.proposals)


def test_main_rejects_a_report_without_examples(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="x.json: not a bench report"):
        main([str(bad)])
