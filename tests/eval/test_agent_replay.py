"""agent-bench: dialogues from API-Bank level-3 / ToolAlpaca records, the replay's three variants, the summary."""

from __future__ import annotations

import json

import pytest

from ooospec.eval.agent import replay as AR
from ooospec.pipelines.records import write_jsonl
from tests.runtime.chat_tiny import ANSWER, CALL, RESULT, TOOLS, USER, trained_chat_model


def _tool(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": "",
                                             "parameters": {"type": "object", "properties": {}}}}


def _apibank_records() -> list[dict]:
    user = [{"role": "user", "content": "Find and use the tool."}]
    call0, call1 = {"name": "ToolSearcher", "arguments": {"keywords": "X"}}, {"name": "X", "arguments": {}}
    step1 = user + [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call0}]},
                    {"role": "tool", "content": '{"name": "X"}'}]
    recs = [
        {"id": "apibank/test-l3/0#0", "source": "apibank", "split": "test-l3", "tools": [_tool("ToolSearcher")],
         "messages": user, "calls": [call0], "meta": {"sample": "level-3/0", "step": 0}},
        {"id": "apibank/test-l3/0#1", "source": "apibank", "split": "test-l3",
         "tools": [_tool("ToolSearcher"), _tool("X")], "messages": step1, "calls": [call1],
         "meta": {"sample": "level-3/0", "step": 1}},
        {"id": "apibank/test-l3/1#0", "source": "apibank", "split": "test-l3", "tools": [_tool("ToolSearcher")],
         "messages": user, "calls": [call0], "meta": {"sample": "level-3/1", "step": 0}},
    ]
    return recs


def test_apibank_dialogues_take_responses_from_the_next_record(tmp_path):
    path = tmp_path / "apibank-l3.jsonl"
    write_jsonl(path, _apibank_records())
    (d,) = AR.load_dialogues(path, min_steps=2)                 # level-3/1 has one step only
    assert d.id == "level-3/0" and d.steps == 2 and d.messages == _apibank_records()[0]["messages"]
    assert [len(t) for t in d.tools] == [1, 2] and d.calls[1] == {"name": "X", "arguments": {}}
    assert d.responses == ['{"name": "X"}', AR.STUB_RESPONSE]
    assert len(AR.load_dialogues(path, min_steps=1)) == 2


def test_toolalpaca_dialogues_stop_at_unrecoverable_steps(tmp_path):
    rec = {"id": "toolalpaca/eval-real/A#0", "source": "toolalpaca", "split": "eval-real", "tools": [_tool("f")],
           "messages": USER, "calls": [{"name": "f", "arguments": {}}],
           "meta": {"steps": [{"name": "f", "arguments": {}}, {"name": "f", "arguments": {"a": 1}},
                              {"name": "f", "arguments_raw": "${x}", "error": "placeholder"}]}}
    path = tmp_path / "ta.jsonl"
    write_jsonl(path, [rec])
    (d,) = AR.load_dialogues(path)
    assert d.steps == 2 and d.responses == [AR.STUB_RESPONSE] * 2
    write_jsonl(path, [rec, {**_apibank_records()[0]}])
    with pytest.raises(ValueError, match="sources"):
        AR.load_dialogues(path)


def test_replay_variants_agree_and_speculation_hides_the_tool_latency():
    model, tok = trained_chat_model()
    dialogue = AR.Dialogue("weather", USER, [TOOLS], [CALL], [RESULT])
    rows = AR.run_bench(model, tok, [dialogue], [0.3], max_new_tokens=40, progress=False)
    by = {r["variant"]: r for r in rows}
    assert by["stateless"]["texts"][1] == ANSWER and all(r["exact"] for r in rows)
    assert by["speculative"]["hits"] == 1 and by["sessions"]["hits"] == 0
    assert by["speculative"]["turns"][0]["guess"] == CALL and by["sessions"]["turns"][0]["guess"] is None
    assert by["speculative"]["speculation"]["started"] == 1 and by["sessions"]["speculation"]["started"] == 0
    # sessions: the tool runs after the call, so the wait is the whole latency (time.sleep never ends early)
    assert by["sessions"]["turns"][0]["tool_wait_s"] >= 0.3
    # speculative: the run started at arrival, before the turn decoded (the agent hands over a call ready at
    # arrival synchronously), so by the call's end it has already run for the turn's decode time
    spec = by["speculative"]["turns"][0]
    assert spec["tool_wait_s"] < by["sessions"]["turns"][0]["tool_wait_s"]
    assert spec["tool_wait_s"] <= max(0.3 - spec["gen_s"], 0.0) + 0.25     # + a loaded machine's thread wake-up
    assert by["sessions"]["turns"][1]["cached_tokens"] > 0 == by["stateless"]["turns"][1]["cached_tokens"]
    summary = {s["variant"]: s for s in AR.summarize(rows)}
    assert summary["sessions"]["prefill_saved_frac"] > 0 and summary["speculative"]["hit_rate"] == 1.0
    table = AR.markdown_table(AR.summarize(rows))
    assert "| 0.3 s | speculative | 1 | 1 |" in table and "100.0%" in table
    json.dumps(rows)                                             # the JSON results are plain data


def test_summary_worked_example():
    def row(variant, dialogue, wall, prefilled):
        return {"id": dialogue, "variant": variant, "latency_s": 0.5, "wall_s": wall, "calls": 1, "hits": 0,
                "exact": True, "turns": [{"prefilled_tokens": prefilled, "tool_wait_s": 0.5}]}
    rows = [row("stateless", "a", 10, 100), row("stateless", "b", 20, 100),
            row("sessions", "a", 9, 100), row("sessions", "b", 17, 50)]
    s = {x["variant"]: x for x in AR.summarize(rows)}
    assert s["sessions"]["saved_frac"] == pytest.approx(1 - 26 / 30)
    assert s["sessions"]["prefill_saved_frac"] == pytest.approx(0.25) and s["stateless"]["saved_frac"] == 0


def test_gate_decisions_are_counted_per_latency_and_variant():
    def row(variant, decisions):
        return {"id": "a", "variant": variant, "latency_s": 2.0, "wall_s": 5.0, "calls": 1, "hits": 1,
                "exact": True, "turns": [{"prefilled_tokens": 10, "tool_wait_s": 0.0,
                                          "wave": None if d is None else {"decision": d}} for d in decisions]}
    rows = [row("stateless", [None, None]), row("speculative", ["slots", "skip"])]
    s = {x["variant"]: x for x in AR.summarize(rows)}
    assert s["speculative"]["waves"] == {"skip": 1, "slots": 1} and s["stateless"]["waves"] == {}
    table = AR.markdown_table(AR.summarize(rows))
    assert table.splitlines()[0].endswith("| waves (gate) |") and "| skip 1, slots 1 |" in table
    assert "waves (gate)" not in AR.markdown_table(AR.summarize(rows[:1]))     # no gate, no column


def test_sidecar_speculator_with_the_gate_runs_every_variant():
    """The sidecar path of run_bench (a stand-in server, a gated client): every variant runs, the server is waited
    for between replays, each turn carries the gate's decision, and the texts are the same in every variant."""
    from ooospec.runtime.sidecar.client import SidecarClient
    from ooospec.runtime.sidecar.deployments import SPLIT
    from ooospec.runtime.sidecar.gate import WaveGate
    from tests.runtime.sidecar_servers import StandIn

    model, tok = trained_chat_model()
    dialogue = AR.Dialogue("weather", USER, [TOOLS], [CALL], [RESULT])
    with StandIn("by_query") as sidecar:
        client = SidecarClient(sidecar.url, timeout=60, gate=WaveGate(SPLIT.prior))
        rows = AR.run_bench(model, tok, [dialogue], [0.1], speculator="sidecar", max_new_tokens=40, client=client,
                            progress=False)
    assert [r["variant"] for r in rows] == list(AR.VARIANTS) and all(r["exact"] for r in rows)
    spec = next(r for r in rows if r["variant"] == "speculative")
    assert all(t["wave"] is not None for t in spec["turns"]) and spec["turns"][0]["wave"]["decision"] != "skip"
    assert AR.summarize(rows)[-1]["waves"]
