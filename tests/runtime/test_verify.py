import math

import pytest
import torch

from ooospec.runtime.engine import GenerationResult, StepStats, merge_candidates
from ooospec.runtime.metrics import (
    acceptance_rate,
    classify_mismatch,
    mean_accepted_tokens,
    speedup,
    summarize,
)
from ooospec.runtime.tree import build_tree, chain_tree
from ooospec.runtime.verify import accept_greedy, default_tie_margin, top2_margins

VOCAB = 10


def _logits(choices: list[int], margin: float = 1.0) -> torch.Tensor:
    """Rows whose argmax is ``choices[i]``; the runner-up (token 0 or 1) is ``margin`` below."""
    logits = torch.zeros(len(choices), VOCAB)
    for i, c in enumerate(choices):
        logits[i, c] = 5.0
        logits[i, 1 if c == 0 else 0] = 5.0 - margin
    return logits


def test_docstring_example():
    tree = build_tree(9, [[7, 3], [7, 4]], max_nodes=8)          # nodes: 9, 7, 3, 4
    acc = accept_greedy(tree, _logits([7, 4, 0, 8]))
    assert acc.path == (0, 1, 3) and acc.accepted_tokens == (7, 4) and acc.bonus == 8
    assert acc.new_tokens == (7, 4, 8) and acc.kept_nodes == (0, 1, 3)


def test_reject_at_root_gives_bonus_only():
    tree = build_tree(9, [[7, 3]], max_nodes=8)
    acc = accept_greedy(tree, _logits([2, 3, 5]))
    assert acc.path == (0,) and acc.new_tokens == (2,) and acc.kept_nodes == (0,)


def test_full_chain_accepted_plus_bonus():
    tree = chain_tree([9, 1, 2, 3])
    acc = accept_greedy(tree, _logits([1, 2, 3, 4], margin=2.0), with_margins=True)
    assert acc.new_tokens == (1, 2, 3, 4) and acc.path == (0, 1, 2, 3)
    assert acc.margins == (2.0, 2.0, 2.0, 2.0)


def test_tie_margin_stops_before_a_near_tie():
    tree = chain_tree([9, 1, 2, 3])
    logits = _logits([1, 2, 3, 4], margin=2.0)
    logits[2, 0] = 5.0 - 0.1                                        # node 2's choice (3) is a near-tie
    acc = accept_greedy(tree, logits, tie_margin=0.25, with_margins=True)
    # tokens 1, 2 committed; node 2's successor is left to a one-token forward; node 2 becomes the root
    assert acc.path == (0, 1, 2) and acc.bonus is None and acc.new_tokens == (1, 2)
    assert acc.kept_nodes == (0, 1)
    assert acc.margins == pytest.approx((2.0, 2.0))
    # a near-tie at the root commits nothing
    at_root = accept_greedy(tree, _logits([1, 2, 3, 4], margin=0.1), tie_margin=0.25)
    assert at_root.new_tokens == () and at_root.kept_nodes == () and at_root.path == (0,)
    # a root-only forward is one-token decoding: no tie check
    single = accept_greedy(chain_tree([9]), _logits([1], margin=0.05), tie_margin=0.25)
    assert single.new_tokens == (1,)


def test_shape_error_and_margins():
    with pytest.raises(ValueError, match="num_nodes=2"):
        accept_greedy(chain_tree([1, 2]), torch.zeros(3, VOCAB))
    assert top2_margins(_logits([3, 4], margin=0.5)).tolist() == [0.5, 0.5]
    assert default_tie_margin(torch.float32) == 0.0 and default_tie_margin(torch.bfloat16) > 0


def test_merge_candidates_round_robin_dedup():
    assert merge_candidates([[[1], [2]], [[3]], [[1], [], [4]]]) == [[1], [3], [2], [4]]
    assert merge_candidates([]) == []


def test_classify_mismatch():
    assert classify_mismatch([5, 6, 7], [5, 6, 7], [1.0, 1.0, 1.0], tol=0.25) is None
    assert classify_mismatch([5, 6, 7], [5, 6, 9], [3.0, 2.5, 0.06], tol=0.25) == {
        "position": 2, "margin": 0.06, "kind": "near_tie"}
    assert classify_mismatch([5, 6, 7], [4, 6, 7], [3.0, 2.5, 0.06], tol=0.25)["kind"] == "defect"
    assert classify_mismatch([5, 6, 7], [5, 6], [3.0, 2.5, 0.06], tol=0.25) == {
        "position": 2, "margin": 0.06, "kind": "defect"}
    with pytest.raises(ValueError, match="one margin per AR token"):
        classify_mismatch([5, 6], [5, 6], [1.0], tol=0.1)


def _result(steps: list[tuple[int, int, int]], decode_s: float = 2.0) -> GenerationResult:
    stats = [StepStats(size, acc, new, 0.0, 0.1, False) for size, acc, new in steps]
    tokens = list(range(sum(s.new_tokens for s in stats)))
    return GenerationResult(tokens, len(stats), stats, 0.5, decode_s, "max_new_tokens")


def test_metrics_definitions():
    a = _result([(5, 2, 3), (1, 0, 1)])           # 4 tokens, 2 forwards, 2 of 4 drafts accepted
    b = _result([(3, 2, 3)])
    assert mean_accepted_tokens([a]) == 2.0
    assert mean_accepted_tokens([a, b]) == pytest.approx(7 / 3)
    assert acceptance_rate([a]) == 0.5
    assert acceptance_rate([a, b]) == pytest.approx(4 / 6)
    assert math.isnan(acceptance_rate([_result([(1, 0, 1)])]))
    assert speedup(3.0, 1.5) == 2.0
    s = summarize([a, b])
    assert s["num_tokens"] == 7 and s["num_forwards"] == 3 and s["num_draft_tokens"] == 6
    assert s["decode_tokens_per_s"] == pytest.approx(7 / 4.0)
