"""Prefix-shared packing: one training sequence per request, with the visibility the runtime's wave has.

A request row (``expand_slots``) is a shared block and its slots. Packed, it is ONE sequence::

    [ block ][ query_1 answer_1 EOS ][ query_2 answer_2 EOS ] ...
     seg 0      seg 1                  seg 2

with ``position_ids`` restarting after the block for every segment (``B, B+1, ...``) and a 4D additive mask in
which a segment token sees the block and the earlier tokens of its own segment only -- exactly what one wave
branch sees at inference (:func:`ooospec.runtime.sidecar.wave.decode_branches`). Both come from the structure the wave
decodes with: the sequence is a :class:`~ooospec.runtime.tree.Forest` (:func:`packed_forest`, the block shared,
each segment a chain), whose :func:`~ooospec.runtime.tree.forest_positions` and
:func:`~ooospec.runtime.tree.forest_visibility` give the segments' positions and visibility.

Labels are the answer tokens and EOS; block and query tokens are ``-100``. The model shifts labels by one inside
its loss, and every segment's first token is an unlabelled query token, so no segment is ever trained to predict
the next one.

Tokenization is the contract's (:func:`ooospec.runtime.sidecar.prompts.encode_wave`): block and query tokenized
apart, answers tokenized alone, EOS appended. A request longer than ``max_len`` is split into several sequences, each
with the block and as many whole segments as fit; a slot that cannot fit even alone is dropped (and counted).

Loss weights (optional, recipe ``loss_weight_*``): :func:`slot_weight` gives each slot a weight -- the index
answer and ``null`` argument answers apart from the rest -- and the packed sequence then carries ``label_weights``
(that weight on each of the slot's label tokens, 0 elsewhere). Without weights nothing changes.

Worked example: block ``[b0, b1]``, segments ``[q, a, E]`` and ``[r, c, E]`` pack to
``input_ids = [b0, b1, q, a, E, r, c, E]``, ``position_ids = [0, 1, 2, 3, 4, 2, 3, 4]``,
``segment_ids = [0, 0, 1, 1, 1, 2, 2, 2]``, ``labels = [-100, -100, -100, a, E, -100, c, E]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby

import torch

from ooospec.pipelines.slot_rows import row_wave
from ooospec.runtime.sidecar.prompts import encode_wave
from ooospec.runtime.tree import Forest, chain_tree, forest_positions, forest_visibility

IGNORE = -100


@dataclass(frozen=True)
class PackStats:
    sequences: int
    slots: int
    slots_dropped: int          # a block + that one slot is longer than max_len
    tokens: int                 # all packed tokens
    label_tokens: int           # answer tokens + EOS (what the loss covers)


@dataclass(frozen=True)
class LossWeights:
    """Per-slot loss weights: the function-index answer, ``null`` argument answers; every other slot weighs 1."""

    function_index: float = 1.0
    null: float = 1.0

    @property
    def uniform(self) -> bool:
        return self.function_index == 1.0 and self.null == 1.0


def slot_weight(slot: dict, weights: LossWeights) -> float:
    """The loss weight of one slot's answer tokens (+EOS)."""
    if slot["form"] == "function_index":
        return weights.function_index
    if slot["form"] == "argument" and slot["answer"] == "null":
        return weights.null
    return 1.0


def pack_request(tokenizer, row: dict, max_len: int,
                 weights: LossWeights | None = None) -> tuple[list[dict], int]:
    """Sequences ``{"input_ids", "labels", "position_ids", "segment_ids"}`` (+ ``label_weights`` when ``weights``
    is given) for one request row; and how many of its slots were dropped because block + slot exceeds
    ``max_len``."""
    block, queries = encode_wave(tokenizer, row_wave(row)[0])
    answers = tokenizer([s["answer"] for s in row["slots"]], add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    slot_w = [slot_weight(s, weights) if weights is not None else None for s in row["slots"]]
    segments = [(list(q), list(a) + [eos], w) for q, a, w in zip(queries, answers, slot_w)]
    out, dropped = [], 0
    current: list[tuple[list[int], list[int], float | None]] = []
    used = len(block)

    def flush() -> None:
        if current:
            out.append(_pack(block, current, weighted=weights is not None))

    for q, a, w in segments:
        n = len(q) + len(a)
        if len(block) + n > max_len:
            dropped += 1
            continue
        if used + n > max_len:
            flush()
            current, used = [], len(block)
        current.append((q, a, w))
        used += n
    flush()
    return out, dropped


def _pack(block: Sequence[int], segments: Sequence[tuple[list[int], list[int], float | None]],
          weighted: bool = False) -> dict:
    ids, labels, segs = list(block), [IGNORE] * len(block), [0] * len(block)
    label_weights = [0.0] * len(block)
    for k, (q, a, w) in enumerate(segments, 1):
        ids += q + a
        labels += [IGNORE] * len(q) + a
        label_weights += [0.0] * len(q) + [float(w) if w is not None else 1.0] * len(a)
        segs += [k] * (len(q) + len(a))
    positions = list(range(len(block))) + forest_positions(packed_forest(segs))
    out = {"input_ids": ids, "labels": labels, "position_ids": positions, "segment_ids": segs}
    if weighted:
        out["label_weights"] = label_weights
    return out


def pack_rows(tokenizer, rows: Sequence[dict], max_len: int,
              weights: LossWeights | None = None) -> tuple[list[dict], PackStats]:
    """Pack every request row; returns the sequences (row order) and counts. ``weights`` (non-uniform) adds
    ``label_weights`` to every sequence."""
    if weights is not None and weights.uniform:
        weights = None
    seqs, dropped, slots = [], 0, 0
    for row in rows:
        packed, d = pack_request(tokenizer, row, max_len, weights)
        seqs += packed
        dropped += d
        slots += len(row["slots"])
    stats = PackStats(len(seqs), slots, dropped, sum(len(s["input_ids"]) for s in seqs),
                      sum(sum(t != IGNORE for t in s["labels"]) for s in seqs))
    return seqs, stats


def packed_forest(segment_ids: Sequence[int]) -> Forest:
    """One packed sequence as the wave's forest: segment 0 (the block) shared, every later segment a chain fed
    right after it, with no history. Its nodes carry token 0: positions and visibility do not depend on tokens.

    ``[0, 0, 1, 1, 1, 2, 2, 2]`` -> ``Forest(2, (3-node chain, 3-node chain), ((), ()))``, whose positions are
    ``[2, 3, 4, 2, 3, 4]``.
    """
    runs = [(k, sum(1 for _ in run)) for k, run in groupby(segment_ids)]
    num_block = runs[0][1] if runs and runs[0][0] == 0 else 0
    lengths = [n for k, n in runs if k]
    assert [k for k, _ in runs if k] == list(range(1, len(lengths) + 1)), f"segments out of order: {runs[:10]}"
    return Forest(num_block, tuple(chain_tree([0] * n) for n in lengths), ((),) * len(lengths))


def packed_visibility(segment_ids: Sequence[int]) -> torch.Tensor:
    """Bool ``[T, T]`` of one packed sequence: the block causal, then :func:`~ooospec.runtime.tree.forest_visibility`
    of its :func:`packed_forest` (a segment token sees the block and its own segment's earlier tokens)."""
    forest = packed_forest(segment_ids)
    b = forest.num_shared
    block_rows = torch.zeros(b, b + forest.num_nodes, dtype=torch.bool)
    block_rows[:, :b] = torch.ones(b, b, dtype=torch.bool).tril()
    return torch.cat([block_rows, forest_visibility(forest, b)])


def segment_visibility(segment_ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Bool ``[B, L, L]``: each row's :func:`packed_visibility` over its real tokens (a prefix, ``valid``); a
    padding row sees itself only (a fully hidden row would make softmax NaN)."""
    batch, length = segment_ids.shape
    visible = torch.eye(length, dtype=torch.bool).repeat(batch, 1, 1)
    for r in range(batch):
        n = int(valid[r].sum())
        assert bool(valid[r, :n].all()), "padding must follow the real tokens"
        visible[r, :n, :n] = packed_visibility(segment_ids[r, :n].tolist())
    return visible


class PackedCollator:
    """Pads packed sequences into a batch with the 4D additive mask and ``position_ids`` the model takes as-is.

    ``mask_dtype`` is the dtype of the additive mask (the model's parameter dtype); hidden entries hold that
    dtype's most negative finite value, so a row never becomes all ``-inf``.

    With ``label_logits_only`` (default) the batch also carries ``logits_to_keep`` (bool ``[B, L]``: positions
    whose NEXT token is a label) and ``shift_labels`` (those next tokens, flattened): the model then runs its
    vocabulary projection and cross-entropy on the ~10% of positions that are trained instead of all of them.
    The loss is the same (it is the mean over label tokens either way); ``labels`` stay for the Trainer.
    Sequences with ``label_weights`` add ``label_weights`` aligned with ``shift_labels`` (needs ``label_logits_only``;
    :class:`~ooospec.pipelines.train_sidecar.WeightedLossTrainer` consumes it).
    """

    def __init__(self, pad_token_id: int, mask_dtype: torch.dtype = torch.float32, label_logits_only: bool = True):
        self.pad_token_id = pad_token_id
        self.mask_dtype = mask_dtype
        self.label_logits_only = label_logits_only

    def __call__(self, features: Sequence[dict]) -> dict[str, torch.Tensor]:
        L = max(len(f["input_ids"]) for f in features)

        def pad(key: str, value: int) -> torch.Tensor:
            return torch.tensor([list(f[key]) + [value] * (L - len(f[key])) for f in features], dtype=torch.long)

        segs = pad("segment_ids", -1)
        valid = segs >= 0
        visible = segment_visibility(segs.clamp_min(0), valid)
        mask = torch.zeros(visible.shape, dtype=self.mask_dtype)
        mask.masked_fill_(~visible, torch.finfo(self.mask_dtype).min)
        labels = pad("labels", IGNORE)
        batch = {"input_ids": pad("input_ids", self.pad_token_id), "labels": labels,
                 "position_ids": pad("position_ids", 0), "attention_mask": mask[:, None]}
        if self.label_logits_only:
            next_labels = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=IGNORE)
            keep = next_labels != IGNORE
            batch["logits_to_keep"] = keep
            batch["shift_labels"] = next_labels[keep]
        if "label_weights" in features[0]:
            if not self.label_logits_only:
                raise ValueError("label_weights need label_logits_only=True (weights align with shift_labels)")
            w = torch.tensor([list(f["label_weights"]) + [0.0] * (L - len(f["label_weights"])) for f in features])
            next_w = torch.nn.functional.pad(w[:, 1:], (0, 1), value=0.0)
            batch["label_weights"] = next_w[keep]
        return batch
