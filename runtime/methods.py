"""Decoding methods as engine configurations: ``METHODS[name](model, **engine_kwargs) -> SpecEngine``.

    ar    no drafter: one token per forward, through the same KV-cache code (the exactness reference)
    pld   prompt-lookup n-gram drafter (:mod:`ooospec.runtime.pld`)

Other methods combine drafters with :func:`make_engine`, e.g. ``make_engine(model, [fsm, retrieval, pld])``. Each
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
