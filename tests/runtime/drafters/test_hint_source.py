"""The one resolver of a request's hint source: each kind, the precedence, and bad input as no hints (a fault)."""

from __future__ import annotations

import pytest

from ooospec.runtime.drafters import hint_source as hs
from ooospec.runtime.drafters.hint_source import HintInputs, ResolvedHints, resolve_hints, source_kind, text_bank
from ooospec.runtime.drafters.hints import HintBank, ScheduledBanks
from ooospec.runtime.formats import hermes
from tests.pipelines.sidecar_tiny import byte_tokenizer

CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


class FakeClient:
    """A sidecar client stand-in: records each submit and returns a bank (any CallGuess would do)."""

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.submitted: list[tuple] = []

    def submit(self, messages, tools, **kwargs):
        if self.fail:
            raise ConnectionError("down")
        self.submitted.append((messages, tools, kwargs))
        return HintBank({"v": [1, 2, 3]})


def _faults():
    seen: list[tuple[str, str]] = []
    return seen, lambda name, what: seen.append((name, what))


# ------------------------------------------------------------------------------------------ each kind


def test_nothing_to_hint_with_is_no_hints(tok):
    assert resolve_hints(HintInputs(), hermes, tok) is None
    assert resolve_hints(HintInputs(text=""), hermes, tok) is None                  # an empty text is no text
    assert resolve_hints(HintInputs(messages=MESSAGES, tools=TOOLS), hermes, tok) is None   # no client: no wave


def test_a_given_guess_is_used_as_it_is(tok):
    guess = HintBank({"v": [4, 5]})
    got = resolve_hints(HintInputs(guess=guess), hermes, tok)
    assert got == ResolvedHints("given", guess) and got.guess is guess and not got.started


def test_known_calls_become_a_bank_of_their_views_and_none_an_empty_bank(tok):
    got = resolve_hints(HintInputs(calls=[CALL]), hermes, tok)
    assert got.kind == "calls" and got.guess.calls == [CALL]
    assert got.guess.views == HintBank.from_calls([CALL], hermes, tok).views
    empty = resolve_hints(HintInputs(calls=[]), hermes, tok)       # an oracle that wrote no call: an empty bank
    assert empty.kind == "calls" and empty.guess.views == {} and empty.guess.wait_call(0) is None


def test_a_schedule_releases_its_banks_late(tok):
    got = resolve_hints(HintInputs(schedule=[(60.0, [CALL])]), hermes, tok)
    assert got.kind == "schedule" and isinstance(got.guess, ScheduledBanks)
    assert got.guess.poll() is None and not got.guess.done
    now = resolve_hints(HintInputs(schedule=[(0.0, [CALL])]), hermes, tok).guess
    assert now.poll().calls == [CALL]


def test_a_text_hint_is_its_calls_else_the_text_itself(tok):
    text = hermes.render_call(CALL)
    got = resolve_hints(HintInputs(text=text), hermes, tok)
    assert got.kind == "text" and got.guess.calls == [CALL]
    free = text_bank("Paris", hermes, tok)
    assert free.calls == [] and free.views == {"text": tuple(tok("Paris", add_special_tokens=False)["input_ids"])}


def test_a_wave_needs_a_client_tools_and_a_conversation(tok):
    client = FakeClient()
    got = resolve_hints(HintInputs(messages=MESSAGES, tools=TOOLS), hermes, tok, sidecar=client, arrival=1.5)
    assert got.kind == "wave" and got.started
    assert client.submitted == [(MESSAGES, TOOLS, {"fmt": hermes, "tokenizer": tok, "arrival": 1.5})]
    resolve_hints(HintInputs(messages=MESSAGES, tools=TOOLS), hermes, tok, sidecar=client)
    assert client.submitted[-1][2] == {"fmt": hermes, "tokenizer": tok}       # no arrival: the client's default
    assert resolve_hints(HintInputs(messages=MESSAGES), hermes, tok, sidecar=client) is None          # no tools
    assert resolve_hints(HintInputs(tools=TOOLS), hermes, tok, sidecar=client) is None                # no messages
    assert len(client.submitted) == 2
    client.submit = lambda messages, tools, **kw: None                # a client that starts no wave: no hints
    assert resolve_hints(HintInputs(messages=MESSAGES, tools=TOOLS), hermes, tok, sidecar=client) is None


# ------------------------------------------------------------------------------------------ precedence


def test_the_first_source_present_wins_in_the_documented_order():
    client = object()
    everything = {"guess": HintBank({}), "schedule": [(0.0, [CALL])], "calls": [CALL], "text": "t",
                  "messages": MESSAGES, "tools": TOOLS}
    for kind, drop in zip(hs.SOURCE_KINDS, ("guess", "schedule", "calls", "text", None)):
        assert source_kind(HintInputs(**everything), client) == kind
        if drop is not None:
            everything.pop(drop)
    assert source_kind(HintInputs(**everything), None) is None


def test_a_given_guess_starts_no_wave(tok):
    client = FakeClient()
    got = resolve_hints(HintInputs(guess=HintBank({}), messages=MESSAGES, tools=TOOLS), hermes, tok, sidecar=client)
    assert got.kind == "given" and client.submitted == []


# ------------------------------------------------------------------------------------------ bad input


def test_a_source_that_cannot_be_built_is_a_fault_and_no_hints(tok, monkeypatch):
    seen, on_fault = _faults()
    bad_schedule = HintInputs(schedule=[(0.0, [{"arguments": {}}])])       # a call without a name
    assert resolve_hints(bad_schedule, hermes, tok, on_fault=on_fault) is None
    assert seen[0][0] == "hints" and seen[0][1].startswith("not built: KeyError")
    dead = resolve_hints(HintInputs(messages=MESSAGES, tools=TOOLS), hermes, tok, sidecar=FakeClient(fail=True),
                         on_fault=on_fault)
    assert dead is None and seen[1] == ("sidecar", "wave not started: ConnectionError: down")
    monkeypatch.setattr(hermes, "parse_calls", lambda text: 1 / 0)
    assert resolve_hints(HintInputs(text="x"), hermes, tok, on_fault=on_fault) is None
    assert seen[2][0] == "hints" and "ZeroDivisionError" in seen[2][1]


def test_without_on_fault_the_error_propagates(tok):
    with pytest.raises(ConnectionError):
        resolve_hints(HintInputs(messages=MESSAGES, tools=TOOLS), hermes, tok, sidecar=FakeClient(fail=True))
    with pytest.raises(ValueError, match="hint source kind"):
        hs.build_guess("nope", HintInputs(), hermes, None)
