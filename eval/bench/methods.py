"""The bench's methods, built from the registry: ``name -> factory() -> fn(prompt_ids, ctx) -> MethodResult``.

    factories, notes = build_methods(["pld", "toolspec"], model, tokenizer, eos_token_ids=eos_ids(model, tokenizer))

Methods: ``ar``, ``pld``, ``toolspec`` run on the engine with the budget tree policy; ``pld-fixed`` and
``toolspec-fixed`` are the same drafters with the fixed 32-node budget (``policy="fixed"``), for comparison.
Engine methods are adapted to the method API (:mod:`ooospec.eval.bench.method_api`) by :func:`decoder_method`; the HF
peers (:mod:`ooospec.eval.bench.peers`) by :func:`peer_method`; the llama.cpp peers come from
:mod:`ooospec.eval.bench.llamacpp_peers`. Method ``ooospec`` takes its hints from a source that
:func:`ooospec.eval.bench.hint_sources.start_hints` starts; ``ooospec-gold`` from the gold call and ``ooospec-oracle``
from ``ar``'s output of the same example (the harness hands it over in
:class:`~ooospec.eval.bench.method_api.BenchContext` ``reference_tokens``, set after ``ar`` ran on the example and
cleared when the next one starts), both at time zero. The timed run over these methods is
:mod:`ooospec.eval.bench.harness`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from ooospec.eval.bench import peers
from ooospec.eval.bench.llamacpp_peers import PEERS as LLAMACPP_PEERS
from ooospec.eval.bench.llamacpp_peers import peer_factory as llamacpp_peer_factory
from ooospec.eval.bench.method_api import BenchContext, BenchMethod, MethodFactory, MethodResult
from ooospec.runtime import decoding, methods
from ooospec.runtime.backends import hardware
from ooospec.runtime.backends.target import as_target
from ooospec.runtime.methods import BASELINE, REFERENCES

HF_PEERS = methods.peers_of("hf")


def eos_ids(model, tokenizer) -> list[int]:
    """Sorted union of the tokenizer's EOS and the model's ``generation_config.eos_token_id`` (int or list)."""
    from ooospec.runtime.backends.models import eos_token_ids

    return eos_token_ids(model, tokenizer)


def method_result(r) -> MethodResult:
    """A :class:`~ooospec.runtime.engine.GenerationResult` as the method API's result."""
    return MethodResult(
        tokens=list(r.tokens), prefill_s=r.prefill_s, decode_s=r.decode_s, n_forwards=r.n_forwards,
        tree_sizes=[s.tree_size for s in r.steps], stop_reason=r.stop_reason,
        accepted=[s.accepted for s in r.steps], proposed=[s.proposed_nodes for s in r.steps],
        margins=r.margins, draft_s=sum(s.t_draft for s in r.steps),
        step_s=[s.t_draft + s.t_forward for s in r.steps],
    )


class WarmCache:
    """The ``--warm-tools`` hook of engine methods (:attr:`~ooospec.eval.bench.method_api.BenchMethod.warm`):
    ``warm(prefix, ctx)`` (untimed) prefills ``prefix`` into a cache that the next call continues from; a call not
    preceded by ``warm`` starts from an empty cache (cold)."""

    def __init__(self, model):
        self.model = model
        self.kv = None
        self.armed = False

    def warm(self, prefix: Sequence[int], ctx: BenchContext | None = None) -> None:
        if self.kv is None:
            self.kv = as_target(self.model).new_kv_cache()
        self.kv.reset()
        self.kv.prefill(list(prefix))
        self.armed = True

    def take(self):
        """The warmed cache for this call (then disarmed), or None (cold)."""
        kv, self.armed = (self.kv if self.armed else None), False
        return kv


def method_hints(method: methods.Method, hints):
    """The hint source of an engine method: the run's sidecar (in the method's own deployment when it fixes one:
    ``ooospec-dedicated``), or its time-zero ceiling."""
    from ooospec.eval.bench.ooospec_method import TIME_ZERO_HINTS, SidecarHints
    from ooospec.runtime.sidecar.deployments import get_deployment

    if not method.uses_sidecar:
        return TIME_ZERO_HINTS[method.hints]()
    if method.deployment is None:
        return hints
    if not isinstance(hints, SidecarHints):
        raise TypeError(f"method {method.name!r} needs a sidecar (--hints sidecar), not {type(hints).__name__}")
    return SidecarHints(hints.client, get_deployment(method.deployment), hints.bench_threads)


def decoder_method(decoder, hints=None) -> BenchMethod:
    """Adapt a :class:`~ooospec.runtime.decoding.RequestDecoder` to the method API (with a ``warm`` hook).

    With ``hints`` (a :class:`~ooospec.eval.bench.ooospec_method.BenchHints`) the request's hints start at its arrival
    (the start of the timed call) and a :class:`~ooospec.runtime.drafters.hints.HintDrafter` joins the drafters right
    after the FSM. Engines that depend on the request (ToolSpec's FSM) are built inside the timed call: building the
    grammar is part of serving that request.
    """
    from ooospec.runtime.drafters.hints import HintDrafter

    cache = WarmCache(decoder.model)

    def run(prompt_ids: list[int], ctx: BenchContext) -> MethodResult:
        arrival = time.perf_counter()  # the request arrives: nothing of it was computed before this
        guess = hints.start(ctx, arrival) if hints is not None else None
        hint_drafter = HintDrafter(guess) if guess is not None else None
        engine = decoder.engine(ctx.tokenizer, ctx.fmt, ctx.record["tools"], hint_drafter)
        try:
            r = engine.generate(prompt_ids, ctx.max_new_tokens, stop=ctx.stop, cache=cache.take())
        except BaseException:
            if hints is not None:
                hints.finish(guess, hint_drafter, None)  # cancel the wave, restore the target's cores
            raise
        res = method_result(r)
        if hints is not None:
            res.hints = hints.finish(guess, hint_drafter, r)
        decoder.observe(prompt_ids, res.tokens)
        return res

    def warm(prefix: Sequence[int], ctx: BenchContext | None = None) -> None:
        """``--warm-tools``: the target's system + tools block, and the hint source's toolbox (the sidecar's),
        computed before the clock starts."""
        cache.warm(prefix)
        if ctx is not None and hints is not None:
            hints.warm(ctx)

    return BenchMethod(run, warm)


def peer_method(name: str, model, tokenizer, *, pld_tokens: int, assistant=None) -> tuple[BenchMethod, str]:
    """An HF ``generate`` peer and the note that goes with it (e.g. the hf-assisted fallback)."""
    method = methods.REGISTRY[name]
    extra: dict = {}
    note = ""
    if "pld" in method.drafters:
        extra = {"prompt_lookup_num_tokens": pld_tokens}
    elif "assistant" in method.drafters:
        if assistant is not None and peers.same_vocab(model, assistant):
            extra = {"assistant_model": assistant}
        else:
            why = "no --assistant given" if assistant is None else "the --assistant vocabulary differs"
            note = f"{name}: {why}; fell back to prompt lookup (prompt_lookup_num_tokens={pld_tokens})"
            extra = {"prompt_lookup_num_tokens": pld_tokens}

    warm = peers.WarmPrefix(model)

    def run(prompt_ids: list[int], ctx: BenchContext) -> MethodResult:
        return peers.hf_generate(model, prompt_ids, eos_token_ids=ctx.eos_token_ids,
                                 max_new_tokens=ctx.max_new_tokens, stop=ctx.stop,
                                 pad_token_id=tokenizer.pad_token_id, note=note, cache=warm.take(), **extra)

    return BenchMethod(run, warm.warm if method.warm_starts else None), note


def build_methods(names: Sequence[str], model, tokenizer, *, eos_token_ids: Sequence[int], pld_tokens: int = 10,
                  assistant=None, hints=None, gguf: str | Path | None = None,
                  threads: int | None = None) -> tuple[dict[str, MethodFactory], list[str]]:
    """Method factories in run order (``ar`` and the backend's stock greedy reference first, always: ``hf-greedy``
    on the HF backend, ``llama.cpp`` on the llama.cpp backend) and the run's notes.

    The HF peers need an HF target; the llama.cpp peers (:mod:`ooospec.eval.bench.llamacpp_peers`) need the target's
    ``gguf`` file and run on ``threads`` threads, whichever backend our engine uses.

    A factory returns a fresh callable (fresh engine, fresh drafter state and acceptance estimates) each time it
    is called. ``NAME-fixed`` is engine method ``NAME`` with the fixed node budget instead of the budget policy.
    ``ooospec`` takes its hints from ``hints`` (a :class:`~ooospec.eval.bench.ooospec_method.BenchHints`, e.g. a running
    sidecar); ``ooospec-gold`` always from the gold call, ``ooospec-oracle`` from ``ar``'s output of the same
    example (the ceilings).
    """

    unknown = [n for n in names if n not in methods.BENCH_METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; known: {list(methods.BENCH_METHODS)}")
    backend = as_target(model).backend
    reference = REFERENCES[backend]
    order = list(dict.fromkeys([BASELINE, reference, *names]))
    if backend != "hf" and any(n in HF_PEERS for n in order):
        raise ValueError(f"the HF peers {[n for n in order if n in HF_PEERS]} need --backend hf")
    if any(n in LLAMACPP_PEERS for n in order) and gguf is None:
        raise ValueError("the llama.cpp peers need a GGUF target (a registry name or a .gguf file)")
    factories: dict[str, MethodFactory] = {}
    notes: list[str] = []
    for name in order:
        method = methods.REGISTRY[name]
        if method.is_engine:
            if method.uses_sidecar and hints is None:
                raise ValueError(f"method {name!r} needs a hint source (a sidecar, or --hints gold / oracle)")
            kw = {"record_margins": True} if name == BASELINE else {}
            factories[name] = lambda method=method, kw=kw: decoder_method(
                decoding.RequestDecoder(method, model, eos_token_ids=eos_token_ids, **kw),
                hints=None if method.hints is None else method_hints(method, hints))
        elif name in LLAMACPP_PEERS:
            factories[name] = llamacpp_peer_factory(name, gguf, threads=threads or hardware.available_cores(),
                                                    pld_tokens=pld_tokens)
        else:
            fn, note = peer_method(name, model, tokenizer, pld_tokens=pld_tokens, assistant=assistant)
            factories[name] = lambda fn=fn: fn
            if note:
                notes.append(note)
    return factories, notes
