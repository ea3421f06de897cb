"""What a sidecar client sends per request and what comes back: the completions protocol's answers and failure
kinds (:func:`parse_response`, :data:`ErrorKind`), and the "function-first" waves: which function first, then only
that function's arguments.

The one-pass wave (:func:`~ooospec.runtime.sidecar.prompts.build_wave`) asks the index query and an argument query
for EVERY tool x parameter, although the target calls one function. A :class:`~ooospec.runtime.sidecar.client.
SidecarClient` built with ``wave="function-first"`` asks in two stages over the same block instead:

1. :func:`index_wave`: the block and the index query (``max_tokens`` :func:`index_tokens`; with ``top_k > 1``
   also ``"logprobs": 5``, OpenAI's legacy completions field). :func:`function_candidates` reads the candidate
   tools from the answer: the greedy index, then the alternatives of its first token's top logprobs that reach
   ``min_prob``, at most ``top_k`` in all. As soon as they are known an EARLY bank is published
   (``{"name": f, "arguments": {}}`` per candidate: the name and the call's fixed keys already draft tokens).
2. :func:`argument_wave`: the same block (byte-identical, so a server's prefix cache reuses stage 1's block KV)
   and only the candidates' argument queries (+ the direct-call query when asked); :func:`join_function_first`
   joins one call per candidate, and their bank (greedy candidate first, then the others, then a different direct
   call) replaces the early one. A candidate without parameters needs no stage 2: its ``{}`` call is complete.

With the client's wave gate the gate's decision still holds: ``index`` sends stage 1 only (the early bank is the
final one), ``slots`` restricts stage 2 to the argument queries the gate kept (:func:`select_arguments`).
A stage-2 failure keeps the early bank (the error kind is still recorded). A server that refuses ``logprobs``
(HTTP 400 naming it) is asked again without, once per client: greedy candidates only.

:class:`~ooospec.runtime.sidecar.client.SidecarClient` owns the transport (threads, sockets, deadlines, stats);
this module imports none of it, only the shared contract (:mod:`ooospec.runtime.sidecar.prompts`) and the bank.

The candidate reading is a single-digit approximation: a first token ``"1"`` or ``" 1"`` reads as index 1, but
with 10 or more tools it may as well begin ``10``..``19``; so only tools 0-9 can be alternatives, and when the
greedy index has several digits the token of its first digit is skipped (its mass is mostly the greedy answer's).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from ooospec.runtime import schemas
from ooospec.runtime.drafters.hints import HintBank
from ooospec.runtime.sidecar import prompts as sp

if TYPE_CHECKING:
    from ooospec.runtime.sidecar.client import HintRequest, SidecarClient

logger = logging.getLogger(__name__)

WaveMode = Literal["all", "function-first"]
WAVE_MODES: tuple[WaveMode, ...] = ("all", "function-first")   # the one-pass wave / the two stages

ErrorKind = Literal[
    "connect",        # nothing listening / unreachable / connect timed out
    "timeout",        # no complete response before the deadline
    "closed",         # the server closed or reset the connection mid-exchange
    "http_status",    # a non-200 answer
    "too_large",      # the response is over max_response_bytes
    "bad_json",       # the body is not JSON
    "bad_response",   # JSON, but not a completions response for these prompts
    "no_call",        # the answers join into no call (e.g. an unknown tool index)
    "cancelled",      # cancel() before the (final) bank was ready
    "internal",       # a bug on our side (logged with its traceback)
]

TOP_LOGPROBS = 5           # alternatives asked for the index answer's first token when top_k > 1
DIGITS = "0123456789"


def index_tokens(num_tools: int) -> int:
    """Stage 1's ``max_tokens``: one per digit an index of ``num_tools`` tools can have (``index_tokens(12) == 2``).
    The answer's EOS is not waited for: the digits are the whole answer, and one forward fewer is a sixth of a
    function-first wave. A tokenizer that merges digits only stops earlier."""
    return len(str(max(num_tools - 1, 0)))




class WaveFailure(Exception):
    """A wave ended without its (final) bank; ``kind`` says why."""

    def __init__(self, kind: ErrorKind, detail: str):
        super().__init__(detail)
        self.kind, self.detail = kind, detail


def check_wave_options(wave: str, top_k: int, min_prob: float) -> None:
    """Raises ValueError unless ``wave`` is one of :data:`WAVE_MODES`, ``top_k`` an integer >= 1 and ``min_prob``
    a probability."""
    if wave not in WAVE_MODES:
        raise ValueError(f"sidecar wave must be one of {', '.join(WAVE_MODES)}; got {wave!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"sidecar top_k must be an integer >= 1, got {top_k!r}")
    if isinstance(min_prob, bool) or not isinstance(min_prob, (int, float)) or not 0.0 <= min_prob <= 1.0:
        raise ValueError(f"sidecar min_prob must be a probability in [0, 1], got {min_prob!r}")


def parse_response(raw: bytes, n_prompts: int) -> tuple[list[str], dict]:
    """``(answers in prompt order, the "ooospec" object or {})`` of a completions response; raises
    :class:`WaveFailure` (``bad_json`` / ``bad_response``) when it is not one for ``n_prompts`` prompts."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise WaveFailure("bad_json", f"{e!r}"[:200]) from None
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if not isinstance(choices, list) or len(choices) != n_prompts:
        raise WaveFailure("bad_response", f"expected {n_prompts} choices, got "
                                          f"{len(choices) if isinstance(choices, list) else type(choices).__name__}")
    answers: list[str | None] = [None] * n_prompts
    for c in choices:
        index = c.get("index") if isinstance(c, dict) else None
        text = c.get("text") if isinstance(c, dict) else None
        if (not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < n_prompts
                or answers[index] is not None or not isinstance(text, str)):
            raise WaveFailure("bad_response", f"bad choice {str(c)[:120]}")
        answers[index] = text
    server = obj.get("ooospec")
    return answers, server if isinstance(server, dict) else {}


# ------------------------------------------------------------------------------------------ function-first waves

def index_wave(messages: Sequence[Any], tools: Sequence[Any], prior_calls: Sequence[Mapping] = (),
               layout: int = sp.LAYOUT_VERSION) -> sp.Wave:
    """Stage 1: :func:`~ooospec.runtime.sidecar.prompts.build_wave`'s block and the index query only."""
    query = sp.SlotQuery("function_index", None, None, sp.INDEX_QUERY)
    return sp.Wave(sp.shared_block(messages, tools, prior_calls, layout), (query,))


def only_tool(tools: Sequence[Any]) -> bool:
    """A toolbox of exactly one named tool: the function is known without asking (no index query is worth sending).

    >>> only_tool([{"name": "f"}]), only_tool([{"name": "f"}, {"name": "g"}]), only_tool([{}])
    (True, False, False)
    """
    return len(tools) == 1 and schemas.tool_name(tools[0]) is not None


def select_arguments(wave: sp.Wave, functions: Sequence[str]) -> sp.Wave:
    """``wave``'s block with its argument queries of ``functions`` (in the wave's order) and its direct-call query."""
    keep = set(functions)
    return sp.Wave(wave.block, tuple(q for q in wave.queries
                                     if q.form == "direct_call" or (q.form == "argument" and q.function in keep)))


def argument_wave(messages: Sequence[Any], tools: Sequence[Any], functions: Sequence[str],
                  prior_calls: Sequence[Mapping] = (), with_direct_call: bool = False,
                  layout: int = sp.LAYOUT_VERSION) -> sp.Wave:
    """Stage 2: the same block as stage 1, the argument queries of the tools named in ``functions`` only (in tool
    order; unknown names ignored, a tool without parameters adds none), then optionally the direct-call query.

    >>> f = {"name": "f", "parameters": {"properties": {"a": {}, "b": {}}}}
    >>> g = {"name": "g", "parameters": {"properties": {"c": {}}}}
    >>> [q.text for q in argument_wave([], [f, g], ["g", "nope"], with_direct_call=True).queries]
    ['Query: g.c\\n', 'Query: call\\n']
    """
    return select_arguments(sp.build_wave(messages, tools, prior_calls, with_direct_call, layout), functions)


# ------------------------------------------------------------------------------------------ candidates and join

def _prob(logprob: Any) -> float | None:
    if isinstance(logprob, bool) or not isinstance(logprob, (int, float)) or not math.isfinite(logprob):
        return None
    return math.exp(min(float(logprob), 0.0))


def function_candidates(index_text: str, top_logprobs: Mapping[str, float] | None, num_tools: int, *,
                        top_k: int, min_prob: float) -> list[int]:
    """The tools to ask arguments for, most likely first: the greedy index (parsed from ``index_text``; ``[]``
    when unusable), then other indices from the first generated token's ``top_logprobs`` (token text -> logprob;
    ``"1"`` and ``" 1"`` both read as index 1 and add up; non-digit tokens and indices ``>= num_tools`` ignored)
    whose probability is at least ``min_prob``, at most ``top_k`` in all. ``top_logprobs`` None or malformed:
    the greedy index only. See the module docstring for the single-digit approximation.

    >>> function_candidates("0", {"0": -0.1, " 2": -1.2, "1": -3.0, "x": -0.5, "7": -0.2}, 3, top_k=3, min_prob=0.1)
    [0, 2]
    >>> function_candidates("7", None, 3, top_k=2, min_prob=0.1)
    []
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    try:
        greedy = sp.parse_function_index(index_text, num_tools)
    except ValueError:
        return []
    if not isinstance(top_logprobs, Mapping) or top_k == 1:
        return [greedy]
    own = str(greedy)[0] if greedy >= 10 else None     # the first digit of a multi-digit greedy answer
    probs: dict[int, float] = {}
    for token, logprob in top_logprobs.items():
        text = token.strip() if isinstance(token, str) else ""
        p = _prob(logprob)
        if len(text) != 1 or text not in DIGITS or text == own or p is None:
            continue
        index = int(text)
        if index < num_tools and index != greedy:
            probs[index] = probs.get(index, 0.0) + p
    others = sorted((i for i, p in probs.items() if p >= min_prob), key=lambda i: (-probs[i], i))
    return [greedy, *others[: top_k - 1]]


def join_function_first(tools: Sequence[Any], candidates: Sequence[int], wave: sp.Wave,
                        answers: Sequence[str]) -> list[dict]:
    """One joined call per candidate tool index (:func:`function_candidates`' order: greedy first) from stage 2's
    ``wave`` and ``answers`` (:func:`~ooospec.runtime.sidecar.prompts.join_slots` per candidate; a tool without a
    name is left out). When the wave holds the direct-call query the first call also carries ``"direct_call"``
    (checked, or None), as :func:`~ooospec.runtime.sidecar.prompts.join_answers` returns it."""
    args, direct = {}, None
    for q, a in zip(wave.queries, answers):
        if q.form == "direct_call":
            direct = a
        elif q.form == "argument":
            args[(q.function, q.parameter)] = a
    joined = (sp.join_slots(tools, sp.function_index_answer(i), args) for i in candidates)
    calls = [c for c in joined if c is not None]
    if calls and direct is not None:
        calls[0]["direct_call"] = sp.checked_direct_call(tools, direct)
    return calls


def first_top_logprobs(raw: bytes) -> dict[str, float] | None:
    """``choices[0]["logprobs"]["top_logprobs"][0]`` of a completions response (the first generated token's
    alternatives, text -> logprob); None when the server gave none or something else."""
    try:
        top = json.loads(raw)["choices"][0]["logprobs"]["top_logprobs"][0]
    except (ValueError, RecursionError, LookupError, TypeError):
        return None
    return top if isinstance(top, dict) else None


def merged_server(a: Mapping, b: Mapping) -> dict:
    """Two stages' server objects as one: numbers added (seconds, tokens, forwards), anything else the later's."""
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    return {**a, **b, **{k: a[k] + b[k] for k in a.keys() & b.keys() if number(a[k]) and number(b[k])}}


# ------------------------------------------------------------------------------------------ the client's two stages

def _send(client: SidecarClient, req: HintRequest, prompts: list[str], max_tokens: int, logprobs: int = 0) -> bytes:
    t0 = time.perf_counter()
    body = {"model": client.model, "prompt": prompts, "max_tokens": max_tokens, "temperature": 0,
            "add_special_tokens": False}
    if logprobs:
        body["logprobs"] = logprobs
    data = json.dumps(body, ensure_ascii=False).encode()
    req._stats.request_bytes += len(data)
    req._stats.build_s += time.perf_counter() - t0
    return client._post(req, data)


def ask_index(client: SidecarClient, req: HintRequest, block: str,
              num_tools: int) -> tuple[str, dict[str, float] | None]:
    """Stage 1: ``(the index answer, its first token's top logprobs or None)``; raises :class:`WaveFailure`."""
    st = req._stats
    st.n_queries = 1
    logprobs = TOP_LOGPROBS if client.top_k > 1 and not client.logprobs_refused else 0
    prompts = [block + sp.INDEX_QUERY]
    try:
        raw = _send(client, req, prompts, index_tokens(num_tools), logprobs)
    except WaveFailure as e:
        if not (logprobs and e.kind == "http_status" and e.detail.startswith("HTTP 400") and "logprobs" in e.detail):
            raise
        logger.info("the sidecar refuses logprobs (%s): greedy candidates only", e.detail[:160])
        client.logprobs_refused, logprobs = True, 0
        raw = _send(client, req, prompts, index_tokens(num_tools))
    st.index_s = st.response_t - st.sent_t
    t0 = time.perf_counter()
    answers, st.server = parse_response(raw, 1)
    st.payload_bytes = len(answers[0].encode())
    top = first_top_logprobs(raw) if logprobs else None
    st.build_s += time.perf_counter() - t0
    return answers[0], top


def ask_arguments(client: SidecarClient, req: HintRequest, tools: Sequence[Any], candidates: Sequence[int],
                  wave: sp.Wave) -> list[dict]:
    """Stage 2: the bank's calls (greedy candidate's first, the others', then a different direct call)."""
    st = req._stats
    st.n_queries += len(wave.queries)
    raw = _send(client, req, wave.prompts(), client.max_tokens)
    t0 = time.perf_counter()
    answers, server = parse_response(raw, len(wave.queries))
    st.server = merged_server(st.server, server)
    st.payload_bytes += sum(len(a.encode()) for a in answers)
    joined = join_function_first(tools, candidates, wave, answers)
    calls = [{"name": c["name"], "arguments": c["arguments"]} for c in joined]
    direct = joined[0].get("direct_call") if joined else None
    if direct is not None and direct not in calls:
        calls.append(direct)
    st.build_s += time.perf_counter() - t0
    return calls


def run_function_first(client: SidecarClient, req: HintRequest, tools: Sequence[Any], fmt: ModuleType, tokenizer,
                       wave: sp.Wave) -> None:
    """Both stages for ``req`` in the client's background thread. ``wave``: the request's full wave, or the gate's
    cut of it (its argument and direct-call queries bound stage 2). Raises :class:`WaveFailure`; the early bank
    stays published after a stage-2 failure. ``sent_t`` stays stage 1's, so ``wave_s`` spans both stages. A toolbox
    of one tool has nothing to choose: no stage 1 (its round trip and decode forward would buy only the name, which
    the schema FSM drafts anyway); the early bank is published at once and stage 2 prefills the block itself."""
    st = req._stats
    t0 = time.perf_counter()
    if only_tool(tools):
        candidates, first_sent = [0], None
    else:
        index_text, top = ask_index(client, req, wave.block, len(tools))
        first_sent = st.sent_t
        t0 = time.perf_counter()
        candidates = function_candidates(index_text, top, len(tools), top_k=client.top_k, min_prob=client.min_prob)
        candidates = [i for i in candidates if schemas.tool_name(tools[i]) is not None]
        if not candidates:
            raise WaveFailure("no_call", f"the index answer {index_text[:40]!r} names no tool")
    st.functions = [schemas.tool_name(tools[i]) for i in candidates]
    early = [{"name": name, "arguments": {}} for name in st.functions]
    stage2 = select_arguments(wave, st.functions)
    bank = HintBank.from_calls(early, fmt, tokenizer)
    st.num_views = len(bank.views)
    st.build_s += time.perf_counter() - t0
    if not stage2.queries:                   # gate "index", or no candidate has parameters: the early bank is final
        req._publish(bank)
        st.early_t, st.call = st.ready_t, early[0]
        return
    req._publish(bank, final=False)
    try:
        calls = ask_arguments(client, req, tools, candidates, stage2)
    finally:
        if first_sent is not None:
            st.sent_t = first_sent
    t0 = time.perf_counter()
    bank = HintBank.from_calls(calls, fmt, tokenizer)
    st.num_views = len(bank.views)
    st.build_s += time.perf_counter() - t0
    req._publish(bank)
    st.call = calls[0]
