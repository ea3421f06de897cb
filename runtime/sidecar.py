"""The sidecar's one-pass wave: prefill a request's shared block once, decode every slot answer as a branch.

A wave (:class:`~ooospec.runtime.sidecar_prompts.Wave`) is one shared block and N short queries. Answering it
as N separate prompts costs N prefills of the block; here the block is prefilled ONCE into the KV cache
(:class:`~ooospec.runtime.kv_cache.KVCache`, the runtime's only cache), the N queries go in as one forest
(shared query prefixes merged, like draft-tree nodes), and then every live branch advances per forward, each
seeing the block and its own tokens only: one token, or, with an :class:`AnswerDrafter`, a small draft tree of
its own (values copied from the conversation, a closing quote + EOS) verified greedily in the same forward. The
wave costs one prefill, one forward over the query forest and at most (longest answer) branch forwards. Each
branch ends at EOS or at ``max_new_tokens`` with exactly the tokens greedy decoding of that slot's prompt on its
own gives, drafts or not (``tests/runtime/test_sidecar.py`` checks this on tiny float64 models).

Tokenization is part of the layout: a prompt is ``ids(block) + ids(query)``, tokenized apart
(:func:`encode_wave`), in training (:mod:`ooospec.pipelines.packing`) and here alike.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ooospec.runtime import sidecar_prompts as sp
from ooospec.runtime.kv_cache import KVCache
from ooospec.runtime.paths import sidecar_adapter_dir
from ooospec.runtime.pld import lookup
from ooospec.runtime.tree import ancestor_matrix, build_tree
from ooospec.runtime.verify import accept_greedy

logger = logging.getLogger(__name__)

METADATA_FILE = "sidecar.json"   # written next to the adapter: layout version, base, data/metrics summary


def encode_wave(tokenizer, wave: sp.Wave) -> tuple[list[int], list[list[int]]]:
    """``(block_ids, [query_ids])``: the block and each query tokenized apart, no special tokens."""
    block = tokenizer(wave.block, add_special_tokens=False)["input_ids"]
    queries = tokenizer([q.text for q in wave.queries], add_special_tokens=False)["input_ids"] if wave.queries else []
    return list(block), [list(q) for q in queries]


@dataclass
class WaveResult:
    """One wave's answers and timings."""

    tokens: list[list[int]]     # [n_queries] generated tokens per query (EOS included when it ended on EOS)
    answers: list[str]          # [n_queries] decoded answers (special tokens dropped)
    prefill_s: float            # the block's prefill
    decode_s: float             # the query forest forward + every branch step
    n_forwards: int             # forwards after the prefill
    block_tokens: int
    query_tokens: int           # distinct query-forest nodes fed in the first decode forward
    drafted: int = 0            # draft tokens fed (AnswerDrafter); they change the forwards, never the answers
    accepted: int = 0           # of them, accepted

    @property
    def wave_s(self) -> float:
        return self.prefill_s + self.decode_s


class WaveCancelled(Exception):
    """The caller gave up on the wave (e.g. the client disconnected): decoding stopped early."""


Propose = Callable[[int, Sequence[int]], Sequence[Sequence[int]]]


def decode_branches(model, block_ids: Sequence[int], query_ids: Sequence[Sequence[int]], *,
                    max_new_tokens: int, eos_token_ids: Sequence[int] = (),
                    should_stop: Callable[[], bool] | None = None,
                    propose: Propose | None = None, max_draft_nodes: int = 6) -> tuple[list[list[int]], dict]:
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
    """
    if not block_ids:
        raise ValueError("the shared block is empty")
    if any(len(q) == 0 for q in query_ids):
        raise ValueError("every query needs at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if max_draft_nodes < 0:
        raise ValueError(f"max_draft_nodes must be >= 0, got {max_draft_nodes}")
    eos = frozenset(int(t) for t in eos_token_ids)
    kv = KVCache(model)
    t0 = time.perf_counter()
    kv.prefill(block_ids)
    t1 = time.perf_counter()
    n_block = kv.length

    # the query forest: node i -> (token, parent node or -1, depth); cache entry of node i = n_block + i
    tokens, parents, depths = [], [], []
    children: list[dict[int, int]] = []
    roots: dict[int, int] = {}
    leaves = []
    for q in query_ids:
        node, level = -1, roots
        for tok in q:
            child = level.get(int(tok))
            if child is None:
                child = len(tokens)
                tokens.append(int(tok))
                parents.append(node)
                depths.append(0 if node < 0 else depths[node] + 1)
                children.append({})
                level[int(tok)] = child
            node, level = child, children[child]
        leaves.append(node)
    n = len(tokens)
    if should_stop is not None and should_stop():
        raise WaveCancelled("wave cancelled after the prefill")
    visible = torch.zeros(n, n_block + n, dtype=torch.bool)
    visible[:, :n_block] = True
    for i in range(n):
        j = i
        while j >= 0:
            visible[i, n_block + j] = True
            j = parents[j]
    positions = torch.tensor(depths, dtype=torch.long) + n_block
    key_pos = torch.cat([torch.arange(n_block), positions])
    logits = kv.forward_masked(tokens, positions, visible, key_pos)
    kv.commit(range(n))
    n_forwards = 1

    # one branch per distinct leaf: its first query, its cache path, its next position, its generated tokens
    branch_of_leaf: dict[int, int] = {}
    query_of: list[int] = []
    paths: list[list[int]] = []
    next_pos: list[int] = []
    out: list[list[int]] = []
    for qi, leaf in enumerate(leaves):
        if leaf in branch_of_leaf:
            continue
        branch_of_leaf[leaf] = len(paths)
        query_of.append(qi)
        path, j = [], leaf
        while j >= 0:
            path.append(n_block + j)
            j = parents[j]
        paths.append(path[::-1])
        next_pos.append(n_block + depths[leaf] + 1)
        out.append([int(logits[leaf].argmax())])
    key_pos_list = key_pos.tolist()
    drafted = accepted = 0

    def done(b: int) -> bool:
        return out[b][-1] in eos or len(out[b]) >= max_new_tokens

    live = [b for b in range(len(out)) if not done(b)]
    while live:
        if should_stop is not None and should_stop():
            raise WaveCancelled(f"wave cancelled after {n_forwards} forwards")
        # every live branch feeds a tree rooted at its last token: the root alone without drafts
        trees = []
        for b in live:
            cands = propose(query_of[b], out[b]) if propose is not None and max_draft_nodes else ()
            budget = min(max_draft_nodes, max_new_tokens - len(out[b]) - 1)   # the bonus fills the last slot
            trees.append(build_tree(out[b][-1], cands, budget))
        offsets = [0]
        for t in trees:
            offsets.append(offsets[-1] + t.num_nodes)
        fed = offsets[-1]
        length = kv.length
        visible = torch.zeros(fed, length + fed, dtype=torch.bool)
        visible[:, :n_block] = True
        feed, pos = [], []
        for b, t, off in zip(live, trees, offsets):
            feed += t.tokens
            pos += [next_pos[b] + d for d in t.depths]
            rows = slice(off, off + t.num_nodes)
            visible[rows, paths[b]] = True                                            # its branch so far
            visible[rows, length + off:length + off + t.num_nodes] = ancestor_matrix(t)   # its own tree
        positions = torch.tensor(pos, dtype=torch.long)
        key_pos_list += pos
        logits = kv.forward_masked(feed, positions, visible, torch.tensor(key_pos_list, dtype=torch.long))
        n_forwards += 1
        kept = []
        for b, t, off in zip(live, trees, offsets):
            acc = accept_greedy(t, logits[off:off + t.num_nodes])
            drafted += t.num_nodes - 1
            accepted += len(acc.accepted_tokens)
            for node in acc.path:
                paths[b].append(length + len(kept))
                kept.append(off + node)
            next_pos[b] += len(acc.path)
            for tok in acc.new_tokens:
                if done(b):
                    break
                out[b].append(int(tok))
        kv.commit(kept)
        # the kept entries' key positions, in cache order
        key_pos_list = key_pos_list[:length] + [key_pos_list[length + i] for i in kept]
        live = [b for b in live if not done(b)]
    t2 = time.perf_counter()
    stats = {"prefill_s": t1 - t0, "decode_s": t2 - t1, "n_forwards": n_forwards, "block_tokens": n_block,
             "query_tokens": n, "drafted": drafted, "accepted": accepted}
    return [list(out[branch_of_leaf[leaf]]) for leaf in leaves], stats


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

    Two sources, merged into each branch's draft tree: prompt lookup (:func:`ooospec.runtime.pld.lookup`) in the
    query's own prompt and the answer so far, since argument values are mostly copied from the conversation; and
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


class LayoutMismatch(ValueError):
    """The adapter was trained on another prompt layout than this runtime builds."""


def read_metadata(adapter_dir: str | os.PathLike) -> dict:
    """The adapter's ``sidecar.json``; checks its layout version against :data:`sidecar_prompts.LAYOUT_VERSION`."""
    path = Path(adapter_dir) / METADATA_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{adapter_dir}: no {METADATA_FILE}; is this a sidecar adapter folder "
                                "(made by `python -m ooospec.pipelines.train_sidecar`)?")
    meta = json.loads(path.read_text(encoding="utf-8"))
    found = meta.get("layout_version")
    if found != sp.LAYOUT_VERSION:
        raise LayoutMismatch(
            f"{adapter_dir}: the adapter was trained on sidecar prompt layout {found!r}, but this runtime builds "
            f"layout {sp.LAYOUT_VERSION}; its answers would be meaningless. Retrain it (`dvc repro train_sidecar`) "
            "or use an ooo-spec release that builds that layout.")
    return meta


class Sidecar:
    """A sidecar model (base + merged LoRA) that answers waves. Thread-compatible, not thread-safe."""

    def __init__(self, model, tokenizer, *, max_new_tokens: int = 48, metadata: Mapping | None = None,
                 max_draft_nodes: int = 6):
        if tokenizer.eos_token_id is None:
            raise ValueError("the sidecar tokenizer has no eos_token_id; answers could not stop")
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.max_draft_nodes = max_draft_nodes   # per branch and forward (AnswerDrafter); 0 = one token per forward
        self.metadata = dict(metadata or {})

    @classmethod
    def from_adapter(cls, adapter_dir: str | os.PathLike | None = None, *, threads: int | None = None,
                     dtype: str = "fp32", max_new_tokens: int = 48, merge: bool = True,
                     max_draft_nodes: int = 6) -> Sidecar:
        """Load ``adapter_dir`` (default :func:`~ooospec.runtime.paths.sidecar_adapter_dir`) on its base model.

        The base is the metadata's ``base`` (a registry name or a local folder) when this machine has it, else
        its Hub id (``base_model_id``).
        """
        from peft import PeftModel
        from transformers import AutoTokenizer

        from ooospec.runtime.models import REGISTRY, load_target

        adapter_dir = sidecar_adapter_dir(adapter_dir)
        meta = read_metadata(adapter_dir)
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
    def eos_token_ids(self) -> list[int]:
        return [self.tokenizer.eos_token_id]

    def drafter(self, block_ids: Sequence[int], query_ids: Sequence[Sequence[int]]) -> AnswerDrafter | None:
        """The ``propose`` for one wave's :func:`decode_branches` (None when drafts are off)."""
        if not self.max_draft_nodes:
            return None
        return AnswerDrafter(self.tokenizer, block_ids, query_ids, eos_token_id=self.tokenizer.eos_token_id)

    def answer(self, wave: sp.Wave) -> WaveResult:
        """Every query of ``wave`` answered greedily in one pass."""
        block, queries = encode_wave(self.tokenizer, wave)
        if not queries:
            return WaveResult([], [], 0.0, 0.0, 0, len(block), 0)
        toks, stats = decode_branches(self.model, block, queries, max_new_tokens=self.max_new_tokens,
                                      eos_token_ids=self.eos_token_ids, propose=self.drafter(block, queries),
                                      max_draft_nodes=self.max_draft_nodes)
        answers = self.tokenizer.batch_decode(toks, skip_special_tokens=True)
        return WaveResult(toks, answers, stats["prefill_s"], stats["decode_s"], stats["n_forwards"],
                          stats["block_tokens"], stats["query_tokens"], stats["drafted"], stats["accepted"])

    def predict(self, messages: Sequence[Any], tools: Sequence[Any], prior_calls: Sequence[Mapping] = (),
                with_direct_call: bool = False) -> tuple[dict | None, WaveResult]:
        """The joined call (see :func:`~ooospec.runtime.sidecar_prompts.join_slots`) and the wave's result."""
        wave = sp.build_wave(messages, tools, prior_calls, with_direct_call)
        result = self.answer(wave)
        return join_answers(tools, wave, result.answers), result


def join_answers(tools: Sequence[Any], wave: sp.Wave, answers: Sequence[str]) -> dict | None:
    """:func:`~ooospec.runtime.sidecar_prompts.join_slots` over a wave's answers, in the wave's query order."""
    index_text, direct, args = "", None, {}
    for q, a in zip(wave.queries, answers):
        if q.form == "function_index":
            index_text = a
        elif q.form == "direct_call":
            direct = a
        else:
            args[(q.function, q.parameter)] = a
    return sp.join_slots(tools, index_text, args, direct)
