"""The contract between the engine and its drafters.

A drafter looks at the committed tokens and proposes candidate continuations: lists of token ids that the
engine merges into one token tree (shared prefixes become shared nodes) under a node budget, verifies with a
single target forward, and accepts greedily. A drafter can only change speed, never the output: whatever it
proposes, the committed tokens are the target's greedy tokens.

Worked example: committed ``[.., 5, 9]``; a PLD drafter proposes ``[[7, 3, 3], [7, 4]]``; the engine builds
the tree ``root(9) -> 7 -> {3 -> 3, 4}`` (4 nodes under the root) and verifies it in one forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class DraftContext:
    """What a drafter may look at. ``tokens`` = prompt + committed output (the last one is the tree root)."""

    tokens: Sequence[int]      # [prompt_len + n_committed]
    prompt_len: int
    step: int                  # index of the verification step about to run (0 = first after prefill)

    @property
    def generated(self) -> Sequence[int]:
        return self.tokens[self.prompt_len:]


class Drafter(Protocol):
    name: str

    def propose(self, ctx: DraftContext) -> list[list[int]]:
        """Candidate continuations of ``ctx.tokens``, most likely first. Empty list = no opinion."""
        ...

    def observe(self, prompt: Sequence[int], output: Sequence[int]) -> None:  # optional: learn from a finished call
        ...

    # optional, read by the engine's budget policy (runtime/budget.py):
    #   proposal_kind: str | None    set by propose(): the class of this step's candidates; their acceptance is
    #                                estimated apart, as drafter "<name>/<kind>" (hints: long or short suffix match)
    #   priors: dict[str, float]     first-token acceptance priors per such label (default 0.5)
