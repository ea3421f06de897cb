"""From ooo-spec's draft candidates to the ONE chain vLLM verifies, and back to acceptance counts (pure functions).

vLLM's V1 engine verifies a single chain of draft tokens per request and step (no trees). Our drafters propose
several candidates each (:class:`~ooospec.runtime.budget.Proposal`); they are merged into a prefix tree, every node
gets the probability that greedy verification accepts it (:func:`~ooospec.runtime.budget.node_probabilities`, from
the same online :class:`~ooospec.runtime.budget.AcceptanceStats` the tree engine plans with), and the chain is the
root-to-node path that maximizes expected committed tokens per second::

    rate(path to node v) = (1 + sum of node probabilities along the path) / T(1 + depth(v))     rate(root) = 1 / T(1)

The 1 is the token every step commits anyway. A node's probability is a prefix product, so the sum is the
expected number of accepted draft tokens of that chain. ``T`` is the verification cost of a chain in one-token
forwards (:class:`ChainCost`): on vLLM's kernels a chain of 16 costs about one token (measured on the CPU backend
here, and the usual case on GPUs at batch 1), so the chain runs as deep as the probabilities carry it.

Worked example: candidates ``[7, 3, 5]`` (probabilities 0.8, 0.72, 0.5) and ``[4]`` (0.3) after root 9, flat cost:
``rate(7) = 1.8, rate(7, 3) = 2.52, rate(7, 3, 5) = 3.02, rate(4) = 1.3`` -> chain ``(7, 3, 5)``. With
``T(n) = 1 + 0.5 (n - 1)`` the rates are ``1.2, 1.26, 1.21, 0.87`` -> ``(7, 3)``.

After the step, vLLM hands back the tokens it sampled for the request: the accepted prefix of the chain and one more
(greedy: the target's own token). :func:`chain_outcomes` turns that into ``(trials, accepted)`` per proposal, exactly
as :func:`~ooospec.runtime.budget.outcome` does for a verified tree, so the estimates learn the same way in both
engines; :func:`label_outcomes` counts each drafter's chain tokens and the accepted ones (the proposer's metrics).
Which chain is verified changes only speed: vLLM's greedy rejection keeps the target's argmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ooospec.runtime.budget import AcceptanceStats, Proposal, candidate_tree, planned_probabilities
from ooospec.runtime.tokens import common_prefix_len
from ooospec.runtime.tree import DraftTree


@dataclass(frozen=True)
class ChainCost:
    """``T(n)`` of verifying ``n`` query tokens (root + ``n - 1`` drafts) in one-token forwards:
    ``1 + slope * (n - 1)``. ``slope = 0`` prices a chain like one token (vLLM's batched verification);
    ``ChainCost(0.05).seconds(17) == 1.8``."""

    slope: float = 0.02

    def __post_init__(self):
        if not 0.0 <= self.slope:
            raise ValueError(f"chain cost slope must be >= 0, got {self.slope}")

    def seconds(self, n: int) -> float:
        if n < 1:
            raise ValueError(f"a forward has at least the root, got n={n}")
        return 1.0 + self.slope * (n - 1)


def node_path(tree: DraftTree, node: int) -> tuple[int, ...]:
    """The draft tokens from the root (excluded) down to ``node``."""
    out = []
    while node > 0:
        out.append(tree.tokens[node])
        node = tree.parents[node]
    return tuple(reversed(out))


def best_chain(tree: DraftTree, probs: Sequence[float], cost: ChainCost, max_len: int) -> tuple[int, ...]:
    """The root-to-node path of ``tree`` (at most ``max_len`` drafts) with the highest rate (module docstring);
    ``()`` when no chain beats the root alone. Ties go to the shorter chain, then the lower node index."""
    best, best_rate = 0, 1.0 / cost.seconds(1)
    gain = [0.0] * tree.num_nodes         # sum of probabilities along the path to each node
    for v in range(1, tree.num_nodes):    # parents precede children in build_tree's order
        gain[v] = gain[tree.parents[v]] + probs[v]
        depth = tree.depths[v]
        if depth > max_len or probs[v] <= 0.0:
            continue
        rate = (1.0 + gain[v]) / cost.seconds(1 + depth)
        if rate > best_rate + 1e-12 or (abs(rate - best_rate) <= 1e-12 and best and depth < tree.depths[best]):
            best, best_rate = v, rate
    return node_path(tree, best)


def choose_chain(root: int, proposals: Sequence[Proposal], stats: AcceptanceStats, cost: ChainCost,
                 max_len: int) -> tuple[int, ...]:
    """The chain to verify after ``root`` from every drafter's ``proposals`` (``()`` = decode one token).

    ``choose_chain(9, [Proposal("pld", 0, (7, 3))], AcceptanceStats(), ChainCost(0.0), 16) == (7, 3)``.
    """
    if max_len < 1 or not proposals:
        return ()
    full = candidate_tree(root, proposals, max_len)
    if full.num_nodes == 1:
        return ()
    return best_chain(full, planned_probabilities(full, proposals, stats, max_len), cost, max_len)


def accepted_of(chain: Sequence[int], sampled: Sequence[int]) -> int:
    """How many of ``chain``'s drafts vLLM accepted, given the tokens it sampled for the request this step
    (the accepted drafts, then the target's own next token): their common prefix, at most ``len(sampled) - 1``."""
    return common_prefix_len(chain, sampled[:-1])


def chain_outcomes(chain: Sequence[int], proposals: Sequence[Proposal],
                   n_accepted: int) -> list[tuple[Proposal, int, int]]:
    """``[(proposal, trials, accepted)]`` for each proposal with at least one judged token after one verified
    chain: a proposal's token is a trial when it is on the chain, every earlier one was accepted, and the target
    judged that position (greedy vLLM judges every chain position up to the first rejection).

    Chain ``(7, 3, 5)`` with 2 accepted: proposal ``(7, 3, 5)`` -> 3 trials, 2 accepted; ``(7, 4)`` -> 1 trial,
    1 accepted (4 was never on the chain); ``(8,)`` -> no trial.
    """
    out = []
    for p in proposals:
        on_chain = common_prefix_len(p.tokens, chain)
        accepted = min(on_chain, n_accepted)
        trials = min(accepted + 1, on_chain)
        if trials:
            out.append((p, trials, accepted))
    return out


def label_outcomes(chain: Sequence[int], proposals: Sequence[Proposal], n_accepted: int) -> dict[str, tuple[int, int]]:
    """``{drafter label: (chain tokens it proposed, of which accepted)}`` after one verified chain, counting each
    chain token once per label (the label's proposal that shares the longest prefix with the chain).

    Chain ``(7, 3, 5)`` with 2 accepted, proposals ``fsm (7, 3, 5)``, ``pld (7, 4)``, ``pld (8,)``:
    ``{"fsm": (3, 2), "pld": (1, 1)}``.
    """
    out: dict[str, tuple[int, int]] = {}
    for p in proposals:
        on_chain = common_prefix_len(p.tokens, chain)
        if on_chain > out.get(p.drafter, (0, 0))[0]:
            out[p.drafter] = (on_chain, min(on_chain, n_accepted))
    return out


def has_label(drafter: str, label: str) -> bool:
    """Whether proposal label ``drafter`` is drafter ``label``'s: its name or one of its ``name/kind`` labels.

    >>> has_label("hints/long", "hints"), has_label("hints", "hints"), has_label("hintsx", "hints")
    (True, True, False)
    """
    return drafter == label or drafter.startswith(label + "/")


def only_accepted(chain: Sequence[int], proposals: Sequence[Proposal], n_accepted: int, label: str) -> int:
    """Accepted chain tokens that only drafter ``label`` had proposed: how far its proposals carried the accepted
    prefix beyond every other drafter's (``min(n, its prefix) - min(n, the best other prefix)``, at least 0). What
    the step would not have accepted without that drafter: a hint token the schema FSM or retrieval also proposed is
    worth nothing extra, one only the hints had saves the target work.

    Chain ``(7, 3, 5)`` with 3 accepted, proposals ``hints (7, 3, 5)``, ``fsm (7,)``: 2 (tokens 3 and 5); with 1
    accepted: 0.

    >>> hints, fsm = Proposal("hints/sidecar", 0, (7, 3, 5)), Proposal("schema_fsm", 0, (7,))
    >>> only_accepted((7, 3, 5), [hints, fsm], 3, "hints"), only_accepted((7, 3, 5), [hints, fsm], 1, "hints")
    (2, 0)

    ``label`` matches a drafter's name and its ``name/kind`` labels.
    """
    own = other = 0
    for p in proposals:
        on_chain = common_prefix_len(p.tokens, chain)
        if has_label(p.drafter, label):
            own = max(own, on_chain)
        else:
            other = max(other, on_chain)
    return max(0, min(n_accepted, own) - min(n_accepted, other))


def record_chain(stats: AcceptanceStats, chain: Sequence[int], proposals: Sequence[Proposal], n_accepted: int) -> None:
    """Count one verified chain in ``stats`` (what :meth:`AcceptanceStats.record_step` does for a tree)."""
    for p, trials, accepted in chain_outcomes(chain, proposals, n_accepted):
        stats.record(p.drafter, p.rank, trials, accepted)
