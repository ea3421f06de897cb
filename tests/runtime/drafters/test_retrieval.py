"""Retrieval drafter: suffix matching against a bank of earlier calls, worked examples written out literally."""

from __future__ import annotations

import json

import pytest

from ooospec.runtime.drafters.base import DraftContext
from ooospec.runtime.drafters.retrieval import CallBank, RetrievalDrafter


def drafter(*seqs, min_match=2, **kw) -> RetrievalDrafter:
    bank = CallBank(min_match=min_match)
    for s in seqs:
        bank.add(s)
    return RetrievalDrafter(bank, **kw)


def test_worked_examples():
    d = drafter([1, 2, 3, 4, 1, 2, 3], num_draft=3)
    assert d.propose_tokens([5, 2, 3]) == [[4, 1, 2]]          # [2, 3] once (the last one has no follower)
    assert d.propose_tokens([9, 4, 1, 2]) == [[3], [3, 4, 1]]  # 3-token match first, then the 2-token one
    assert d.propose_tokens([1, 2, 3, 4, 1, 2]) == [[3], [3, 4, 1]]
    assert d.propose_tokens([7, 8]) == []
    assert d.propose_tokens([2]) == []                          # shorter than min_match

    d = drafter([1, 2, 3, 4, 5], [7, 2, 3, 8], num_draft=4)
    assert d.propose_tokens([9, 2, 3]) == [[8], [4, 5]]         # equal match length: newest sequence first
    assert d.propose_tokens([1, 2, 3]) == [[4, 5], [8]]         # longer match wins over recency

    d = drafter([1, 2, 3, 4, 5, 6, 7], num_draft=2)
    assert d.propose_tokens([0, 1, 2]) == [[3, 4]]              # num_draft caps the candidate


def test_candidates_are_distinct_and_capped():
    d = drafter([0, 1, 2, 5], [9, 1, 2, 5], [1, 2, 6], [1, 2, 7], [1, 2, 8], max_candidates=3, num_draft=2)
    assert d.propose_tokens([3, 1, 2]) == [[8], [7], [6]]
    d = drafter([0, 1, 2, 5], [9, 1, 2, 5], max_candidates=3)
    assert d.propose_tokens([3, 1, 2]) == [[5]]


def test_max_match_bounds_the_ranking():
    d = drafter([1, 2, 3, 4, 10], [0, 3, 4, 11], max_match=2, num_draft=1)
    # [.., 2, 3, 4] matches 3 tokens in the first sequence, but max_match=2 makes them tie; recency decides
    assert d.propose_tokens([1, 2, 3, 4]) == [[11], [10]]


def test_bank_is_bounded_lru_by_count():
    bank = CallBank(capacity=3, min_match=2)
    for k in range(5):
        bank.add([k, 100 + k, 200 + k])
    assert list(bank) == [(2, 102, 202), (3, 103, 203), (4, 104, 204)]
    assert bank.occurrences((0, 100)) == set() and bank.occurrences((1, 101)) == set()  # index cleaned
    bank.add([2, 102, 202])        # re-adding refreshes instead of duplicating
    assert list(bank) == [(3, 103, 203), (4, 104, 204), (2, 102, 202)]
    d = RetrievalDrafter(bank)
    assert d.propose_tokens([3, 103]) == [[203]]  # a used sequence is refreshed too
    bank.add([5, 105, 205])
    assert list(bank) == [(2, 102, 202), (3, 103, 203), (5, 105, 205)]
    with pytest.raises(ValueError, match="capacity"):
        CallBank(capacity=0)


def test_observe_stores_prompt_tail_and_output():
    d = RetrievalDrafter(CallBank(min_match=2), prompt_tail=2, num_draft=3)
    d.observe([50, 51, 90, 91], [7, 8, 9, 10])
    assert list(d.bank) == [(90, 91, 7, 8, 9, 10)]
    # a new request ending with the same assistant header gets the earlier call's start right away
    ctx = DraftContext(tokens=[60, 90, 91], prompt_len=3, step=0)
    assert d.propose(ctx) == [[7, 8, 9]]
    ctx = DraftContext(tokens=[60, 90, 91, 7, 8], prompt_len=3, step=1)
    assert d.propose(ctx) == [[9, 10]]


def test_bank_persists_to_jsonl(tmp_path):
    path = tmp_path / "bank" / "calls.jsonl"
    bank = CallBank(capacity=2, path=path)
    bank.add([1, 2, 3])
    bank.add([4, 5, 6])
    bank.add([7, 8, 9])
    assert [json.loads(line)["tokens"] for line in path.read_text().splitlines()] == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    reloaded = CallBank(capacity=2, path=path)
    assert list(reloaded) == [(4, 5, 6), (7, 8, 9)]
    assert RetrievalDrafter(reloaded).propose_tokens([0, 7, 8]) == [[9]]
    path.write_text('{"tokens": [1, 2, 3]}\n{"toks": [1]}\n')
    with pytest.raises(ValueError, match=r"calls.jsonl:2: not a bank line"):
        CallBank(path=path)
