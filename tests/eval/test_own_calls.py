"""The stand-in for a user's traffic (a benchmark replayed through a chat server whose call log is on) and the
learning-curve report built from the runs' metrics."""

from __future__ import annotations

import json

import pytest

from ooospec.eval.sidecar import own_calls, own_calls_report
from ooospec.runtime.call_log import SERVE, log_line
from ooospec.runtime.formats.messages import openai_messages

TOOLS = [{"type": "function", "function": {"name": "f", "description": "", "parameters": {"type": "object",
                                                                                           "properties": {}}}}]


def record(i: int) -> dict:
    return {"id": f"b/test/{i}", "source": "b", "split": "test", "tools": TOOLS,
            "messages": [{"role": "user", "content": f"q{i}"},
                         {"role": "assistant", "content": "", "tool_calls": [
                             {"type": "function", "function": {"name": "f", "arguments": {}}}]},
                         {"role": "tool", "content": "ok"}, {"role": "user", "content": f"again {i}"}],
            "calls": [{"name": "f", "arguments": {}}]}


def test_replay_sends_what_the_log_lacks_and_resumes(tmp_path, monkeypatch):
    log = tmp_path / "calls.jsonl"
    done = record(0)
    log.write_text(log_line(TOOLS, openai_messages(done["messages"]), {"content": "x"}, model="m", source=SERVE))
    (tmp_path / "calls.jsonl.1").write_text(
        log_line(TOOLS, openai_messages(record(1)["messages"]), {"content": "y"}, model="m", source=SERVE))
    sent = []

    def fake_post(url, body, timeout_s):
        sent.append(body)
        return {"choices": [{"message": {"content": None, "tool_calls": [{"function": {"name": "f"}}]}}]}

    monkeypatch.setattr(own_calls, "post", fake_post)
    counts = own_calls.replay([record(i) for i in range(4)], "http://x", model="m", max_tokens=8,
                              skip=own_calls.logged_keys(log))
    assert counts | {"seconds": 0} == {"sent": 2, "skipped": 2, "answered_with_calls": 2, "errors": 0, "seconds": 0}
    assert [b["messages"][0]["content"] for b in sent] == ["q2", "q3"]
    body = sent[0]
    assert body["temperature"] == 0 and body["model"] == "m" and body["tools"] == TOOLS
    assert body["messages"][1]["tool_calls"][0]["function"]["arguments"] == "{}"     # OpenAI's wire form
    assert body["messages"][2]["tool_call_id"] == body["messages"][1]["tool_calls"][0]["id"]


def _metrics(tmp_path, name: str, base: str, joined: float, trained: int | None) -> None:
    ev = {"base": base, "adapter": f"models/{name}", "requests": 100, "dtype": "bf16",
          "function_index": {"accuracy": 0.9}, "argument": {"exact_match": 0.8, "exact_match_non_null": 0.6},
          "joined": {"exact_match": joined}, "direct_call": {"exact_match": joined - 0.1},
          "latency": {"threads": 2, "wave": {"median_ms": 500.0}}}
    (tmp_path / f"{name}.heldout.json").write_text(json.dumps(ev))
    if trained is not None:
        (tmp_path / f"{name}.train.json").write_text(json.dumps(
            {"requests": {"trained": trained}, "init_adapter": {"path": "adapters/sidecar", "sha256": "ab" * 32},
             "train_seconds": 60.0}))


def test_the_learning_curve_report(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    _metrics(runs, "shipped", "q05", 0.40, None)
    _metrics(runs, "q05-040", "q05", 0.50, 40)
    _metrics(runs, "q05-all", "q05", 0.62, 115)
    report = own_calls_report.write_report(runs, tmp_path / "out")
    assert [r["run"] for r in report["rows"]] == ["shipped", "q05-040", "q05-all"]
    assert report["gains"] == [{"base": "q05", "from": "shipped", "to": "q05-all", "requests": 115,
                                "function": 0.0, "argument EM": 0.0, "argument EM non-null": 0.0,
                                "joined call EM": 22.0, "direct call EM": 22.0}]
    lo, hi = report["rows"][2]["joined call EM 95% interval"]          # Wilson, 62 of 100
    assert round(lo, 3) == 0.522 and round(hi, 3) == 0.709
    md = (tmp_path / "out" / "learning_curve.md").read_text()
    assert "| q05-all | q05 | 115 | 90.0% |" in md and "joined call +22.0 points" in md and "| [52, 71] |" in md
    assert (tmp_path / "out" / "learning_curve.png").stat().st_size > 1000
    with pytest.raises(SystemExit, match="no <run>.heldout.json"):
        own_calls_report.write_report(tmp_path / "out", tmp_path / "x")


def test_copy_ceiling_sorts_each_value_by_where_it_comes_from():
    held = [{"messages": [{"role": "user", "content": "alarm at 6:30 for Jane"}],
             "calls": [{"name": "A", "arguments": {"who": "Jane", "at": "06:30", "tok": "t1", "n": None}}]},
            {"messages": [{"role": "user", "content": "2 rooms"}],
             "calls": [{"name": "B", "arguments": {"rooms": 2}}]}]
    train = [{"calls": [{"name": "A", "arguments": {"tok": "t1"}}, {"name": "B", "arguments": {"who": "Jane"}}]}]
    c = own_calls_report.copy_ceiling(held, train)
    # "06:30" is derived, a null is no value, 2 is in "2 rooms", "t1" was seen for A.tok
    assert c == {"requests": 2, "training_requests": 1, "values": 4, "in_conversation": 2, "seen_in_training": 1,
                 "neither": 1, "requests_within_reach": 1}
    lines = own_calls_report.ceiling_lines(c)
    assert "neither 1 (25%)" in lines[0] and "1 (50%) of the held-out requests" in lines[1]


def test_dialogue_shape_finds_back_to_back_calls():
    def turn(dialogue, n_steps, calls=1):
        steps = [m for _ in range(n_steps) for m in ({"role": "assistant"}, {"role": "tool"})]
        return {"meta": {"dialogue": dialogue}, "calls": [{}] * calls, "messages": [{"role": "user"}, *steps]}

    user_between = {"meta": {"dialogue": "c"}, "calls": [{}], "messages": [
        {"role": "user"}, {"role": "assistant"}, {"role": "tool"}, {"role": "assistant"}, {"role": "user"}]}
    other_history = turn("d", 1) | {"messages": [{"role": "user", "content": "else"}, *turn("d", 1)["messages"][1:]]}
    shape = own_calls_report.dialogue_shape([turn("a", 1), turn("a", 0), turn("b", 0, calls=2),
                                             turn("c", 0), user_between, turn("d", 0), other_history])
    assert shape == {"dialogues": 4, "with_two_calls_or_more": 4, "with_back_to_back_calls": 1}
