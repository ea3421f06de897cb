"""Prompt layouts 2 ("context first") and 3 ("tools first"): the block, the adapter metadata, the client's
layout lookup (``GET /health``) and the training rows of ``expand_slots``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ooospec.pipelines import expand_slots
from ooospec.pipelines.records import read_jsonl
from ooospec.pipelines.slot_rows import read_request_rows, row_layout, rows_layout
from ooospec.runtime.formats import hermes
from ooospec.runtime.sidecar import prompts as sp
from ooospec.runtime.sidecar.client import SidecarClient
from tests.pipelines.sidecar_tiny import byte_tokenizer
from tests.runtime.sidecar_servers import MESSAGES, TOOLS, StandIn

GOOD = ["0", '"Paris"', '"celsius"', "null"]          # index, get_weather.city, get_weather.unit, get_time.tz
FIXTURE = Path(__file__).parents[2] / "fixtures" / "train_records.jsonl"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "City name."},
        "unit": {"enum": ["celsius", "fahrenheit"], "default": "celsius", "description": "Temperature unit."}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone.",
    "parameters": {"type": "object", "required": ["tz"], "properties": {"tz": {"type": "string"}}}}}
DOC_MESSAGES = [{"role": "user", "content": "Weather in Paris,\n in celsius?"}]


def test_layouts_are_known_and_the_default_is_the_shipped_adapters():
    from ooospec.runtime.sidecar.client import adapter_layout

    assert sp.LAYOUTS == {2: "context first", 3: "tools first"}
    assert sp.LAYOUT_VERSION == adapter_layout() == 3        # one default: what ships (adapters/sidecar/sidecar.json)
    assert sp.build_wave(MESSAGES, TOOLS) == sp.build_wave(MESSAGES, TOOLS, layout=3)
    for bad in (1, 9, True, "3", None):
        with pytest.raises(ValueError, match="unknown sidecar prompt layout"):
            sp.build_wave(MESSAGES, TOOLS, layout=bad)


def test_docstring_worked_example_of_layout_3():
    wave = sp.build_wave(DOC_MESSAGES, [WEATHER, TIME], layout=3)
    assert wave.block == (
        "Tools:\n"
        "[0] get_weather - Current weather for a city.\n"
        "  city (string, required): City name.\n"
        '  unit ("celsius"|"fahrenheit", optional, default="celsius"): Temperature unit.\n'
        "[1] get_time - Current time in a time zone.\n"
        "  tz (string, required)\n"
        "Conversation:\n"
        "user: Weather in Paris, in celsius?\n")
    assert wave.block in sp.__doc__.replace("\n    ", "\n")


def test_tools_first_block_has_the_same_views_and_queries():
    prior = [{"name": "get_time", "arguments": {"tz": "UTC"}}]
    two = sp.build_wave(MESSAGES, TOOLS, prior, with_direct_call=True, layout=2)
    three = sp.build_wave(MESSAGES, TOOLS, prior, with_direct_call=True, layout=3)
    tools = f"Tools:\n{sp.tools_view(TOOLS)}\n"
    context = f"Conversation:\n{sp.context_view(MESSAGES, prior)}\n"
    assert three.block.startswith("Tools:\n") and three.block == tools + context
    assert two.block.startswith("Conversation:\n") and two.block == context + tools
    assert sorted(three.block.splitlines()) == sorted(two.block.splitlines())
    assert three.queries == two.queries
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert sp.gold_answers(three.queries, TOOLS, call) == sp.gold_answers(two.queries, TOOLS, call)


@pytest.mark.parametrize("layout", sorted(sp.LAYOUTS))
def test_every_query_prompt_starts_with_the_block(layout):
    wave = sp.build_wave(MESSAGES, TOOLS, with_direct_call=True, layout=layout)
    assert len(wave.prompts()) == len(wave.queries) == 5
    for prompt, q in zip(wave.prompts(), wave.queries):
        assert prompt.startswith(wave.block) and prompt[len(wave.block):] == q.text
        assert wave.block.endswith("\n") and q.text.startswith("Query: ")


@pytest.mark.parametrize("layout", [2, 3])
def test_metadata_accepts_every_known_layout(tmp_path, layout):
    (tmp_path / sp.METADATA_FILE).write_text(json.dumps({**sp.layout_metadata(layout), "base": "b"}))
    assert sp.read_metadata(tmp_path) == {"layout_version": layout, "base": "b"}


def test_metadata_refuses_an_unknown_layout(tmp_path):
    (tmp_path / sp.METADATA_FILE).write_text(json.dumps({"layout_version": 9, "base": "b"}))
    with pytest.raises(sp.LayoutMismatch, match="layout 9"):
        sp.read_metadata(tmp_path)
    with pytest.raises(ValueError):
        sp.layout_metadata(9)


def test_sidecar_uses_its_adapters_layout():
    pytest.importorskip("torch")
    from ooospec.runtime.sidecar.wave import Sidecar

    tok = byte_tokenizer()
    assert Sidecar(None, tok, metadata={"layout_version": 3}).layout == 3
    assert Sidecar(None, tok, metadata={"base": "b"}).layout == sp.LAYOUT_VERSION


def _ask(client, server, tok):
    req = client.submit(MESSAGES, TOOLS, fmt=hermes, tokenizer=tok)
    bank = req.wait(10)
    assert bank is not None and req.stats().error is None, req.stats().error_detail
    return server.received[-1][1]["prompt"]


@pytest.mark.parametrize("layout", [2, 3])
def test_client_asks_health_once_for_the_layout(layout):
    tok = byte_tokenizer()
    with StandIn("good", GOOD) as server:
        server.health = {"status": "ok", "layout_version": layout}
        client = SidecarClient(server.url)
        assert server.health_gets == 0                 # building a client sends nothing
        for _ in range(2):
            assert _ask(client, server, tok) == sp.build_wave(MESSAGES, TOOLS, layout=layout).prompts()
    assert server.health_gets == 1 and client.layout == layout


def test_client_without_a_reported_layout_uses_the_default_and_a_given_layout_asks_nothing():
    tok = byte_tokenizer()
    with StandIn("good", GOOD) as server:              # reports no layout_version (like vLLM)
        client = SidecarClient(server.url)
        assert _ask(client, server, tok) == sp.build_wave(MESSAGES, TOOLS).prompts()
        assert client.layout == sp.LAYOUT_VERSION and server.health_gets == 1
    with StandIn("good", GOOD) as server:
        server.health = {"layout_version": 2}
        client = SidecarClient(server.url, layout=3)
        assert _ask(client, server, tok) == sp.build_wave(MESSAGES, TOOLS, layout=3).prompts()
        assert server.health_gets == 0
    with pytest.raises(ValueError):
        SidecarClient("http://127.0.0.1:1", layout=9)


def test_client_refuses_a_layout_it_cannot_build():
    tok = byte_tokenizer()
    with StandIn("good", GOOD) as server:
        server.health = {"layout_version": 9}
        req = SidecarClient(server.url).submit(MESSAGES, TOOLS, fmt=hermes, tokenizer=tok)
        assert req.wait(10) is None
        assert req.stats().error == "bad_response" and "layout" in req.stats().error_detail
        assert server.received == []


def test_expand_slots_layout_3_rows_follow_the_tools_first_block(tmp_path):
    params = expand_slots.ExpandSlotsParams(heldout_fraction=0.0, layout=3)
    out = tmp_path / "train.jsonl"
    stats = expand_slots.run(params, FIXTURE, out, tmp_path / "heldout.jsonl", tmp_path / "m.json",
                             tmp_path / "card.md")
    rows = read_request_rows(out)
    assert rows and rows_layout(rows) == 3 and stats["layout_version"] == 3
    records = {r["id"]: r for r in read_jsonl(FIXTURE)}
    for row in rows:
        assert row["layout"] == 3 and row["block"].startswith("Tools:\n")
        rec, k = records[row["record_id"]], int(row["id"].rsplit("#", 1)[1])
        wave = sp.build_wave(rec["messages"], rec["tools"], rec["calls"][:k], with_direct_call=True, layout=3)
        assert row["block"] == wave.block
        assert [s["query"] for s in row["slots"]] == [q.text for q in wave.queries]   # no cap: every slot
        assert all((row["block"] + s["query"]).startswith("Tools:\n") for s in row["slots"])
    assert "prompt layout\n3, tools first" in (tmp_path / "card.md").read_text()
    with pytest.raises(ValueError, match="expand_slots.layout"):
        expand_slots.ExpandSlotsParams(layout=9)


def test_layout_2_rows_are_as_before_and_mixed_rows_are_refused():
    rec = next(iter(read_jsonl(FIXTURE)))
    row2 = expand_slots.record_rows(rec, expand_slots.ExpandSlotsParams(heldout_fraction=0.0, layout=2),
                                    "heldout")[0][0]
    assert "layout" not in row2 and row_layout(row2) == 2
    row3 = expand_slots.record_rows(rec, expand_slots.ExpandSlotsParams(heldout_fraction=0.0, layout=3),
                                    "heldout")[0][0]
    with pytest.raises(ValueError, match="mix prompt layouts"):
        rows_layout([row2, row3])


def test_training_records_the_rows_layout(tmp_path):
    from ooospec.pipelines import train_sidecar as ts
    from ooospec.pipelines.recipe import recipe_from_dict
    from tests.pipelines.sidecar_tiny import tiny_recipe_dict

    recipe = recipe_from_dict(tiny_recipe_dict(tmp_path))
    metrics = {"layout_version": 3, "requests": {"trained": 2}, "slots": {"trained": 9}, "steps": 1}
    meta = ts.sidecar_metadata(recipe, metrics)
    assert meta["layout_version"] == 3
    (tmp_path / sp.METADATA_FILE).write_text(json.dumps(meta))
    assert sp.read_metadata(tmp_path)["layout_version"] == 3
    params = ts.TrainSidecarParams(recipe="<tiny>", max_train_requests=8, seed=3, threads=1, resume=True)
    assert ts.run_fingerprint(params, recipe, "x") == ts.run_fingerprint(params, recipe, "x", sp.LAYOUT_VERSION)
    assert ts.run_fingerprint(params, recipe, "x", 3) != ts.run_fingerprint(params, recipe, "x", 2)


def test_eval_refuses_rows_in_another_layout_than_the_adapters(tmp_path):
    from ooospec.pipelines import eval_sidecar as ev

    (tmp_path / sp.METADATA_FILE).write_text(json.dumps({"layout_version": 3, "base": "b"}))
    rec = next(iter(read_jsonl(FIXTURE)))
    rows = expand_slots.record_rows(rec, expand_slots.ExpandSlotsParams(heldout_fraction=0.0, layout=2),
                                    "heldout")[0]
    with pytest.raises(ValueError, match="learned prompt layout 3"):   # before any model is loaded
        ev.run(ev.EvalSidecarParams(), rows, tmp_path, tmp_path / "m.json")
