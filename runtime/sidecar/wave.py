"""The sidecar's one-pass wave: prefill a request's shared block once, decode every slot answer as a branch.

A wave (:class:`~ooospec.runtime.sidecar.prompts.Wave`) is one shared block and N short queries. Answering it
as N separate prompts costs N prefills of the block; here the block is prefilled ONCE into the KV cache
(:class:`~ooospec.runtime.backends.kv_cache.KVCache`, the runtime's only cache), the N queries go in as one draft tree
rooted at the block's last token (shared query prefixes merged, :func:`~ooospec.runtime.tree.build_tree`), and
then every live branch advances per forward, each seeing the block and its own tokens only
(:class:`~ooospec.runtime.tree.Forest`, the structure training packs with too): one token, or, with an
:class:`AnswerDrafter`, a small draft tree of its own (values copied from the conversation, a closing quote +
EOS) verified greedily in the same forward (:func:`~ooospec.runtime.verify.accept_greedy`). The wave costs one
prefill, one forward over the query tree and at most (longest answer) branch forwards. Each branch ends at EOS or
at ``max_new_tokens`` with exactly the tokens greedy decoding of that slot's prompt on its own gives, drafts or
not (``tests/runtime/sidecar/test_wave.py`` checks this on tiny float64 models).

The prompt layout, its tokenization (:func:`~ooospec.runtime.sidecar.prompts.encode_wave`), the joining of
answers and the adapter's metadata are the sidecar's contract, :mod:`ooospec.runtime.sidecar.prompts`.

    sidecar = Sidecar.from_adapter()                                  # the shipped adapter (runtime/paths.py)
    call, result = sidecar.predict(messages, tools)                   # {"name", "arguments"} | None
    result.prefill_s, result.decode_s, result.n_forwards, result.answers
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ooospec.runtime.backends.kv_cache import KVCache
from ooospec.runtime.drafters.pld import lookup
from ooospec.runtime.paths import sidecar_adapter_dir
from ooospec.runtime.sidecar import prompts as sp
from ooospec.runtime.tree import DraftTree, Forest, build_tree, forest_positions, forest_visibility
from ooospec.runtime.verify import accept_greedy

if TYPE_CHECKING:   # duck-typed: any object with lookup_shared() and insert()
    from ooospec.runtime.agent.session import PrefixCache

logger = logging.getLogger(__name__)


@dataclass
class WaveResult:
    """One wave's answers and timings."""

    tokens: list[list[int]]     # [n_queries] generated tokens per query (EOS included when it ended on EOS)
    answers: list[str]          # [n_queries] decoded answers (special tokens dropped)
    prefill_s: float            # the block's prefill (all but its last token: the query tree's root)
    decode_s: float             # the query tree forward + every branch step
    n_forwards: int             # forwards after the prefill
    block_tokens: int
    query_tokens: int           # distinct query-tree nodes fed in the first decode forward (the root excluded)
    drafted: int = 0            # draft tokens fed (AnswerDrafter); they change the forwards, never the answers
    accepted: int = 0           # of them, accepted
    cached_tokens: int = 0      # block tokens whose KV came from the prefix cache (not prefilled)
    top_logprobs: list[list[dict[str, float]]] | None = None   # asked for: per query, per token, top-k text -> lp

    @property
    def wave_s(self) -> float:
        return self.prefill_s + self.decode_s


class WaveCancelled(Exception):
    """The caller gave up on the wave (e.g. the client disconnected): decoding stopped early."""


Propose = Callable[[int, Sequence[int]], Sequence[Sequence[int]]]


@dataclass
class _Branch:
    """One distinct query's answer in progress."""

    query: int              # the first query with this prompt: what ``propose`` is asked about
    history: list[int]      # cache indices of its entries past the block: query tokens, then kept answer tokens
    out: list[int]          # generated tokens; out[-1] is the root of its next tree (not in the cache yet)
    logprobs: list[dict[int, float]] = field(default_factory=list)   # per out token, when asked: top-k logprobs


def _query_branches(kv: KVCache, queries: DraftTree, query_ids: Sequence[Sequence[int]],
                    logprobs: int = 0) -> tuple[list[_Branch], list[int]]:
    """Forward the query tree and start the branches; returns them and ``which[i]``, the branch of query ``i``.

    ``queries`` (the block's last token, then every query) is committed whole after the cache's ``root_key``
    entries, so node ``j`` is entry ``root_key + j``; its logits ``[num_nodes, vocab]`` give every branch its first
    token. Identical queries end on the same node and share a branch.
    """
    root_key = kv.length
    logits = kv.forward_tree(queries)
    kv.commit(range(queries.num_nodes))
    branches: list[_Branch] = []
    which, branch_of_leaf = [], {}
    for i, q in enumerate(query_ids):
        leaf = 0
        for tok in q:
            leaf = queries.children[leaf][int(tok)]
        if leaf not in branch_of_leaf:
            branch_of_leaf[leaf] = len(branches)
            history = [root_key + j for j in queries.path_to(leaf)[1:]]
            branches.append(_Branch(i, history, [int(logits[leaf].argmax())],
                                    [top_logprobs(logits[leaf], logprobs)] if logprobs else []))
        which.append(branch_of_leaf[leaf])
    return branches, which


def decode_branches(model, block_ids: Sequence[int], query_ids: Sequence[Sequence[int]], *,
                    max_new_tokens: int, eos_token_ids: Sequence[int] = (),
                    should_stop: Callable[[], bool] | None = None,
                    propose: Propose | None = None, max_draft_nodes: int = 6,
                    prefix_cache: PrefixCache | None = None, logprobs: int = 0) -> tuple[list[list[int]], dict]:
    """Greedy answers of ``block + query_i`` for every i, sharing the block's prefill. Returns ``(tokens, stats)``.

    ``tokens[i]`` equals greedy decoding of ``block_ids + query_ids[i]`` alone, cut after the first EOS or at
    ``max_new_tokens``. Identical queries share a branch; queries sharing a prefix share its nodes.
    ``should_stop`` is polled before every forward; when it returns True the wave raises :class:`WaveCancelled`
    (a server stops computing for a client that went away).

    ``propose(i, generated)`` (optional) drafts continuations of query ``i``'s answer so far: each branch then
    feeds a small draft tree (:func:`~ooospec.runtime.tree.build_tree`, at most ``max_draft_nodes`` draft nodes)
    instead of one token, and keeps the longest path greedy decoding agrees with
    (:func:`~ooospec.runtime.verify.accept_greedy`) plus the bonus token. Drafts change how many forwards the wave
    takes, never its answers.

    ``prefix_cache`` (optional): the block's KV starts from the stored snapshot sharing the longest token prefix
    with it (:meth:`~ooospec.runtime.agent.session.PrefixCache.lookup_shared`; e.g. a tools-first block whose toolbox an
    earlier wave prefilled), only the rest is prefilled, and the block's KV is stored for later waves. Reused
    entries are those a prefill computes for the same ids at the same positions: the answers do not change.

    ``logprobs`` (optional, k > 0): ``stats["top_logprobs"][i]`` holds, for every token of ``tokens[i]``, the k
    most likely tokens at that step and their log-probabilities (``{token_id: logprob}``, :func:`top_logprobs`).
    """
    check_wave_args(block_ids, query_ids, max_new_tokens, max_draft_nodes)
    eos = frozenset(int(t) for t in eos_token_ids)

    def poll(when: str) -> None:
        if should_stop is not None and should_stop():
            raise WaveCancelled(f"wave cancelled {when}")

    def done(b: _Branch) -> bool:
        return b.out[-1] in eos or len(b.out) >= max_new_tokens

    def draft(b: _Branch) -> DraftTree:
        cands = propose(b.query, b.out) if propose is not None and max_draft_nodes else ()
        return build_tree(b.out[-1], cands, min(max_draft_nodes, max_new_tokens - len(b.out) - 1))  # bonus: +1

    num_block = len(block_ids)
    t0 = time.perf_counter()
    kv, cached = prefill_block(model, block_ids[:-1], prefix_cache)   # the last token: the first tree's root
    t1 = time.perf_counter()
    poll("after the prefill")
    queries = build_tree(block_ids[-1], query_ids, max_nodes=sum(len(q) for q in query_ids))
    branches, which = _query_branches(kv, queries, query_ids, logprobs)
    n_forwards, drafted, accepted = _decode_until_done(kv, num_block, queries, branches, draft, done, poll, logprobs)
    t2 = time.perf_counter()
    stats = {"prefill_s": t1 - t0, "decode_s": t2 - t1, "n_forwards": n_forwards, "block_tokens": num_block,
             "query_tokens": queries.num_nodes - 1, "drafted": drafted, "accepted": accepted,
             "cached_tokens": cached}
    if logprobs:
        stats["top_logprobs"] = [list(branches[w].logprobs) for w in which]
    return [list(branches[w].out) for w in which], stats


def _decode_until_done(kv: KVCache, num_block: int, queries: DraftTree, branches: Sequence[_Branch],
                       draft: Callable[[_Branch], DraftTree], done: Callable[[_Branch], bool],
                       poll: Callable[[str], None], logprobs: int = 0) -> tuple[int, int, int]:
    """Advance the branches :func:`_query_branches` started, one forward over every live branch's draft tree at a
    time (``poll`` before each), until each is ``done``. Returns ``(forwards, drafted, accepted)``: the forwards
    after the prefill (the query tree's included) and the draft tokens fed and accepted."""
    key_pos = list(range(num_block)) + [num_block - 1 + d for d in queries.depths[1:]]   # [kv.length]
    n_forwards, drafted, accepted = 1, 0, 0
    live = [b for b in branches if not done(b)]
    while live:
        poll(f"after {n_forwards} forwards")
        forest = Forest(num_block, tuple(draft(b) for b in live), tuple(tuple(b.history) for b in live))
        num_drafted, num_accepted = _advance_branches(kv, forest, live, key_pos, done, logprobs)
        n_forwards, drafted, accepted = n_forwards + 1, drafted + num_drafted, accepted + num_accepted
        live = [b for b in live if not done(b)]
    return n_forwards, drafted, accepted


def _advance_branches(kv: KVCache, forest: Forest, live: Sequence[_Branch], key_pos: list[int],
                      done: Callable[[_Branch], bool], logprobs: int = 0) -> tuple[int, int]:
    """One forward over ``forest`` (each live branch's draft tree after the block): every branch keeps the path
    greedy decoding agrees with plus the bonus token (up to where it is ``done``), the cache commits those nodes
    and ``key_pos`` (the position of every cache entry) grows with them. Returns ``(drafted, accepted)`` tokens."""
    pos = forest_positions(forest)
    logits = kv.forward_masked(forest.tokens, torch.tensor(pos), forest_visibility(forest, kv.length),
                               torch.tensor(key_pos + pos))
    kept: list[int] = []        # fed nodes whose entries stay, in cache order
    drafted = accepted = 0
    for b, tree, start in zip(live, forest.trees, forest.offsets):
        acc = accept_greedy(tree, logits[start:start + tree.num_nodes])
        b.history += range(kv.length + len(kept), kv.length + len(kept) + len(acc.kept_nodes))
        kept += [start + node for node in acc.kept_nodes]
        drafted, accepted = drafted + tree.num_nodes - 1, accepted + len(acc.accepted_tokens)
        for j, tok in enumerate(acc.new_tokens):
            if done(b):
                break
            b.out.append(int(tok))
            if logprobs:        # token j is the choice at path node j
                b.logprobs.append(top_logprobs(logits[start + acc.path[j]], logprobs))
    kv.commit(kept)
    key_pos += [pos[i] for i in kept]
    return drafted, accepted


def prefill_block(model, tokens: Sequence[int], prefix_cache: PrefixCache | None = None) -> tuple[KVCache, int]:
    """A cache holding ``tokens``' KV, and how many of them came from ``prefix_cache`` (the stored entry sharing
    the longest prefix with them); the rest are prefilled, and the whole is stored there for later blocks."""
    kv, head = KVCache(model), [int(t) for t in tokens]
    found = prefix_cache.lookup_shared(head) if prefix_cache is not None and head else None
    cached = 0 if found is None else found[1]
    if found is not None:
        kv.load(*found)
    kv.prefill(head[cached:])
    if prefix_cache is not None and len(head) > cached:
        prefix_cache.insert(kv.snapshot())
    return kv, cached


def measure_wave_cost(model, *, vocab_size: int, max_draft_nodes: int = 6, block_tokens: int = 256,
                      num_queries: int = 9, query_tokens: int = 8, max_new_tokens: int = 4, repeats: int = 2,
                      seed: int = 0, decode: Callable[..., tuple[list[list[int]], dict]] | None = None) -> dict:
    """What a wave costs this model on this machine, with its threads, now: one synthetic wave (a
    ``block_tokens`` block of seeded random ids, ``num_queries`` queries, every branch fed a full
    ``max_draft_nodes`` draft that greedy decoding rejects, as large as a real wave's forwards get) run ``repeats``
    times; the last run counts (the first warms the kernels). ``decode`` (default :func:`decode_branches` on
    ``model``) runs it on another engine: it takes ``(block, queries)`` and ``decode_branches``'s keywords
    ``max_new_tokens``, ``propose`` and ``max_draft_nodes``, and must not reuse a block between runs. A server
    measures this at start-up and reports it in ``/health`` so that a client's wave gate prices waves for the
    machine it runs on instead of a prior calibrated elsewhere
    (:meth:`~ooospec.runtime.sidecar.gate.WaveGate.calibrate`).

    Returns ``{"prefill_per_token", "decode_forward_s", "num_queries", "block_tokens", "n_forwards", "seconds"}``:
    prefill seconds per block + query token and decode seconds per forward, computed as the gate computes them from
    a real wave's server timings (``prefill_s / (block_tokens + query_tokens)``, ``decode_s / n_forwards``).
    """
    if block_tokens < 2 or num_queries < 1 or query_tokens < 1 or repeats < 1 or vocab_size < 4:
        raise ValueError("need block_tokens >= 2, num_queries, query_tokens, repeats >= 1 and vocab_size >= 4")
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(vocab_size // 4, vocab_size // 2, (block_tokens + num_queries * query_tokens,),
                        generator=g).tolist()
    block = ids[:block_tokens]
    queries = [ids[block_tokens + i * query_tokens: block_tokens + (i + 1) * query_tokens] for i in range(num_queries)]
    draft = ids[:max_draft_nodes]
    if decode is None:
        def decode(block, queries, **kw):
            return decode_branches(model, block, queries, **kw)
    t0 = time.perf_counter()
    with torch.no_grad():
        for _ in range(repeats):
            _, st = decode(block, queries, max_new_tokens=max_new_tokens,
                           propose=(lambda i, out: [draft]) if draft else None, max_draft_nodes=max_draft_nodes)
    return {"prefill_per_token": st["prefill_s"] / (st["block_tokens"] + st["query_tokens"]),
            "decode_forward_s": st["decode_s"] / st["n_forwards"], "num_queries": num_queries,
            "seconds_per_wave": st["prefill_s"] + st["decode_s"],
            "block_tokens": block_tokens, "n_forwards": st["n_forwards"],
            "seconds": round(time.perf_counter() - t0, 3)}


def by_text(tokenizer, step: Mapping[int, float]) -> dict[str, float]:
    """``{token id: logprob}`` keyed by token text; ids that decode to the same text keep the most likely."""
    out: dict[str, float] = {}
    for i, lp in step.items():
        text = tokenizer.decode([i])
        out[text] = max(lp, out.get(text, lp))
    return out


def check_wave_args(block_ids: Sequence[int], query_ids: Sequence[Sequence[int]], max_new_tokens: int,
                max_draft_nodes: int) -> None:
    if not block_ids:
        raise ValueError("the shared block is empty")
    if any(len(q) == 0 for q in query_ids):
        raise ValueError("every query needs at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if max_draft_nodes < 0:
        raise ValueError(f"max_draft_nodes must be >= 0, got {max_draft_nodes}")


def top_logprobs(logits: torch.Tensor, k: int) -> dict[int, float]:
    """The ``k`` most likely next tokens of one logits row and their log-probabilities (float32 softmax)::

        top_logprobs(torch.tensor([0.0, 0.0, -1e9]), 1) -> {0: -0.6931...}
    """
    lp = torch.log_softmax(logits.float(), dim=-1)
    values, ids = lp.topk(min(int(k), lp.numel()))
    return {int(i): float(v) for i, v in zip(ids, values)}


# ------------------------------------------------------------------------------------------- answer drafts

CLOSERS = ('"', '"]', '"}', ']', '}')   # what ends a JSON value that has started, tried in this order


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


class AnswerDrafter:
    """Draft continuations of slot answers (a ``propose`` for :func:`decode_branches`).

    Two sources, merged into each branch's draft tree: prompt lookup (:func:`ooospec.runtime.drafters.pld.lookup`) in
    the query's own prompt and the answer so far, since argument values are mostly copied from the conversation; and
    the shortest closer of :data:`CLOSERS` that makes the answer a complete JSON value, followed by EOS
    (``"San Francisco`` -> ``"`` EOS). Worked example: answer so far ``"New York`` with the block holding
    ``... in New York City ...`` drafts ``[" City", ...]`` (lookup) and ``['"', EOS]`` (closer).
    """

    def __init__(self, tokenizer, block_ids: Sequence[int], query_ids: Sequence[Sequence[int]], *,
                 eos_token_id: int, max_candidates: int = 2, num_pred_tokens: int = 4, max_ngram: int = 3):
        self.tokenizer = tokenizer
        self.block = list(block_ids)
        self.queries = [list(q) for q in query_ids]
        self.eos = int(eos_token_id)
        self.max_candidates = max_candidates
        self.num_pred_tokens = num_pred_tokens
        self.max_ngram = max_ngram
        self.closers = [tokenizer.encode(c, add_special_tokens=False) for c in CLOSERS]

    def __call__(self, query: int, generated: Sequence[int]) -> list[list[int]]:
        generated = list(generated)
        cands = lookup(self.block + self.queries[query] + generated, self.max_ngram, 1, self.num_pred_tokens,
                       self.max_candidates)
        if not _is_json(self.tokenizer.decode(generated)):
            for closer in self.closers:
                if _is_json(self.tokenizer.decode(generated + closer)):
                    cands.append(closer + [self.eos])
                    break
        return cands


# ------------------------------------------------------------------------------------------- the sidecar


class Sidecar:
    """A sidecar model (base + merged LoRA) that answers waves on transformers. Thread-compatible, not thread-safe.

    The engine-facing part is :meth:`decode` (a wave's token ids in, greedy answers and stats out), ``vocab_size``,
    ``weights``, :meth:`prefill` and :meth:`calibrate`; :class:`~ooospec.runtime.sidecar.llamacpp.LlamaCppSidecar`
    implements them on llama.cpp and inherits the rest (layout, drafts, :meth:`answer`, :meth:`predict`).
    """

    engine = "transformers"

    def __init__(self, model, tokenizer, *, max_new_tokens: int = 48, metadata: Mapping | None = None,
                 max_draft_nodes: int = 6, prefix_cache: PrefixCache | None = None):
        if tokenizer.eos_token_id is None:
            raise ValueError("the sidecar tokenizer has no eos_token_id; answers could not stop")
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.max_draft_nodes = max_draft_nodes   # per branch and forward (AnswerDrafter); 0 = one token per forward
        self.metadata = dict(metadata or {})
        self.prefix_cache = prefix_cache         # KV of earlier blocks (e.g. toolboxes) that later waves start from

    @classmethod
    def from_adapter(cls, adapter_dir: str | os.PathLike | None = None, *, threads: int | None = None,
                     dtype: str = "fp32", max_new_tokens: int = 48, merge: bool = True,
                     max_draft_nodes: int = 6) -> Sidecar:
        """Load ``adapter_dir`` (default :func:`~ooospec.runtime.paths.sidecar_adapter_dir`) on its base model.

        The base is the metadata's ``base`` (a registry name or a local folder) when this machine has it, else
        its Hub id (``base_model_id``). Another engine, or the faster one here:
        :func:`~ooospec.runtime.sidecar.engines.load_sidecar`.
        """
        from peft import PeftModel
        from transformers import AutoTokenizer

        from ooospec.runtime.backends.models import REGISTRY, load_target

        adapter_dir = sidecar_adapter_dir(adapter_dir)
        meta = sp.read_metadata(adapter_dir)
        base = meta.get("base") or ""
        if base not in REGISTRY and not Path(base).exists():   # trained elsewhere: the Hub id
            base = meta.get("base_model_id") or base
        model, _ = load_target(base, dtype=dtype, threads=threads)
        model = PeftModel.from_pretrained(model, str(adapter_dir))
        if merge:
            model = model.merge_and_unload()
        tok = AutoTokenizer.from_pretrained(str(adapter_dir))
        return cls(model.eval(), tok, max_new_tokens=max_new_tokens, metadata=meta, max_draft_nodes=max_draft_nodes)

    @property
    def layout(self) -> int:
        """The prompt layout this sidecar's adapter learned (its metadata's ``layout_version``; default
        :data:`~ooospec.runtime.sidecar.prompts.LAYOUT_VERSION` without one, e.g. an untrained base)."""
        layout = self.metadata.get("layout_version")
        return sp.LAYOUT_VERSION if layout is None else sp.check_layout(layout)

    @property
    def eos_token_ids(self) -> list[int]:
        return [self.tokenizer.eos_token_id]

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @property
    def threads(self) -> int:
        return torch.get_num_threads()

    @property
    def weights(self) -> str:
        """The weights' type as ``/health`` reports it, e.g. ``bfloat16``."""
        return str(next(self.model.parameters()).dtype).removeprefix("torch.")

    def decode(self, block: Sequence[int], queries: Sequence[Sequence[int]], *, max_new_tokens: int,
               should_stop: Callable[[], bool] | None = None, logprobs: int = 0) -> tuple[list[list[int]], dict]:
        """Every query's greedy answer after the block, in one pass (:func:`decode_branches`: its tokens, stats)."""
        return decode_branches(self.model, block, queries, max_new_tokens=max_new_tokens,
                               eos_token_ids=self.eos_token_ids, should_stop=should_stop,
                               propose=self.drafter(block, queries), max_draft_nodes=self.max_draft_nodes,
                               prefix_cache=self.prefix_cache, logprobs=logprobs)

    def cache_info(self) -> dict | None:
        """What this sidecar keeps of earlier blocks (``/health``'s ``prefix_cache``; None: nothing)."""
        return None if self.prefix_cache is None else self.prefix_cache.to_dict()

    def reset_cache(self) -> None:
        """Forget every earlier block (the next wave prefills all of its block)."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def calibrate(self, **wave) -> dict:
        """What a wave costs here, now (:func:`measure_wave_cost`'s synthetic wave, ``wave`` its shape; seconds)."""
        return measure_wave_cost(self.model, vocab_size=self.vocab_size, max_draft_nodes=self.max_draft_nodes,
                                 **wave)

    def prefill(self, block: str) -> int:
        """Compute ``block``'s KV into the prefix cache ahead of a wave (e.g. a toolbox, untimed); returns the
        tokens prefilled (0 without a cache)."""
        if self.prefix_cache is None:
            return 0
        ids = self.tokenizer(block, add_special_tokens=False)["input_ids"]
        _, cached = prefill_block(self.model, ids[:-1], self.prefix_cache)
        return max(len(ids) - 1 - cached, 0)

    def drafter(self, block_ids: Sequence[int], query_ids: Sequence[Sequence[int]]) -> AnswerDrafter | None:
        """The ``propose`` for one wave's :func:`decode_branches` (None when drafts are off)."""
        if not self.max_draft_nodes:
            return None
        return AnswerDrafter(self.tokenizer, block_ids, query_ids, eos_token_id=self.tokenizer.eos_token_id)

    def answer(self, wave: sp.Wave, logprobs: int = 0, max_new_tokens: int | None = None) -> WaveResult:
        """Every query of ``wave`` answered greedily in one pass; ``logprobs`` > 0 adds each answer token's top-k
        (``top_logprobs``: token text -> log-probability); ``max_new_tokens`` caps this wave's answers (default
        the sidecar's)."""
        block, queries = sp.encode_wave(self.tokenizer, wave)
        if not queries:
            return WaveResult([], [], 0.0, 0.0, 0, len(block), 0)
        with torch.no_grad():
            toks, stats = self.decode(block, queries, max_new_tokens=max_new_tokens or self.max_new_tokens,
                                      logprobs=logprobs)
        answers = self.tokenizer.batch_decode(toks, skip_special_tokens=True)
        return WaveResult(toks, answers, stats["prefill_s"], stats["decode_s"], stats["n_forwards"],
                          stats["block_tokens"], stats["query_tokens"], stats["drafted"], stats["accepted"],
                          stats["cached_tokens"], self.logprob_texts(stats.get("top_logprobs")))

    def logprob_texts(self, top: list[list[dict[int, float]]] | None) -> list[list[dict[str, float]]] | None:
        """``top_logprobs`` with token ids as text (what an OpenAI completions response carries)."""
        if top is None:
            return None
        return [[by_text(self.tokenizer, step) for step in q] for q in top]

    def predict(self, messages: Sequence[Any], tools: Sequence[Any], prior_calls: Sequence[Mapping] = (),
                with_direct_call: bool = False) -> tuple[dict | None, WaveResult]:
        """The joined call (see :func:`~ooospec.runtime.sidecar.prompts.join_slots`) and the wave's result (the
        wave built in the adapter's layout)."""
        wave = sp.build_wave(messages, tools, prior_calls, with_direct_call, self.layout)
        result = self.answer(wave)
        return sp.join_answers(tools, wave, result.answers), result
