"""The transformers backend's KV cache: the single owner of a target's KV entries (prefill, tree forwards,
compaction to the accepted path). Its :class:`~ooospec.runtime.backends.target.Target` is
:class:`~ooospec.runtime.backends.hf_target.HFTarget`.

Works on stock transformers 5.x causal LMs (no forked modeling code). Every forward passes
``input_ids``, explicit ``position_ids``, a **float additive 4D mask** ``[1, 1, q, kv]`` (0 / -inf) and
``cache=`` (transformers 5.24 renamed ``past_key_values=``; the old name is deprecated); the one exception is a
root-only forward (one-token decoding) or a prefill from an empty cache: where the mask would be plain causal
attention they pass none, so they run the same sdpa kernels as HF decoding and prefill. Models whose config has
``layer_types`` (Qwen2/3, Gemma 3, ...) get a dict ``{layer_type: mask}``, which their forward uses as-is; a
``"sliding_attention"`` entry honours ``config.sliding_window``. Other models (Llama, Mistral) get one tensor,
windowed by ``config.sliding_window`` when they have one. That dispatch is :func:`attention_windows`, the
only model-family knowledge in the runtime.

The model must use ``attn_implementation="sdpa"`` (recommended on CPU) or ``"eager"``: flash-attention ignores
custom 4D masks. Load it like::

    model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16, attn_implementation="sdpa").eval()

Cache layout and invariant
--------------------------
The cache is a plain ``DynamicCache()`` (no config), so every layer is a ``DynamicLayer`` holding keys/values
``[1, kv_heads, length, head_dim]`` for *all* past positions, sliding layers included; the sliding window is
enforced by the mask, which keeps compaction a plain index operation on every layer.
Between steps the cache holds exactly the committed tokens except the last one (the next tree root), so
``length == len(committed) - 1``. ``tokens`` keeps the id of every committed entry, so a cache says which token
prefix it holds: a later request whose prompt starts with those ids continues from it (:meth:`keep_prefix_of`
drops what differs, :meth:`truncate` cuts back to a length), and :meth:`snapshot` / :meth:`load` copy a prefix
out and back in (a conversation's session, the shared system + tools block, :mod:`ooospec.runtime.agent.session`).
Cutting is a plain slice on every layer, sliding layers included, for the same reason compaction is.

One step::

    kv = KVCache(model)
    kv.prefill(prompt[:-1])                  # length = P - 1
    logits = kv.forward_tree(tree)           # [N, vocab]; cache now has length + N entries (pending)
    kv.commit(accepted.kept_nodes)           # keep the accepted root path, drop the rest: O(layers) ops

Continuing a conversation::

    kept = kv.keep_prefix_of(new_prompt[:-1])   # e.g. 812 of 812 cached entries still match the new prompt
    kv.prefill(new_prompt[kept:-1])             # only the new tokens
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import DynamicCache

from ooospec.runtime.tokens import common_prefix_len
from ooospec.runtime.tree import DraftTree, causal_mask, tree_mask, tree_positions, visibility_mask

SUPPORTED_ATTENTION = ("sdpa", "eager")


def attention_windows(config) -> dict[str | None, int | None]:
    """Which masks a model's forward wants, as ``{layer_type: sliding_window or None}``.

    The key ``None`` means "one tensor for every layer". Examples: Llama -> ``{None: None}``; Mistral v0.1 ->
    ``{None: 4096}``; Qwen2 (no sliding) -> ``{"full_attention": None}``; Gemma 3 ->
    ``{"full_attention": None, "sliding_attention": config.sliding_window}``.
    """
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:
        return {None: getattr(config, "sliding_window", None)}
    windows: dict[str | None, int | None] = {}
    for layer_type in sorted(set(layer_types)):
        if layer_type == "full_attention":
            windows[layer_type] = None
        elif layer_type == "sliding_attention":
            windows[layer_type] = config.sliding_window
        else:
            raise ValueError(
                f"{type(config).__name__}: layer type {layer_type!r} is not supported by the tree verifier "
                "(supported: full_attention, sliding_attention)"
            )
    return windows


@dataclass(frozen=True)
class KVSnapshot:
    """A copy of the first ``len(tokens)`` entries of a cache: per layer ``(keys, values)``, each
    ``[1, kv_heads, len(tokens), head_dim]``; made by :meth:`KVCache.snapshot`, restored by :meth:`KVCache.load`."""

    tokens: tuple[int, ...]
    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


def decoder_of(model) -> torch.nn.Module | None:
    """The decoder stack under a causal LM's head (``model.base_model``), or None when the model has none.

    A prefill needs the KV entries only, so it runs the decoder and skips the head. Asking the whole model for
    ``logits_to_keep=1`` instead is not free: HF slices the last row as a ``[1, 1, hidden]`` view that
    ``matmul`` cannot fold, so it multiplies by an expanded, transposed copy of the whole head (``[1, hidden,
    vocab]``, the size of the embedding matrix); on a short SmolLM2-135M prefill that copy took longer than the
    whole decoder.
    """
    if not isinstance(model, PreTrainedModel):   # e.g. a peft model: its base_model is no PreTrainedModel either
        return None
    inner = model.base_model
    return inner if inner is not model and isinstance(inner, PreTrainedModel) else None


class KVCache:
    """KV cache of one sequence (batch 1) for tree verification. See the module docstring."""

    def __init__(self, model: PreTrainedModel):
        impl = model.config._attn_implementation
        if impl not in SUPPORTED_ATTENTION:
            raise ValueError(
                f"attn_implementation={impl!r} ignores custom 4D masks; load the model with "
                f"attn_implementation in {SUPPORTED_ATTENTION}"
            )
        self.model = model
        self.decoder = decoder_of(model)
        self.windows = attention_windows(model.config.get_text_config())
        self.cache = DynamicCache()
        self.length = 0      # committed entries
        self.pending = 0     # entries appended by the last forward_tree, awaiting commit()
        self.tokens: list[int] = []              # [length] the token id of each committed entry, in cache order
        self._pending_tokens: list[int] = []     # [pending]

    @property
    def device(self) -> torch.device:
        return self.model.device

    def reset(self) -> None:
        self.cache = DynamicCache()
        self.length = self.pending = 0
        self.tokens, self._pending_tokens = [], []

    @property
    def nbytes(self) -> int:
        """Bytes held by the keys and values of every layer."""
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in self.cache.layers if layer.is_initialized)

    def _require_committed(self, what: str) -> None:
        if self.pending:
            raise RuntimeError(f"{what}() called with an uncommitted forward; call commit() first")

    @torch.inference_mode()
    def truncate(self, length: int) -> None:
        """Keep the first ``length`` committed entries (``0 <= length <= self.length``); a slice per layer."""
        self._require_committed("truncate")
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} entries to {length}")
        if length == self.length:
            return
        for layer in self.cache.layers:
            if layer.is_initialized:
                layer.keys = layer.keys[:, :, :length]
                layer.values = layer.values[:, :, :length]
        self.length = length
        del self.tokens[length:]

    def keep_prefix_of(self, tokens: Sequence[int]) -> int:
        """Keep the longest cached prefix that ``tokens`` start with, drop the rest; returns its length.

        Cached ``[5, 6, 7, 8]`` and ``tokens = [5, 6, 9]`` keep ``[5, 6]`` and return 2: entries computed for the
        same ids at the same positions over the same prefix are exactly what a prefill of ``tokens`` computes.
        """
        kept = common_prefix_len(self.tokens, tokens)
        self.truncate(kept)
        return kept

    @torch.inference_mode()
    def snapshot(self, length: int | None = None) -> KVSnapshot:
        """A copy of the first ``length`` (default all) committed entries."""
        self._require_committed("snapshot")
        length = self.length if length is None else length
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot snapshot {length} entries of a cache of {self.length}")
        layers = tuple((layer.keys[:, :, :length].clone(), layer.values[:, :, :length].clone())
                       for layer in self.cache.layers if layer.is_initialized)
        return KVSnapshot(tuple(self.tokens[:length]), layers)

    @torch.inference_mode()
    def load(self, snap: KVSnapshot, length: int | None = None) -> None:
        """Replace the contents with a copy of the first ``length`` (default all) entries of ``snap`` (the snapshot
        stays usable for other caches)."""
        length = len(snap.tokens) if length is None else length
        if not 0 <= length <= len(snap.tokens):
            raise ValueError(f"cannot load {length} entries of a snapshot of {len(snap.tokens)}")
        self.reset()
        if length == 0:
            return
        for i, (keys, values) in enumerate(snap.layers):
            self.cache.update(keys[:, :, :length].clone(), values[:, :, :length].clone(), i)
        self.length = length
        self.tokens = list(snap.tokens[:length])

    def _masks(self, build: Callable[[int | None], torch.Tensor | None]):
        if None in self.windows:
            return build(self.windows[None])
        by_window = {w: build(w) for w in set(self.windows.values())}
        return {layer_type: by_window[w] for layer_type, w in self.windows.items()}

    @torch.inference_mode()
    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, masks, logits_to_keep: int | None):
        """One forward on top of the cache; ``logits_to_keep=None``: the KV entries only, no logits (None)."""
        kwargs = {"input_ids": input_ids, "position_ids": position_ids, "attention_mask": masks,
                  "cache": self.cache, "use_cache": True}
        if logits_to_keep is None:
            if self.decoder is not None:
                self.decoder(**kwargs)
                return None
            logits_to_keep = 1
        return self.model(**kwargs, logits_to_keep=logits_to_keep).logits[0]

    def prefill(self, tokens: Sequence[int]) -> None:
        """Append a chain of committed tokens (normally ``prompt[:-1]``); computes no logits worth keeping."""
        self._require_committed("prefill")
        if not tokens:
            return
        q, dtype, dev, length = len(tokens), self.model.dtype, self.device, self.length

        def build(window: int | None) -> torch.Tensor | None:
            if length == 0 and (window is None or q <= window):
                return None   # plain causal attention from scratch: sdpa's is_causal kernel, as in HF prefill
            return causal_mask(q, length, dtype, dev, window)

        masks = self._masks(build)
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=dev)
        pos = torch.arange(self.length, self.length + q, device=dev).unsqueeze(0)
        self._forward(ids, pos, masks, logits_to_keep=None)   # no logits: skip the lm_head
        self.length += q
        self.tokens.extend(int(t) for t in tokens)

    def forward_tree(self, tree: DraftTree) -> torch.Tensor:
        """Run the target over every tree node on top of the cache. Returns logits ``[N, vocab]``.

        The N new entries stay in the cache as pending until :meth:`commit`.
        """
        if self.pending:
            raise RuntimeError("forward_tree() called twice without commit()")
        dtype, dev, length = self.model.dtype, self.device, self.length

        def build(window: int | None) -> torch.Tensor | None:
            if tree.num_nodes == 1 and (window is None or length < window):
                # A lone root sees the whole cache: no mask, so sdpa takes the same unmasked (native-GQA) kernel
                # as HF one-token decoding instead of repeating the KV heads to apply an all-zero mask.
                return None
            return tree_mask(tree, length, dtype, dev, window)

        masks = self._masks(build)
        ids = torch.tensor([tree.tokens], dtype=torch.long, device=dev)
        logits = self._forward(ids, tree_positions(tree, self.length, dev), masks, logits_to_keep=0)
        self.pending = tree.num_nodes
        self._pending_tokens = list(tree.tokens)
        return logits

    def forward_masked(self, tokens: Sequence[int], positions: torch.Tensor, visible: torch.Tensor,
                       key_positions: torch.Tensor | None = None) -> torch.Tensor:
        """Run ``tokens`` on top of the cache with an explicit visibility; returns logits ``[q, vocab]``.

        ``positions`` ``[q]`` are their position ids, ``visible`` bool ``[q, length + q]`` says which cache entries
        and which of the new tokens each new token attends to, ``key_positions`` ``[length + q]`` are the position
        ids of every key (needed only for sliding-window layers). The new entries stay pending until
        :meth:`commit`; ``commit(range(q))`` keeps them all (a forest of branches, e.g. the sidecar's wave).
        """
        if self.pending:
            raise RuntimeError("forward_masked() called with an uncommitted forward; call commit() first")
        q, dev = len(tokens), self.device
        if tuple(visible.shape) != (q, self.length + q):
            raise ValueError(f"visible must be [{q}, {self.length + q}], got {tuple(visible.shape)}")
        positions = positions.to(dev)
        if key_positions is None:
            if any(w is not None for w in self.windows.values()):
                raise ValueError("key_positions are needed for a model with sliding-window layers")
            key_positions = torch.zeros(self.length + q, dtype=torch.long, device=dev)

        def build(window: int | None) -> torch.Tensor:
            return visibility_mask(visible.to(dev), positions, key_positions.to(dev), self.model.dtype, window)

        ids = torch.tensor([list(tokens)], dtype=torch.long, device=dev)
        logits = self._forward(ids, positions.unsqueeze(0), self._masks(build), logits_to_keep=0)
        self.pending = q
        self._pending_tokens = [int(t) for t in tokens]
        return logits

    @torch.inference_mode()  # the cache tensors are inference tensors; in-place writes need the same mode
    def commit(self, kept_nodes: Sequence[int]) -> None:
        """Keep the pending entries of ``kept_nodes`` (a root path, in order) and drop the other pending ones.

        Per layer: one ``index_select`` of the kept rows written to ``[length, length + len(kept))`` and a slice;
        a chain prefix ``[0, 1, .., k-1]`` (AR, or a linear draft) needs only the slice.
        """
        n_keep = len(kept_nodes)
        if n_keep > self.pending:
            raise ValueError(f"cannot keep {n_keep} nodes from a forward of {self.pending}")
        start, end = self.length, self.length + n_keep
        needs_gather = list(kept_nodes) != list(range(n_keep))
        idx = torch.tensor(kept_nodes, dtype=torch.long, device=self.device) + start if needs_gather else None
        for layer in self.cache.layers:
            if not layer.is_initialized:
                continue
            if needs_gather:
                layer.keys[:, :, start:end] = layer.keys.index_select(2, idx)
                layer.values[:, :, start:end] = layer.values.index_select(2, idx)
            layer.keys = layer.keys[:, :, :end]
            layer.values = layer.values[:, :, :end]
        self.tokens.extend(self._pending_tokens[i] for i in kept_nodes)
        self.length, self.pending, self._pending_tokens = end, 0, []
