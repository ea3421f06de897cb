"""A decoding method's engine, built from its registry entry (:mod:`ooospec.runtime.methods`).

One request at a time, a method is driven by a :class:`RequestDecoder`: it builds the request's engine (the FSM
depends on the request's tools) and carries what a long-lived server learns across requests (acceptance
estimates, the retrieval bank, the previous output the next FSM observes)::

    decoder = RequestDecoder("toolspec", model, eos_token_ids=[tok.eos_token_id])
    out = decoder.engine(tok, fmt, tools).generate(ids, 256)
    decoder.observe(ids, out.tokens)

A request-independent method's engine: ``build_engine("pld", model, **engine_kwargs)``, a
:class:`~ooospec.runtime.engine.SpecEngine`. ``engine_kwargs`` are SpecEngine keywords (``policy``,
``max_draft_nodes``, ``max_depth``, ``cost``, ``acceptance``, ``tie_margin``, ``eos_token_ids``,
``record_margins``). Each step the budget policy (:mod:`ooospec.runtime.budget`) picks, from all drafters'
candidates, the nodes that maximize expected committed tokens per second of forward time (``policy="fixed"``:
merge round-robin by rank and fill ``max_draft_nodes``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ooospec.runtime.budget import AcceptanceStats
from ooospec.runtime.drafters.base import Drafter
from ooospec.runtime.drafters.pld import PromptLookupDrafter
from ooospec.runtime.drafters.retrieval import RetrievalDrafter
from ooospec.runtime.drafters.schema_fsm import SchemaFSMDrafter
from ooospec.runtime.engine import SpecEngine
from ooospec.runtime.methods import Method, get_method

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from ooospec.runtime.backends.target import Target


def make_engine(model: Target | PreTrainedModel, drafters: Sequence[Drafter], **engine_kwargs) -> SpecEngine:
    """An engine verifying the union of ``drafters``' candidates (in this order of priority)."""
    return SpecEngine(model, drafters, **engine_kwargs)


def build_engine(method: str | Method, model: Target | PreTrainedModel, **engine_kwargs) -> SpecEngine:
    """The engine of a request-independent method (``ar``, ``pld``, ``pld-fixed``)."""
    method = get_method(method)
    if not method.is_engine or method.per_request:
        raise ValueError(f"method {method.name!r} is built per request: use RequestDecoder({method.name!r}, model)")
    drafters = [PromptLookupDrafter()] if "pld" in method.drafters else []
    return make_engine(model, drafters, **{**method.engine_kwargs(), **engine_kwargs})


class RequestDecoder:
    """One engine method serving a stream of requests (the bench, the chat server and the agent loop use it).

    :meth:`engine` builds the request's engine: request-independent methods reuse one engine; ToolSpec and
    OoO-Spec build the schema FSM of the request's tools and put the request's hint drafter (if any) right after
    it. The acceptance estimates, the retrieval bank and the PLD are one object each for the whole stream, and
    each new FSM first observes the previous request's output (:meth:`observe`). All learn only from outputs this
    decoder produced, never from gold calls.
    """

    def __init__(self, method: str | Method, model: Target | PreTrainedModel, *,
                 acceptance: AcceptanceStats | None = None, **engine_kwargs):
        self.method = get_method(method)
        if not self.method.is_engine:
            raise ValueError(f"{self.method.name!r} is a peer, not an engine method")
        self.model = model
        self.acceptance = acceptance if acceptance is not None else AcceptanceStats()
        self.engine_kwargs = {**self.method.engine_kwargs(), **engine_kwargs, "acceptance": self.acceptance}
        self.toolspec = ToolSpecDrafters() if self.method.per_request else None
        self._engine: SpecEngine | None = None

    def engine(self, tokenizer=None, fmt=None, tools: Sequence[dict] = (),
               hints: Drafter | None = None) -> SpecEngine:
        """The engine for one request with ``tools`` (``hints``: its hint drafter, used by hint methods only)."""
        if self.toolspec is None:
            if self._engine is None:
                self._engine = build_engine(self.method, self.model, **self.engine_kwargs)
            return self._engine
        hints = hints if self.method.takes_hints else None
        return make_engine(self.model, self.toolspec.for_request(tokenizer, fmt, list(tools), hints),
                           **self.engine_kwargs)

    def observe(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        """The request just served (the next request's FSM observes it)."""
        if self.toolspec is not None:
            self.toolspec.observe(prompt, output)


class ToolSpecDrafters:
    """ToolSpec's drafters for a stream of requests, in priority order: the schema FSM of the request's tools,
    sidecar hints (when given), retrieval of earlier calls, prompt lookup.

    The FSM depends on the request's tools, so it is built per request (:meth:`for_request`, building the grammar
    is part of serving that request). What a long-lived drafter would have learnt carries over: one retrieval bank
    and one PLD for all requests, and each new FSM first observes the previous request's output (how this target
    opens its calls). Learns only from outputs the target produced (:meth:`observe`), never from gold calls::

        drafters = ToolSpecDrafters()
        engine = make_engine(model, drafters.for_request(tok, fmt, tools), eos_token_ids=[tok.eos_token_id])
        out = engine.generate(ids, 256)
        drafters.observe(ids, out.tokens)
    """

    def __init__(self) -> None:
        self.retriever = RetrievalDrafter()
        self.pld = PromptLookupDrafter()
        self._last: list[tuple[list[int], list[int]]] = []   # [(prompt, output)] of the previous request

    def for_request(self, tokenizer, fmt, tools: list[dict], hints: Drafter | None = None) -> list[Drafter]:
        """The drafters for one request with ``tools`` (``hints``: e.g. a
        :class:`~ooospec.runtime.drafters.hints.HintDrafter`)."""
        fsm = SchemaFSMDrafter(tokenizer, fmt, tools)
        for prompt, output in self._last:
            fsm.observe(prompt, output)
        return [fsm] + ([hints] if hints is not None else []) + [self.retriever, self.pld]

    def observe(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        """The request just served: the next request's FSM observes it."""
        self._last[:] = [(list(prompt), list(output))]
