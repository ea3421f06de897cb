"""Your own tool calls as ingest sources: OpenAI chat JSONL (call logs), Hugging Face datasets in the xlam, hermes
and glaive layouts, hostile lines, the held-out split by conversation, dedupe's routing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ooospec.pipelines import dedupe as dedupe_stage
from ooospec.pipelines import ingest
from ooospec.pipelines.params import from_dict
from ooospec.pipelines.records import Reject, load_records, read_jsonl
from ooospec.pipelines.sources import layouts, openai_chat, user
from ooospec.runtime.formats.messages import normalize_messages

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                   "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "now", "description": "The time"}}   # no parameters: takes none


def tool_call(name: str, args: dict, i: int = 0) -> dict:
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def conversation(city: str, second: str | None = None) -> dict:
    """A user asks, the assistant calls, the tool answers, the assistant replies; optionally a second turn with two
    calls at once."""
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": f"Weather in {city}?"},
                {"role": "assistant", "content": None, "tool_calls": [tool_call("get_weather", {"city": city})]},
                {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
                {"role": "assistant", "content": "Sunny."}]
    if second:
        messages += [{"role": "user", "content": f"And {second}, in celsius, and the time?"},
                     {"role": "assistant", "content": "", "tool_calls": [
                         tool_call("get_weather", {"city": second, "unit": "C"}, 1), tool_call("now", {}, 2)]}]
    return {"tools": [WEATHER, CLOCK], "messages": messages}


def write_lines(path: Path, items: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in items), encoding="utf-8")
    return path


def records_of(items) -> tuple[list[dict], list[Reject]]:
    items = list(items)
    return [i for i in items if not isinstance(i, Reject)], [i for i in items if isinstance(i, Reject)]


# ---------------------------------------------------------------- openai_chat


def test_every_calling_turn_is_a_record_with_the_conversation_before_it(tmp_path):
    path = write_lines(tmp_path / "log.jsonl", [conversation("Paris", second="Rome")])
    recs, rejects = records_of(openai_chat.parse_file(path, "mine"))
    assert not rejects
    assert [r["id"] for r in recs] == ["mine/train/log.jsonl:1#t2", "mine/train/log.jsonl:1#t6"]
    first, second = recs
    assert first["messages"] == [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "Weather in Paris?"}]
    assert first["calls"] == [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    # several calls in one turn stay one record; the history's call is an object, ids and tool_call_id dropped
    assert second["calls"] == [{"name": "get_weather", "arguments": {"city": "Rome", "unit": "C"}},
                               {"name": "now", "arguments": {}}]
    assert second["messages"][2] == {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    assert second["messages"][3] == {"role": "tool", "content": "sunny"}
    assert first["tools"][1]["function"]["parameters"] == {"type": "object", "properties": {}}
    assert first["meta"]["dialogue"] == second["meta"]["dialogue"]


def test_a_call_log_line_is_one_request_its_last_turn(tmp_path):
    line = conversation("Paris", second="Rome") | {"log_version": 1, "source": "ooospec-serve"}
    recs, _ = records_of(openai_chat.parse_file(write_lines(tmp_path / "calls.jsonl", [line]), "mine"))
    assert [r["id"] for r in recs] == ["mine/train/calls.jsonl:1#t6"]


def test_requests_of_one_conversation_share_a_key_and_a_split():
    a = conversation("Paris")
    b = conversation("Paris", second="Rome")            # the same conversation one turn later
    c = conversation("Oslo")
    key = openai_chat.conversation_key

    def norm(o):
        return [openai_chat.normalize_message(m)[0] for m in normalize_messages(o["messages"])]

    assert key(a, norm(a)) == key(b, norm(b)) != key(c, norm(c))
    assert key(a | {"tools": []}, norm(a)) == key(a, norm(a))   # the same opening request, whatever the tools
    assert key(a | {"conversation_id": "x1"}, norm(a)) == "id:x1"
    assert key(a | {"metadata": {"session_id": 7}}, norm(a)) == "id:7"
    split = user.split_of("mine", 0.5)
    keys = [f"k{i}" for i in range(400)]
    held = sum(split(k) == "heldout" for k in keys)
    assert 150 < held < 250 and all(split(k) == split(k) for k in keys)
    assert user.split_of("mine", 0.0)("k1") == "train"


HOSTILE = [
    "this is not JSON",
    {"tools": [{"type": "function"}], "messages": [{"role": "user", "content": "x"}]},        # a tool without a schema
    {"tools": [WEATHER], "messages": [{"role": "user", "content": "x"},
                                      {"role": "assistant", "content": "", "tool_calls": [tool_call("launch", {})]}]},
    {"tools": [WEATHER], "messages": [{"role": "user", "content": "big"}, {"role": "assistant", "content": "",
                                      "tool_calls": [tool_call("get_weather", {"city": "x" * 10_000_000})]}]},
    {"tools": [WEATHER], "messages": [{"role": "user", "content": "y"}, {"role": "assistant", "content": "",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{city: 1"}}]}]},
    {"tools": [WEATHER], "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]},
    [1, 2, 3],
]


def test_hostile_lines_are_rejects_by_reason_and_the_rest_lands(tmp_path):
    path = write_lines(tmp_path / "calls.jsonl", [conversation("Paris")] + HOSTILE + [conversation("Oslo")])
    spec = user.UserSource(name="mine", kind="openai_chat", path=str(path), heldout_fraction=0.0,
                           max_reject_fraction=1.0)
    params = ingest.IngestParams(sources=(), user_sources=(spec,))
    stats = ingest.run(params, tmp_path / "out", metrics_path=tmp_path / "m.json", card_path=tmp_path / "card.md")
    st = stats["sources"]["mine"]
    assert st["parsed"] == 2 and st["rejected"] == len(HOSTILE)
    assert st["rejects_by_reason"] == {"call_unknown_tool": 1, "malformed_record": 3, "not_json": 2,
                                       "record_too_large": 1}
    rejects = list(read_jsonl(tmp_path / "out" / "rejects.jsonl"))
    details = " ".join(r["detail"] for r in rejects)
    wheres = ("calls.jsonl:2:", "calls.jsonl:3: tools[0]",
              "calls.jsonl:6: messages[1].tool_calls[0]: expected", "messages[0].content[0]: only text parts",
              "calls.jsonl:8: expected a JSON object per line")
    for where in wheres:
        assert where in details
    assert all(len(json.dumps(r)) < 20_000 for r in rejects)     # a 10 MB value is not copied into the rejects
    assert [r["calls"][0]["arguments"]["city"] for r in load_records(tmp_path / "out" / "records.jsonl").rows] == \
        ["Paris", "Oslo"]
    assert "mine" in (tmp_path / "card.md").read_text()


def test_too_many_rejects_fail_the_stage_without_a_records_file(tmp_path):
    path = write_lines(tmp_path / "calls.jsonl", [conversation("Paris")] + HOSTILE[:2])
    out = tmp_path / "out"
    out.mkdir()
    (out / "records.jsonl").write_text("stale\n")
    spec = user.UserSource(name="mine", kind="openai_chat", path=str(path), on_reject="fail")
    with pytest.raises(SystemExit, match="mine: 2 rejects"):
        ingest.run(ingest.IngestParams(sources=(), user_sources=(spec,)), out, metrics_path=tmp_path / "m.json",
                   card_path=None)
    assert not (out / "records.jsonl").exists() and (out / "rejects.jsonl").exists()


def test_user_sources_are_typed_params_with_errors_by_name(tmp_path):
    p = from_dict(ingest.IngestParams, {"sources": [], "user_sources": [
        {"name": "mine", "kind": "openai_chat", "path": "logs/*.jsonl"}]}, "ingest")
    assert p.user_sources[0] == user.UserSource(name="mine", kind="openai_chat", path="logs/*.jsonl")
    with pytest.raises(ValueError, match=r"ingest.user_sources\[0\].*unknown key\(s\) \['paht'\]"):
        from_dict(ingest.IngestParams, {"user_sources": [{"name": "m", "kind": "hf", "paht": "x"}]}, "ingest")
    with pytest.raises(ValueError, match="kind must be one of"):
        from_dict(ingest.IngestParams, {"user_sources": [{"name": "m", "kind": "csv", "path": "x"}]}, "ingest")
    with pytest.raises(ValueError, match="is a built-in source"):
        user.UserSource(name="glaive", kind="openai_chat", path="x")
    with pytest.raises(ValueError, match="names must be unique"):
        ingest.IngestParams(sources=(), user_sources=(user.UserSource(name="a", kind="hf", path="x"),) * 2)


def test_a_source_that_cannot_be_opened_is_one_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(json.dumps({"ingest": {"sources": [], "user_sources": [
        {"name": "hub", "kind": "hf", "path": "someone/some-dataset", "schema": "xlam"}]}}))
    assert ingest.main(["out"]) == 2
    assert "needs a pinned `revision`" in capsys.readouterr().err
    (tmp_path / "params.yaml").write_text(json.dumps({"ingest": {"sources": [], "user_sources": [
        {"name": "mine", "kind": "openai_chat", "path": "logs/calls.jsonl*"}]}}))
    assert ingest.main(["out"]) == 2
    assert "no file matches path 'logs/calls.jsonl*'" in capsys.readouterr().err
    (tmp_path / "params.yaml").write_text(json.dumps({"ingest": {"user_sources": [
        {"name": "glaive", "kind": "openai_chat", "path": "x.jsonl"}]}}))
    assert ingest.main(["out"]) == 2
    assert "'glaive' is a built-in source" in capsys.readouterr().err


# ---------------------------------------------------------------- hf: the three layouts, loaded by datasets

XLAM_ROW = {"id": 0, "query": "Weather in Paris, and the time?",
            "tools": json.dumps([{"name": "get_weather", "description": "Weather now", "parameters": {
                "city": {"type": "str", "description": "City"},
                "days": {"type": "int, optional", "description": "Days", "default": 1}}},
                {"name": "now", "description": "The time", "parameters": {}}]),
            "answers": json.dumps([{"name": "get_weather", "arguments": {"city": "Paris", "days": "3"}},
                                   {"name": "now", "arguments": {}}])}
HERMES_ROW = {"id": "h0", "conversations": [
    {"from": "system", "value": "You are a function calling AI model. <tools> [{'type': 'function', 'function': "
                                "{'name': 'get_weather', 'description': 'Weather now', 'parameters': {'type': "
                                "'object', 'properties': {'city': {'type': 'string'}}, 'required': ['city']}}}] "
                                "</tools> Answer inside <tool_call></tool_call>."},
    {"from": "human", "value": "Weather in Paris?"},
    {"from": "gpt", "value": "<tool_call>\n{'arguments': {'city': 'Paris'}, 'name': 'get_weather'}\n</tool_call>"},
    {"from": "tool", "value": "<tool_response>\n{\"sky\": \"clear\"}\n</tool_response>"},
    {"from": "gpt", "value": "Clear skies."},
    {"from": "human", "value": "And Rome?"},
    {"from": "gpt", "value": "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n"
                             "</tool_call>"}]}
GLAIVE_ROW = {"system": "SYSTEM: You are a helpful assistant with access to the following functions. Use them if "
                        "required -\n{\n    \"name\": \"get_weather\",\n    \"description\": \"Weather now\",\n    "
                        "\"parameters\": {\n        \"type\": \"object\",\n        \"properties\": {\n            "
                        "\"city\": {\"type\": \"string\"}\n        },\n        \"required\": [\"city\"]\n    }\n}\n",
              "chat": "USER: Is it raining in Paris?\n\n\nASSISTANT: <functioncall> {\"name\": \"get_weather\", "
                      "\"arguments\": '{\"city\": \"Paris\"}'} <|endoftext|>\n\n\nFUNCTION RESPONSE: {\"rain\": "
                      "false}\n\n\nASSISTANT: No rain in Paris today. <|endoftext|>\n\n\nUSER: Thanks!\n\n\n"
                      "ASSISTANT: You're welcome! <|endoftext|>\n"}


def test_layout_mappers():
    x = layouts.xlam_row(XLAM_ROW)
    assert x["tools"][0]["function"]["parameters"]["required"] == ["city"]
    assert x["messages"][1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris", "days": 3}   # "3" -> 3
    h = layouts.hermes_row(HERMES_ROW)
    assert [m["role"] for m in h["messages"]] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert h["messages"][2]["content"] == '{"sky": "clear"}'
    g = layouts.glaive_row(GLAIVE_ROW)
    assert g["messages"][1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert g["messages"][-1] == {"role": "assistant", "content": "You're welcome!"}
    with pytest.raises(openai_chat.BadConversation, match="answers: not JSON"):
        layouts.xlam_row({**XLAM_ROW, "answers": "[{"})


def _hf_file(tmp_path: Path, name: str, rows: list[dict], fmt: str) -> Path:
    path = tmp_path / name
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        write_lines(path, rows)
    return path


@pytest.mark.parametrize(("schema", "row", "fmt", "calls"), [
    ("xlam", XLAM_ROW, "parquet", 1), ("hermes", HERMES_ROW, "jsonl", 2), ("glaive", GLAIVE_ROW, "jsonl", 1)])
def test_hf_sources_load_local_files_as_datasets_does(tmp_path, schema, row, fmt, calls):
    bad = {k: ("{not json" if k in ("tools", "chat", "conversations") else v) for k, v in row.items()}
    if schema == "hermes":
        bad = {"id": "h1", "conversations": [{"from": "narrator", "value": "x"}]}
    path = _hf_file(tmp_path, f"data.{fmt}", [row, bad, row], fmt)
    spec = user.UserSource(name="hub", kind="hf", path=str(path), schema=schema, heldout_fraction=0.0,
                           max_reject_fraction=0.5)
    recs, rejects, stats = ingest.ingest_user_source(spec)
    assert stats["parsed"] == 2 * calls and stats["rejects_by_reason"] == {"unreadable_row": 1}
    assert f"row 1 ({schema})" in rejects[0]["detail"]
    assert {r["id"].split("#")[0] for r in recs} == {"hub/train/row0", "hub/train/row2"}
    assert all(c["name"] == "get_weather" or c["name"] == "now" for r in recs for c in r["calls"])


# ---------------------------------------------------------------- dedupe: your held-out conversations


def test_dedupe_holds_out_user_conversations_and_keeps_their_repeats_out_of_training(tmp_path):
    convs = [conversation(c) for c in ("Paris", "Oslo", "Rome", "Lima", "Kyiv", "Bern", "Doha", "Riga")]
    path = write_lines(tmp_path / "calls.jsonl", convs + [conversation("Paris")])     # a repeat of the first
    spec = user.UserSource(name="mine", kind="openai_chat", path=str(path), heldout_fraction=0.5)
    recs, _, _ = ingest.ingest_user_source(spec)
    train, evals, stats = dedupe_stage.dedupe(dedupe_stage.DedupeParams(eval_sets={}, train_splits=()), recs)
    held = evals["mine"]
    assert held and train and stats["eval_sets"] == {"mine": "mine/heldout"}
    held_dialogues = {r["meta"]["dialogue"] for r in held}
    assert not held_dialogues & {r["meta"]["dialogue"] for r in train}
    paris_held = any("Paris" in r["messages"][1]["content"] for r in held)
    assert stats["train"]["removed_total"] == ({} if paris_held else {"exact_duplicate": 1})
    assert len(held) + len(train) == 9 - (0 if paris_held else 1)
    assert dedupe_stage.check_no_leak(train, evals) == []
    with pytest.raises(ValueError, match="named like a benchmark"):
        dedupe_stage.dedupe(dedupe_stage.DedupeParams(eval_sets={"mine": "x/y"}), recs)
