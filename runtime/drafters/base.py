"""The contract between the engine and its drafters.

A drafter looks at the committed tokens and proposes candidate continuations: lists of token ids that the
engine merges into one token tree (shared prefixes become shared nodes) under a node budget, verifies with a
single target forward, and accepts greedily. A drafter can only change speed, never the output: whatever it
proposes, the committed tokens are the target's greedy tokens.

Worked example: committed ``[.., 5, 9]``; a PLD drafter proposes ``[[7, 3, 3], [7, 4]]``; the engine builds
the tree ``root(9) -> 7 -> {3 -> 3, 4}`` (4 nodes under the root) and verifies it in one forward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar


@dataclass(frozen=True)
class DraftContext:
    """What a drafter may look at. ``tokens`` = prompt + committed output (the last one is the tree root)."""

    tokens: Sequence[int]      # [prompt_len + n_committed]
    prompt_len: int
    step: int                  # index of the verification step about to run (0 = first after prefill)

    @property
    def generated(self) -> Sequence[int]:
        return self.tokens[self.prompt_len:]


class Drafter:
    """Every drafter's members, with their defaults; a drafter subclasses this and overrides :meth:`propose`.

    ``name``           its label in acceptance estimates, metrics and fault counts
    ``propose(ctx)``   candidate continuations of ``ctx.tokens``, most likely first; ``[]`` = no opinion
    ``observe(p, o)``  learn from a finished call (prompt ids, output ids); default: nothing to learn
    ``proposal_kind``  set by ``propose``: the class of this step's candidates, whose acceptance is estimated apart
                       as ``"<name>/<kind>"`` (hints: a long or short suffix match); default None = one class
    ``priors``         first-token acceptance priors per such label, read when an engine starts (default: none,
                       i.e. :class:`~ooospec.runtime.budget.AcceptanceStats`'s own prior)

    The engines (the tree engine, the vLLM chain proposer) read these members and nothing else.
    """

    name: str = "drafter"
    proposal_kind: str | None = None
    priors: ClassVar[Mapping[str, float]] = MappingProxyType({})

    def propose(self, ctx: DraftContext) -> list[list[int]]:
        raise NotImplementedError(f"{type(self).__name__}.propose")

    def observe(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        return None


MAX_FAULT_TEXT = 300        # characters of a fault's description in a warning or log line


class Faults(dict):
    """Faults by name (a drafter's, or a request argument's): ``faults(name, what)`` counts one, and reports the
    first of each name through ``report(message)`` (the tree engine warns, the vLLM proposer logs). Only drafts
    are ever lost to a fault, never output."""

    def __init__(self, report: Callable[[str], None]):
        super().__init__()
        self.report = report

    def __call__(self, name: str, what: str) -> None:
        if name not in self:
            self.report(f"{name!r} {what[:MAX_FAULT_TEXT]}; only its drafts are lost (output unaffected)")
        self[name] = self.get(name, 0) + 1


def observe_all(drafters: Iterable[Drafter], prompt: Sequence[int], output: Sequence[int],
                on_fault: Callable[[str, str], None]) -> None:
    """Show a finished call to every drafter; a drafter whose ``observe`` raises is a fault (``on_fault(name,
    what)``), never an error: both engines call this."""
    for drafter in drafters:
        try:
            drafter.observe(prompt, output)
        except Exception as e:  # noqa: BLE001 - a drafter that cannot learn must not break decoding
            on_fault(drafter.name, f"observe raised {e!r}")
