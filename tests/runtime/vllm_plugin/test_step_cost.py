"""Chains priced by the batch (runtime/vllm/step_cost.py): the step-cost fit, the price, the step clock, and the
proposer shortening chains under load without changing output."""

from __future__ import annotations

import json

import pytest

from ooospec.runtime.vllm.proposer import ChainProposer, ProposerConfig
from ooospec.runtime.vllm.step_cost import StepClock, StepCost
from tests.runtime.chat_tiny import TOOLS, USER, trained_chat_model
from tests.runtime.vllm_plugin.test_chain import chain_decode, greedy


def test_the_fit_recovers_a_linear_step_cost_and_ignores_stalls():
    cost = StepCost(0.02, min_samples=4)
    for n in (1, 5, 9, 17, 33, 1, 17):
        cost.observe(1, n - 1, 0.1 + 0.005 * n)    # batch 1 only: one slope over the tokens verified
    cost.observe(1, 16, 30.0)                      # a stall (the engine idle between requests): left out
    a, b_row, b_draft = cost.fit()
    assert a == pytest.approx(0.1) and b_row == pytest.approx(0.005) and b_draft == pytest.approx(0.005)
    assert cost.slope() == pytest.approx(0.005 / 0.105)
    assert cost.price(8) == pytest.approx(8 * 0.005 / (0.1 + 8 * 0.005))


def test_a_draft_and_a_row_get_their_own_slopes_and_the_price_follows_the_batch():
    """Where a drafted token costs more than a batch row, one slope over both underprices drafts under load.
    Price = b_draft * B / (a + b_row * B); the module docstring's worked example last."""
    cost = StepCost(0.02, min_samples=4)
    for rows in (1, 4, 8, 12, 16):
        for drafts in (0, 8, 40):
            cost.observe(rows, drafts, 0.0335 + 0.0015 * rows + 0.0029 * drafts)
    a, b_row, b_draft = cost.fit()
    assert (a, b_row, b_draft) == pytest.approx((0.0335, 0.0015, 0.0029))
    assert [round(cost.price(b), 2) for b in (1, 8, 16)] == [0.08, 0.51, 0.81]
    example = StepCost(0.02, min_samples=4)
    for rows, drafts, _ in cost.samples:
        example.observe(rows, drafts, 0.0250 + 0.0024 * rows + 0.00245 * drafts)
    assert [round(example.price(b), 2) for b in (1, 8, 16)] == [0.09, 0.44, 0.62]
    assert cost.slope() == pytest.approx(cost.price(1))
    single = StepCost(0.02, min_samples=4)
    for rows, drafts, s in cost.samples:
        single.observe(rows + drafts, 0, s)         # the same steps seen as tokens only: one slope, cheaper drafts
    assert single.price(16) < cost.price(16)


def test_the_prior_stands_until_the_fit_has_enough_distinct_steps():
    cost = StepCost(0.02, min_samples=4)
    assert cost.slope() == 0.02 and cost.fit() is None
    for _ in range(10):
        cost.observe(1, 16, 0.2)                  # one token count only: no slope to fit
    assert cost.slope() == 0.02 and cost.price(4) == pytest.approx(0.08)
    cost.observe(0, 1, 1.0)
    cost.observe(1, -1, 1.0)
    cost.observe(5, 0, -1.0)                      # nonsense is not a step
    assert len(cost.samples) == 10
    with pytest.raises(ValueError):
        StepCost(-0.1)


def test_the_slope_is_never_negative_nor_above_a_whole_step():
    cost = StepCost(0.02, min_samples=2)
    cost.observe(1, 0, 0.3)
    cost.observe(1, 29, 0.1)                      # noise that would fit a negative slope
    assert cost.slope() == 0.0


def test_the_clock_times_only_steps_whose_batch_did_not_change():
    now = [0.0]
    cost = StepCost(0.02, min_samples=2)
    clock = StepClock(cost, lambda: now[0])
    clock.start(["a"])
    clock.end(1, 16)
    now[0] = 0.25
    clock.start(["a"])                            # same batch: a root and 16 drafts in 0.25 s
    clock.end(1, 2)
    now[0] = 1.25
    clock.start(["a", "b"])                       # b arrived: its prefill ran in this step, not timed
    clock.end(2, 0)
    assert list(cost.samples) == [(1, 16, 0.25)]


def test_under_load_chains_shorten_and_the_output_stays_greedy():
    model, tok = trained_chat_model()
    prompt = tok(tok.apply_chat_template(USER, tools=TOOLS, add_generation_prompt=True, tokenize=False),
                 add_special_tokens=False)["input_ids"]
    ref = greedy(model, prompt, 30)
    drafted = {}
    for batch in (1, 64):
        proposer = ChainProposer(tok, vocab_size=len(tok), max_len=16,
                                 config=ProposerConfig(method="toolspec", chain_cost_slope=0.02))
        proposer.batch = batch                    # what OoOSpecProposer.propose sets from vLLM's batch
        out, forwards = chain_decode(model, prompt, 30, proposer, "a", {"ooospec_tools": json.dumps(TOOLS)})
        assert out == ref
        drafted[batch] = (proposer.totals["drafted"], forwards)
        assert proposer.metrics()["pricing"]["price"] == pytest.approx(0.02 * batch)
        assert proposer.acceptance.bonus_scale == pytest.approx(1 / batch)   # its share of the exploration
    assert drafted[64][0] < drafted[1][0]          # a draft must be likelier to pay at batch 64
    fixed = ChainProposer(tok, vocab_size=len(tok), max_len=16,
                          config=ProposerConfig(method="toolspec", chain_pricing="fixed"))
    fixed.batch = 64
    assert fixed.chain_cost().slope == 0.02
    with pytest.raises(ValueError, match="chain_pricing"):
        ProposerConfig(chain_pricing="auto")
