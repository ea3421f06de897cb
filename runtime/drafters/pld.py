"""Prompt-lookup decoding (PLD): draft by copying what followed an earlier occurrence of the current suffix.

A :class:`~ooospec.runtime.drafters.base.Drafter`. For ``n`` from ``max_ngram`` down to ``min_ngram``, the last ``n``
tokens are searched for in the context (prompt + output); each earlier occurrence, most recent first, proposes
the ``num_pred_tokens`` tokens that followed it. Distinct continuations are returned, longest n-gram first, at
most ``max_candidates`` of them; the engine merges them into one tree.

Worked example: ``tokens = [1, 2, 3, 4, 2, 3]``, ``max_ngram = 2``, ``min_ngram = 1``, ``num_pred_tokens = 3``::

    n = 2: suffix [2, 3]; earlier occurrences start at 1      -> continuation tokens[3:6] = [4, 2, 3]
    n = 1: suffix [3];    earlier occurrences start at 2      -> continuation tokens[3:6] = [4, 2, 3] (duplicate)
    propose -> [[4, 2, 3]]

With ``tokens = [7, 1, 8, 5, 1, 9, 1]`` (``max_ngram = 2``): ``[9, 1]`` never occurred before; for ``n = 1`` the
suffix ``[1]`` occurred at 4 and 1, giving ``[9, 1]`` (most recent first) and ``[8, 5, 1]``.

The search is a vectorised numpy comparison over all windows (O(context * n) in C per step); no state is kept
between steps, so one instance can serve any number of requests.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ooospec.runtime.drafters.base import DraftContext, Drafter


class PromptLookupDrafter(Drafter):
    """N-gram prompt lookup over prompt + generated tokens.

    Args:
        max_ngram: longest suffix to match (tried first).
        min_ngram: shortest suffix to match.
        num_pred_tokens: tokens copied after a match (candidate length).
        max_candidates: distinct continuations returned per step (1 = classic linear PLD).
    """

    name = "pld"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, num_pred_tokens: int = 10, max_candidates: int = 4):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        if num_pred_tokens < 1 or max_candidates < 1:
            raise ValueError(f"need num_pred_tokens, max_candidates >= 1, got {num_pred_tokens}, {max_candidates}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.num_pred_tokens = num_pred_tokens
        self.max_candidates = max_candidates

    def propose(self, ctx: DraftContext) -> list[list[int]]:
        return lookup(ctx.tokens, self.max_ngram, self.min_ngram, self.num_pred_tokens, self.max_candidates)

    def observe(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        """PLD only looks at the current context; nothing to learn."""


def lookup(
    tokens: Sequence[int],
    max_ngram: int,
    min_ngram: int,
    num_pred_tokens: int,
    max_candidates: int,
) -> list[list[int]]:
    """Distinct continuations of earlier occurrences of the suffix of ``tokens`` (see the module docstring)."""
    arr = np.asarray(tokens, dtype=np.int64)
    length = len(arr)
    found: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        # windows of arr[:-1] start at 0 .. length-1-n, so every match is followed by >= 1 token and the
        # suffix itself (start length-n) is excluded.
        windows = sliding_window_view(arr[:-1], n)
        starts = np.flatnonzero((windows == arr[length - n:]).all(axis=1))
        for start in starts[::-1].tolist():
            cont = tuple(arr[start + n: start + n + num_pred_tokens].tolist())
            if cont not in seen:
                seen.add(cont)
                found.append(list(cont))
                if len(found) == max_candidates:
                    return found
    return found
