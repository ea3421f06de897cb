"""The budget policy's pure parts on hand-written trees, probabilities and costs."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ooospec.runtime.backends.cost_model import ForwardCost
from ooospec.runtime.budget import (
    AcceptanceStats,
    Proposal,
    best_size,
    candidate_tree,
    choose_nodes,
    depth_bucket,
    exclusive_siblings,
    node_probabilities,
    outcome,
    path_nodes,
    plan_tree,
    rank_bucket,
)
from ooospec.runtime.engine import SpecEngine
from ooospec.runtime.tree import build_tree, subtree
from ooospec.runtime.verify import Accepted

CHEAP = ForwardCost((1, 2, 3, 4), (1.0, 1.1, 1.2, 1.3))
STEEP = ForwardCost.linear(0.5)
DOC = [Proposal("d", 0, (7, 3)), Proposal("d", 1, (5,))]


def test_buckets():
    assert [depth_bucket(d) for d in (1, 2, 3, 4, 5, 8, 9, 40)] == [0, 1, 2, 2, 3, 3, 4, 4]
    assert [rank_bucket(r) for r in (0, 1, 2, 7)] == [0, 1, 2, 2]


def test_docstring_example():
    tree = candidate_tree(9, DOC, max_depth=16)
    assert tree.tokens == (9, 7, 3, 5)
    probs = node_probabilities(tree, DOC, [[0.8, 0.72], [0.3]])
    assert probs == pytest.approx([1.0, 0.8, 0.72, 0.2])   # siblings 7 and 5: 5 gets what 7 leaves
    assert choose_nodes(tree, probs, ForwardCost.linear(0.0), max_nodes=8) == [0, 1, 2, 3]
    assert choose_nodes(tree, probs, CHEAP, max_nodes=8) == [0, 1, 2]
    assert choose_nodes(tree, probs, STEEP, max_nodes=8) == [0, 1, 2]
    assert choose_nodes(tree, probs, CHEAP, max_nodes=1) == [0, 1]         # the cap wins over the rate
    assert subtree(tree, [0, 1, 2]).tokens == (9, 7, 3)


def test_best_size():
    assert best_size([0.8, 0.72, 0.3], STEEP, 8) == 2
    assert best_size([0.4, 0.1], STEEP, 8) == 0            # 1.4 / 1.5 < 1: plain decoding is faster
    assert best_size([0.4, 0.1], ForwardCost.linear(0.0), 8) == 2
    assert best_size([0.0, 0.0], ForwardCost.linear(0.0), 8) == 0
    assert best_size([], CHEAP, 8) == 0


def test_shared_nodes_take_the_most_probable_proposal():
    props = [Proposal("a", 0, (7, 3, 1)), Proposal("b", 0, (7, 3, 2))]
    tree = candidate_tree(9, props, max_depth=16)
    probs = node_probabilities(tree, props, [[0.5, 0.4, 0.3], [0.9, 0.1, 0.05]])
    assert probs == [1.0, 0.9, 0.4, 0.3, 0.05]


def test_children_are_never_chosen_without_their_parent():
    props = [Proposal("a", 0, (1, 2, 3, 4)), Proposal("b", 0, (5, 6))]
    tree = candidate_tree(0, props, max_depth=16)
    probs = node_probabilities(tree, props, [[0.6, 0.6, 0.6, 0.6], [0.6, 0.5]])  # ties: parents first
    for k in range(1, 7):
        kept = choose_nodes(tree, probs, ForwardCost.linear(0.0), max_nodes=k)
        assert all(tree.parents[i] in kept for i in kept[1:])
        subtree(tree, kept)                                 # raises if a parent is missing


def test_siblings_exclude_each_other():
    """Two drafters offering different next tokens at 0.9 each: the position commits one of them at most, so the
    plan counts 1.0 between them, not 1.8 (the best keeps its estimate); subtrees scale with their root; a chain is
    left exactly as it is."""
    props = [Proposal("a", 0, (1,)), Proposal("b", 0, (2, 3)), Proposal("c", 0, (2, 4))]
    tree = candidate_tree(0, props, max_depth=16)          # 0 -> {1, 2 -> {3, 4}}
    probs = node_probabilities(tree, props, [[0.9], [0.6, 0.5], [0.3, 0.1]])
    assert tree.tokens == (0, 1, 2, 3, 4)
    assert probs == pytest.approx([1.0, 0.9, 0.1, 0.5 / 6, 0.1 / 6])
    assert probs[1] + probs[2] <= 1.0 + 1e-9 and probs[3] + probs[4] <= probs[2] + 1e-9
    chain = [Proposal("a", 0, (5, 6, 7))]
    assert node_probabilities(candidate_tree(0, chain, 16), chain, [[0.8, 0.6, 0.3]]) == [1.0, 0.8, 0.6, 0.3]
    assert exclusive_siblings(candidate_tree(0, chain, 16), [1.0, 0.8, 0.9, 0.3]) == [1.0, 0.8, 0.8, 0.3 * 0.8 / 0.9]


def test_max_depth_cuts_proposals():
    tree = candidate_tree(0, [Proposal("a", 0, tuple(range(1, 30)))], max_depth=4)
    assert tree.num_nodes == 5


def test_plan_tree_with_learnt_estimates():
    stats = AcceptanceStats()
    for _ in range(50):
        stats.record("good", 0, trials=3, accepted=3)
        stats.record("bad", 0, trials=1, accepted=0)
    props = [Proposal("bad", 0, (4, 4, 4)), Proposal("good", 0, (7, 3, 1))]
    full = candidate_tree(9, props, 16)
    tree = plan_tree(full, props, stats, STEEP, max_nodes=16, max_depth=16)
    assert tree.tokens == (9, 7, 3, 1)                       # all of the good drafter, nothing of the bad one
    assert plan_tree(full, props, stats, STEEP, max_nodes=0, max_depth=16).num_nodes == 1


def test_outcome_counts_only_judged_positions():
    tree = build_tree(9, [[7, 3, 5], [7, 4]], max_nodes=8)
    bonus = Accepted(path=(0, 1, 4), accepted_tokens=(7, 4), bonus=8)
    assert outcome(tree, (7, 3, 5), bonus) == (2, 1)         # 7 accepted, 3 rejected, 5 never judged
    assert outcome(tree, (7, 4), bonus) == (2, 2)
    assert outcome(tree, (6,), bonus) == (0, 0)              # not in the tree
    assert outcome(tree, (7, 4, 8), bonus) == (2, 2)         # the 8 was not verified: no trial
    tie = Accepted(path=(0, 1), accepted_tokens=(7,), bonus=None)
    assert outcome(tree, (7, 3, 5), tie) == (1, 1)           # stopped at a near-tie after 7: 3 is not judged
    root_only = Accepted(path=(0,), accepted_tokens=(), bonus=None)
    assert outcome(tree, (7, 3, 5), root_only) == (0, 0)


def test_path_nodes():
    tree = build_tree(9, [[7, 3]], 2)
    assert path_nodes(tree, [7, 3, 3]) == [1, 2] and path_nodes(tree, [3]) == []


def test_acceptance_stats_prior_request_and_across_requests():
    stats = AcceptanceStats(request_weight=8.0)
    assert stats.probability("new-drafter", 0, 1) == 0.5               # any name plugs in: the prior
    stats.record("pld", 0, trials=2, accepted=1)                        # depth 1 accepted, depth 2 rejected
    p_all_d1 = (1 + 1) / (1 + 2)
    assert stats.probability("pld", 0, 1) == pytest.approx((1 + 8 * p_all_d1) / (1 + 8))
    p_all_d2 = (0 + 2 * p_all_d1) / (1 + 2)                            # its prior: the depth-1 estimate
    assert stats.probability("pld", 0, 2) == pytest.approx((0 + 8 * p_all_d2) / (1 + 8))
    stats.start_request()                                               # the request's own counts go
    assert stats.probability("pld", 0, 1) == pytest.approx(p_all_d1)
    assert stats.probability("pld", 1, 1) == 0.5                        # other ranks are separate cells
    assert AcceptanceStats(exploration=0.0).prefix_probs("x", 0, 2) == [0.5, 0.25]
    explored = stats.plan_probability("pld", 0, 2)
    assert explored == pytest.approx(p_all_d2 + 0.5 * math.sqrt(p_all_d2 * (1 - p_all_d2) / 2))
    assert stats.prefix_probs("pld", 0, 2)[1] == pytest.approx(stats.plan_probability("pld", 0, 1) * explored)
    summary = stats.summary()["pld"]
    assert summary["trials"] == 2 and summary["accepted"] == 1 and summary["first_token_rate"] == 1.0


def test_old_requests_fade():
    stats = AcceptanceStats(max_trials=100)
    for _ in range(1000):
        stats.record("d", 0, trials=1, accepted=0)
    for _ in range(100):
        stats.record("d", 0, trials=1, accepted=1)
    stats.start_request()
    assert stats.probability("d", 0, 1) > 0.4                 # capped history: the recent successes count
    assert not math.isnan(stats.summary()["d"]["first_token_rate"])


def test_root_near_ties_make_trees_less_attractive():
    stats = AcceptanceStats()
    tree = build_tree(9, [[7]], 1)
    assert stats.root_tie_rate() == pytest.approx(0.05)
    for _ in range(90):
        stats.record_step(tree, [], Accepted(path=(0,), accepted_tokens=(), bonus=None))
    assert stats.root_tie_rate() == pytest.approx(90.5 / 100)
    stats.record_step(build_tree(9, [], 0), [], Accepted(path=(0,), accepted_tokens=(), bonus=None))
    assert stats.root_tie_rate() == pytest.approx(90.5 / 100)          # a root-only step never ties
    assert best_size([0.9, 0.9], CHEAP, 8) == 2
    assert best_size([0.9, 0.9], CHEAP, 8, p_tie=0.6) == 0                # 0.4 * 2.8 / 1.2 < 1


def test_efficiency_scales_trees_down_where_they_realize_less_than_planned():
    stats = AcceptanceStats()
    assert stats.efficiency() == 1.0                                  # nothing seen: trust the plan
    for _ in range(50):                                               # one-token steps run as planned
        stats.record_speed(1, tokens=1, seconds=0.030, planned_seconds=0.030)
    for _ in range(20):                                               # trees planned 6 tokens, committed 3
        stats.planned_tokens = 6.0
        stats.record_speed(16, tokens=3, seconds=0.200, planned_seconds=0.200)
    eff = stats.efficiency()
    assert 0.5 < eff < 0.6                                            # (3 + prior) / (6 + prior) per planned s
    # a plan that pays on paper (rate 1.6 vs 1) is dropped once it is known to realize about half of it
    gains = [0.9] * 8
    assert best_size(gains, STEEP, 8) > 0
    assert best_size(gains, STEEP, 8, efficiency=eff) < best_size(gains, STEEP, 8)


def test_efficiency_compares_trees_with_one_token_steps_on_the_same_machine():
    stats = AcceptanceStats()
    for _ in range(100):   # everything 20% slower than calibrated (a busy machine): no reason to prefer either
        stats.record_speed(1, tokens=1, seconds=0.036, planned_seconds=0.030)
        stats.planned_tokens = 4.0
        stats.record_speed(8, tokens=4, seconds=0.120, planned_seconds=0.100)
    assert stats.efficiency() == pytest.approx(1.0, abs=0.05)
    for _ in range(100):   # trees doing better than planned never widen the plan: capped at 1
        stats.planned_tokens = 2.0
        stats.record_speed(8, tokens=6, seconds=0.100, planned_seconds=0.100)
    assert stats.efficiency() == 1.0


def test_the_engine_reports_every_step_to_the_speed_estimate(monkeypatch):
    from tests.runtime.test_engine_exact import FnDrafter

    seen = []
    stats = AcceptanceStats()
    monkeypatch.setattr(stats, "record_speed", lambda *a: seen.append(a))
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1,
                                         attn_implementation="sdpa")).eval()
    engine = SpecEngine(model, [FnDrafter("d", lambda ctx: [[1, 2, 3]])], cost=CHEAP, acceptance=stats)
    out = engine.generate([5, 6, 7], 6)
    assert len(seen) == out.n_forwards
    assert all(n >= 1 and tok >= 0 and sec > 0 and planned == CHEAP.seconds(n) for n, tok, sec, planned in seen)


def test_one_token_steps_keep_the_root_tie_rate_learning():
    """A root near-tie is the target's, not the tree's: one-token steps measure it too (engine -> record_root_tie),
    so a rate raised by one early tie comes back down while the policy verifies no trees."""
    stats = AcceptanceStats()
    stats.record_step(build_tree(9, [[7]], 1), [], Accepted(path=(0,), accepted_tokens=(), bonus=None))
    assert stats.root_tie_rate() == pytest.approx(1.5 / 11)
    for _ in range(89):
        stats.record_root_tie(False)
    assert stats.root_tie_rate() == pytest.approx(1.5 / 100)


def _tiny_llama():
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1,
                                        attn_implementation="sdpa")).eval()


def test_the_engine_reports_root_margins_and_leaves_root_tie_stops_out_of_the_speed_estimate(monkeypatch):
    from tests.runtime.test_engine_exact import FnDrafter

    torch.manual_seed(0)
    model = _tiny_llama()
    greedy = SpecEngine(model).generate([5, 6, 7], 6).tokens
    stats = AcceptanceStats()
    speed, ties = [], []
    monkeypatch.setattr(stats, "record_speed", lambda *a: speed.append(a))
    real_tie = stats.record_root_tie
    monkeypatch.setattr(stats, "record_root_tie", lambda tied: (ties.append(tied), real_tie(tied)))
    # every margin is a "near-tie": each tree stops at its root and the next step is a one-token forward
    engine = SpecEngine(model, [FnDrafter("d", lambda ctx: [[1, 2, 3]])], cost=CHEAP, acceptance=stats,
                        tie_margin=1e9)
    out = engine.generate([5, 6, 7], 6)
    assert out.tokens == greedy                                         # speed only, never the text
    trees = [s for s in out.steps if s.tree_size > 1]
    roots = [s for s in out.steps if s.tree_size == 1]
    assert trees and roots and all(s.new_tokens == 0 for s in trees)    # every tree stopped at its root
    assert len(speed) == len(roots) and all(n == 1 for n, *_ in speed)  # tree steps left out of the efficiency
    assert ties == [True] * len(out.steps)                              # trees and one-token steps alike


def test_a_declared_prior_gets_a_reliable_drafter_tried_where_trees_are_dear():
    steep = ForwardCost.linear(0.7)                                     # T(n)/T(1) = 1 + 0.7 (n - 1)
    proposals = [Proposal("hints/long", 0, tuple(range(1, 13)))]
    full = candidate_tree(0, proposals, 16)
    plain = AcceptanceStats()
    assert plan_tree(full, proposals, plain, steep, 16, 16).num_nodes == 1     # 0.5 prior: nothing pays
    primed = AcceptanceStats()
    primed.set_prior("hints/long", 0.85)
    assert plan_tree(full, proposals, primed, steep, 16, 16).num_nodes > 1


def test_a_drafter_written_off_early_is_tried_again_and_less_often_each_time_it_fails():
    """The trap: a few failed guesses at an answer's start (it opens with prose) price a drafter below what one
    node costs where trees are dear (llama.cpp on 2 AVX2 cores: T(2) = 1.7 T(1)); with no trials its estimate
    would never move again. The revisit term brings it back after idle steps, later after each failure."""
    steep = ForwardCost.linear(0.7)
    proposals = [Proposal("schema_fsm/call", 0, (5, 6, 7))]
    full = candidate_tree(0, proposals, 16)
    stats = AcceptanceStats()
    for _ in range(4):
        stats.record("schema_fsm/call", 0, trials=1, accepted=0)
    stats.start_request()

    def idle_until_tried(limit=50_000):
        for step in range(limit):
            if plan_tree(full, proposals, stats, steep, 16, 16).num_nodes > 1:
                return step
            stats.record_speed(1, 1, 0.03, 0.03)                      # a one-token step: the clock ticks
        return None

    first = idle_until_tried()
    assert first is not None and 500 < first < 10_000                 # not at once, not never
    stats.record("schema_fsm/call", 0, trials=1, accepted=0)         # tried again and failed
    second = idle_until_tried()
    assert second is not None and second > first                      # waits longer after each failure
    assert AcceptanceStats(revisit=0.0).plan_probability("d", 0, 1) == AcceptanceStats().plan_probability("d", 0, 1)


def test_without_steps_the_revisit_term_changes_nothing():
    stats = AcceptanceStats()
    stats.record("d", 0, trials=3, accepted=1)
    p, trials = stats._estimate("d", 0, 1)
    assert stats.plan_probability("d", 0, 1) == pytest.approx(p + 0.5 * math.sqrt(p * (1 - p) / (trials + 1)))


def test_a_batch_takes_its_share_of_the_uncertainty_bonus():
    """Inside vLLM one estimate plans every request of a batch of B: each explores at 1 / B of the bonus (a
    never-tried cell plans at 0.75 alone, just above its 0.5 mean at batch 16), the mean itself unchanged."""
    stats = AcceptanceStats()
    assert stats.plan_probability("d", 0, 1) == pytest.approx(0.75)
    stats.bonus_scale = 1 / 16
    assert stats.plan_probability("d", 0, 1) == pytest.approx(0.5 + 0.25 / 16)
    assert stats.probability("d", 0, 1) == pytest.approx(0.5)
