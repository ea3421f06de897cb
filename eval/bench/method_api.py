"""The benchmark's method API: what one method is given and what it returns for one prompt.

A method is ``name -> factory() -> BenchMethod``, called as ``method(prompt_ids, ctx) -> MethodResult``: engine
methods (``ar``, ``pld``, ``toolspec``, built in :mod:`ooospec.eval.bench.methods`) and the peers
(:mod:`ooospec.eval.bench.peers`, :mod:`ooospec.eval.bench.llamacpp_peers`) all return a :class:`MethodResult`,
so the harness treats them alike. This module imports nothing from ``ooospec``,
so both sides can import it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class MethodResult:
    """What one method returns for one prompt."""

    tokens: list[int]                   # generated tokens, cut at the stop rule (EOS included when it stopped there)
    prefill_s: float
    decode_s: float
    n_forwards: int                     # target forwards that produced output tokens (prefill-only forwards excluded)
    tree_sizes: list[int]               # [n_forwards] query nodes of each forward, root included (1 = plain step)
    stop_reason: str                    # "eos" | "stop" | "max_new_tokens"
    accepted: list[int] | None = None   # [n_forwards] accepted draft tokens (bonus excluded), when the method knows
    proposed: list[int] | None = None   # [n_forwards] draft nodes proposed before the tree policy chose, when known
    margins: list[float] | None = None  # [len(tokens)] top-2 logit margin behind each token (AR only)
    overshoot: int = 0                  # tokens generated past the stop rule and cut off (HF assisted decoding)
    draft_s: float | None = None        # seconds spent drafting (inside decode_s), when the method knows
    step_s: list[float] | None = None   # [n_forwards] seconds of each step (drafting + forward), when the method knows
    note: str = ""
    hints: dict | None = None           # sidecar / gold / oracle hint instrumentation of this request (ooospec)


@dataclass
class BenchContext:
    """Everything a method may use besides the prompt ids. ``record`` changes per example.

    ``reference_tokens``: the tokens the baseline ``ar`` generated for ``reference_id`` (a record id). The harness
    clears both when an example starts and sets them once ``ar`` has run on it, before the other methods; only the
    oracle hint source (method ``ooospec-oracle``, ``--hints oracle``) reads them.
    """

    model: Any
    tokenizer: Any
    fmt: Any                            # a runtime.formats module
    eos_token_ids: list[int]
    max_new_tokens: int
    stop: Callable[[Sequence[int]], bool]
    record: dict = field(default_factory=dict)
    reference_tokens: list[int] | None = None   # ar's output for the record ``reference_id`` (the oracle's hints)
    reference_id: str | None = None

    def set_reference(self, record_id: str | None, tokens: Sequence[int] | None) -> None:
        """``ar``'s tokens for record ``record_id`` (None, None: no reference yet for the current example)."""
        self.reference_id = record_id
        self.reference_tokens = None if tokens is None else list(tokens)


@dataclass(frozen=True)
class BenchMethod:
    """One instance of a method: ``method(prompt_ids, ctx)`` decodes one prompt (its state carries over calls).

    ``warm(prefix, ctx)`` is the bench's ``--warm-tools`` hook: untimed, it leaves ``prefix`` (the request's system
    + tools block) in the cache the next call continues from; a call not preceded by it starts cold. None: the
    method cannot continue from a cached prefix and always starts cold.
    """

    run: Callable[[list[int], BenchContext], MethodResult]
    warm: Callable[[Sequence[int], BenchContext | None], None] | None = None

    def __call__(self, prompt_ids: list[int], ctx: BenchContext) -> MethodResult:
        return self.run(prompt_ids, ctx)


MethodFactory = Callable[[], BenchMethod]
