"""The metric definitions of runtime/metrics.py that the transfer stage added: the bootstrap interval of a median
and call accuracy against gold (BFCL's allowed values respected). Hand-written inputs, exact expectations."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from ooospec.pipelines.sources import bfcl
from ooospec.runtime import metrics as M

EVAL = Path(__file__).resolve().parents[2] / "data" / "dedupe" / "eval"


# ------------------------------------------------------------------------------------------ bootstrap


def test_bootstrap_is_seeded_and_brackets_the_median():
    values = [0.8, 1.1, 1.2, 1.3, 1.35, 1.4, 1.6, 1.9, 2.4, 3.0]
    lo, hi = M.bootstrap_median_ci(values, seed=7)
    assert (lo, hi) == M.bootstrap_median_ci(values, seed=7)
    assert lo <= statistics.median(values) <= hi
    assert min(values) <= lo and hi <= max(values)


def test_bootstrap_of_another_statistic_brackets_it():
    values = [0.0, 0.0, 0.0, 0.0, 10.0, 10.0, 30.0]        # median 0, mean 7.14: the intervals differ
    lo, hi = M.bootstrap_median_ci(values, seed=0, statistic=statistics.fmean)
    assert lo <= statistics.fmean(values) <= hi and lo > 0.0
    assert M.bootstrap_median_ci(values, seed=0)[0] == 0.0


def test_bootstrap_of_identical_values_is_a_point():
    assert M.bootstrap_median_ci([1.5] * 6, seed=0) == (1.5, 1.5)


def test_bootstrap_narrows_with_more_examples():
    few = [1.0, 2.0, 3.0, 4.0, 5.0]
    many = few * 20
    w_few = M.bootstrap_median_ci(few, seed=0)
    w_many = M.bootstrap_median_ci(many, seed=0)
    assert w_many[1] - w_many[0] < w_few[1] - w_few[0]


def test_bootstrap_nearest_rank_quantiles():
    # 4 resamples: the quantile ranks are floor(0.025*4)=0 and ceil(0.975*4)-1=3, the smallest and largest median
    import random

    rng = random.Random(3)
    medians = sorted(statistics.median(rng.choices([1.0, 2.0, 4.0], k=3)) for _ in range(4))
    assert M.bootstrap_median_ci([1.0, 2.0, 4.0], seed=3, num_resamples=4) == (medians[0], medians[-1])


@pytest.mark.parametrize("kwargs, match", [({"values": []}, "at least one"), ({"level": 1.0}, "level"),
                                           ({"num_resamples": 0}, "num_resamples")])
def test_bootstrap_rejects_bad_input(kwargs, match):
    args = {"values": [1.0], "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=match):
        M.bootstrap_median_ci(args.pop("values"), **args)


# ---------------------------------------------------------------------------------------- call accuracy


def call(name, **args):
    return {"name": name, "arguments": args}


@pytest.mark.parametrize("pred, gold, expected", [
    ([call("f", city="Paris")], [call("f", city="paris ")], (True, True, True)),        # case and whitespace
    ([call("f", n=2.0)], [call("f", n=2)], (True, True, True)),                         # numbers numerically
    ([call("f", flag=1)], [call("f", flag=True)], (True, True, False)),                 # a bool is a bool
    ([call("f", city="Paris", extra=1)], [call("f", city="Paris")], (True, True, False)),
    ([call("g", city="Paris")], [call("f", city="Paris")], (True, False, False)),
    ([call("f", xs=[1, 2])], [call("f", xs=[2, 1])], (True, True, False)),              # lists keep order
    ([call("f", a="x"), call("h")], [call("f", a="x")], (True, True, True)),           # the first call counts
    ([], [call("f")], (False, False, False)),
])
def test_score_call_against_gold(pred, gold, expected):
    s = M.score_call(pred, gold)
    assert (s["parsed"], s["name"], s["call"]) == expected


ALLOWED = [{"area": {"base": [10], "height": [5], "unit": ["units", ""]}}]


@pytest.mark.parametrize("args, ok", [
    ({"base": 10, "height": 5}, True),                       # optional parameter left out
    ({"base": 10, "height": 5, "unit": "Units"}, True),      # BFCL string standardization
    ({"base": 10, "height": 5, "unit": "cm"}, False),
    ({"base": 10}, False),                                   # a required parameter missing
    ({"base": 10, "height": 5, "colour": "red"}, False),     # an undeclared argument
    ({"base": "10", "height": "5"}, True),                   # the JSON text of an allowed value (Java/JS strings)
    ({"base": "10L", "height": "5"}, True),                  # a Java typed literal
])
def test_score_call_with_bfcl_allowed_values(args, ok):
    gold = [call("area", base=10, height=5, unit="units")]
    assert M.score_call([call("area", **args)], gold, ALLOWED)["call"] is ok


def test_allowed_objects_hold_allowed_lists():
    allowed = [{"req": {"config": [{"method": ["GET", "get"], "retries": [3, ""]}]}}]
    gold = [call("req", config={"method": "GET"})]
    assert M.score_call([call("req", config={"method": "get"})], gold, allowed)["call"]
    assert M.score_call([call("req", config='{"method": "GET", "retries": 3}')], gold, allowed)["call"]
    assert not M.score_call([call("req", config={"method": "POST"})], gold, allowed)["call"]


def test_call_accuracy_rates():
    scores = [M.score_call([call("f")], [call("f")]), M.score_call([], [call("f")]),
              M.score_call([call("g")], [call("f")]), M.score_call([call("f", a=1)], [call("f", a=1)])]
    assert M.call_accuracy(scores) == {"n": 4, "parsed": 0.75, "name": 0.5, "call": 0.5}
    with pytest.raises(ValueError):
        M.call_accuracy([])


BFCL_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bfcl"
BFCL_SPLITS = {"bfcl-simple-python": "simple-python", "bfcl-javascript": "simple-javascript",
               "bfcl-java": "simple-java"}
SOURCES = ["fixtures", pytest.param("data", marks=pytest.mark.integration)]


def bfcl_records(source: str, name: str) -> list[dict]:
    """The eval set ``name``: parsed here from the BFCL excerpts in tests/fixtures/bfcl (runs in CI), or as the
    dedupe stage built it in data/dedupe/eval (the full set: ``dvc repro dedupe``, then
    ``.venv/bin/python -m pytest -m integration tests/runtime/test_metrics.py``)."""
    if source == "fixtures":
        return [r for r in bfcl.parse(BFCL_FIXTURES) if isinstance(r, dict) and r["split"] == BFCL_SPLITS[name]]
    path = EVAL / f"{name}.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not built (dvc repro dedupe)")
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name", sorted(BFCL_SPLITS))
def test_every_bfcl_gold_call_is_right(source, name):
    records = bfcl_records(source, name)
    assert records
    for rec in records:
        assert M.score_call(rec["calls"], rec["calls"], rec["meta"]["allowed"])["call"], rec["id"]


@pytest.mark.parametrize("source", SOURCES)
def test_bfcl_allowed_values_alone_accept_python_and_javascript_gold(source):
    """Scored by the allowed values alone (not by equality with gold), BFCL's own gold answers all pass."""
    for name in ("bfcl-simple-python", "bfcl-javascript"):
        records = bfcl_records(source, name)
        assert records
        for rec in records:
            gold = rec["calls"][0]
            decoy = [{"name": gold["name"], "arguments": {"__never__": 0}}]   # equality with gold cannot help
            assert M.score_call([gold], decoy, rec["meta"]["allowed"])["call"], rec["id"]
