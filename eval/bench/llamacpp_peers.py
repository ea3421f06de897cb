"""llama.cpp as a benchmark peer: what CPU users already run, on the same GGUF, threads and requests.

Each peer is llama-cpp-python's stock high-level API (``Llama.generate``), one instance per peer, so its numbers
are what a user of the bindings gets::

    llama.cpp       Llama(gguf).generate(ids, temp=0)                        plain greedy decoding (the reference)
    llama.cpp-pld   Llama(gguf, draft_model=LlamaPromptLookupDecoding(k))    the bindings' prompt-lookup speculation

(``llama.cpp-pld`` pays what the bindings pay for speculation: with a draft model they copy every position's
logits, the prompt's included, into a numpy array; that is part of what a user of that API gets.)

On a CPU with AMX the bindings' model is loaded without llama.cpp's extra weight buffers, as ooo-spec's own
llama.cpp backend is (:func:`~ooospec.runtime.backends.llamacpp.default_repack`: llama.cpp 0.3.36's AMX matmul
segfaults on the registry's Q4_K GGUFs, so the stock ``Llama`` crashed at its first forward there); ``Llama`` has no
argument for it, so :func:`extra_buffers` sets it in the default model parameters while the instance loads.

Every call starts cold (``Llama.reset()``: no KV of an earlier request is reused), unless ``warm_prefix`` says
which prompt prefix was prefilled before the clock started (the bench's ``--warm-tools``).

Counting. Every ``Llama.eval`` is one target forward; the first holds the prompt (it also yields the first token, as
HF's prefill does in :mod:`ooospec.eval.bench.peers`), so ``n_forwards`` counts it, as a one-node step in ``tree_sizes``
(the others: 1 + the draft tokens fed). ``prefill_s`` runs to the first token, ``decode_s`` from there to the return.
The generator is stopped by the harness' stop rule (EOS, end of call, token cap) right after the token that meets it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ooospec.eval.bench.method_api import BenchContext, BenchMethod, MethodResult
from ooospec.runtime.methods import REGISTRY, peers_of

PEERS = peers_of("llama.cpp")
logger = logging.getLogger(__name__)


@contextmanager
def extra_buffers(on: bool) -> Iterator[None]:
    """While it is open, a ``llama_cpp.Llama`` built loads its model with llama.cpp's ``use_extra_bufts`` = ``on``
    (the bindings' default parameters, patched and restored; ``Llama`` takes no such argument)."""
    import llama_cpp.llama_cpp as lib

    default = lib.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = bool(on)
        return p

    lib.llama_model_default_params = params
    try:
        yield
    finally:
        lib.llama_model_default_params = default


class LlamaCppPeer:
    """One ``llama_cpp.Llama`` on ``gguf`` (greedy; with ``pld_tokens``: prompt-lookup drafts of that length)."""

    def __init__(self, gguf: str | Path, *, threads: int, n_ctx: int = 4096, pld_tokens: int | None = None):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        from ooospec.runtime.backends.llamacpp import default_repack

        draft = LlamaPromptLookupDecoding(num_pred_tokens=pld_tokens) if pld_tokens else None
        # with a draft model the bindings keep every position's logits (scores[n_ctx, vocab]); they size that
        # array by the logits_all argument, so it must be passed too (0.3.36 crashes past n_batch tokens otherwise)
        repack, why = default_repack()
        if not repack:
            logger.info("llama.cpp peer: %s", why)
        with extra_buffers(repack):
            self.llm = Llama(model_path=str(gguf), n_ctx=n_ctx, n_batch=512, n_threads=threads,
                             n_threads_batch=threads, draft_model=draft, logits_all=draft is not None, seed=0,
                             verbose=False)
        self.repack = repack
        self._q_lens: list[int] = []
        self._armed = False
        inner = self.llm.eval

        def counted(tokens: Sequence[int]):
            self._q_lens.append(len(tokens))
            return inner(tokens)

        self.llm.eval = counted   # instance attribute: Llama.generate calls self.eval

    def prefill(self, prefix: Sequence[int]) -> None:
        """Leave ``prefix`` in the KV cache (untimed): the next call whose prompt starts with it reuses it."""
        self.llm.reset()
        self.llm.eval(list(prefix))
        self._q_lens.clear()

    def warm(self, prefix: Sequence[int], ctx: BenchContext | None = None) -> None:
        """The bench's ``--warm-tools`` hook: the next call starts from ``prefix`` in the cache."""
        self.prefill(prefix)
        self._armed = True

    def __call__(self, prompt_ids: list[int], ctx: BenchContext) -> MethodResult:
        if not self._armed:
            self.llm.reset()   # n_tokens = 0: generate() prefills the whole prompt
        self._armed = False
        self._q_lens.clear()
        eos = set(ctx.eos_token_ids)
        out: list[int] = []
        reason = "max_new_tokens"
        t0 = time.perf_counter()
        t_first = None
        for tok in self.llm.generate(list(prompt_ids), temp=0.0, top_k=1, top_p=1.0, min_p=0.0,
                                     repeat_penalty=1.0, reset=True):
            if t_first is None:
                t_first = time.perf_counter()
            out.append(int(tok))
            if tok in eos:
                reason = "eos"
                break
            if ctx.stop(out):
                reason = "stop"
                break
            if len(out) >= ctx.max_new_tokens:
                break
        t_end = time.perf_counter()
        t_first = t_end if t_first is None else t_first
        q_lens = list(self._q_lens)
        # the prefill forward yields one token, like a one-node step (HF peers count it the same way)
        tree_sizes = [1] + q_lens[1:] if q_lens else []
        return MethodResult(tokens=out, prefill_s=t_first - t0, decode_s=t_end - t_first, n_forwards=len(q_lens),
                            tree_sizes=tree_sizes, stop_reason=reason)

    def close(self) -> None:
        self.llm.close()


def peer_factory(name: str, gguf: str | Path, *, threads: int, pld_tokens: int, n_ctx: int = 4096):
    """A method factory (``() -> BenchMethod``) for peer ``name``; the Llama instance is made once, on first use,
    and shared by the factory's methods (each call resets its cache)."""
    if name not in PEERS:
        raise ValueError(f"unknown llama.cpp peer {name!r}; known: {PEERS}")
    holder: dict = {}

    def factory() -> BenchMethod:
        if "peer" not in holder:
            holder["peer"] = LlamaCppPeer(gguf, threads=threads, n_ctx=n_ctx,
                                          pld_tokens=pld_tokens if "pld" in REGISTRY[name].drafters else None)
        return BenchMethod(holder["peer"], holder["peer"].warm)

    return factory
