import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ooospec.runtime.drafters.base import DraftContext
from ooospec.runtime.drafters.pld import PromptLookupDrafter, lookup


def test_docstring_examples():
    assert lookup([1, 2, 3, 4, 2, 3], max_ngram=2, min_ngram=1, num_pred_tokens=3, max_candidates=4) == [[4, 2, 3]]
    assert lookup([7, 1, 8, 5, 1, 9, 1], 2, 1, 3, 4) == [[9, 1], [8, 5, 1]]


def test_longest_ngram_first_and_candidate_cap():
    tokens = [1, 2, 3, 9, 8, 2, 3, 7, 5, 6, 3]
    # suffix [3]: occurrences at 6 (-> 7 5) and 2 (-> 9 8); no earlier [6, 3]
    assert lookup(tokens, 2, 1, 2, 4) == [[7, 5], [9, 8]]
    assert lookup(tokens, 2, 1, 2, 1) == [[7, 5]]
    # with min_ngram=2 the unigram matches are not used
    assert lookup(tokens, 2, 2, 2, 4) == []
    # [2, 3] at the end matches the earlier bigram first, then unigrams add more
    assert lookup([2, 3, 4, 0, 3, 5, 2, 3], 2, 1, 1, 4) == [[4], [5]]


def test_continuation_stops_at_context_end():
    assert lookup([4, 5, 4], 1, 1, 10, 4) == [[5, 4]]
    assert lookup([4], 3, 1, 10, 4) == []
    assert lookup([], 3, 1, 10, 4) == []


def test_drafter_protocol():
    drafter = PromptLookupDrafter(max_ngram=2, num_pred_tokens=3)
    ctx = DraftContext(tokens=(1, 2, 3, 4, 2, 3), prompt_len=4, step=0)
    assert drafter.name == "pld" and drafter.propose(ctx) == [[4, 2, 3]]
    drafter.observe([1, 2], [3])
    with pytest.raises(ValueError, match="min_ngram"):
        PromptLookupDrafter(max_ngram=1, min_ngram=2)


def _naive(tokens, max_ngram, min_ngram, k, cap):
    out = []
    for n in range(max_ngram, min_ngram - 1, -1):
        if n >= len(tokens):
            continue
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                cont = tokens[start + n:start + n + k]
                if cont not in out:
                    out.append(cont)
    return out[:cap]


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(tokens=st.lists(st.integers(0, 4), max_size=30), max_ngram=st.integers(1, 4), k=st.integers(1, 5),
       cap=st.integers(1, 5))
def test_matches_naive_search(tokens, max_ngram, k, cap):
    assert lookup(tokens, max_ngram, 1, k, cap) == _naive(tokens, max_ngram, 1, k, cap)
