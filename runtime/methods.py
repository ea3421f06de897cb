"""Decoding methods as engine configurations: ``METHODS[name](model, **engine_kwargs) -> SpecEngine``.

    ar    no drafter: one token per forward, through the same KV-cache code (the exactness reference)
    pld   prompt-lookup n-gram drafter (:mod:`ooospec.runtime.pld`)

Other methods combine drafters with :func:`make_engine`, e.g. ``make_engine(model, [fsm, retrieval, pld])``;
ToolSpec's set for a stream of requests is :class:`ToolSpecDrafters` (the bench and the chat server share it). Each
step the budget policy (:mod:`ooospec.runtime.budget`) picks, from all drafters' candidates, the nodes that
maximize expected committed tokens per second of forward time (``policy="fixed"``: merge round-robin by rank and
fill ``max_draft_nodes``).

``engine_kwargs`` are :class:`~ooospec.runtime.engine.SpecEngine` keywords (``policy``, ``max_draft_nodes``,
``max_depth``, ``cost``, ``acceptance``, ``tie_margin``, ``eos_token_ids``, ``record_margins``). Example::

    engine = METHODS["pld"](model, eos_token_ids=[tokenizer.eos_token_id])
    result = engine.generate(tokenizer(prompt)["input_ids"], max_new_tokens=256)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from transformers import PreTrainedModel

from ooospec.runtime.drafting import Drafter
from ooospec.runtime.engine import SpecEngine
from ooospec.runtime.pld import PromptLookupDrafter
from ooospec.runtime.retrieval import RetrievalDrafter
from ooospec.runtime.schema_fsm import SchemaFSMDrafter


def make_engine(model: PreTrainedModel, drafters: Sequence[Drafter], **engine_kwargs) -> SpecEngine:
    """An engine verifying the union of ``drafters``' candidates (in this order of priority)."""
    return SpecEngine(model, drafters, **engine_kwargs)


def ar(model: PreTrainedModel, **engine_kwargs) -> SpecEngine:
    """Plain greedy decoding: no drafters, every tree is the root alone."""
    return make_engine(model, [], **engine_kwargs)


def pld(model: PreTrainedModel, **engine_kwargs) -> SpecEngine:
    """Prompt-lookup decoding with the default n-gram settings (max_ngram=3, 10 tokens, 4 candidates)."""
    return make_engine(model, [PromptLookupDrafter()], **engine_kwargs)


METHODS: dict[str, Callable[..., SpecEngine]] = {"ar": ar, "pld": pld}


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
        """The drafters for one request with ``tools`` (``hints``: e.g. a :class:`~ooospec.runtime.hints.HintDrafter`)."""
        fsm = SchemaFSMDrafter(tokenizer, fmt, tools)
        for prompt, output in self._last:
            fsm.observe(prompt, output)
        return [fsm] + ([hints] if hints is not None else []) + [self.retriever, self.pld]

    def observe(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        """The request just served: the next request's FSM observes it."""
        self._last[:] = [(list(prompt), list(output))]
