"""The wave-alone comparison (eval/sidecar/engines.py): its waves, scores and agreement on hand-made rows."""

from __future__ import annotations

from ooospec.eval.sidecar import engines as se
from ooospec.runtime.sidecar import prompts as sp
from tests.runtime.sidecar.test_prompts import MESSAGES, TIME, WEATHER

TOOLS = [WEATHER, TIME]


def test_argument_queries_are_build_waves_for_the_named_tools():
    every = [q for q in sp.build_wave(MESSAGES, TOOLS).queries if q.form == "argument"]
    assert se.argument_queries(TOOLS) == every
    assert se.argument_queries(TOOLS, ["get_time"]) == [q for q in every if q.function == "get_time"]


def test_toolbox_is_the_tools_section_of_a_layout_3_block():
    block = sp.shared_block(MESSAGES, TOOLS, layout=3)
    assert se.toolbox_of(block) == sp.shared_block([], TOOLS, layout=3).split("Conversation:")[0]
    assert se.toolbox_of(sp.shared_block(MESSAGES, TOOLS, layout=2)).startswith("Conversation:") is False


def test_quality_and_agreement_count_what_they_say():
    row = {"id": "r", "function": "get_weather", "slots": [
        {"form": "function_index", "function": None, "parameter": None, "query": sp.INDEX_QUERY, "answer": "0"},
        {"form": "argument", "function": "get_weather", "parameter": "city", "query": "q", "answer": '"Paris"'},
        {"form": "argument", "function": "get_weather", "parameter": "unit", "query": "q", "answer": '"celsius"'},
        {"form": "argument", "function": "get_time", "parameter": "tz", "query": "q", "answer": "null"}]}
    ref = {"id": "r", "answers": {"index": "0", "get_weather.city": '"Paris"', "get_weather.unit": "null"}}
    other = {"id": "r", "answers": {"index": "0", "get_weather.city": '"Paris"', "get_weather.unit": '"celsius"'}}
    assert se.quality([row], [ref]) == {"index_accuracy": 1.0, "argument_exact": 0.5, "gold_arguments": 2}
    assert se.quality([row], [other])["argument_exact"] == 1.0
    a = se.agreement([ref], [other])
    assert (a["both"], a["same"]) == (3, 2) and a["differ"] == [("r", "get_weather.unit", "null", '"celsius"')]


def test_configs_name_every_engine_and_refuse_others():
    assert se._configs("transformers:all,vllm:function-first") == [("transformers", "all"),
                                                                    ("vllm", "function-first")]
    import pytest

    with pytest.raises(SystemExit, match="engine:shape"):
        se._configs("sglang:all")


def test_reference_runs_must_answer_the_same_rows(tmp_path):
    import json

    import pytest

    rows = [{"id": "a"}, {"id": "b"}]
    run = [{"id": "a", "answers": {}}, {"id": "b", "answers": {}}]
    path = tmp_path / "ref.json"
    path.write_text(json.dumps({"runs": {"transformers:all:cold": run}, "env": {"engines": {}},
                                "summary": [{"config": "transformers:all:cold"}], "command": "x"}))
    runs, _, reference = se.reference_runs(path, rows)
    assert reference == "transformers:all" and list(runs) == ["transformers:all:cold"]
    with pytest.raises(SystemExit, match="other requests"):
        se.reference_runs(path, rows[:1])
