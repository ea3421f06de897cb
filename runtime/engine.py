"""Greedy-exact tree speculative decoding, batch 1: propose -> plan tree -> one forward -> accept -> commit.

Whatever the drafters propose, the output equals plain greedy decoding of the target token for token
(``tests/runtime/test_engine_exact.py`` checks this against HF ``generate(do_sample=False)``); drafters only
change how many tokens each target forward commits.

Public API (``model``: a transformers causal LM or any :class:`~ooospec.runtime.backends.target.Target`)::

    from ooospec.runtime.decoding import build_engine, make_engine
    engine = build_engine("pld", model, eos_token_ids=[tok.eos_token_id])  # or make_engine(model, [d1, d2], ...)
    result = engine.generate(input_ids, max_new_tokens=256, stop=None)    # input_ids: list[int] (rendered prompt)
    result.tokens        # list[int] generated tokens (EOS included when it stopped on EOS)
    result.n_forwards    # verification forwards (the prefill is not counted)
    result.steps         # [StepStats(tree_size, accepted, new_tokens, t_draft, t_forward, tie_stop, proposed_nodes)]
    result.prefill_s, result.decode_s, result.stop_reason   # "eos" | "stop" | "max_new_tokens"
    result.num_cached    # prompt tokens whose KV came from ``cache=`` instead of being prefilled (0 without it)

Which draft nodes a step verifies is the tree policy's choice: ``"budget"`` (default,
:mod:`ooospec.runtime.budget`) picks the nodes that maximize expected committed tokens per second of forward
time from each drafter's online acceptance (``engine.acceptance``, per drafter ``name``) and the target's measured
forward cost (:mod:`ooospec.runtime.backends.cost_model`, measured once per model/dtype/threads, cached); ``"fixed"``
fills ``max_draft_nodes`` round-robin by rank (:func:`merge_candidates`).

``stop(generated_tokens) -> bool`` is called after every committed token (e.g. "the tool call is closed");
generation ends right after the first token for which it returns True, exactly where plain decoding would end.

The loop state: ``tokens`` = prompt + committed output; the target's KV cache
(:class:`~ooospec.runtime.backends.target.TargetCache`) holds all of them but the last, which is the root of the next
tree. A step with a near-tie stop (see :mod:`ooospec.runtime.verify`) is followed by a root-only step, i.e. one-token
decoding.

Continuing from a cache (``generate(..., cache=kv)``; a session's, :mod:`ooospec.runtime.agent.session`): the cache
keeps the longest prefix of its token ids that the new prompt starts with and prefills only the rest, so a next
turn whose prompt extends the last prompt + output costs only its new tokens. Still exact: the reused entries are
those a full prefill of the same ids at the same positions would compute. On return the cache holds prompt +
output except the last token, ready for the next turn. Without ``cache`` every call starts from an empty cache.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ooospec.runtime.backends.cost_model import ForwardCost, forward_cost
from ooospec.runtime.backends.target import Target, TargetCache, as_target
from ooospec.runtime.budget import AcceptanceStats, Proposal, candidate_tree, collect_proposals, plan_tree
from ooospec.runtime.drafters.base import DraftContext, Drafter, Faults, observe_all
from ooospec.runtime.tree import DraftTree, build_tree
from ooospec.runtime.verify import Accepted, accept_greedy, top2_margins

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

StopReason = Literal["eos", "stop", "max_new_tokens"]
TreePolicy = Literal["budget", "fixed"]


@dataclass(frozen=True)
class StepStats:
    """One verification step."""

    tree_size: int      # nodes in the verified tree incl. the root (= the forward's query length)
    accepted: int       # draft tokens accepted (bonus excluded)
    new_tokens: int     # tokens this step committed to the output (accepted + bonus, cut at a stop)
    t_draft: float      # seconds in the drafters
    t_forward: float    # seconds in the target forward + acceptance (acceptance reads logits, which syncs)
    tie_stop: bool      # acceptance stopped at a near-tie; the next step is a one-token forward
    proposed_nodes: int = 0   # distinct draft nodes the drafters proposed (before the policy chose tree_size - 1)


@dataclass
class GenerationResult:
    tokens: list[int]                   # generated tokens
    n_forwards: int                     # verification forwards (= len(steps)); prefill excluded
    steps: list[StepStats]
    prefill_s: float
    decode_s: float
    stop_reason: StopReason
    margins: list[float] | None = None  # [len(tokens)] top-2 margin behind each token
    num_cached: int = 0                 # prompt tokens whose KV came from the given cache (not prefilled)


def merge_candidates(per_drafter: Sequence[Sequence[Sequence[int]]]) -> list[list[int]]:
    """Union of several drafters' candidates: round-robin by rank, exact duplicates and empties dropped.

    ``[[a1, a2], [b1]] -> [a1, b1, a2]``: every drafter's best guess gets into the node budget before anyone's
    second guess. Shared prefixes are merged later by :func:`~ooospec.runtime.tree.build_tree`.
    """
    merged: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    for rank in range(max((len(c) for c in per_drafter), default=0)):
        for cands in per_drafter:
            if rank < len(cands):
                key = tuple(cands[rank])
                if key and key not in seen:
                    seen.add(key)
                    merged.append(list(key))
    return merged


DEFAULT_MAX_DEPTH = 16   # the longest candidate a tree keeps: a fixed-size cache needs this much room past the output


@dataclass
class _LoopState:
    """What one ``generate`` call carries from step to step."""

    prompt_len: int
    tokens: list[int]                  # prompt + committed output; the last one is the next tree root
    generated: list[int] = field(default_factory=list)
    margins: list[float] | None = None  # [len(generated)] top-2 margin behind each token (record_margins)
    steps: list[StepStats] = field(default_factory=list)
    one_token_next: bool = False       # the last step stopped at a near-tie: the next one verifies the root only
    reason: StopReason | None = None


class SpecEngine:
    """Greedy tree speculative decoding over one target model (see the module docstring).

    Args:
        model: the target: a causal LM loaded with ``attn_implementation`` "sdpa" or "eager", in eval mode
            (adapted by :func:`~ooospec.runtime.backends.target.as_target`), or any
            :class:`~ooospec.runtime.backends.target.Target` (e.g. a
            :class:`~ooospec.runtime.backends.llamacpp.LlamaCppTarget`).
        drafters: objects following :class:`~ooospec.runtime.drafters.base.Drafter`; none = plain greedy decoding
            (one token per forward, through the same cache code).
        policy: ``"budget"`` (choose the tree for expected tokens per second) or ``"fixed"`` (fill the node budget).
        max_draft_nodes: the most draft nodes in a tree (root excluded): the budget under ``"fixed"``, a cap under
            ``"budget"``.
        max_depth: longest candidate kept.
        cost: the target's forward cost for ``"budget"``; None =
        :func:`~ooospec.runtime.backends.cost_model.forward_cost`
            (measured on first use, cached on disk per model, dtype, threads and machine).
        acceptance: online acceptance estimates; pass one instance to several engines to share what they learn
            across requests. None = a fresh one for this engine (it still learns across this engine's calls).
        tie_margin: stop acceptance before a choice whose top-2 logit margin is below this; that token then
            comes from a one-token forward. ``0`` = off. ``None`` (default) = the target's ``tie_margin``:
            off in fp32/fp64, on in bf16/fp16 and on the llama.cpp backend.
        eos_token_ids: generation ends after any of these.
        record_margins: keep the top-2 margin behind every generated token (``GenerationResult.margins``).
    """

    def __init__(
        self,
        model: Target | PreTrainedModel,
        drafters: Sequence[Drafter] = (),
        *,
        policy: TreePolicy = "budget",
        max_draft_nodes: int = 63,
        max_depth: int = DEFAULT_MAX_DEPTH,
        cost: ForwardCost | None = None,
        acceptance: AcceptanceStats | None = None,
        tie_margin: float | None = None,
        eos_token_ids: Sequence[int] = (),
        record_margins: bool = False,
    ):
        if max_draft_nodes < 0 or max_depth < 1:
            raise ValueError(f"need max_draft_nodes >= 0 and max_depth >= 1, got {max_draft_nodes}, {max_depth}")
        if policy not in ("budget", "fixed"):
            raise ValueError(f"policy must be 'budget' or 'fixed', got {policy!r}")
        self.target = as_target(model)
        self.drafters = list(drafters)
        self.policy = policy
        self.max_draft_nodes = max_draft_nodes
        self.max_depth = max_depth
        self.cost = cost
        self.acceptance = acceptance if acceptance is not None else AcceptanceStats()
        self.tie_margin = self.target.tie_margin if tie_margin is None else tie_margin
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.record_margins = record_margins
        self.vocab_size = self.target.vocab_size
        self.kv = self.target.new_kv_cache()
        # drafter name -> steps whose drafts were dropped; the first of each name is a warning
        self.drafter_faults = Faults(lambda message: warnings.warn(f"drafter {message}", stacklevel=4))
        for drafter in self.drafters:                  # first-token priors a drafter declares for its proposals
            for label, p in drafter.priors.items():
                self.acceptance.set_prior(label, p)

    def propose(self, ctx: DraftContext) -> list[Proposal]:
        """Every drafter's candidates as :class:`~ooospec.runtime.budget.Proposal` s, in drafter order.

        A drafter can only change speed, never the output, and it cannot stop generation either: a drafter that
        raises, or proposes token ids outside the vocabulary, loses that step's candidates (counted in
        ``drafter_faults``, warned once per drafter) and the step goes on with the others.
        """
        return collect_proposals(self.drafters, ctx, self.vocab_size, self.drafter_faults)

    def plan(self, root: int, proposals: Sequence[Proposal]) -> tuple[DraftTree, int]:
        """The tree to verify (chosen by the budget policy, or the fixed budget filled round-robin by rank) and
        the number of distinct draft nodes proposed."""
        full = candidate_tree(root, proposals, self.max_depth)
        if self.policy == "budget":
            tree = plan_tree(full, proposals, self.acceptance, self.cost, self.max_draft_nodes, self.max_depth)
            return tree, full.num_nodes - 1
        per_drafter: dict[str, list[tuple[int, ...]]] = {}
        for p in proposals:
            per_drafter.setdefault(p.drafter, []).append(p.tokens)
        merged = merge_candidates(list(per_drafter.values()))
        return build_tree(root, merged, self.max_draft_nodes, self.max_depth), full.num_nodes - 1

    def _stop_reason(self, generated: list[int], max_new_tokens: int, stop) -> StopReason | None:
        if generated[-1] in self.eos_token_ids:
            return "eos"
        if stop is not None and stop(generated):
            return "stop"
        if len(generated) >= max_new_tokens:
            return "max_new_tokens"
        return None

    def generate(
        self,
        input_ids: Sequence[int],
        max_new_tokens: int,
        stop: Callable[[Sequence[int]], bool] | None = None,
        *,
        cache: TargetCache | None = None,
    ) -> GenerationResult:
        """Greedy-decode up to ``max_new_tokens`` tokens after ``input_ids`` (a non-empty list of token ids).

        ``cache``: continue from this cache (of this model) instead of an empty one: the longest prefix of its
        tokens that ``input_ids`` starts with is kept, the rest of the prompt is prefilled (see the module
        docstring). On return it holds ``input_ids + tokens[:-1]``.
        """
        prompt = self._check_request(input_ids, max_new_tokens, cache)
        if self.drafters and self.policy == "budget" and self.cost is None:
            self.cost = forward_cost(self.target)   # measured once per model/dtype/threads, before the clock starts
        self.acceptance.start_request()
        t_start = time.perf_counter()
        kv = self.kv if cache is None else cache
        if cache is None:
            kv.reset()
        num_cached = kv.keep_prefix_of(prompt[:-1])
        kv.prefill(prompt[num_cached:-1])
        t_prefilled = time.perf_counter()

        state = _LoopState(len(prompt), list(prompt), margins=[] if self.record_margins else None)
        while state.reason is None:
            self._step(kv, state, max_new_tokens, stop)
        kv.truncate(len(state.tokens) - 1)   # drop accepted entries past a stop: the cache ends where the output does
        t_end = time.perf_counter()
        self._observe(prompt, state.generated)
        return GenerationResult(
            tokens=state.generated,
            n_forwards=len(state.steps),
            steps=state.steps,
            prefill_s=t_prefilled - t_start,
            decode_s=t_end - t_prefilled,
            stop_reason=state.reason,
            margins=state.margins,
            num_cached=num_cached,
        )

    def _check_request(self, input_ids: Sequence[int], max_new_tokens: int, cache: TargetCache | None) -> list[int]:
        prompt = [int(t) for t in input_ids]
        if not prompt:
            raise ValueError("input_ids is empty; the engine needs at least one prompt token")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if cache is not None and cache.model is not self.kv.model:
            raise ValueError("cache belongs to another model; a KV cache is only valid for the model that filled it")
        return prompt

    def _step(self, kv: TargetCache, state: _LoopState, max_new_tokens: int, stop) -> None:
        """One verification step: propose, plan the tree, one forward over it, accept, commit; recorded in ``state``."""
        t0 = time.perf_counter()
        proposals = []
        if self.drafters and not state.one_token_next:
            proposals = self.propose(DraftContext(tuple(state.tokens), state.prompt_len, len(state.steps)))
        tree, proposed = self.plan(state.tokens[-1], proposals)
        t1 = time.perf_counter()
        logits = kv.forward_tree(tree)
        acc = accept_greedy(tree, logits, self.tie_margin, with_margins=self.record_margins)
        t2 = time.perf_counter()
        kv.commit(acc.kept_nodes)
        self._learn(tree, proposals, acc, logits, t2 - t1)
        state.one_token_next = acc.bonus is None
        num_new = self._append(state, acc, max_new_tokens, stop)
        state.steps.append(StepStats(tree.num_nodes, len(acc.accepted_tokens), num_new, t1 - t0, t2 - t1,
                                     state.one_token_next, proposed))

    def _learn(self, tree: DraftTree, proposals: Sequence[Proposal], acc: Accepted, logits: torch.Tensor,
               forward_s: float) -> None:
        """Update the online estimates the budget policy plans with: acceptance, root ties, speed."""
        self.acceptance.record_step(tree, proposals, acc)
        if self.policy != "budget" or self.cost is None:
            return
        if tree.num_nodes == 1 and self.tie_margin > 0 and self.drafters:
            # the root's margin, which a tree step would have stopped at: keeps the tie rate learning
            self.acceptance.record_root_tie(float(top2_margins(logits[:1])[0]) < self.tie_margin)
        root_tie = acc.bonus is None and len(acc.path) == 1
        if not root_tie:
            self.acceptance.record_speed(tree.num_nodes, len(acc.new_tokens), forward_s,
                                         self.cost.seconds(tree.num_nodes))

    def _append(self, state: _LoopState, acc: Accepted, max_new_tokens: int, stop) -> int:
        """Append ``acc``'s new tokens to ``state`` up to the first one that ends generation; returns how many."""
        for i, tok in enumerate(acc.new_tokens):
            state.tokens.append(tok)
            state.generated.append(tok)
            if state.margins is not None:
                state.margins.append(acc.margins[i])
            state.reason = self._stop_reason(state.generated, max_new_tokens, stop)
            if state.reason is not None:
                return i + 1
        return len(acc.new_tokens)

    def _observe(self, prompt: list[int], generated: list[int]) -> None:
        """Show the finished call to every drafter (a failing hook is a fault, not an error)."""
        observe_all(self.drafters, prompt, generated, self.drafter_faults)
