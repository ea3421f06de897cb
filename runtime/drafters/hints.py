"""The hint bank: text views of a predicted call, tokenized by the TARGET, suffix-matched as a drafter.

The sidecar predicts a call as data (``{"name", "arguments"}``); the target prints it as text in its own style.
So the call is rendered as several equivalent text views (:func:`render_views`: the target format's own call
syntax, compact JSON, spaced JSON, pretty JSON in a fence, the arguments alone), each tokenized with the
target's tokenizer into a per-request :class:`HintBank`. At every step :class:`HintDrafter` polls its source
without blocking; once the bank is there, the longest suffix of the committed tokens (7 tokens, backing off to
1) is looked up in every view and the tokens that follow each occurrence become candidates. The alignment is
by suffix, so a hint that arrives late still continues wherever the target is; a wrong hint is rejected by the
verifier like any other draft (the target stays the only commit authority).

Worked example (``max_match=3``): views ``{"a": [5, 6, 7, 8], "b": [1, 6, 7, 9]}``, committed ``[.., 2, 6, 7]``::

    n = 3: suffix [2, 6, 7] occurs in no view
    n = 2: suffix [6, 7] occurs in "a" (followed by [8]) and in "b" (followed by [9])
    propose -> [[8], [9]]                      (the longest matching n only; shorter suffixes are not tried)

Use::

    bank = HintBank.from_calls([call], fmt, tokenizer)            # or a sidecar_client request, polled
    drafter = HintDrafter(bank)                                    # any CallGuess: a bank, a sidecar's wave
    engine = make_engine(model, [fsm, retrieval, drafter, pld], eos_token_ids=[tokenizer.eos_token_id])
    result = engine.generate(prompt_ids, max_new_tokens=256)
    drafter.stats(result)      # HintStats(ready_step, num_proposed_tokens, num_accepted_tokens, match_s, ...)
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import TYPE_CHECKING, ClassVar, Protocol

from ooospec.runtime.calls import compact_json
from ooospec.runtime.drafters.base import DraftContext, Drafter
from ooospec.runtime.tokens import common_prefix_len

if TYPE_CHECKING:
    from ooospec.runtime.engine import GenerationResult

MAX_MATCH = 7        # longest suffix looked up (the OoO-Spec paper: 7 down to 1)
LONG_MATCH = 4       # a suffix match this long puts the target on a view: its continuation is estimated apart
# First-token prior of a long match's continuation: `python -m ooospec.eval.bench.hint_replay` on the committed 0.5B
# reports (eval/reports/cpu/engine/hints_ceiling_05b_epyc/) measured 0.78-1.00 for suffixes of 4-7 tokens (gold,
# real and oracle hints on three benchmarks) against 0.48-1.00 for one-token suffixes.
LONG_MATCH_PRIOR = 0.85


# ------------------------------------------------------------------------------------------ text views


def dumps_inline_lists(obj, indent: int = 2, level: int = 0) -> str:
    """JSON with ``indent``-space nesting like ``json.dumps(obj, indent=indent)``, except that a list of scalars
    stays on one line (``[3, 2, -4]``), as code models print arrays::

        dumps_inline_lists({"a": [1, 2], "b": [[1, 2], [3]]}) ==
        '{\\n  "a": [1, 2],\\n  "b": [\\n    [1, 2],\\n    [3]\\n  ]\\n}'
    """
    if isinstance(obj, dict) and obj:
        pad, inner = " " * (indent * level), " " * (indent * (level + 1))
        items = (f"{inner}{json.dumps(str(k), ensure_ascii=False)}: {dumps_inline_lists(v, indent, level + 1)}"
                 for k, v in obj.items())
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and obj and any(isinstance(v, (dict, list)) for v in obj):
        pad, inner = " " * (indent * level), " " * (indent * (level + 1))
        return "[\n" + ",\n".join(inner + dumps_inline_lists(v, indent, level + 1) for v in obj) + "\n" + pad + "]"
    return json.dumps(obj, ensure_ascii=False)


def render_views(call: Mapping, fmt: ModuleType) -> dict[str, str]:
    """Equivalent texts of one call ``{"name", "arguments"}``, one per way a target tends to print it.

    For ``{"name": "f", "arguments": {"x": [1, 2]}}`` and the hermes format::

        format     <tool_call>\\n{"name": "f", "arguments": {"x": [1, 2]}}\\n</tool_call>   (fmt.render_call)
        compact    {"name":"f","arguments":{"x":[1,2]}}
        spaced     {"name": "f", "arguments": {"x": [1, 2]}}
        pretty     ```json\\n{\\n  "name": "f",\\n  "arguments": {\\n    "x": [\\n      1,\\n      2\\n    ]\\n ...```
        pretty_inline  the same with lists of scalars on one line: ``"x": [1, 2]`` (Qwen2.5-Coder on BFCL)
        mixed      {"name": "f", "arguments": {\\n  "x": [1, 2]\\n}}   (the header on one line, the arguments
                   indented: Qwen2.5-Coder on API-Bank)
        arguments  {"x": [1, 2]}

    Non-ASCII characters are kept as they are (``ensure_ascii=False``), as the targets print them. Which views
    make a difference is measured by ``python -m ooospec.eval.bench.hint_replay`` on the committed bench reports.
    """
    bare = {"name": call["name"], "arguments": call["arguments"]}
    name = json.dumps(bare["name"], ensure_ascii=False)
    return {
        "format": fmt.render_call(bare),
        "compact": compact_json(bare, allow_nan=True),
        "spaced": json.dumps(bare, ensure_ascii=False),
        "pretty": "```json\n" + json.dumps(bare, ensure_ascii=False, indent=2) + "\n```",
        "pretty_inline": "```json\n" + dumps_inline_lists(bare) + "\n```",
        "mixed": '{"name": ' + name + ', "arguments": ' + dumps_inline_lists(bare["arguments"]) + "}",
        "arguments": json.dumps(bare["arguments"], ensure_ascii=False),
    }


def tokenize_views(views: Mapping[str, str], tokenizer) -> dict[str, list[int]]:
    """Each view tokenized alone with the target's tokenizer (no special tokens); identical texts kept once."""
    names, texts, seen = [], [], set()
    for name, text in views.items():
        if text and text not in seen:
            seen.add(text)
            names.append(name)
            texts.append(text)
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    return {name: [int(t) for t in seq] for name, seq in zip(names, ids)}


# ------------------------------------------------------------------------------------------ the bank


class _KnownGuess:
    """The :class:`CallGuess` members of a guess that runs nothing in the background: nothing to cancel, and no
    wave gate learns from it."""

    def cancel(self) -> None:
        pass

    def report(self, result, hint_stats, calls: Sequence[Mapping] = ()) -> dict | None:
        return None

    def observe_tool(self, tool_s: float, hit: bool | None) -> None:
        pass


class HintBank(_KnownGuess):
    """Token views of one request's predicted call(s), indexed by every n-gram of length 1..:data:`MAX_MATCH`.

    A bank is ready by construction, so it is also a :class:`CallGuess` known at arrival (the gold call, the call
    the target itself writes, a client's hint text): ``poll()`` returns the bank, ``wait_call`` its first call.

    Args:
        views: view name -> target token ids.
        calls: the calls the views render (``{"name", "arguments"}``; none for views of free text).
    """

    def __init__(self, views: Mapping[str, Sequence[int]], calls: Sequence[Mapping] = ()):
        self.views: dict[str, tuple[int, ...]] = {k: tuple(int(t) for t in v) for k, v in views.items() if v}
        self.calls = list(calls)
        # n-gram -> [(view, end)]: the gram ends at ``end`` and view[end] is the next token (so end < len(view))
        self._index: dict[tuple[int, ...], list[tuple[str, int]]] = {}
        for name, seq in self.views.items():
            for end in range(1, len(seq)):
                for n in range(1, min(MAX_MATCH, end) + 1):
                    self._index.setdefault(seq[end - n:end], []).append((name, end))

    @classmethod
    def from_calls(cls, calls: Sequence[Mapping], fmt: ModuleType, tokenizer) -> HintBank:
        """The views of every call (the first call's views named as in :func:`render_views`, later ones
        ``"<view>#<i>"``), tokenized with ``tokenizer`` (the TARGET's)."""
        views: dict[str, str] = {}
        for i, call in enumerate(calls):
            for name, text in render_views(call, fmt).items():
                views[name if i == 0 else f"{name}#{i}"] = text
        return cls(tokenize_views(views, tokenizer), calls)

    @property
    def num_tokens(self) -> int:
        return sum(len(v) for v in self.views.values())

    # a CallGuess that is ready at arrival: nothing runs in the background and no wave gate learns from it
    def poll(self) -> HintBank:
        return self

    @property
    def done(self) -> bool:
        return True

    def wait_call(self, timeout: float) -> dict | None:
        return self.calls[0] if self.calls else None


    def match(self, tokens: Sequence[int], *, max_match: int = MAX_MATCH, min_match: int = 1,
              max_len: int = 16, max_candidates: int = 3) -> list[list[int]]:
        """Continuations of the longest suffix of ``tokens`` (``max_match`` down to ``min_match`` tokens) found
        in the views: up to ``max_candidates`` distinct ones, each at most ``max_len`` tokens, in view order
        then position order. ``[]`` when no suffix of those lengths occurs (see the module docstring)."""
        return self.lookup(tokens, max_match=max_match, min_match=min_match, max_len=max_len,
                           max_candidates=max_candidates)[1]

    def lookup(self, tokens: Sequence[int], *, max_match: int = MAX_MATCH, min_match: int = 1,
               max_len: int = 16, max_candidates: int = 3) -> tuple[int, list[list[int]]]:
        """:meth:`match` with the length of the suffix that matched: ``(n, continuations)``, ``(0, [])`` when
        none did."""
        if not 1 <= min_match <= max_match <= MAX_MATCH:
            raise ValueError(f"need 1 <= min_match <= max_match <= {MAX_MATCH}, got {min_match}, {max_match}")
        for n in range(min(max_match, len(tokens)), min_match - 1, -1):
            hits = self._index.get(tuple(int(t) for t in tokens[len(tokens) - n:]))
            if not hits:
                continue
            found: list[list[int]] = []
            seen: set[tuple[int, ...]] = set()
            for name, end in hits:
                cont = self.views[name][end:end + max_len]
                if cont not in seen:
                    seen.add(cont)
                    found.append(list(cont))
                    if len(found) == max_candidates:
                        break
            return n, found
        return 0, []


class ScheduledBanks(_KnownGuess):
    """Banks released at fixed offsets (seconds) from this object's creation: a :class:`CallGuess` replaying a wave
    that was timed elsewhere. The ``dedicated`` deployment's emulation (the sidecar on a device of its own, as fast
    as the CPU it was timed on) builds one per request from a wave run alone before it: the early bank of a
    function-first wave at its latency, the final one at its own. ``done`` once the last is released.

        guess = ScheduledBanks([(0.21, early_bank), (0.48, final_bank)])    # then a HintDrafter(guess)
    """

    def __init__(self, schedule: Sequence[tuple[float, HintBank]]):
        self.schedule = sorted(((float(t), bank) for t, bank in schedule), key=lambda x: x[0])
        self.start = time.perf_counter()

    @classmethod
    def from_calls(cls, schedule: Sequence[tuple[float, Sequence[Mapping]]], fmt: ModuleType,
                   tokenizer) -> ScheduledBanks:
        """``[(after_s, calls), ...]`` (e.g. from JSON) with each calls' bank built now, before the clock."""
        return cls([(t, HintBank.from_calls(calls, fmt, tokenizer)) for t, calls in schedule])

    @property
    def done(self) -> bool:
        return not self.schedule or time.perf_counter() - self.start >= self.schedule[-1][0]

    def poll(self) -> HintBank | None:
        now = time.perf_counter() - self.start
        released = [bank for t, bank in self.schedule if t <= now]
        return released[-1] if released else None

    def wait_call(self, timeout: float) -> dict | None:
        left = self.schedule[-1][0] - (time.perf_counter() - self.start) if self.schedule else 0.0
        if left > timeout:
            return None
        time.sleep(max(left, 0.0))
        bank = self.poll()
        return bank.calls[0] if bank is not None and bank.calls else None



# ------------------------------------------------------------------------------------------ the drafter


class CallGuess(Protocol):
    """An early guess of one request's call, ready at some unknown time: a sidecar's wave
    (:class:`~ooospec.runtime.sidecar.client.HintRequest`) or a call known at arrival (a :class:`HintBank`).

    The one protocol every consumer takes: a :class:`HintDrafter` polls it for draft tokens, an agent loop runs the
    guessed call's tool early (:meth:`wait_call`), and whoever started it ends it (:meth:`cancel`) and tells it how
    the request went (:meth:`report`, :meth:`observe_tool`), which a sidecar's wave gate learns from.
    """

    def poll(self) -> HintBank | None:
        """The bank once it is ready, else None. Must return at once (the target never waits on it)."""
        ...

    @property
    def done(self) -> bool:
        """No later bank will come (a function-first wave has an early bank, then the final one); read it before
        :meth:`poll`, so that a bank polled after ``done`` is the last."""
        ...

    def wait_call(self, timeout: float) -> dict | None:
        """Block up to ``timeout`` s for the guessed call ``{"name", "arguments"}``; None when there is none."""
        ...

    def cancel(self) -> None:
        """The request is over: stop working on the guess."""
        ...

    def report(self, result, hint_stats, calls: Sequence[Mapping] = ()) -> dict | None:
        """The request is over: the engine's result (None: generation failed), the :class:`HintStats` of the drafter
        that used the guess (None: none did) and the calls the target wrote. Returns the wave gate's record of the
        guess (None: no gate decided it)."""
        ...

    def observe_tool(self, tool_s: float, hit: bool | None) -> None:
        """An agent loop ran the call's tool for ``tool_s`` s; ``hit``: served from this guess's speculative run
        (None: no guessed call was ready when the turn ended)."""
        ...


@dataclass
class HintStats:
    """One request's hint usage (see :meth:`HintDrafter.stats`)."""

    ready_step: int | None       # first step whose poll found the bank (0 = before the first tree); None = never
    num_polls: int               # polls that found nothing plus the one that found the bank
    num_proposed_steps: int      # steps at which the bank proposed at least one candidate
    num_proposed_tokens: int     # hint tokens proposed, all steps and candidates (before the engine's budget cut)
    num_accepted_tokens: int | None  # draft tokens on accepted paths that a hint candidate proposed (None: no result)
    match_s: float               # seconds spent in propose (poll + suffix match), on the target's critical path
    num_views: int               # views in the bank (0 before it is ready)
    bank_tokens: int             # target tokens over all views

    @property
    def used(self) -> bool | None:
        """Whether any hint token was accepted (None without the engine's result)."""
        return None if self.num_accepted_tokens is None else self.num_accepted_tokens > 0

    def to_dict(self) -> dict:
        return {**asdict(self), "used": self.used}


class HintDrafter(Drafter):
    """Suffix-matched hint candidates from a source that becomes ready at some unknown step.

    One drafter per request (its bank belongs to the request). Until ``source.poll()`` returns a bank the drafter
    proposes nothing; it polls once per step and never blocks. A source whose ``done`` is still False
    (a function-first sidecar wave: an early bank, then the final one) is polled on after its first bank, and a
    new bank replaces the one in use.

    Args:
        source: the request's :class:`CallGuess` (a sidecar's wave, or a :class:`HintBank`); only polled.
        max_match / min_match: suffix lengths tried, longest first.
        max_len: tokens per candidate.
        max_candidates: distinct continuations per step.
    """

    name = "hints"
    priors: ClassVar[dict[str, float]] = {"hints/long": LONG_MATCH_PRIOR}

    def __init__(self, source: CallGuess, *, max_match: int = MAX_MATCH, min_match: int = 1, max_len: int = 16,
                 max_candidates: int = 3):
        if not 1 <= min_match <= max_match <= MAX_MATCH:
            raise ValueError(f"need 1 <= min_match <= max_match <= {MAX_MATCH}, got {min_match}, {max_match}")
        if max_len < 1 or max_candidates < 1:
            raise ValueError(f"need max_len, max_candidates >= 1, got {max_len}, {max_candidates}")
        self.source = source
        self.max_match, self.min_match = max_match, min_match
        self.max_len, self.max_candidates = max_len, max_candidates
        self.bank: HintBank | None = None
        self.ready_step: int | None = None
        self.num_polls = 0
        self._final = False      # the bank in use is the source's last (read after the source was done)
        self.match_s = 0.0
        self._log: list[tuple[int, int, list[list[int]]]] = []   # [(step, tokens generated before it, cands)]
        self.proposal_kind: str | None = None   # "long" / "short" suffix match of this step's candidates

    def propose(self, ctx: DraftContext) -> list[list[int]]:
        t0 = time.perf_counter()
        try:
            if self.bank is None or not self._final:
                final = self.source.done    # read first: a bank polled after done is the last
                bank = self.source.poll()
                if self.bank is None:
                    self.num_polls += 1
                    if bank is None:
                        return []
                    self.ready_step = ctx.step
                self.bank, self._final = (bank if bank is not None else self.bank), final
            n, cands = self.bank.lookup(ctx.tokens, max_match=self.max_match, min_match=self.min_match,
                                        max_len=self.max_len, max_candidates=self.max_candidates)
            self.proposal_kind = "long" if n >= LONG_MATCH else "short"
            if cands:
                self._log.append((ctx.step, len(ctx.tokens) - ctx.prompt_len, cands))
            return cands
        finally:
            self.match_s += time.perf_counter() - t0

    def observe(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        """A bank belongs to one request; nothing carries over."""

    def stats(self, result: GenerationResult | None = None) -> HintStats:
        """This request's :class:`HintStats`; pass the engine's result to count accepted hint tokens.

        A step's accepted hint tokens = the longest prefix that one of its hint candidates shares with the draft
        tokens the step accepted (``steps[k].accepted`` of the tokens committed at step k, the bonus excluded).
        A token another drafter proposed too counts here as well.
        """
        accepted = None
        if result is not None:
            accepted = 0
            for step, n_done, cands in self._log:
                st = result.steps[step]
                drafts = result.tokens[n_done:n_done + min(st.accepted, st.new_tokens)]
                accepted += max(common_prefix_len(c, drafts) for c in cands)
        return HintStats(
            ready_step=self.ready_step, num_polls=self.num_polls, num_proposed_steps=len(self._log),
            num_proposed_tokens=sum(len(c) for _, _, cands in self._log for c in cands),
            num_accepted_tokens=accepted, match_s=self.match_s,
            num_views=len(self.bank.views) if self.bank is not None else 0,
            bank_tokens=self.bank.num_tokens if self.bank is not None else 0)
