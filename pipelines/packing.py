"""Prefix-shared packing: one training sequence per request, with the visibility the runtime's wave has.

A request row (``expand_slots``) is a shared block and its slots. Packed, it is ONE sequence::

    [ block ][ query_1 answer_1 EOS ][ query_2 answer_2 EOS ] ...
     seg 0      seg 1                  seg 2

with ``position_ids`` restarting after the block for every segment (``B, B+1, ...``) and a 4D additive mask in
which a segment token sees the block and the earlier tokens of its own segment only -- exactly what one wave
branch sees at inference (:func:`ooospec.runtime.sidecar.decode_branches`). Labels are the answer tokens and EOS;
block and query tokens are ``-100``. The model shifts labels by one inside its loss, and every segment's first
token is an unlabelled query token, so no segment is ever trained to predict the next one.

Tokenization is the runtime's: block and query tokenized apart (:func:`ooospec.runtime.sidecar.encode_wave`),
answers tokenized alone, EOS appended. A request longer than ``max_len`` is split into several sequences, each
with the block and as many whole segments as fit; a slot that cannot fit even alone is dropped (and counted).

Worked example: block ``[b0, b1]``, segments ``[q, a, E]`` and ``[r, c, E]`` pack to
``input_ids = [b0, b1, q, a, E, r, c, E]``, ``position_ids = [0, 1, 2, 3, 4, 2, 3, 4]``,
``segment_ids = [0, 0, 1, 1, 1, 2, 2, 2]``, ``labels = [-100, -100, -100, a, E, -100, c, E]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ooospec.pipelines.slot_rows import row_wave
from ooospec.runtime.sidecar import encode_wave

IGNORE = -100


@dataclass(frozen=True)
class PackStats:
    sequences: int
    slots: int
    slots_dropped: int          # a block + that one slot is longer than max_len
    tokens: int                 # all packed tokens
    label_tokens: int           # answer tokens + EOS (what the loss covers)


def pack_request(tokenizer, row: dict, max_len: int) -> tuple[list[dict], int]:
    """Sequences ``{"input_ids", "labels", "position_ids", "segment_ids"}`` for one request row; and how many of
    its slots were dropped because block + slot exceeds ``max_len``."""
    block, queries = encode_wave(tokenizer, row_wave(row)[0])
    answers = tokenizer([s["answer"] for s in row["slots"]], add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    segments = [(list(q), list(a) + [eos]) for q, a in zip(queries, answers)]
    out, dropped = [], 0
    current: list[tuple[list[int], list[int]]] = []
    used = len(block)

    def flush() -> None:
        if current:
            out.append(_pack(block, current))

    for q, a in segments:
        n = len(q) + len(a)
        if len(block) + n > max_len:
            dropped += 1
            continue
        if used + n > max_len:
            flush()
            current, used = [], len(block)
        current.append((q, a))
        used += n
    flush()
    return out, dropped


def _pack(block: Sequence[int], segments: Sequence[tuple[list[int], list[int]]]) -> dict:
    ids, labels = list(block), [IGNORE] * len(block)
    positions, segs = list(range(len(block))), [0] * len(block)
    for k, (q, a) in enumerate(segments, 1):
        ids += q + a
        labels += [IGNORE] * len(q) + a
        positions += list(range(len(block), len(block) + len(q) + len(a)))
        segs += [k] * (len(q) + len(a))
    return {"input_ids": ids, "labels": labels, "position_ids": positions, "segment_ids": segs}


def pack_rows(tokenizer, rows: Sequence[dict], max_len: int) -> tuple[list[dict], PackStats]:
    """Pack every request row; returns the sequences (row order) and counts."""
    seqs, dropped, slots = [], 0, 0
    for row in rows:
        packed, d = pack_request(tokenizer, row, max_len)
        seqs += packed
        dropped += d
        slots += len(row["slots"])
    stats = PackStats(len(seqs), slots, dropped, sum(len(s["input_ids"]) for s in seqs),
                      sum(sum(t != IGNORE for t in s["labels"]) for s in seqs))
    return seqs, stats


def segment_visibility(segment_ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Bool ``[B, L, L]``: query i sees key j iff ``j <= i``, both are real tokens, and j is in the block (segment
    0) or in i's segment. A padding row sees itself only (a fully hidden row would make softmax NaN)."""
    L = segment_ids.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    block = (segment_ids == 0)[:, None, :]
    visible = causal[None] & (same | block) & valid[:, None, :] & valid[:, :, None]
    return visible | (torch.eye(L, dtype=torch.bool)[None] & ~valid[:, :, None])


class PackedCollator:
    """Pads packed sequences into a batch with the 4D additive mask and ``position_ids`` the model takes as-is.

    ``mask_dtype`` is the dtype of the additive mask (the model's parameter dtype); hidden entries hold that
    dtype's most negative finite value, so a row never becomes all ``-inf``.

    With ``label_logits_only`` (default) the batch also carries ``logits_to_keep`` (bool ``[B, L]``: positions
    whose NEXT token is a label) and ``shift_labels`` (those next tokens, flattened): the model then runs its
    vocabulary projection and cross-entropy on the ~10% of positions that are trained instead of all of them.
    The loss is the same (it is the mean over label tokens either way); ``labels`` stay for the Trainer.
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
        return batch
