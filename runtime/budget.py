"""The budget policy: which draft nodes to verify, chosen for expected committed tokens per second.

Every step, each drafter's candidates become :class:`Proposal` s (drafter name, rank, tokens) and are merged into
one prefix tree with no budget (:func:`candidate_tree`). Each node gets the probability that greedy verification
accepts it (:func:`node_probabilities`), from online acceptance estimates (:class:`AcceptanceStats`). The tree
that is verified is the ``k`` most probable nodes, with ``k`` chosen to maximize the expected committed tokens
per second of forward time (:func:`choose_nodes`)::

    rate(0) = 1 / T(1)
    rate(k) = efficiency * (1 - p_tie) * (1 + sum of the k largest node probabilities) / T(1 + k)

where the 1 is the bonus token every step commits, ``T`` is the measured forward cost
(:mod:`ooospec.runtime.backends.cost_model`), ``efficiency`` how trees have realized their plans so far (below), and
``p_tie`` the observed rate of tree steps that stopped at a near-tie at the root and committed nothing (bf16/fp16
and llama.cpp only, :mod:`ooospec.runtime.verify`; a root-only step never stops).
``k = 0`` is plain one-token decoding, so a step is only widened when the estimates say it pays: cheap trees where
verification is expensive (fp32 on AVX2), wide ones where it is nearly free (bf16 with AMX, GPUs), and no nodes at
all for a drafter whose drafts are rarely accepted. A node is never
more probable than its parent, so the top-``k`` nodes always form a tree. Which nodes are verified changes only
speed: acceptance stays greedy (:mod:`ooospec.runtime.verify`), the output is the target's greedy output.

Realized speed. The engine reports every step's committed tokens and forward seconds
(:meth:`AcceptanceStats.record_speed`); ``efficiency`` is the realized / planned rate of tree steps over the same
ratio for one-token steps. It corrects the plan where acceptance or ``T(n)`` are off for this workload (on
llama.cpp's CPU kernels a 16-node forward costs 6-9 one-token steps, so a plan a little too hopeful loses).

Acceptance model. A proposal of drafter ``d`` at rank ``r`` (0 = its best guess) has its ``j``-th token accepted,
given its first ``j - 1`` were, with probability ``q[d][rank bucket of r][depth bucket of j]``; a node's
probability is the largest prefix product ``q(1) * .. * q(j)`` over the proposals passing through it.
:class:`AcceptanceStats` keeps counts per drafter *name* (so a new drafter plugs in by its ``name``; a drafter that
classes its proposals, ``proposal_kind``, is counted per ``name/kind``, e.g. ``hints/long``) at two levels:
across requests (a Beta prior worth two trials, centred on the drafter's first-token prior for the first token
(0.5 unless the drafter declares one, :meth:`AcceptanceStats.set_prior`) and on the estimate of the depth bucket
above for deeper ones: a drafter right about its first tokens is presumed right further on until shown otherwise),
and for the current request, whose estimate starts at the across-requests one and moves with
the request's own trials::

    p_all     = (accepted_all + 2 * prior) / (trials_all + 2)      prior = the drafter's at depth 1, else the p_all one
    p_request = (accepted_req + W * p_all) / (trials_req + W)          W = request_weight (8 trials)
    p_plan    = min(1, p_request + C * sqrt(p_request * (1 - p_request) / (trials_all + 1))
                       + R * sqrt(ln(1 + idle / S) / (trials_all + 1)))      C = exploration, R = revisit

The last line is optimism under uncertainty: a cell with few trials is planned with more than its mean, so
every drafter gets tried (a cell never tried counts as 0.75), and the bonus fades as trials accumulate; a drafter
whose drafts keep failing is planned at ~1.5 / trials and stops getting nodes once that is below what a node costs.
Its last term keeps that from being forever: ``idle`` counts the engine's steps since the drafter's last trial
beyond the first ``S`` (:meth:`AcceptanceStats.record_speed` ticks the clock; ``S`` = ``revisit_steps``, 20:
a drafter tried now and then plans as without the term), so a drafter written off
by early failures -- on a CPU where one extra node costs 0.7 of a step -- is tried again: after ~100 idle steps
when 2 trials failed, ~3,000 when 4 did, ~10x longer after each further failure (a UCB-style revisit: the price
is a node now and then; the chain proposer inside vLLM does not tick the clock, its verification is nearly free).
In a batch of ``B`` requests sharing one estimate (the chain proposer inside vLLM) both bonuses are scaled by
``1 / B`` (``bonus_scale``): exploring costs each of them a draft the batch pays for, while what it teaches is
learnt once (with the two-slope chain price of ``runtime/vllm/step_cost.py``, it took drafting's extra cost at 16
in flight from 9% of the wall time to none: ``python -m ooospec.eval.vllm.load_probe``, eval/reports/cpu/quantized/).
A drafter that classes its proposals keeps one class's failures from writing off another (the schema drafter's
``open`` guesses, before a call's body, from its ``call`` ones, inside it).

Siblings exclude each other (the target accepts one token after their parent), so sibling estimates that sum to
more than their parent's are cut, the most probable first served (:func:`exclusive_siblings`): each drafter's
estimate is made for its proposal alone, and without this the plan promised up to 2.4x the tokens trees delivered
on llama.cpp (``apibank-l1``, 0.5B; the speed check below then stopped every tree for good).

Worked example: a drafter proposes ``[[7, 3], [5]]`` after root 9, with ``q`` = 0.8 at depth 1 and 0.9 at depth 2
for rank 0 and 0.3 for rank 1: node probabilities ``7: 0.8, 3: 0.72, 5: 0.2`` (5 gets what 7 leaves). With
``p_tie = 0`` (fp32) and a free forward (``T(n) = T(1)``) all three nodes are verified; with ``T(n)/T(1) = 1, 1.1,
1.2, 1.3`` for n = 1..4: ``rate(0..3) = 1/1, 1.8/1.1, 2.52/1.2, 2.72/1.3 = 1, 1.64, 2.1, 2.09``: only
``9 -> 7 -> 3``, and with ``1, 1.5, 2.0, 2.5``: ``1, 1.2, 1.26, 1.09``: the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ooospec.runtime.backends.cost_model import ForwardCost
from ooospec.runtime.tree import DraftTree, build_tree, subtree
from ooospec.runtime.verify import Accepted

DEPTH_EDGES = (1, 2, 3, 5, 9)      # depth buckets: 1, 2, 3-4, 5-8, 9+
NUM_RANKS = 3                      # rank buckets: 0, 1, 2+


@dataclass(frozen=True)
class Proposal:
    """One candidate continuation of the tree root, with where it came from."""

    drafter: str                 # the drafter's ``name``
    rank: int                    # its position in that drafter's list (0 = most likely)
    tokens: tuple[int, ...]


def collect_proposals(drafters: Sequence, ctx, vocab_size: int, on_fault: Callable[[str, str], None]) -> list[Proposal]:
    """Every drafter's candidates for ``ctx`` (a :class:`~ooospec.runtime.drafters.base.DraftContext`) as
    :class:`Proposal` s, in drafter order, labelled ``name`` or ``name/kind`` (a drafter's ``proposal_kind``).

    A drafter can only change speed, never the output, and it cannot stop generation either: a drafter that raises,
    or proposes token ids outside ``[0, vocab_size)``, loses that step's candidates (``on_fault(name, what)``) and
    the step goes on with the others. Both engines call this: the tree engine and the vLLM chain proposer.
    """
    proposals: list[Proposal] = []
    for drafter in drafters:
        name = drafter.name
        try:
            cands = [tuple(int(t) for t in c) for c in drafter.propose(ctx)]
        except Exception as e:  # noqa: BLE001 - a broken drafter must not break decoding
            on_fault(name, f"raised {type(e).__name__}: {e}")
            continue
        valid = [c for c in cands if all(0 <= t < vocab_size for t in c)]
        if len(valid) < len(cands):
            bad = next(c for c in cands if c not in valid)
            on_fault(name, f"proposed token ids outside [0, {vocab_size}) at step {ctx.step}: {bad[:20]}")
        kind = drafter.proposal_kind              # a drafter may class its proposals (hints: by match)
        label = f"{name}/{kind}" if kind else name
        proposals.extend(Proposal(label, rank, c) for rank, c in enumerate(valid) if c)
    return proposals


def depth_bucket(depth: int) -> int:
    """``1 -> 0, 2 -> 1, 3..4 -> 2, 5..8 -> 3, 9+ -> 4`` (depth 1 = the first drafted token)."""
    return sum(depth >= edge for edge in DEPTH_EDGES) - 1


def rank_bucket(rank: int) -> int:
    return min(rank, NUM_RANKS - 1)


# ------------------------------------------------------------------------------------ pure tree choice


def candidate_tree(root: int, proposals: Sequence[Proposal], max_depth: int) -> DraftTree:
    """Every proposal (cut at ``max_depth``) merged into one prefix tree, no node budget."""
    return build_tree(root, [p.tokens for p in proposals], max_nodes=sum(len(p.tokens) for p in proposals),
                      max_depth=max_depth)


def path_nodes(tree: DraftTree, tokens: Sequence[int]) -> list[int]:
    """Nodes of ``tree`` along ``tokens`` from the root, as far as the tree has them.

    ``path_nodes(build_tree(9, [[7, 3]], 2), [7, 3, 3]) == [1, 2]``.
    """
    nodes, node = [], 0
    for tok in tokens:
        node = tree.children[node].get(int(tok), -1)
        if node < 0:
            break
        nodes.append(node)
    return nodes


def node_probabilities(tree: DraftTree, proposals: Sequence[Proposal],
                       prefix_probs: Sequence[Sequence[float]]) -> list[float]:
    """``[N]`` estimated P(node accepted): the largest prefix probability of a proposal through it; root 1.0.

    ``prefix_probs[i][j]`` = P(the first ``j + 1`` tokens of proposal ``i`` are all accepted).
    """
    probs = [0.0] * tree.num_nodes
    probs[0] = 1.0
    for proposal, pp in zip(proposals, prefix_probs):
        for node, p in zip(path_nodes(tree, proposal.tokens), pp):
            probs[node] = max(probs[node], p)
    return exclusive_siblings(tree, probs)


def exclusive_siblings(tree: DraftTree, probs: Sequence[float]) -> list[float]:
    """``probs`` made consistent with greedy verification: siblings exclude each other (the target picks one token
    after their parent), so given their parent their probabilities sum to at most 1, and a node is never more
    probable than its parent. Siblings are served most probable first: each keeps its estimate up to what the ones
    before it leave (the best guess keeps its full, possibly optimistic, estimate: exploration stays as planned);
    a node scaled down scales its subtree with it. Unaffected nodes keep their value exactly.

    Each drafter's estimate is made for its own proposal alone, so where two drafters offer different next tokens
    at 0.9 each the raw sum plans 1.8 accepted tokens for a position that commits one. ``exclusive_siblings`` of
    ``root -> {a: 0.9, b: 0.6 -> c: 0.5}`` is ``a 0.9, b 0.1, c 0.5 / 6``.
    """
    out = list(probs)
    for node in range(tree.num_nodes):                      # parents[i] < i: a parent is final before its children
        p = probs[node]
        ratio = out[node] / p if p > 0.0 else 0.0           # how much this node was scaled down (1.0: not)
        left = p                                            # of the parent's mass, what later siblings may take
        for k in sorted(tree.children[node].values(), key=lambda k: (-probs[k], k)):
            take = min(probs[k], left)
            left -= take
            out[k] = take * ratio                           # exact where untouched: take == probs[k], ratio 1.0
    return out


def best_size(gains: Sequence[float], cost: ForwardCost, max_nodes: int, p_tie: float = 0.0,
              efficiency: float = 1.0) -> int:
    """The ``k <= max_nodes`` maximizing ``rate(k)`` of the module docstring; ``gains`` sorted descending.

    ``efficiency`` multiplies the rate of every tree (``k >= 1``): what trees have realized so far relative to
    what was planned for them (:meth:`AcceptanceStats.efficiency`). Ties go to the smaller tree.
    ``best_size([0.8, 0.72, 0.3], ForwardCost.linear(0.5), 8) == 2``.
    """
    best_k, best_rate, expected = 0, 1.0 / cost.seconds(1), 1.0
    for k, gain in enumerate(gains[:max_nodes], 1):
        if gain <= 0:
            break
        expected += gain
        rate = efficiency * (1.0 - p_tie) * expected / cost.seconds(1 + k)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k


def choose_nodes(tree: DraftTree, probs: Sequence[float], cost: ForwardCost, max_nodes: int,
                 p_tie: float = 0.0, efficiency: float = 1.0) -> list[int]:
    """Nodes to verify (root first, topological order): the ``best_size`` most probable ones.

    Ordered by probability, then depth, so a parent always precedes its children: every prefix of the order
    is a tree.
    """
    order = sorted(range(1, tree.num_nodes), key=lambda i: (-probs[i], tree.depths[i], i))
    k = best_size([probs[i] for i in order], cost, max_nodes, p_tie, efficiency)
    return [0] + sorted(order[:k])


def planned_probabilities(full: DraftTree, proposals: Sequence[Proposal], stats: AcceptanceStats,
                          max_depth: int) -> list[float]:
    """:func:`node_probabilities` of ``full`` with the planned prefix probabilities of ``stats`` (one product per
    drafter and rank bucket, cut per proposal). The tree engine and the vLLM chain proposer both plan with it."""
    table: dict[tuple[str, int], list[float]] = {}
    for p in proposals:
        key = (p.drafter, rank_bucket(p.rank))
        if key not in table:
            table[key] = stats.prefix_probs(p.drafter, p.rank, max_depth)
    return node_probabilities(full, proposals, [table[p.drafter, rank_bucket(p.rank)][:len(p.tokens)]
                                                for p in proposals])


def plan_tree(full: DraftTree, proposals: Sequence[Proposal], stats: AcceptanceStats, cost: ForwardCost,
              max_nodes: int, max_depth: int) -> DraftTree:
    """The part of ``full`` (the :func:`candidate_tree` of ``proposals``) to verify this step; the root alone
    when nothing pays (see the module docstring)."""
    if full.num_nodes == 1:
        return full
    probs = planned_probabilities(full, proposals, stats, max_depth)
    nodes = choose_nodes(full, probs, cost, max_nodes, stats.root_tie_rate(), stats.efficiency())
    stats.planned_tokens = 1.0 + sum(probs[i] for i in nodes[1:])   # what this tree is expected to commit
    return subtree(full, nodes)


def outcome(tree: DraftTree, tokens: Sequence[int], acc: Accepted) -> tuple[int, int]:
    """``(trials, accepted)`` of one proposal in a verified step: its tokens' positions that were judged, and
    how many of them were accepted.

    A position is a trial when the proposal's token there was in the tree, every earlier one was accepted, and the
    target's choice there is known (not past a near-tie stop). Example: proposal ``[7, 3, 5]``, all in the tree,
    accepted ``(7, 4)`` + bonus: trials 2 (7 accepted, 3 rejected), accepted 1.
    """
    in_tree = len(path_nodes(tree, tokens))
    accepted = 0
    while accepted < in_tree and accepted < len(acc.accepted_tokens) and \
            tokens[accepted] == acc.accepted_tokens[accepted]:
        accepted += 1
    judged = len(acc.accepted_tokens) + (acc.bonus is not None)
    return min(accepted + 1, in_tree, judged), accepted


# ------------------------------------------------------------------------------------ online estimates


class AcceptanceStats:
    """Online acceptance estimates per drafter name, across requests and within the current one.

    Share one instance between engines to carry what was learnt from request to request (``ooospec bench``
    does so for ``toolspec``, whose engine is built per request). See the module docstring for the estimates.

    Args:
        request_weight: how many of the request's own trials the across-requests estimate is worth.
        exploration: ``C``, the weight of the uncertainty bonus (0 = plan with the mean).
        max_trials: per cell, the across-requests counts are scaled down to this many trials, so old requests
            fade (the estimate follows a drafter whose usefulness changes).
        revisit: ``R``, the weight of the bonus for steps without a trial; revisit_steps: ``S``, its time scale.
    """

    def __init__(self, request_weight: float = 8.0, exploration: float = 0.5, max_trials: float = 1000.0,
                 revisit: float = 0.5, revisit_steps: float = 20.0):
        self.request_weight = request_weight
        self.exploration = exploration
        self.revisit = revisit
        self.revisit_steps = revisit_steps
        self.bonus_scale = 1.0                   # the share of both bonuses a plan takes (vLLM proposer: 1 / batch)
        self._clock = 0                          # steps seen (record_speed)
        self._last_trial: dict[str, int] = {}     # drafter label -> the clock at its last trial
        self.max_trials = max_trials
        self._all: dict[str, list[list[list[float]]]] = {}      # name -> [rank][depth] -> [trials, accepted]
        self._request: dict[str, list[list[list[float]]]] = {}
        self._priors: dict[str, float] = {}                      # name -> first-token prior mean (default 0.5)
        self._roots = [0.0, 0.0]      # [steps whose root margin was judged, of which the margin was a near-tie]
        # realized vs planned speed: [tokens, seconds, planned tokens, planned seconds] of tree steps and of
        # root-only steps (see efficiency)
        self._speed = {"tree": [0.0, 0.0, 0.0, 0.0], "root": [0.0, 0.0, 0.0, 0.0]}
        self.planned_tokens = 1.0     # set by plan_tree for the tree it returns
        self.speed_prior = 20.0       # planned tokens' worth of belief that the plan is right
        self.max_speed_tokens = 200.0 # past this many tokens per kind, old steps fade

    @staticmethod
    def _cells() -> list[list[list[float]]]:
        return [[[0.0, 0.0] for _ in DEPTH_EDGES] for _ in range(NUM_RANKS)]

    def set_prior(self, drafter: str, p: float) -> None:
        """The prior mean of ``drafter``'s first-token acceptance for its best guess (rank 0; worth two trials;
        default 0.5; other ranks keep 0.5: they are alternatives to the best guess).

        A drafter whose proposals are known to be reliable before any are verified (a hint continuing a long
        suffix match, measured by ``python -m ooospec.eval.bench.hint_replay``) declares it, so that the policy tries
        it where a tree costs several one-token forwards; its own trials take over from there.
        """
        if not 0.0 < p < 1.0:
            raise ValueError(f"a prior must be in (0, 1), got {p}")
        self._priors[drafter] = float(p)

    def start_request(self) -> None:
        """Forget the per-request counts (the across-requests ones stay)."""
        self._request = {}

    def probability(self, drafter: str, rank: int, depth: int) -> float:
        """P(token ``depth`` of a rank-``rank`` proposal is accepted | the ones before it were): ``p_request``."""
        return self._estimate(drafter, rank, depth)[0]

    def plan_probability(self, drafter: str, rank: int, depth: int) -> float:
        """The probability the policy plans with: ``p_request`` plus the uncertainty bonus (``p_plan``)."""
        p, trials = self._estimate(drafter, rank, depth)
        idle = max(0.0, self._clock - self._last_trial.get(drafter, self._clock) - self.revisit_steps)
        bonus = (self.exploration * math.sqrt(p * (1.0 - p) / (trials + 1.0))
                 + self.revisit * math.sqrt(math.log1p(idle / self.revisit_steps) / (trials + 1.0)))
        return min(1.0, p + self.bonus_scale * bonus)

    def _estimate(self, drafter: str, rank: int, depth: int) -> tuple[float, float]:
        """``(p_request, trials_all)`` of one cell."""
        r, d = rank_bucket(rank), depth_bucket(depth)
        cells = self._all[drafter][r] if drafter in self._all else self._cells()[0]
        p_all = self._priors.get(drafter, 0.5) if r == 0 else 0.5    # a declared prior is for its best guess
        for t_all, a_all in cells[:d + 1]:     # each depth bucket's prior mean is the shallower bucket's estimate
            p_all = (a_all + 2.0 * p_all) / (t_all + 2.0)
        t_req, a_req = self._request[drafter][r][d] if drafter in self._request else (0.0, 0.0)
        return (a_req + self.request_weight * p_all) / (t_req + self.request_weight), t_all

    def prefix_probs(self, drafter: str, rank: int, length: int) -> list[float]:
        """``[length]`` planned P(the first ``j + 1`` tokens of a rank-``rank`` proposal are all accepted)."""
        out, p = [], 1.0
        for depth in range(1, length + 1):
            p *= self.plan_probability(drafter, rank, depth)
            out.append(p)
        return out

    def record(self, drafter: str, rank: int, trials: int, accepted: int) -> None:
        """Count positions ``1..trials`` of one proposal as trials and ``1..accepted`` as accepted."""
        r = rank_bucket(rank)
        if trials > 0:
            self._last_trial[drafter] = self._clock
        for level in (self._all, self._request):
            cells = level.setdefault(drafter, self._cells())[r]
            for depth in range(1, trials + 1):
                cell = cells[depth_bucket(depth)]
                cell[0] += 1
                cell[1] += depth <= accepted
        for cell in self._all[drafter][r]:
            if cell[0] > self.max_trials:
                scale = self.max_trials / cell[0]
                cell[0] *= scale
                cell[1] *= scale

    def root_tie_rate(self) -> float:
        """Estimated P(a tree step stops at a near-tie at its root), prior 1 in 20 worth 10 steps.

        Counted over every step whose root margin was judged (tree steps, and one-token steps the engine reports
        with :meth:`record_root_tie`): the margin at the root is the target's, whatever the tree holds, so
        one-token steps measure it too, and the estimate keeps learning while the policy verifies no trees.
        """
        steps, ties = self._roots
        return (ties + 0.5) / (steps + 10.0)

    def record_root_tie(self, tied: bool) -> None:
        """One step's root margin: below the tie margin (``tied``) or not."""
        self._roots[0] += 1
        self._roots[1] += bool(tied)
        if self._roots[0] > self.max_trials:
            self._roots = [t * self.max_trials / self._roots[0] for t in self._roots]

    def record_step(self, tree: DraftTree, proposals: Sequence[Proposal], acc: Accepted) -> None:
        """Update every drafter's counts and the root near-tie rate from one verified step (a root-only step
        says nothing about ties here: the engine reports its margin with :meth:`record_root_tie`)."""
        if tree.num_nodes > 1:
            self.record_root_tie(acc.bonus is None and len(acc.path) == 1)
        for p in proposals:
            trials, accepted = outcome(tree, p.tokens, acc)
            if trials:
                self.record(p.drafter, p.rank, trials, accepted)

    def record_speed(self, num_nodes: int, tokens: int, seconds: float, planned_seconds: float) -> None:
        """One verified step: the tokens it committed in ``seconds`` of forward time, against what was planned
        (``planned_tokens`` of the last :func:`plan_tree`, or 1 for a root-only step, in ``planned_seconds`` =
        ``T(num_nodes)``). The engine leaves out tree steps that stopped at a near-tie at their root: the plan
        prices those with :meth:`root_tie_rate`, so counting them here too would charge them twice."""
        self._clock += 1
        kind = "tree" if num_nodes > 1 else "root"
        planned = self.planned_tokens if num_nodes > 1 else 1.0
        cell = self._speed[kind]
        for i, v in enumerate((tokens, seconds, planned, planned_seconds)):
            cell[i] += v
        if cell[0] + cell[2] > 2 * self.max_speed_tokens:    # old steps fade, as acceptance counts do
            cell[:] = [v / 2 for v in cell]

    def efficiency(self) -> float:
        """Realized / planned rate of tree steps, relative to the same ratio of root-only steps (prior 1).

        The plan's two halves can be off on a given machine and workload: acceptance estimated over requests
        that are not alike (a tool call vs prose), and ``T(n)`` calibrated on a quiet chain of random tokens.
        Where trees have committed less per second than planned, compared with how one-token steps did, every
        tree's rate is scaled down by this factor, so the policy stops paying for trees that do not pay.
        ``(tokens / seconds) / (planned / planned_seconds)`` per kind; a prior of ``speed_prior`` planned tokens at
        the planned rate keeps it at 1 until steps say otherwise.
        Capped at 1: it only ever makes the policy more careful (trees that beat their plan are left to the
        acceptance estimates, which follow them anyway).
        """
        def ratio(cell: list[float]) -> float:
            tokens, seconds, planned, planned_s = cell
            if planned <= 0 or planned_s <= 0:
                return 1.0
            prior_s = self.speed_prior * planned_s / planned
            return ((tokens + self.speed_prior) / (seconds + prior_s)) / (planned / planned_s)

        return min(1.0, ratio(self._speed["tree"]) / ratio(self._speed["root"]))

    def summary(self) -> dict[str, dict[str, float]]:
        """``{drafter: {"trials", "accepted", "first_token_rate"}}`` across requests (rank 0, depth 1 for the rate)."""
        out = {}
        for name, ranks in sorted(self._all.items()):
            trials = sum(c[0] for cells in ranks for c in cells)
            accepted = sum(c[1] for cells in ranks for c in cells)
            t0, a0 = ranks[0][0]
            out[name] = {"trials": round(trials, 1), "accepted": round(accepted, 1),
                         "first_token_rate": a0 / t0 if t0 else float("nan")}
        return out
