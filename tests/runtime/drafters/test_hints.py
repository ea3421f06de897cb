"""Hint bank: text views, suffix matching on hand-written tokens, and exactness of the hint drafter on tiny
float64 models with hints that are right, wrong, partial, early, late or never ready."""

from __future__ import annotations

import itertools
import json
import random
from types import SimpleNamespace

import pytest

from ooospec.runtime.decoding import build_engine, make_engine
from ooospec.runtime.drafters import hints
from ooospec.runtime.drafters.base import DraftContext
from ooospec.runtime.drafters.hints import (
    LONG_MATCH_PRIOR,
    HintBank,
    HintDrafter,
    dumps_inline_lists,
    render_views,
    tokenize_views,
)
from ooospec.runtime.drafters.pld import PromptLookupDrafter
from ooospec.runtime.formats import hermes, llama3_json, plain_json
from tests.pipelines.sidecar_tiny import byte_tokenizer
from tests.runtime.conftest import VOCAB

CALL = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}


# ------------------------------------------------------------------------------------------ views


def test_views_render_the_call_in_every_style():
    v = render_views({**CALL, "direct_call": None}, hermes)       # extra keys are not part of the call
    assert v["format"] == ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
                           '\n</tool_call>')
    assert v["compact"] == '{"name":"get_weather","arguments":{"city":"Paris","unit":"celsius"}}'
    assert v["spaced"] == json.dumps(CALL)
    assert v["pretty"] == "```json\n" + json.dumps(CALL, indent=2) + "\n```"
    assert v["arguments"] == '{"city": "Paris", "unit": "celsius"}'
    assert render_views(CALL, llama3_json)["format"] == json.dumps(
        {"name": "get_weather", "parameters": CALL["arguments"]})
    assert render_views({"name": "f", "arguments": {"q": "café"}}, plain_json)["compact"] == \
        '{"name":"f","arguments":{"q":"café"}}'


def test_views_as_code_models_print_them():
    call = {"name": "f", "arguments": {"x": [3, 2, -4], "t": [[10, 20], [30, 40]], "d": {}, "s": "é"}}
    v = render_views(call, hermes)
    # BFCL (Qwen2.5-Coder): pretty JSON with lists of scalars on one line
    assert v["pretty_inline"] == ('```json\n{\n  "name": "f",\n  "arguments": {\n    "x": [3, 2, -4],\n'
                                  '    "t": [\n      [10, 20],\n      [30, 40]\n    ],\n'
                                  '    "d": {},\n    "s": "é"\n  }\n}\n```')
    # API-Bank: the header on one line, the arguments indented
    assert v["mixed"] == ('{"name": "f", "arguments": {\n  "x": [3, 2, -4],\n'
                          '  "t": [\n    [10, 20],\n    [30, 40]\n  ],\n  "d": {},\n  "s": "é"\n}}')
    for text in (v["pretty_inline"].strip("`json\n"), v["mixed"]):
        assert json.loads(text) == call                    # equivalent texts of the same call
    assert dumps_inline_lists([]) == "[]" and dumps_inline_lists({}) == "{}" and dumps_inline_lists(1.5) == "1.5"


def test_hint_proposals_are_labelled_by_match_length_with_a_prior_for_long_ones():
    from ooospec.runtime.budget import AcceptanceStats
    from ooospec.runtime.drafters.base import DraftContext

    drafter = HintDrafter(HintBank({"v": [1, 2, 3, 4, 5, 6, 7, 8]}))
    assert drafter.propose(DraftContext((9, 1, 2, 3, 4), 1, 0)) == [[5, 6, 7, 8]]
    assert drafter.proposal_kind == "long"                   # 4 tokens matched
    assert drafter.propose(DraftContext((9, 4), 1, 1)) == [[5, 6, 7, 8]]
    assert drafter.proposal_kind == "short"
    stats = AcceptanceStats()
    for label, p in drafter.priors.items():
        stats.set_prior(label, p)
    assert stats.probability("hints/long", 0, 1) == pytest.approx(LONG_MATCH_PRIOR)
    assert stats.probability("hints/short", 0, 1) == pytest.approx(0.5)
    assert stats.probability("hints/long", 1, 1) == pytest.approx(0.5)       # the prior is for the best guess
    with pytest.raises(ValueError, match="prior"):
        stats.set_prior("x", 1.0)


def test_views_are_tokenized_by_the_target_and_deduplicated():
    tok = byte_tokenizer()
    views = render_views(CALL, plain_json)            # plain_json's own syntax is the spaced JSON
    ids = tokenize_views(views, tok)
    assert "spaced" not in ids and ids["format"] == tok(views["spaced"], add_special_tokens=False)["input_ids"]
    bank = HintBank.from_calls([CALL, {"name": "get_time", "arguments": {}}], plain_json, tok)
    assert set(bank.views) >= {"format", "compact", "pretty", "arguments", "format#1", "compact#1"}
    assert bank.num_tokens == sum(len(v) for v in bank.views.values())
    # a bank is a guess of the call ready at arrival: it polls at once, hands its first call to the tools and has
    # no wave gate to report to
    assert bank.poll() is bank and bank.wait_call(0.0) == CALL and bank.report(None, None) is None
    assert HintBank(ids).wait_call(0.0) is None       # views of free text: no call


# ------------------------------------------------------------------------------------------ suffix matching


def test_suffix_match_worked_example():
    bank = HintBank({"a": [5, 6, 7, 8], "b": [1, 6, 7, 9]})
    assert bank.match([4, 2, 6, 7], max_match=3) == [[8], [9]]


def test_longest_suffix_wins_and_shorter_ones_are_not_tried():
    bank = HintBank({"a": [1, 2, 3, 4, 5, 6], "b": [9, 3, 7, 7]})
    assert bank.match([0, 2, 3]) == [[4, 5, 6]]        # [2, 3] only in "a"; [3] -> [7, 7] is not proposed
    assert bank.match([0, 8, 3]) == [[4, 5, 6], [7, 7]]
    assert bank.match([5, 6]) == []                    # a match at the end of a view has nothing to propose
    assert bank.match([42]) == []


def test_match_bounds_and_deduplication():
    bank = HintBank({"a": [1, 2, 3, 4, 5, 6, 7, 8], "b": [2, 3, 4, 5], "c": [2, 3, 9], "d": [2, 3, 8]})
    assert bank.match([2, 3], max_len=2) == [[4, 5], [9], [8]]            # "b" repeats "a"'s first 2 tokens
    assert bank.match([2, 3], max_len=2, max_candidates=2) == [[4, 5], [9]]
    assert bank.match([1, 2, 3], min_match=3) == [[4, 5, 6, 7, 8]]
    assert bank.match([7, 2, 3], min_match=3) == []
    seq = list(range(20))
    assert HintBank({"s": seq}).match(seq[:9]) == [seq[9:20]]             # suffix of 7, at most 16 tokens
    with pytest.raises(ValueError, match="min_match"):
        bank.match([1], max_match=8)


def test_drafter_polls_without_blocking_until_ready():
    class Later:
        done = True        # one bank: the first found is the last

        def __init__(self):
            self.polls = 0

        def poll(self):
            self.polls += 1
            return HintBank({"v": [1, 2, 3]}) if self.polls > 2 else None

    d = HintDrafter(Later())
    ctx = [DraftContext((9, 1), 1, step) for step in range(4)]
    assert [d.propose(c) for c in ctx] == [[], [], [[2, 3]], [[2, 3]]]
    s = d.stats()
    assert (s.ready_step, s.num_polls, s.num_proposed_steps, s.num_proposed_tokens) == (2, 3, 2, 4)
    assert s.num_accepted_tokens is None and s.used is None and s.num_views == 1


def test_drafter_takes_the_final_bank_of_a_source_that_is_not_done():
    class TwoBanks:                     # a function-first wave: an early bank, later the final one
        done = False

        def __init__(self):
            self.bank, self.polls = HintBank({"early": [9, 1, 5]}), 0

        def poll(self):
            self.polls += 1
            return self.bank

    src = TwoBanks()
    d = HintDrafter(src)
    assert d.propose(DraftContext((9, 1), 1, 0)) == [[5]]
    src.bank, src.done = HintBank({"final": [9, 1, 2, 3]}), True
    assert d.propose(DraftContext((9, 1), 1, 1)) == [[2, 3]]       # swapped while the source said done
    assert d.propose(DraftContext((9, 1), 1, 2)) == [[2, 3]] and src.polls == 2    # then polled no more
    s = d.stats()
    assert (s.ready_step, s.num_polls, s.num_views) == (0, 1, 1)


# ------------------------------------------------------------------------------------------ exactness


class ReadyAt:
    """A fake sidecar request whose bank becomes ready at the ``ready_at``-th poll (= decoding step)."""

    done = True      # one bank: the first found is the last

    def __init__(self, bank: HintBank | None, ready_at: int):
        self.bank, self.ready_at, self.polls = bank, ready_at, 0

    def poll(self):
        self.polls += 1
        return self.bank if self.polls > self.ready_at else None


N_NEW = 40


@pytest.fixture(scope="module")
def reference(request):
    """``(model, prompt, greedy continuation)`` per family, computed once with the engine's AR and HF."""
    from tests.runtime.conftest import _hf_greedy, tiny_model

    cache = {}

    def get(family):
        if family not in cache:
            model = tiny_model(family)
            rng = random.Random(7)
            prompt = [rng.randrange(VOCAB) for _ in range(12)]
            ar = build_engine("ar", model).generate(prompt, N_NEW).tokens
            assert ar == _hf_greedy(model, prompt, N_NEW)
            cache[family] = (model, prompt, ar)
        return cache[family]

    return get


def hint_views(kind: str, prompt: list[int], out: list[int]) -> dict[str, list[int]]:
    """Views of a predicted 'call': the prompt's tail (where the call starts) then some continuation."""
    rng = random.Random(kind)
    junk = [rng.randrange(VOCAB) for _ in range(N_NEW)]
    head = prompt[-3:]
    return {
        "right": {"v": head + out},
        "wrong": {"v": head + junk},
        "partial": {"v": head + out[:10] + junk[:5] + out[15:]},   # right, then 5 wrong tokens, then right again
        "mixed": {"wrong": head + junk, "right": head + out, "shifted": out[1:]},
    }[kind]


@pytest.mark.parametrize("kind, ready_at", [("right", 0), ("right", 6), ("wrong", 0), ("partial", 0),
                                            ("mixed", 2), ("right", 10_000)])
def test_hints_never_change_the_output(reference, kind, ready_at):
    model, prompt, ar = reference("llama")
    bank = HintBank(hint_views(kind, prompt, ar))
    drafter = HintDrafter(ReadyAt(bank, ready_at))
    result = make_engine(model, [drafter, PromptLookupDrafter()]).generate(prompt, N_NEW)
    assert result.tokens == ar
    stats = drafter.stats(result)
    if ready_at >= N_NEW:
        assert stats.ready_step is None and stats.num_proposed_tokens == 0 and stats.num_accepted_tokens == 0
        return
    assert stats.ready_step == ready_at
    if kind in ("right", "mixed", "partial"):            # how many nodes a step verifies is the engine's policy;
        assert stats.used and result.n_forwards < len(ar)  # that right hints get accepted is not
    if kind == "right" and ready_at == 0:
        assert result.n_forwards <= len(ar) // 2


class CountingHintDrafter(HintDrafter):
    def __init__(self, source):
        super().__init__(source)
        self.num_calls = 0

    def propose(self, ctx):
        self.num_calls += 1
        return super().propose(ctx)


@pytest.mark.parametrize("ready_at", [0, 3])
def test_every_family_stays_exact_and_accounting_matches_the_engine(reference, family, ready_at, monkeypatch):
    model, prompt, ar = reference(family)
    # the drafter's clock ticks 1 s per read, so match_s counts its propose() calls exactly (2 reads per call)
    monkeypatch.setattr(hints, "time", SimpleNamespace(perf_counter=itertools.count().__next__))
    drafter = CountingHintDrafter(ReadyAt(HintBank(hint_views("partial", prompt, ar)), ready_at))
    result = make_engine(model, [drafter]).generate(prompt, N_NEW)   # the hints are the only drafter
    assert result.tokens == ar
    stats = drafter.stats(result)
    assert stats.num_accepted_tokens == sum(min(s.accepted, s.new_tokens) for s in result.steps) > 0
    assert stats.ready_step == ready_at and stats.num_polls == ready_at + 1
    assert stats.match_s == drafter.num_calls > ready_at
    assert stats.to_dict()["used"] is True
