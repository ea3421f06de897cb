"""The target interface: what the engine, sessions, cost model and bench ask of a target model, and nothing more.

Two backends implement it: :class:`~ooospec.runtime.backends.hf_target.HFTarget` (a transformers causal LM, its cache a
:class:`~ooospec.runtime.backends.kv_cache.KVCache`) and :class:`~ooospec.runtime.backends.llamacpp.LlamaCppTarget` (a
GGUF on llama.cpp, its cache a :class:`~ooospec.runtime.backends.llamacpp_kv.LlamaCppKV`). Everything above them types
against
:class:`Target` and :class:`TargetCache`; :func:`as_target` adapts a transformers model once, at the entry points
that take one (``SpecEngine(model)``, ``Session(model)``), so callers keep passing the model they loaded::

    target = as_target(model)              # HFTarget(model) for a transformers model; a Target as it is
    kv = target.new_kv_cache()             # the one owner of this sequence's KV entries
    kv.prefill(prompt[:-1])
    logits = kv.forward_tree(tree)         # [N, vocab]: one forward over the tree on top of the cache
    kv.commit(accepted.kept_nodes)         # keep the accepted root path, drop the rest

Torch-free at import: the types below are annotations only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from ooospec.runtime.backends.cost_model import Footprint
    from ooospec.runtime.backends.kv_cache import KVSnapshot
    from ooospec.runtime.tree import DraftTree


class TargetCache(Protocol):
    """The KV cache of one sequence on a target; between steps it holds every committed token but the last.

    ``forward_tree`` leaves the tree's entries pending; ``commit`` keeps the accepted root path and drops the rest
    (the only step that changes what is committed besides ``prefill``, ``truncate`` and ``load``).
    """

    model: object          # the model whose forwards fill it; a cache is only valid for that model
    length: int            # committed entries
    pending: int           # entries of the last forward awaiting commit()
    tokens: list[int]      # [length] the token id of each committed entry

    def reset(self) -> None:
        """Drop every entry."""
        ...

    def prefill(self, tokens: Sequence[int]) -> None:
        """Append a chain of committed tokens (no logits)."""
        ...

    def forward_tree(self, tree: DraftTree) -> torch.Tensor:
        """Logits ``[N, vocab]`` of every tree node on top of the cache; the N entries stay pending."""
        ...

    def commit(self, kept_nodes: Sequence[int]) -> None:
        """Keep the pending entries of ``kept_nodes`` (a root path, in order); drop the other pending ones."""
        ...

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` committed entries."""
        ...

    def keep_prefix_of(self, tokens: Sequence[int]) -> int:
        """Keep the longest committed prefix that ``tokens`` start with; returns its length."""
        ...

    def snapshot(self, length: int | None = None) -> KVSnapshot:
        """A copy of the first ``length`` (default all) committed entries."""
        ...

    def load(self, snap: KVSnapshot, length: int | None = None) -> None:
        """Replace the contents with the first ``length`` (default all) entries of ``snap``."""
        ...


class Target(Protocol):
    """A target model as the runtime sees it: a KV cache to verify trees on, and the facts around it."""

    backend: str           # "hf" | "llama.cpp": which stock greedy decoding is its reference
    vocab_size: int        # rows of its logits; drafts outside [0, vocab_size) are dropped
    # optional ``cost_sizes``: the query lengths its forward cost is timed at (cost_model.cost_sizes; default
    # powers of two, where T(n) is smooth between them)

    @property
    def device(self) -> torch.device:
        """Where its logits live."""
        ...

    @property
    def tie_margin(self) -> float:
        """The engine's default tie margin: top-2 margins below it are re-taken by a one-token forward
        (:mod:`ooospec.runtime.verify`); 0 where a tree forward rounds like a one-token forward."""
        ...

    def new_kv_cache(self, persistent: bool = False) -> TargetCache:
        """A new, empty cache of one sequence. ``persistent``: it keeps its entries while other caches of the target
        run (a chat session's); a backend whose caches share one store (llama.cpp) copies them out and back, one
        whose caches are independent (HF) ignores it."""
        ...

    def eos_token_ids(self) -> list[int]:
        """The model's own end-of-generation ids, sorted (the tokenizer's EOS is added by
        :func:`ooospec.runtime.backends.models.eos_token_ids`); may be empty."""
        ...

    def cost_fingerprint(self) -> str:
        """Everything a forward's seconds depend on (model, weights, threads, device, machine): the key of its
        measured :class:`~ooospec.runtime.backends.cost_model.ForwardCost`."""
        ...

    def footprint(self) -> Footprint:
        """Parameter and byte counts for the roofline (:class:`~ooospec.runtime.backends.cost_model.Footprint`)."""
        ...


def as_target(model: Target | PreTrainedModel) -> Target:
    """The :class:`Target` of ``model``: a torch module (a transformers causal LM) wrapped in
    :class:`~ooospec.runtime.backends.hf_target.HFTarget`; a target (``HFTarget``, ``LlamaCppTarget``) as it is."""
    import torch

    from ooospec.runtime.backends.hf_target import HFTarget

    return HFTarget(model) if isinstance(model, torch.nn.Module) else model
