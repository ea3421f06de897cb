import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ooospec.runtime.tree import (
    Forest,
    ancestor_matrix,
    build_tree,
    causal_mask,
    chain_tree,
    forest_positions,
    forest_visibility,
    tree_mask,
    tree_positions,
)

INF = float("-inf")


def _visible(mask: torch.Tensor) -> list[list[int]]:
    assert mask.dim() == 4 and mask.shape[:2] == (1, 1)
    assert set(mask.unique().tolist()) <= {0.0, INF}
    return (mask[0, 0] == 0).int().tolist()


def test_docstring_example_tree():
    tree = build_tree(9, [[7, 3, 3], [7, 4], [5]], max_nodes=4)
    assert tree.tokens == (9, 7, 3, 3, 4)
    assert tree.parents == (-1, 0, 1, 2, 1)
    assert tree.depths == (0, 1, 2, 3, 2)
    assert tree.children[1] == {3: 2, 4: 4}
    assert tree.path_to(3) == [0, 1, 2, 3]
    assert tree_positions(tree, cache_len=2).tolist() == [[2, 3, 4, 5, 4]]
    assert _visible(tree_mask(tree, cache_len=2)) == [
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 0, 0, 1],
    ]


def test_mask_is_float_additive_in_requested_dtype():
    mask = tree_mask(build_tree(1, [[2]], 4), cache_len=3, dtype=torch.bfloat16)
    assert mask.dtype == torch.bfloat16 and mask.shape == (1, 1, 2, 5)
    assert mask[0, 0, 0, 4].item() == INF and mask[0, 0, 1, 4].item() == 0


def test_sliding_window_mask_literal():
    # root at position 3 (cache_len 3), chain of 3 drafts, window 2: each query sees itself and one step back.
    tree = chain_tree([5, 6, 7, 8])
    assert _visible(tree_mask(tree, cache_len=3, sliding_window=2)) == [
        [0, 0, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 1, 1],
    ]


def test_budget_truncates_and_dedupes():
    tree = build_tree(0, [[1, 2, 3], [1, 2, 3], [1, 2], [4, 5]], max_nodes=4)
    assert tree.tokens == (0, 1, 2, 3, 4)          # duplicates free; [4, 5] cut to [4]
    assert build_tree(0, [[1, 2, 3]], max_nodes=0).tokens == (0,)
    assert build_tree(0, [[], [1]], max_nodes=3).tokens == (0, 1)
    assert build_tree(0, [[1, 2, 3, 4]], max_nodes=9, max_depth=2).tokens == (0, 1, 2)


def test_causal_mask_equals_chain_tree_mask():
    for window in (None, 1, 3, 50):
        chain = chain_tree(list(range(7)))
        assert torch.equal(causal_mask(7, 4, sliding_window=window), tree_mask(chain, 4, sliding_window=window))
    assert causal_mask(3, 0).shape == (1, 1, 3, 3)


def test_forest_docstring_example():
    forest = Forest(2, (chain_tree([7, 8]), chain_tree([9])), ((2,), ()))
    assert forest.tokens == [7, 8, 9] and forest.offsets == [0, 2, 3] and forest.num_nodes == 3
    assert forest_positions(forest) == [3, 4, 2]
    assert forest_visibility(forest, num_keys=3).int().tolist() == [
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
        [1, 1, 0, 0, 0, 1]]


def test_forest_of_branching_trees_on_histories():
    """Block of 1 key; branch A (keys 1, 3) feeds root 9 -> {7, 5}; branch B (key 2) feeds a lone root."""
    forest = Forest(1, (build_tree(9, [[7], [5]], max_nodes=2), chain_tree([4])), ((1, 3), (2,)))
    assert forest_positions(forest) == [3, 4, 4, 2]
    assert forest_visibility(forest, num_keys=4).int().tolist() == [
        [1, 1, 0, 1, 1, 0, 0, 0],
        [1, 1, 0, 1, 1, 1, 0, 0],
        [1, 1, 0, 1, 1, 0, 1, 0],
        [1, 0, 1, 0, 0, 0, 0, 1]]


candidates = st.lists(st.lists(st.integers(0, 5), max_size=6), max_size=8)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(cands=candidates, budget=st.integers(0, 12))
def test_tree_invariants(cands, budget):
    tree = build_tree(99, cands, max_nodes=budget)
    n = tree.num_nodes
    prefixes = {()} | {tuple(c[:k]) for c in cands for k in range(len(c) + 1)}
    assert n == 1 + min(budget, len(prefixes) - 1)     # one node per distinct prefix, until the budget runs out
    assert all(tree.parents[i] < i and tree.depths[i] == tree.depths[tree.parents[i]] + 1 for i in range(1, n))
    # every node's root path spells a prefix of some candidate
    for i in range(n):
        assert tuple(tree.tokens[j] for j in tree.path_to(i)[1:]) in prefixes
    # no two siblings share a token
    for i in range(n):
        siblings = [tree.tokens[j] for j in range(1, n) if tree.parents[j] == i]
        assert len(siblings) == len(set(siblings)) == len(tree.children[i])
    # the ancestor matrix agrees with path_to
    anc = ancestor_matrix(tree)
    for i in range(n):
        assert anc[i].nonzero().flatten().tolist() == sorted(tree.path_to(i))
    # with a big enough budget every candidate is a root path
    if budget >= sum(len(c) for c in cands):
        assert prefixes == {tuple(tree.tokens[j] for j in tree.path_to(i)[1:]) for i in range(n)}
