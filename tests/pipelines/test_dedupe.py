"""Dedupe: duplicates within/across sources, planted leaks of every kind, determinism."""

import pytest

from ooospec.pipelines import dedupe as D
from ooospec.pipelines import records as R

P = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [R.tool("weather", "Weather", P)]


def rec(source, split, lid, user, city, meta=None, tools=TOOLS, first_user=None):
    msgs = ([{"role": "user", "content": first_user}, {"role": "assistant", "content": "ok"}] if first_user else [])
    msgs.append({"role": "user", "content": user})
    return R.make_record(source, split, lid, tools, msgs, [R.call("weather", {"city": city})], meta)


PARAMS = D.DedupeParams(eval_sets={"bench": "ev/test"}, train_splits=("a/train", "b/train"))


def corpus():
    return [
        rec("ev", "test", "1", "Weather in Paris please", "Paris", meta={"dialogue": "d1.jsonl"}),
        rec("ev", "test", "2", "How hot is Rome?", "Rome"),
        rec("ev", "test", "3", "How hot is Rome?", "Rome"),                       # duplicate inside the benchmark
        rec("a", "train", "a-keep", "Weather in Oslo", "Oslo"),
        rec("a", "train", "exact", "Weather in Oslo", "Oslo"),                    # exact duplicate of keep1
        rec("b", "train", "norm", "  weather IN\u00a0oslo ", "OSLO"),            # normalized duplicate, other source
        rec("a", "train", "leakreq", "WEATHER in paris   please", "Lyon"),        # shares the eval request
        rec("a", "train", "leakfirst", "and tomorrow?", "Berlin", first_user="How hot is Rome?"),  # first user turn
        rec("ev", "dialog", "x", "unrelated", "Nice"),                            # split not used
        R.make_record("ev", "samples", "sib", TOOLS, [{"role": "user", "content": "something else"}],
                      [R.call("weather", {"city": "Paris"})], {"dialogue": "d1.jsonl"}),
        rec("b", "train", "keep2", "Is it raining in Madrid?", "Madrid"),
        rec("b", "train", "distractor", "Wind in Porto?", "Porto", meta={"bfcl_distractor": True}),
    ]


def test_removes_duplicates_and_planted_leaks():
    train, evals, stats = D.dedupe(PARAMS, corpus())
    assert [r["id"] for r in train] == ["a/train/a-keep", "b/train/keep2"]
    removed = stats["train"]["removed_total"]
    assert removed == {"exact_duplicate": 1, "normalized_duplicate": 1, "leak_request": 2,
                       "leak_benchmark_tool_docs": 1}
    assert [r["id"] for r in evals["bench"]] == ["ev/test/1", "ev/test/2", "ev/test/3"]
    assert stats["eval"]["bench"]["normalized_duplicates"] == 1
    assert stats["unused_splits"] == {"ev/dialog": 1, "ev/samples": 1}
    assert D.check_no_leak(train, evals) == []


def test_same_dialogue_sibling_is_removed():
    params = D.DedupeParams(eval_sets={"bench": "ev/test"}, train_splits=("ev/samples",))
    train, _, stats = D.dedupe(params, corpus())
    assert train == [] and stats["train"]["removed_total"] == {"leak_same_dialogue": 1}


def test_request_call_pair_leak():
    # same request text but only via the pair key: build an eval record whose request is also the train request
    ev = rec("ev", "test", "1", "Weather in Paris please", "Paris")
    tr = rec("a", "train", "t", "Weather in Paris please", "Paris")
    assert D.pair_keys(ev) & D.pair_keys(tr)
    train, _, stats = D.dedupe(PARAMS, [ev, tr])
    assert train == [] and sum(stats["train"]["removed_total"].values()) == 1


def test_drop_eval_duplicates_option():
    params = D.DedupeParams(eval_sets={"bench": "ev/test"}, train_splits=(), drop_eval_duplicates=True)
    _, evals, stats = D.dedupe(params, corpus())
    assert [r["id"] for r in evals["bench"]] == ["ev/test/1", "ev/test/2"]
    assert stats["eval"]["bench"]["dropped_duplicates"] == 1


def test_keys_are_normalized():
    a = rec("a", "train", "1", "Weather  in OSLO", "Oslo")
    b = rec("b", "train", "2", "weather in oslo", "oslo")
    assert D.normalized_key(a) == D.normalized_key(b) and D.exact_key(a) != D.exact_key(b)


def test_stage_is_deterministic_and_writes_cards(tmp_path):
    src = tmp_path / "records.jsonl"
    R.write_jsonl(src, corpus()[::-1])                   # input order must not matter
    for out in ("one", "two"):
        D.run(PARAMS, src, tmp_path / out, metrics_path=tmp_path / out / "m.json",
              cards_dir=tmp_path / out / "cards", ingest_metrics=None)
    for rel in ("train.jsonl", "eval/bench.jsonl", "m.json", "cards/train.md", "cards/eval/bench.md"):
        assert (tmp_path / "one" / rel).read_bytes() == (tmp_path / "two" / rel).read_bytes(), rel
    card = (tmp_path / "one" / "cards" / "train.md").read_text()
    assert "**2** records" in card and "leak_request" in card


def test_unknown_param_key_fails(tmp_path):
    from ooospec.pipelines.params import from_dict
    with pytest.raises(ValueError, match="eval_set"):
        from_dict(D.DedupeParams, {"eval_set": {}}, "dedupe")
