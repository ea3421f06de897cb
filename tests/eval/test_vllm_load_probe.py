"""The load probe (eval/vllm/load_probe.py): its request variants and its summary (servers are not started here)."""

from __future__ import annotations

import pytest

from ooospec.eval.vllm import load_probe as lp
from tests.eval.test_vllm_load import RECORD


def test_the_probe_takes_one_concurrency_and_sets_what_the_server_reads():
    args = lp.parse_args(["--target", "m", "--out", "out/x.json", "--concurrency", "8"])
    assert (args.levels, args.streams, args.rounds, args.reps) == ([8], [False], 1, 3)
    with pytest.raises(SystemExit):
        lp.parse_args(["--target", "m", "--out", "out/x.json", "--reps", "0"])


def test_opted_out_requests_carry_off_beside_their_history():
    args = lp.parse_args(["--target", "m", "--out", "out/x.json"])
    args.model_dir = "/models/m"
    off = lp.bodies_of(args, [RECORD, {**RECORD, "id": "r2"}], "probe-toolspec-off-0", lp.OPTED_OUT)
    assert [b["vllm_xargs"] for b in off] == [{"ooospec_history": "probe-toolspec-off-0", "ooospec": "off"}] * 2
    plain = lp.bodies_of(args, [RECORD], None, None)
    assert "vllm_xargs" not in plain[0] and plain[0]["tools"] == RECORD["tools"]


def test_the_summary_sets_each_variant_against_both_plain_servers():
    walls = {"plain-before": [8.6, 8.5, 8.7], "plain-after": [8.0, 8.1, 7.9], "toolspec-off": [8.4, 8.3, 8.5],
             "toolspec": [9.0, 8.9, 9.4]}
    out = lp.summary(walls)
    assert out["toolspec"]["median_s"] == 9.0
    assert out["toolspec"]["x_plain_wall"] == pytest.approx(9.0 / 8.3, abs=1e-3)
    assert out["toolspec-off"]["x_plain_wall"] == pytest.approx(8.4 / 8.3, abs=1e-3)
