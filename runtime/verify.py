"""Greedy acceptance of a verified draft tree. Pure functions on (tree, logits); no model, no cache.

``logits[i]`` is the target's next-token distribution after the root path of node ``i`` (one row per tree node,
``[N, vocab]``). Greedy acceptance walks from the root: at node ``i`` the target's choice is
``argmax(logits[i])``; if a child of ``i`` carries that token, it is accepted and the walk continues there,
otherwise the walk ends and the target's choice is the **bonus** token. The committed tokens are therefore exactly
what one-token greedy decoding would produce, whatever the tree holds.

Worked example: tree ``root(9) -> 7 -> {3, 4}`` (nodes 0..3: tokens 9, 7, 3, 4) and argmax per node
``[7, 4, 0, 8]``: node 0 chooses 7 = node 1 (accept), node 1 chooses 4 = node 3 (accept), node 3 chooses 8 and has
no children -> ``Accepted(path=(0, 1, 3), accepted_tokens=(7, 4), bonus=8)``; three new tokens from one forward.

Near-ties (``tie_margin``): in bf16 a multi-token forward can round differently from a one-token forward, which
flips the argmax where the top-2 logits are within rounding of each other. With ``tie_margin > 0`` the walk stops
at the first path node whose top-2 margin is below ``tie_margin`` *without* taking that node's choice
(``bonus=None``); the engine then produces that token with a one-token forward, as plain decoding would.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ooospec.runtime.tree import DraftTree


@dataclass(frozen=True)
class Accepted:
    """The outcome of one verification step.

    ``path`` holds the root and every accepted draft node. New committed tokens are
    ``accepted_tokens + (bonus,)``; with ``bonus=None`` (stopped at a near-tie) they are ``accepted_tokens`` and
    the last path node's successor is left for a one-token forward.
    """

    path: tuple[int, ...]               # [1 + num_accepted] node indices, path[0] = 0 (root)
    accepted_tokens: tuple[int, ...]    # [num_accepted] tokens of path[1:]
    bonus: int | None                   # target's choice after the path; None = stopped at a near-tie
    margins: tuple[float, ...] | None = None  # [len(new_tokens)] top-2 logit margin that chose each new token

    @property
    def new_tokens(self) -> tuple[int, ...]:
        return self.accepted_tokens if self.bonus is None else self.accepted_tokens + (self.bonus,)

    @property
    def kept_nodes(self) -> tuple[int, ...]:
        """Tree nodes whose KV entries stay in the cache: all but the last committed token (the next root)."""
        return self.path if self.bonus is not None else self.path[:-1]


# Absolute top-2 logit margins below which a multi-token forward may pick a different argmax than a one-token
# forward. One bf16 step (8 significant bits) is 0.0625 for logits in [8, 16) and 0.125 in [16, 32); the default
# covers two steps at the usual logit magnitudes. fp16 has 11 significant bits.
TIE_MARGINS = {torch.bfloat16: 0.25, torch.float16: 0.03}


def default_tie_margin(dtype: torch.dtype) -> float:
    """The ``tie_margin`` to use for a transformers model of ``dtype``: 0 (exact arithmetic is stable enough) for
    fp32/fp64. A target's own is :attr:`~ooospec.runtime.backends.target.Target.tie_margin`."""
    return TIE_MARGINS.get(dtype, 0.0)


def top2_margins(logits: torch.Tensor) -> torch.Tensor:
    """``top1 - top2`` of each row: ``[N, vocab] -> [N]`` (float32 or wider)."""
    top2 = logits.topk(2, dim=-1).values
    return (top2[:, 0] - top2[:, 1]).float()


def accept_greedy(
    tree: DraftTree,
    logits: torch.Tensor,
    tie_margin: float = 0.0,
    with_margins: bool = False,
) -> Accepted:
    """Accept the longest root path whose every token is the target's argmax at its parent, plus the bonus.

    Args:
        tree: the verified tree, ``N`` nodes.
        logits: ``[N, vocab]`` target logits, row ``i`` = after node ``i``'s root path.
        tie_margin: stop before taking a choice whose top-2 margin is below this (only for trees with more than
            one node: a single-node forward *is* one-token decoding). ``0`` disables it.
        with_margins: also return the margin behind each new token (for near-tie diagnostics).

    Returns:
        :class:`Accepted`.
    """
    if logits.dim() != 2 or logits.shape[0] != tree.num_nodes:
        raise ValueError(f"logits must be [num_nodes={tree.num_nodes}, vocab], got {tuple(logits.shape)}")
    choice = logits.argmax(dim=-1).tolist()
    check_ties = tie_margin > 0 and tree.num_nodes > 1
    margins = top2_margins(logits).tolist() if (check_ties or with_margins) else None
    path = [0]
    while True:
        node = path[-1]
        if check_ties and margins[node] < tie_margin:
            bonus = None
            break
        child = tree.children[node].get(choice[node])
        if child is None:
            bonus = choice[node]
            break
        path.append(child)
    accepted = tuple(tree.tokens[i] for i in path[1:])
    num_new = len(accepted) + (bonus is not None)
    chosen_margins = tuple(margins[i] for i in path[:num_new]) if with_margins else None
    return Accepted(tuple(path), accepted, bonus, chosen_margins)
