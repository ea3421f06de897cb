"""Draft token trees: merge candidate continuations, then build the tree attention mask and position ids.

Pure functions; nothing here touches a model or a cache.

Conventions
-----------
* Node 0 is the **root**: the last committed token. It is not in the KV cache yet; the verification forward
  feeds it together with the draft nodes, so the root's logits predict the first new token.
* Nodes are stored in insertion order, so ``parents[i] < i`` for every ``i > 0`` (a topological order).
* ``depths[i]`` is the distance from the root; node ``i`` sits at sequence position ``cache_len + depths[i]``.
* The node budget ``max_nodes`` counts **draft** nodes (the root is free): a tree has at most ``1 + max_nodes``
  nodes, i.e. the verification forward has ``q_len <= 1 + max_nodes``.

Worked example (``root = 9``, candidates ``[[7, 3, 3], [7, 4], [5]]``, ``max_nodes = 4``)::

    node  token  parent  depth
      0     9      -1      0        root(9) ─┬─ 7 ─┬─ 3 ─ 3
      1     7       0      1                 │     └─ 4
      2     3       1      2                 └─ (5 dropped: budget of 4 draft nodes used up)
      3     3       2      3
      4     4       1      2

With a cache of ``L = 2`` entries, ``tree_positions`` is ``[[2, 3, 4, 5, 4]]`` and ``tree_mask`` is the additive
``[1, 1, 5, 2 + 5]`` mask whose visible pattern (1 = attend, 0 = ``-inf``) is::

             cache | tree nodes 0..4
    node 0:  1 1   | 1 0 0 0 0
    node 1:  1 1   | 1 1 0 0 0
    node 2:  1 1   | 1 1 1 0 0
    node 3:  1 1   | 1 1 1 1 0
    node 4:  1 1   | 1 1 0 0 1

A sliding-window layer of window ``W`` additionally hides every key whose position is ``>= W`` before the
query's position (``pos_q - pos_k >= W``), matching ``transformers.masking_utils.sliding_window_overlay``.

Forests
-------
A :class:`Forest` is several branches on ONE shared block, each feeding a tree on top of its own history: one
forward of the sidecar's wave (every branch answers one slot query;
:func:`ooospec.runtime.sidecar.wave.decode_branches`) and one packed training sequence (every segment is a chain after
the block; :mod:`ooospec.pipelines.packing`).
:func:`forest_positions` and :func:`forest_visibility` give both the same positions and the same visibility.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DraftTree:
    """A token tree rooted at the last committed token. All sequences have length ``num_nodes``."""

    tokens: tuple[int, ...]                 # [N] token id of each node; tokens[0] = root
    parents: tuple[int, ...]                # [N] parent index; parents[0] = -1, parents[i] < i
    depths: tuple[int, ...]                 # [N] distance from the root; depths[0] = 0
    children: tuple[dict[int, int], ...]    # [N] token id -> child node index

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to ``node`` inclusive, e.g. ``path_to(3) == [0, 1, 2, 3]`` above."""
        path = [node]
        while self.parents[path[-1]] >= 0:
            path.append(self.parents[path[-1]])
        return path[::-1]


def build_tree(
    root: int,
    candidates: Sequence[Sequence[int]],
    max_nodes: int,
    max_depth: int | None = None,
) -> DraftTree:
    """Merge candidate continuations of ``root`` into a prefix tree under a node budget.

    Candidates are inserted in order (most likely first); shared prefixes become shared nodes, duplicates cost
    nothing. When the budget runs out mid-candidate, the candidate's prefix that fits is kept.

    Args:
        root: the last committed token (node 0).
        candidates: token-id continuations of ``root``; empty ones are ignored.
        max_nodes: the most draft nodes (excluding the root), ``>= 0``.
        max_depth: the longest continuation kept; ``None`` = no limit besides ``max_nodes``.

    Returns:
        The :class:`DraftTree` (see the module docstring for a worked example).
    """
    if max_nodes < 0:
        raise ValueError(f"max_nodes must be >= 0, got {max_nodes}")
    tokens, parents, depths = [int(root)], [-1], [0]
    children: list[dict[int, int]] = [{}]
    budget = max_nodes
    for cand in candidates:
        node = 0
        for tok in list(cand)[:max_depth]:
            tok = int(tok)
            child = children[node].get(tok)
            if child is None:
                if budget == 0:
                    break
                budget -= 1
                child = len(tokens)
                tokens.append(tok)
                parents.append(node)
                depths.append(depths[node] + 1)
                children.append({})
                children[node][tok] = child
            node = child
        if budget == 0:  # later candidates could only reuse existing nodes, which adds nothing
            break
    return DraftTree(tuple(tokens), tuple(parents), tuple(depths), tuple(children))


def subtree(tree: DraftTree, keep: Sequence[int]) -> DraftTree:
    """``tree`` restricted to the nodes ``keep`` (the root and, with every node, its parent), renumbered.

    Kept nodes stay in their original order, so ``parents[i] < i`` still holds. With the docstring's tree,
    ``subtree(tree, [0, 1, 4])`` is ``root(9) -> 7 -> 4``: tokens ``(9, 7, 4)``, parents ``(-1, 0, 1)``.
    """
    kept = sorted(set(keep))
    if not kept or kept[0] != 0:
        raise ValueError(f"a subtree keeps the root (node 0), got {list(keep)[:20]}")
    new_index = {old: new for new, old in enumerate(kept)}
    tokens, parents, depths = [], [], []
    children: list[dict[int, int]] = []
    for old in kept:
        parent = tree.parents[old]
        if old and parent not in new_index:
            raise ValueError(f"node {old} is kept but its parent {parent} is not")
        tokens.append(tree.tokens[old])
        parents.append(new_index[parent] if old else -1)
        depths.append(tree.depths[old])
        children.append({})
        if old:
            children[new_index[parent]][tree.tokens[old]] = len(tokens) - 1
    return DraftTree(tuple(tokens), tuple(parents), tuple(depths), tuple(children))


def chain_tree(tokens: Sequence[int]) -> DraftTree:
    """A linear tree ``tokens[0] -> tokens[1] -> ...`` (what an oracle or a single candidate gives)."""
    if not tokens:
        raise ValueError("chain_tree needs at least the root token")
    return build_tree(tokens[0], [tokens[1:]], max_nodes=len(tokens) - 1)


def tree_positions(tree: DraftTree, cache_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Position ids ``[1, N]``: ``cache_len + depths``."""
    return (torch.tensor(tree.depths, dtype=torch.long, device=device) + cache_len).unsqueeze(0)


def ancestor_matrix(tree: DraftTree, device: torch.device | str = "cpu") -> torch.Tensor:
    """``anc[i, j]`` is True iff node ``j`` is node ``i`` or one of its ancestors. Bool ``[N, N]``.

    Pointer jumping: ``max_depth + 1`` vectorised steps, no per-node Python loop.
    """
    n = tree.num_nodes
    if tree.max_depth == n - 1:   # a chain (parents[i] < i, so only a chain reaches depth n - 1): O(1) ops
        return torch.ones(n, n, dtype=torch.bool, device=device).tril()
    parents = torch.tensor(tree.parents, dtype=torch.long, device=device).clamp_min(0)  # root points to itself
    anc = torch.zeros(n, n, dtype=torch.bool, device=device)
    rows = torch.arange(n, device=device)
    cur = rows.clone()
    for _ in range(tree.max_depth + 1):
        anc[rows, cur] = True
        cur = parents[cur]
    return anc


@dataclass(frozen=True)
class Forest:
    """Branches sharing one block; branch ``b`` feeds ``trees[b]`` on top of the keys ``histories[b]``.

    Keys ``[0, num_shared)`` are the block, at positions ``0 .. num_shared - 1``, and every node sees them. A
    branch's history is its own earlier entries past the block, at consecutive positions from ``num_shared``, so
    its tree's root sits at position ``num_shared + len(history)``. The fed nodes are the trees' nodes, branch
    after branch (``offsets``); each also sees its history and its own root path, nothing of the other branches.

    Worked example: a block of 2 keys, a third key holding branch A's first token, and the feed of A's chain
    ``[x, y]`` and branch B's lone root ``[z]``: ``Forest(2, (chain_tree([x, y]), chain_tree([z])), ((2,), ()))``
    has positions ``[3, 4, 2]`` and, with ``num_keys = 3``, the visibility::

                   keys 0 1 2 | fed 0 1 2
        A's x:          1 1 1 |     1 0 0
        A's y:          1 1 1 |     1 1 0
        B's z:          1 1 0 |     0 0 1
    """

    num_shared: int                           # the block's keys
    trees: tuple[DraftTree, ...]              # [num_branches] the nodes each branch feeds
    histories: tuple[tuple[int, ...], ...]    # [num_branches] key indices of each branch's entries past the block

    def __post_init__(self):
        assert len(self.trees) == len(self.histories), (len(self.trees), len(self.histories))

    @property
    def offsets(self) -> list[int]:
        """``[num_branches + 1]``: where each branch's nodes start in the feed (cumulative node counts)."""
        out = [0]
        for tree in self.trees:
            out.append(out[-1] + tree.num_nodes)
        return out

    @property
    def num_nodes(self) -> int:
        return sum(tree.num_nodes for tree in self.trees)

    @property
    def tokens(self) -> list[int]:
        """``[num_nodes]`` the fed tokens, branch after branch."""
        return [t for tree in self.trees for t in tree.tokens]


def forest_positions(forest: Forest) -> list[int]:
    """``[num_nodes]`` position ids of the fed nodes: ``num_shared + len(history) + depth``."""
    return [forest.num_shared + len(history) + d
            for tree, history in zip(forest.trees, forest.histories) for d in tree.depths]


def forest_visibility(forest: Forest, num_keys: int) -> torch.Tensor:
    """Bool ``[num_nodes, num_keys + num_nodes]``: which keys and which fed nodes each fed node attends to.

    ``num_keys`` is the number of keys before the fed nodes (a cache's length; the block alone in a packed
    sequence), at least ``num_shared``; histories index into them. See :class:`Forest` for a literal example.
    """
    assert num_keys >= forest.num_shared, (num_keys, forest.num_shared)
    n = forest.num_nodes
    visible = torch.zeros(n, num_keys + n, dtype=torch.bool)
    visible[:, :forest.num_shared] = True
    for tree, history, start in zip(forest.trees, forest.histories, forest.offsets):
        assert all(forest.num_shared <= k < num_keys for k in history), "a history key outside [num_shared, num_keys)"
        rows = slice(start, start + tree.num_nodes)
        visible[rows, list(history)] = True
        visible[rows, num_keys + start:num_keys + start + tree.num_nodes] = ancestor_matrix(tree)
    return visible


def _additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool visibility ``[q, kv]`` -> float additive mask ``[1, 1, q, kv]`` (0 where visible, -inf elsewhere)."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~visible, float("-inf"))[None, None]


def visibility_mask(visible: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, dtype: torch.dtype = torch.float32,
                    sliding_window: int | None = None) -> torch.Tensor:
    """Any visibility pattern as a float additive mask ``[1, 1, q, kv]``, windowed by position.

    ``visible`` is bool ``[q, kv]``; ``q_pos`` ``[q]`` and ``k_pos`` ``[kv]`` are the position ids of the queries
    and keys. With ``sliding_window = W`` a key is also hidden when ``q_pos - k_pos >= W``. This is what a
    forest of branches sharing one prefix needs (the sidecar's wave), where no single root path exists.
    """
    if sliding_window is not None:
        visible = visible & (q_pos[:, None] - k_pos[None, :] < sliding_window)
    return _additive(visible, dtype)


def tree_mask(tree: DraftTree, cache_len: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
              sliding_window: int | None = None) -> torch.Tensor:
    """Float additive attention mask ``[1, 1, N, cache_len + N]`` for verifying ``tree`` on top of a cache.

    Every node sees the whole cache and its own root path (see the module docstring for a literal example).
    With ``sliding_window = W`` a key is also hidden when ``pos_q - pos_k >= W``.

    A float mask is required: transformers' eager attention adds the mask to the scores, so a bool mask
    would be silently wrong there.
    """
    depths = torch.tensor(tree.depths, dtype=torch.long, device=device)
    visible_tree = ancestor_matrix(tree, device)
    visible_cache = torch.ones(tree.num_nodes, cache_len, dtype=torch.bool, device=device)
    if sliding_window is not None:
        q_pos = (depths + cache_len)[:, None]
        visible_cache &= q_pos - torch.arange(cache_len, device=device)[None, :] < sliding_window
        visible_tree &= depths[:, None] - depths[None, :] < sliding_window
    return _additive(torch.cat([visible_cache, visible_tree], dim=1), dtype)


def causal_mask(num_new: int, cache_len: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                sliding_window: int | None = None) -> torch.Tensor:
    """The mask of a linear chain of ``num_new`` tokens on a cache of ``cache_len``: ``[1, 1, q, cache_len + q]``.

    Equal to ``tree_mask(chain_tree(...), ...)`` but O(1) torch ops, for long prefills.
    """
    q_pos = torch.arange(num_new, device=device)[:, None] + cache_len
    k_pos = torch.arange(cache_len + num_new, device=device)[None, :]
    visible = k_pos <= q_pos
    if sliding_window is not None:
        visible &= q_pos - k_pos < sliding_window
    return _additive(visible, dtype)
