"""Integration: ingest + dedupe over the real raw datasets (../shared/datasets, beside the checkout in CI).

Checks the acceptance bars of the foundation issue on the real files: ≥ 98% of API-Bank gold calls and of BFCL
answers become schema-valid records, every benchmark is non-empty, and no training record shares a normalized request
with an evaluation record.
"""

import dataclasses
from pathlib import Path

import pytest

from ooospec.pipelines import dedupe, ingest
from ooospec.pipelines.params import load_section
from ooospec.pipelines.records import read_jsonl

ROOT = Path(__file__).parents[2]
DATA = (ROOT / "../shared/datasets").resolve()
pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason=f"raw datasets not found at {DATA}")


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    out = tmp_path_factory.mktemp("real")
    params = dataclasses.replace(load_section(ingest.IngestParams, "ingest", ROOT / "params.yaml"), source=str(DATA))
    istats = ingest.run(params, out / "ingest", metrics_path=out / "ingest.json",
                        card_path=out / "ingest.md")
    dstats = dedupe.run(load_section(dedupe.DedupeParams, "dedupe", ROOT / "params.yaml"),
                        out / "ingest" / "records.jsonl", out / "dedupe",
                        metrics_path=out / "dedupe.json", cards_dir=out / "cards", ingest_metrics=out / "ingest.json")
    return out, istats, dstats


def _rate(stats, source, splits):
    ok = sum(stats["sources"][source]["splits"].get(s, {}).get("parsed", 0) for s in splits)
    bad = sum(stats["sources"][source]["splits"].get(s, {}).get("rejected", 0) for s in splits)
    return ok / max(1, ok + bad), ok


def test_apibank_gold_calls_parse(stages):
    _, istats, _ = stages
    rate, n = _rate(istats, "apibank", ["test-l1", "test-l2", "test-l3", "train-l3"])
    assert rate >= 0.98 and n >= 1600, (rate, n)


def test_bfcl_answers_parse(stages):
    _, istats, _ = stages
    rate, n = _rate(istats, "bfcl", ["simple-python", "simple-java", "simple-javascript", "multiple", "parallel"])
    assert rate >= 0.98 and n >= 930, (rate, n)


def test_every_source_contributes(stages):
    _, istats, _ = stages
    for name, s in istats["sources"].items():
        assert s["parsed"] > 0, name


def test_benchmarks_and_no_leak(stages):
    out, _, dstats = stages
    for bench, e in dstats["eval"].items():
        assert e["records"] > 0, bench
    train = list(read_jsonl(out / "dedupe" / "train.jsonl"))
    evals = {p.stem: list(read_jsonl(p)) for p in (out / "dedupe" / "eval").glob("*.jsonl")}
    assert len(train) > 1000
    assert dedupe.check_no_leak(train, evals) == []
    assert not any(r["split"].startswith("samples") for r in train if r["source"] == "apibank") or \
        dstats["train"]["removed_total"].get("leak_same_dialogue", 0) > 0


def test_card_counts_equal_stats(stages):
    out, istats, dstats = stages
    card = (out / "ingest.md").read_text()
    for name, s in istats["sources"].items():
        assert f"| {name} | {s['parsed']} | {s['rejected']} |" in card
    assert f"**{dstats['train']['records']}** records" in (out / "cards" / "train.md").read_text()
