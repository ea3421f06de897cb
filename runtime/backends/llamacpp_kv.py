"""The KV cache of one sequence on a llama.cpp target: a draft tree as one multi-sequence batch.

How a tree becomes one llama.cpp batch (the scheme of llama.cpp's own tree-speculative example): every leaf of
the tree is a sequence id; a node carries the ids of all leaves below it, so its KV cell belongs to every
root-to-leaf path through it. llama.cpp masks a query by its *first* sequence id and position: node ``i`` (first
id = a leaf ``s`` below it) sees the cells of ``s`` at positions ``<= pos(i)``: the committed prefix and exactly
``i``'s ancestors. The KV cache is *unified* (one buffer; a cell holds a set of sequence ids), so a cell shared
by several paths is stored once.

Invariant between steps: the committed cells (prompt + accepted tokens but the last) belong to sequences
``0 .. n_seq - 1`` (``n_seq`` grows to the widest tree seen, up to ``max_leaves``). After a forward, ``commit``
keeps the accepted path: the path's cells are exactly the cells of a leaf ``s`` below its last node at
positions ``< length + len(path)``; every other sequence drops the tree's cells (``llama_memory_seq_rm``) and
gets the path back (``llama_memory_seq_cp``, which adds a sequence id to existing cells: no KV is copied).

One context per target. A llama.cpp context holds one physical KV store, so only one :class:`LlamaCppKV` of a
target can hold entries at a time: a cache used after another one took the context finds itself empty (its
tokens are dropped and re-prefilled by the engine's ``keep_prefix_of``), which costs time, never correctness.
A *persistent* cache (``target.new_kv_cache(persistent=True)``: a chat session's) is parked instead: its
committed cells are copied out (``llama_state_seq_get_data``) before the other cache clears the context, and
copied back on its next use, so interleaved conversations each keep their KV (a copy of its bytes per switch).

Snapshots (the prefix cache's and a session's fork, :mod:`ooospec.runtime.agent.session`) are the same copies:
:meth:`LlamaCppKV.snapshot` copies a prefix of the committed cells out through a spare sequence id
(``max_leaves - 1``, never a tree's while the widest tree leaves it free), :meth:`LlamaCppKV.load` puts them
back as sequence 0 (``llama_state_seq_set_data``). The cells keep their ids and positions, so a restored cache
computes what a prefill of the same tokens computes, up to the accumulation order of cells placed elsewhere
in the buffer (the same order effect as a tree's rejected siblings leave; below the tie margin).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ooospec.runtime.tokens import common_prefix_len

if TYPE_CHECKING:
    import torch

    from ooospec.runtime.backends.llamacpp import LlamaCppTarget
    from ooospec.runtime.tree import DraftTree


def leaf_seqs(tree: DraftTree) -> tuple[list[list[int]], int]:
    """Sequence ids per node: the index of every leaf below it (its own if it is a leaf), and the leaf count.

    Worked example: ``root -> a -> {b, c}``, ``root -> d`` (nodes 0..4 = root, a, b, c, d): leaves b, c, d get ids
    0, 1, 2; node a carries [0, 1], the root [0, 1, 2]. A node's first id is the leaf its query is masked by.
    """
    n = tree.num_nodes
    has_child = [False] * n
    for i in range(1, n):
        has_child[tree.parents[i]] = True
    seqs: list[list[int]] = [[] for _ in range(n)]
    leaf = 0
    for i in range(n):
        if not has_child[i]:
            node = i
            while node >= 0:
                seqs[node].append(leaf)
                node = tree.parents[node]
            leaf += 1
    return seqs, leaf


@dataclass(frozen=True, eq=False)
class LlamaCppSnapshot:
    """A copy of the first ``len(tokens)`` committed entries of a :class:`LlamaCppKV`: the cells llama.cpp copied
    out of one sequence (``data``; it may hold cells past ``tokens``, which :meth:`LlamaCppKV.load` drops), valid
    for ``target`` only. Never modified once made, so parked caches and snapshots may share one buffer."""

    tokens: tuple[int, ...]
    data: ctypes.Array | None       # None: no cells
    target: LlamaCppTarget

    @property
    def nbytes(self) -> int:
        return 0 if self.data is None else len(self.data)


class LlamaCppKV:
    """The KV cache of one sequence on a :class:`~ooospec.runtime.backends.llamacpp.LlamaCppTarget` (a
    :class:`~ooospec.runtime.backends.target.TargetCache`); ``persistent``: parked, not dropped, when another cache
    takes the context. See the module docstring."""

    def __init__(self, model: LlamaCppTarget, persistent: bool = False):
        self.model = model
        self.persistent = persistent
        self._parked: LlamaCppSnapshot | None = None   # a persistent cache's cells while another holds the context
        self._empty()

    def _empty(self) -> None:
        self.length = self.pending = 0
        self.tokens: list[int] = []
        self._pending_tokens: list[int] = []
        self._pending_seqs: list[list[int]] = []
        self._n_seq = 1   # sequences 0..n_seq-1 hold the committed cells

    def _own(self) -> None:
        """Take the context: park the cache that holds it if it is persistent, then start from this cache's parked
        cells, or empty when another cache used the context since (its entries are gone)."""
        if self.model.owner is self:
            return
        previous = self.model.owner
        if previous is not None and previous.persistent:
            previous._park()
        self.model.clear()
        self.model.owner = self
        self._empty()
        parked, self._parked = self._parked, None
        if parked is not None:
            self._restore(parked, len(parked.tokens))

    def _park(self) -> None:
        """Copy the committed cells out before another cache clears the context (an unfinished forward: none)."""
        self._parked = self._save(self.length) if self.length and not self.pending else None

    def _require_committed(self, what: str) -> None:
        if self.pending:
            raise RuntimeError(f"{what}() called with an uncommitted forward; call commit() first")

    def reset(self) -> None:
        self._parked = None
        self._own()
        self.model.clear()
        self._empty()

    @property
    def nbytes(self) -> int:
        return self.model.shape.kv_bytes_per_token * self.length

    def truncate(self, length: int) -> None:
        self._own()
        self._require_committed("truncate")
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} entries to {length}")
        if length == self.length:
            return
        for s in range(self._n_seq):
            self.model.seq_rm(s, length, -1)
        self.length = length
        del self.tokens[length:]

    def keep_prefix_of(self, tokens: Sequence[int]) -> int:
        self._own()
        kept = common_prefix_len(self.tokens, tokens)
        self.truncate(kept)
        return kept

    def snapshot(self, length: int | None = None) -> LlamaCppSnapshot:
        """A copy of the first ``length`` (default all) committed entries. A parked cache's shares its parked
        buffer (the context is not touched); a cache whose entries were dropped gives an empty one."""
        length = self.length if length is None else int(length)
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot snapshot {length} entries of a cache of {self.length}")
        if self.model.owner is not self:
            parked = self._parked
            if parked is None:
                return LlamaCppSnapshot((), None, self.model)
            return LlamaCppSnapshot(parked.tokens[:length], parked.data, self.model)
        self._require_committed("snapshot")
        return self._save(length)

    def load(self, snap: LlamaCppSnapshot, length: int | None = None) -> None:
        """Replace the contents with the first ``length`` (default all) entries of ``snap``."""
        if getattr(snap, "target", None) is not self.model:
            raise ValueError("the snapshot is not of this target's cache; a KV snapshot is only valid for its model")
        n = len(snap.tokens) if length is None else int(length)
        if not 0 <= n <= len(snap.tokens):
            raise ValueError(f"cannot load {n} entries of a snapshot of {len(snap.tokens)}")
        self.reset()
        self._restore(snap, n)

    def _save(self, length: int) -> LlamaCppSnapshot:
        """The first ``length`` committed cells copied out of the context (which this cache holds): through the
        spare sequence id when that is a strict prefix and the id is free, else every committed cell."""
        if length == 0:
            return LlamaCppSnapshot((), None, self.model)
        spare = self.model.max_leaves - 1
        if length < self.length and self._n_seq <= spare:
            self.model.seq_cp(0, spare, 0, length)
            try:
                data = self.model.seq_state(spare)
            finally:
                self.model.seq_rm(spare, -1, -1)
        else:
            data = self.model.seq_state(0)
        return LlamaCppSnapshot(tuple(self.tokens[:length]), data, self.model)

    def _restore(self, snap: LlamaCppSnapshot, n: int) -> None:
        """Put the first ``n`` entries of ``snap`` into the emptied context as the committed cells."""
        if n:
            self.model.set_seq_state(snap.data, 0)
            self.model.seq_rm(0, n, -1)
        self.tokens, self.length = list(snap.tokens[:n]), n

    def prefill(self, tokens: Sequence[int]) -> None:
        """Append committed tokens in chunks of ``n_batch`` (no logits are computed)."""
        self._own()
        self._require_committed("prefill")
        tokens = [int(t) for t in tokens]
        if self.length + len(tokens) + 1 > self.model.n_ctx:
            raise ValueError(f"prompt of {self.length + len(tokens) + 1} tokens does not fit n_ctx={self.model.n_ctx}")
        seqs = list(range(self._n_seq))
        step = self.model.n_batch
        for start in range(0, len(tokens), step):
            chunk = tokens[start:start + step]
            pos = range(self.length, self.length + len(chunk))
            self.model.decode(chunk, pos, [seqs] * len(chunk), [False] * len(chunk))
            self.length += len(chunk)
            self.tokens.extend(chunk)

    def forward_tree(self, tree: DraftTree) -> torch.Tensor:
        """Logits ``[N, vocab]`` (float32) of every tree node on top of the cache; entries pending until commit."""
        self._own()
        if self.pending:
            raise RuntimeError("forward_tree() called twice without commit()")
        seqs, n_leaves = leaf_seqs(tree)
        if n_leaves > self.model.max_leaves:
            raise ValueError(f"a tree with {n_leaves} leaves exceeds max_leaves={self.model.max_leaves}")
        if self.length + tree.max_depth + 1 > self.model.n_ctx:
            raise ValueError(f"context full: {self.length} cached + a tree of depth {tree.max_depth} > "
                             f"n_ctx={self.model.n_ctx}")
        for s in range(self._n_seq, n_leaves):   # every path needs the committed prefix
            self.model.seq_cp(0, s)
        self._n_seq = max(self._n_seq, n_leaves)
        positions = [self.length + d for d in tree.depths]
        self.model.decode(list(tree.tokens), positions, seqs, [True] * tree.num_nodes)
        self.pending = tree.num_nodes
        self._pending_tokens = list(tree.tokens)
        self._pending_seqs = seqs
        return self.model.logits(tree.num_nodes)

    def commit(self, kept_nodes: Sequence[int]) -> None:
        """Keep the pending cells of ``kept_nodes`` (a root path, in order) in every sequence; drop the rest."""
        if self.model.owner is not self:
            raise RuntimeError("commit() on a cache whose context was taken by another cache")
        kept = list(kept_nodes)
        if len(kept) > self.pending:
            raise ValueError(f"cannot keep {len(kept)} nodes from a forward of {self.pending}")
        start, end = self.length, self.length + len(kept)
        tree_seqs = sorted({s for ids in self._pending_seqs for s in ids})
        if not kept:
            for s in tree_seqs:
                self.model.seq_rm(s, start, -1)
        else:
            keep_seq = self._pending_seqs[kept[-1]][0]   # a leaf below the last kept node: its path is `kept`
            for s in tree_seqs:
                if s != keep_seq:
                    self.model.seq_rm(s, start, -1)
            self.model.seq_rm(keep_seq, end, -1)
            for s in range(self._n_seq):
                if s != keep_seq:
                    self.model.seq_cp(keep_seq, s, start, end)
        self.tokens.extend(self._pending_tokens[i] for i in kept)
        self.length, self.pending = end, 0
        self._pending_tokens, self._pending_seqs = [], []
