"""Prefix-shared packing: layout, and the packed loss/gradients equal training each slot prompt on its own."""

from __future__ import annotations

import pytest
import torch
from sidecar_tiny import byte_tokenizer, tiny_llama

from ooospec.pipelines.packing import (
    IGNORE,
    PackedCollator,
    pack_request,
    pack_rows,
    packed_forest,
    segment_visibility,
)

BLOCK = "Conversation:\nuser: weather in Paris?\nTools:\n[0] w - weather\n  city (string, required)\n"


def _row(slots):
    return {"id": "r#0", "record_id": "r", "function": "w", "block": BLOCK,
            "slots": [{"form": f, "function": None, "parameter": None, "query": q, "answer": a} for f, q, a in slots]}


ROW = _row([("function_index", "Query: tool index\n", "0"), ("argument", "Query: w.city\n", '"Paris"'),
            ("direct_call", "Query: call\n", '{"name":"w","arguments":{"city":"Paris"}}')])
ROW2 = _row([("function_index", "Query: tool index\n", "0"), ("argument", "Query: w.day\n", "null")])


def test_worked_example_layout():
    tok = byte_tokenizer()
    row = {"id": "x", "block": "ab", "slots": [{"form": "argument", "query": "q", "answer": "a"},
                                               {"form": "argument", "query": "r", "answer": "c"}]}
    (seq,), dropped = pack_request(tok, row, max_len=100)
    a, b, q, r, c, E = (tok.convert_tokens_to_ids(x) for x in ["a", "b", "q", "r", "c", "</s>"])
    assert dropped == 0
    assert seq["input_ids"] == [a, b, q, a, E, r, c, E]
    assert seq["position_ids"] == [0, 1, 2, 3, 4, 2, 3, 4]
    assert seq["segment_ids"] == [0, 0, 1, 1, 1, 2, 2, 2]
    assert seq["labels"] == [IGNORE, IGNORE, IGNORE, a, E, IGNORE, c, E]


def test_visibility_is_block_plus_own_segment_and_padding_sees_itself():
    segs = torch.tensor([[0, 0, 1, 1, 2, 0]])
    valid = torch.tensor([[True, True, True, True, True, False]])
    v = segment_visibility(segs, valid)[0].int().tolist()
    assert v == [[1, 0, 0, 0, 0, 0],
                 [1, 1, 0, 0, 0, 0],
                 [1, 1, 1, 0, 0, 0],
                 [1, 1, 1, 1, 0, 0],
                 [1, 1, 0, 0, 1, 0],
                 [0, 0, 0, 0, 0, 1]]


def test_a_packed_sequence_is_the_waves_forest():
    """Segments are chains after the shared block: the positions and visibility the wave's branches get."""
    forest = packed_forest([0, 0, 1, 1, 1, 2, 2, 2])
    assert forest.num_shared == 2 and [t.num_nodes for t in forest.trees] == [3, 3]
    assert forest.histories == ((), ())
    tok = byte_tokenizer()
    row = {"id": "x", "block": "ab", "slots": [{"form": "argument", "query": "q", "answer": "a"},
                                               {"form": "argument", "query": "r", "answer": "c"}]}
    (seq,), _ = pack_request(tok, row, max_len=100)
    v = segment_visibility(torch.tensor([seq["segment_ids"]]), torch.ones(1, 8, dtype=torch.bool))[0]
    assert seq["position_ids"] == [0, 1, 2, 3, 4, 2, 3, 4]
    assert v.int().tolist() == [[1, 0, 0, 0, 0, 0, 0, 0],
                                [1, 1, 0, 0, 0, 0, 0, 0],
                                [1, 1, 1, 0, 0, 0, 0, 0],
                                [1, 1, 1, 1, 0, 0, 0, 0],
                                [1, 1, 1, 1, 1, 0, 0, 0],
                                [1, 1, 0, 0, 0, 1, 0, 0],
                                [1, 1, 0, 0, 0, 1, 1, 0],
                                [1, 1, 0, 0, 0, 1, 1, 1]]


def test_long_requests_split_into_whole_segments_and_hopeless_slots_are_dropped():
    tok = byte_tokenizer()
    block_len = len(BLOCK.encode())
    seqs, dropped = pack_request(tok, ROW, max_len=block_len + 45)
    assert dropped == 1                              # the direct call cannot fit even alone
    assert len(seqs) == 1 and max(seqs[0]["segment_ids"]) == 2
    seqs, dropped = pack_request(tok, ROW, max_len=block_len + 30)
    assert dropped == 1 and len(seqs) == 2           # index and city each with the block
    assert all(s["input_ids"][:block_len] == seqs[0]["input_ids"][:block_len] for s in seqs)
    _, stats = pack_rows(tok, [ROW, ROW2], max_len=4096)
    assert stats.sequences == 2 and stats.slots == 5 and stats.slots_dropped == 0


def _separate_loss(model, tok, rows):
    """Sum of per-token CE over every slot trained as its own prompt, divided by all label tokens."""
    block = tok(BLOCK, add_special_tokens=False)["input_ids"]
    total, count = 0.0, 0
    for row in rows:
        for s in row["slots"]:
            q = tok(s["query"], add_special_tokens=False)["input_ids"]
            a = tok(s["answer"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            ids = torch.tensor([block + q + a])
            labels = torch.tensor([[IGNORE] * (len(block) + len(q)) + a])
            out = model(input_ids=ids, labels=labels)
            total = total + out.loss * len(a)
            count += len(a)
    return total / count


@pytest.mark.parametrize("label_logits_only", [True, False])
@pytest.mark.parametrize("rows", [[ROW], [ROW, ROW2]], ids=["one", "padded-batch"])
def test_packed_loss_and_gradients_equal_separate_prompts(rows, label_logits_only):
    torch.manual_seed(0)
    tok = byte_tokenizer()
    model = tiny_llama().float().train()
    torch.nn.init.normal_(model.model.embed_tokens.weight, std=0.5)  # non-trivial logits
    seqs, _ = pack_rows(tok, rows, max_len=4096)
    batch = PackedCollator(tok.pad_token_id, torch.float32, label_logits_only)(seqs)
    packed = model(**batch).loss
    packed.backward()
    g_packed = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    separate = _separate_loss(model, tok, rows)
    separate.backward()
    torch.testing.assert_close(packed, separate, rtol=1e-5, atol=1e-6)
    assert g_packed
    for n, p in model.named_parameters():
        torch.testing.assert_close(g_packed[n], p.grad, rtol=1e-5, atol=1e-6, msg=n)
