"""The bench harness: method factories from the registry, benchmark examples, the timed run and its summaries.

A library API with typed arguments (the command line is :mod:`ooospec.eval.bench`, ``ooospec bench``; the
``transfer`` stage calls the same functions)::

    factories, notes = build_methods(["pld", "toolspec"], model, tokenizer, eos_token_ids=eos_ids(model, tokenizer))
    results = run_bench(model, tokenizer, load_examples(path, limit=30), factories, fmt=detect_format(tokenizer))
    # -> {"methods": {name: summary}, "examples": [row, ...], "tie_margin": float}

What is measured. Every method decodes the same prompts (the record rendered through the target's chat template
with its tools, ``fmt.render_prompt``) with the same stop rule -- EOS, the end of the tool call
(``fmt.is_complete``) or ``max_new_tokens`` -- in the same process, threads and dtype. Examples are sorted by
id and taken in that order (``limit=N`` = the first N ids); for each example the methods run one after the
other in a fixed order (``ar``, the backend's stock greedy reference, then the requested methods), so slow drift
of a shared machine hits all methods alike. Every method is first warmed up (untimed, a short generation on the
first prompt) by an instance that is then thrown away, so a method that learns from earlier calls (retrieval)
never sees an example before its timed run.

Per example and method (one row of ``examples``): wall time of the whole call (``time_s``, prefill + decode,
measured by the harness around the call), ``prefill_s`` / ``decode_s`` (reported by the method), new tokens,
target forwards (those that produce output tokens), #MAT, per-forward tree sizes (and, for engine methods, the
draft nodes proposed before the tree policy chose), and whether the tokens equal ``ar``'s (``exact``) and
stock ``model.generate`` greedy's (``exact_hf``, the ``hf-greedy`` reference, run for every example). A
mismatch with ``ar`` is located and classified by :func:`ooospec.runtime.metrics.classify_mismatch` with AR's
recorded top-2 logit margins: ``near_tie`` (margin within bf16 rounding, :func:`default_tie_margin`) or
``defect``.

Per method (``methods[name]``): ``n``, ``mean_s``, ``median_s``, ``speedup``, ``speedup_median``,
``decode_speedup``, ``mat``, ``mean_tree_size``, ``exact_rate``, ``exact_hf_rate``, ``near_ties``, ``defects`` and
a few more (see :func:`summarize`); every metric as defined in :mod:`ooospec.runtime.metrics`. Given this
machine's roofline (:func:`ooospec.runtime.hardware.roofline`), each summary also has the target's achieved
``prefill_flops_per_s`` and ``decode_bytes_per_s`` (:func:`ooospec.runtime.metrics.prefill_flops`,
:func:`~ooospec.runtime.metrics.decode_bytes`) and their fractions of the roofs (``prefill_peak_frac``,
``decode_peak_frac``).

Methods: ``ar``, ``pld``, ``toolspec`` run on the engine with the budget tree policy; ``pld-fixed`` and
``toolspec-fixed`` are the same drafters with the fixed 32-node budget (``policy="fixed"``), for comparison.
A method is ``name -> factory() -> fn(prompt_ids, ctx) -> MethodResult`` (:mod:`ooospec.eval.method_api`,
built by :func:`build_methods`): engine methods and the HF peers of :mod:`ooospec.eval.peers`. Method
``ooospec`` takes its hints from a source that :func:`start_hints` starts from :class:`HintOptions`;
``ooospec-gold`` from the gold call and ``ooospec-oracle`` from ``ar``'s output of the same example (the harness
hands it over in :class:`~ooospec.eval.method_api.BenchContext` ``reference_tokens``, set after ``ar`` ran on the
example and cleared when the next one starts), both at time zero. The results' ``env.sidecar_adapter``
(:func:`sidecar_adapter_record`) names the adapter that made ``ooospec``'s sidecar hints.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from ooospec.eval import peers
from ooospec.eval.llamacpp_peers import PEERS as LLAMACPP_PEERS
from ooospec.eval.llamacpp_peers import peer_factory as llamacpp_peer_factory
from ooospec.eval.method_api import BenchContext, MethodFactory, MethodFn, MethodResult
from ooospec.eval.ooospec_method import DEFAULT_DEPLOYMENT, DEPLOYMENTS, summarize_hints
from ooospec.pipelines.records import iter_jsonl, load_records, sha256_file
from ooospec.runtime import hardware, methods, metrics
from ooospec.runtime.cost_model import Footprint, footprint
from ooospec.runtime.paths import PACKAGE_ROOT, sidecar_adapter_dir
from ooospec.runtime.verify import tie_margin_of

BASELINE = "ar"
HF_REFERENCE = "hf-greedy"
LLAMACPP_REFERENCE = "llama.cpp"
REFERENCES = {"hf": HF_REFERENCE, "llama.cpp": LLAMACPP_REFERENCE}   # backend -> its stock greedy, run every example
HF_PEERS = methods.peers_of("hf")
KNOWN_METHODS = tuple(methods.REGISTRY)
WARMUP_TOKENS = 16  # budget of a warm-up call


# ----------------------------------------------------------------------------------------- the methods


def make_stop(tokenizer, fmt) -> Callable[[Sequence[int]], bool]:
    """The end-of-call predicate every method shares: ``fmt.is_complete`` on the decoded generated text."""

    def stop(generated: Sequence[int]) -> bool:
        return fmt.is_complete(tokenizer.decode(list(generated), skip_special_tokens=False))

    return stop


def eos_ids(model, tokenizer) -> list[int]:
    """Sorted union of the tokenizer's EOS and the model's ``generation_config.eos_token_id`` (int or list)."""
    from ooospec.runtime.models import eos_token_ids

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
    """The ``--warm-tools`` hook of engine methods: ``warm(prefix, ctx)`` (untimed) prefills ``prefix`` into a
    cache that the next call continues from; a call not preceded by ``warm`` starts from an empty cache (cold)."""

    def __init__(self, model):
        self.model = model
        self.kv = None
        self.armed = False

    def warm(self, prefix: Sequence[int], ctx: BenchContext | None = None) -> None:
        from ooospec.runtime.kv_cache import new_kv_cache

        if self.kv is None:
            self.kv = new_kv_cache(self.model)
        self.kv.reset()
        self.kv.prefill(list(prefix))
        self.armed = True

    def take(self):
        """The warmed cache for this call (then disarmed), or None (cold)."""
        kv, self.armed = (self.kv if self.armed else None), False
        return kv


def decoder_method(decoder, hints=None) -> MethodFn:
    """Adapt a :class:`~ooospec.runtime.methods.RequestDecoder` to the method API (with a ``warm`` hook).

    With ``hints`` (a :class:`~ooospec.eval.ooospec_method.BenchHints`) the request's hints start at its arrival
    (the start of the timed call) and a :class:`~ooospec.runtime.hints.HintDrafter` joins the drafters right after
    the FSM. Engines that depend on the request (ToolSpec's FSM) are built inside the timed call: building the
    grammar is part of serving that request.
    """
    from ooospec.runtime.hints import HintDrafter

    cache = WarmCache(decoder.model)

    def run(prompt_ids: list[int], ctx: BenchContext) -> MethodResult:
        arrival = time.perf_counter()  # the request arrives: nothing of it was computed before this
        source = hints.start(ctx, arrival) if hints is not None else None
        hint_drafter = HintDrafter(source) if source is not None else None
        engine = decoder.engine(ctx.tokenizer, ctx.fmt, ctx.record["tools"], hint_drafter)
        try:
            r = engine.generate(prompt_ids, ctx.max_new_tokens, stop=ctx.stop, cache=cache.take())
        except BaseException:
            if hints is not None:
                hints.finish(source, hint_drafter, None)  # cancel the wave, restore the target's cores
            raise
        res = method_result(r)
        if hints is not None:
            res.hints = hints.finish(source, hint_drafter, r)
        decoder.observe(prompt_ids, res.tokens)
        return res

    def warm(prefix: Sequence[int], ctx: BenchContext | None = None) -> None:
        """``--warm-tools``: the target's system + tools block, and the hint source's toolbox (the sidecar's),
        computed before the clock starts."""
        cache.warm(prefix)
        if ctx is not None and hasattr(hints, "warm"):
            hints.warm(ctx)

    run.warm = warm
    return run


def peer_method(name: str, model, tokenizer, *, pld_tokens: int, assistant=None) -> tuple[MethodFn, str]:
    """An HF ``generate`` peer and the note that goes with it (e.g. the hf-assisted fallback)."""
    extra: dict = {}
    note = ""
    if name == "hf-pld":
        extra = {"prompt_lookup_num_tokens": pld_tokens}
    elif name == "hf-assisted":
        if assistant is not None and peers.same_vocab(model, assistant):
            extra = {"assistant_model": assistant}
        else:
            why = "no --assistant given" if assistant is None else "the --assistant vocabulary differs"
            note = f"hf-assisted: {why}; fell back to prompt lookup (prompt_lookup_num_tokens={pld_tokens})"
            extra = {"prompt_lookup_num_tokens": pld_tokens}

    warm = peers.WarmPrefix(model)

    def run(prompt_ids: list[int], ctx: BenchContext) -> MethodResult:
        return peers.hf_generate(model, prompt_ids, eos_token_ids=ctx.eos_token_ids,
                                 max_new_tokens=ctx.max_new_tokens, stop=ctx.stop,
                                 pad_token_id=tokenizer.pad_token_id, note=note, cache=warm.take(), **extra)

    if not extra:   # stock greedy only: transformers' prompt lookup and assisted generation (5.24) feed the whole
        run.warm = warm.warm   # prompt on top of a pre-filled cache (peers.check_continued), so they run cold only
    return run, note


def build_methods(names: Sequence[str], model, tokenizer, *, eos_token_ids: Sequence[int], pld_tokens: int = 10,
                  assistant=None, hints=None, gguf: str | Path | None = None,
                  threads: int | None = None) -> tuple[dict[str, MethodFactory], list[str]]:
    """Method factories in run order (``ar`` and the backend's stock greedy reference first, always: ``hf-greedy``
    on the HF backend, ``llama.cpp`` on the llama.cpp backend) and the run's notes.

    The HF peers need an HF target; the llama.cpp peers (:mod:`ooospec.eval.llamacpp_peers`) need the target's
    ``gguf`` file and run on ``threads`` threads, whichever backend our engine uses.

    A factory returns a fresh callable (fresh engine, fresh drafter state and acceptance estimates) each time it
    is called. ``NAME-fixed`` is engine method ``NAME`` with the fixed node budget instead of the budget policy.
    ``ooospec`` takes its hints from ``hints`` (a :class:`~ooospec.eval.ooospec_method.BenchHints`, e.g. a running
    sidecar); ``ooospec-gold`` always from the gold call, ``ooospec-oracle`` from ``ar``'s output of the same
    example (the ceilings).
    """
    from ooospec.eval.ooospec_method import TIME_ZERO_HINTS

    unknown = [n for n in names if n not in KNOWN_METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; known: {list(KNOWN_METHODS)}")
    backend = backend_of(model)
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
            if method.hints == "sidecar" and hints is None:
                raise ValueError(f"method {name!r} needs a hint source (a sidecar, or --hints gold / oracle)")
            kw = {"record_margins": True} if name == BASELINE else {}
            factories[name] = lambda method=method, kw=kw: decoder_method(
                methods.RequestDecoder(method, model, eos_token_ids=eos_token_ids, **kw),
                hints=None if method.hints is None
                else hints if method.hints == "sidecar" else TIME_ZERO_HINTS[method.hints]())
        elif name in LLAMACPP_PEERS:
            factories[name] = llamacpp_peer_factory(name, gguf, threads=threads or hardware.available_cores(),
                                                    pld_tokens=pld_tokens)
        else:
            fn, note = peer_method(name, model, tokenizer, pld_tokens=pld_tokens, assistant=assistant)
            factories[name] = lambda fn=fn: fn
            if note:
                notes.append(note)
    return factories, notes


# ------------------------------------------------------------------------------------------------- data


def record_ids_of(rows_path: Path) -> set[str]:
    """The ``record_id`` of every request row in ``rows_path`` (``data/slots/heldout.jsonl``: the heldout records)."""
    ids = set()
    for lineno, row in iter_jsonl(rows_path):
        if not isinstance(row, dict) or not isinstance(row.get("record_id"), str):
            # a bad line of a data file: ValueError, like every record reader
            raise ValueError(  # noqa: TRY004
                f"{rows_path}:{lineno}: not a request row with a 'record_id' (data/slots/*.jsonl rows)")
        ids.add(row["record_id"])
    return ids


def load_examples(path: Path, limit: int | None = None, *, ids: set[str] | None = None, sample: int | None = None,
                  seed: int = 0) -> list[dict]:
    """Valid records of ``path`` sorted by id: only those in ``ids`` when given, then a seeded random ``sample`` of
    them (kept in id order), then the first ``limit``. Invalid or duplicate ids (among those kept) raise."""
    read = load_records(path, "fail" if ids is None else "skip", what="benchmark records")
    bad = [b for b in read.bad if ids is None or b.id is None or b.id in ids]
    if bad:
        raise ValueError(bad[0].message())
    records = [r for r in read.rows if ids is None or r["id"] in ids]
    records.sort(key=lambda r: r["id"])
    if sample is not None:
        if sample < 1:
            raise ValueError(f"--sample must be >= 1, got {sample}")
        if sample < len(records):
            records = sorted(random.Random(seed).sample(records, sample), key=lambda r: r["id"])
    if limit is not None:
        if limit < 1:
            raise ValueError(f"--limit must be >= 1, got {limit}")
        records = records[:limit]
    if not records:
        raise ValueError(f"{path}: no records")
    return records


def prompt_ids_of(record: dict, tokenizer, fmt) -> list[int]:
    """The record's conversation and tools rendered through the target's chat template, tokenized."""
    text = fmt.render_prompt(tokenizer, record["messages"], record["tools"])
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ----------------------------------------------------------------------------------------------- the run


def _row(record_id: str, method: str, prompt_len: int, time_s: float, res: MethodResult, tokenizer,
         fp: Footprint) -> dict:
    return {
        "id": record_id, "method": method, "prompt_tokens": prompt_len, "time_s": time_s,
        "prefill_s": res.prefill_s, "decode_s": res.decode_s, "new_tokens": len(res.tokens),
        "forwards": res.n_forwards, "mat": metrics.mat(len(res.tokens), res.n_forwards),
        "tree_sizes": list(res.tree_sizes), "accepted": res.accepted, "proposed": res.proposed,
        "stop_reason": res.stop_reason, "overshoot": res.overshoot, "draft_s": res.draft_s, "step_s": res.step_s,
        "prefill_flops": metrics.prefill_flops(fp, prompt_len),
        "decode_bytes": metrics.decode_bytes(fp, res.n_forwards, prompt_len, len(res.tokens)),
        "tokens": list(res.tokens), "text": tokenizer.decode(res.tokens, skip_special_tokens=False),
        "hints": res.hints,
    }


def backend_of(model) -> str:
    """``"llama.cpp"`` for a :class:`~ooospec.runtime.llamacpp.LlamaCppTarget`, ``"hf"`` for a transformers model."""
    return getattr(model, "backend", "hf")


def compare_rows(rows: dict[str, dict], ar_margins: Sequence[float], tie_tol: float,
                 reference: str = HF_REFERENCE) -> None:
    """Fill ``exact``, ``exact_hf`` and ``mismatch`` of one example's rows (``{method: row}``) in place.

    ``exact_hf``: identical to the backend's stock greedy ``reference`` (``hf-greedy`` or ``llama.cpp``)."""
    ar_tokens = rows[BASELINE]["tokens"]
    hf_tokens = rows[reference]["tokens"] if reference in rows else None
    for row in rows.values():
        row["exact"] = row["tokens"] == ar_tokens
        row["exact_hf"] = None if hf_tokens is None else row["tokens"] == hf_tokens
        row["mismatch"] = (None if row["exact"]
                           else metrics.classify_mismatch(ar_tokens, row["tokens"], ar_margins, tie_tol))


def _timed(fn: MethodFn, prompt_ids: list[int], ctx: BenchContext) -> tuple[float, MethodResult]:
    gc.collect()
    t0 = time.perf_counter()
    res = fn(prompt_ids, ctx)
    return time.perf_counter() - t0, res


def run_bench(
    model,
    tokenizer,
    records: Sequence[dict],
    factories: dict[str, MethodFactory],
    *,
    fmt,
    max_new_tokens: int = 256,
    warmup: int = 1,
    progress: bool = True,
    on_example: Callable[[dict], None] | None = None,
    roofline: dict | None = None,
    settle: Callable[[], None] | None = None,
    warm_tools: bool = False,
) -> dict:
    """Run every method on every record (interleaved, fixed order) and return ``{"methods", "examples"}``.

    Args:
        model, tokenizer: the target.
        records: benchmark records (run in id order).
        factories: ``{name: factory}`` from :func:`build_methods`; must contain ``"ar"``.
        fmt: the tool-call format module (``render_prompt``, ``is_complete``).
        max_new_tokens: generation budget per call.
        warmup: untimed calls per method on the first prompt (at most ``WARMUP_TOKENS`` new tokens each),
            by a throw-away instance.
        on_example: called after each example with the results so far (e.g. to save a partial JSON).
        settle: called before every timed call, untimed (e.g. wait until a sidecar server has finished a
            wave that an earlier call cancelled, so that it does not slow the next method down).
        warm_tools: before every timed call, prefill the request's system + tools block
            (:func:`~ooospec.runtime.chat.system_tools_block`) into the method's cache, untimed, for every method
            alike: the agent setting, where one toolbox serves many requests. Every method needs a ``warm`` hook.
        roofline: ``{"peak_flops", "peak_bytes_per_s"}`` of this machine (:func:`ooospec.runtime.hardware.roofline`)
            to give each method's achieved prefill FLOP/s and decode bytes/s as fractions of them.
    """
    if BASELINE not in factories:
        raise ValueError(f"methods must include the baseline {BASELINE!r}, got {list(factories)}")
    ctx = BenchContext(model, tokenizer, fmt, eos_ids(model, tokenizer), max_new_tokens, make_stop(tokenizer, fmt))
    tie_tol = tie_margin_of(model)
    reference = REFERENCES[backend_of(model)]
    fp = footprint(model)
    records = sorted(records, key=lambda r: r["id"])
    prompts = [prompt_ids_of(rec, tokenizer, fmt) for rec in records]

    # warm-up: the first prompt with a short budget (kernels, allocator, caches); instances are thrown away
    warm_ctx = dataclasses.replace(ctx, record=records[0], max_new_tokens=min(WARMUP_TOKENS, max_new_tokens))
    for name, factory in factories.items():
        fn = factory()
        for _ in range(warmup):
            res = fn(prompts[0], warm_ctx)
            if name == BASELINE:   # the oracle hint source's reference (ar runs first: build_methods' order)
                warm_ctx.set_reference(records[0]["id"], res.tokens)
    methods = {name: factory() for name, factory in factories.items()}
    if warm_tools:
        from ooospec.runtime.chat import system_tools_block
        from ooospec.runtime.kv_cache import common_prefix_len

        cold_only = [name for name, fn in methods.items() if not hasattr(fn, "warm")]
        if cold_only:
            raise ValueError(f"--warm-tools: method(s) {cold_only} cannot start from a cached prefix")
        blocks = [common_prefix_len(system_tools_block(fmt, tokenizer, rec["messages"], rec["tools"]), prompt)
                  for rec, prompt in zip(records, prompts)]

    examples: list[dict] = []
    for i, (rec, prompt) in enumerate(tqdm(list(zip(records, prompts)), desc="bench", disable=not progress)):
        ctx.record = rec
        ctx.set_reference(None, None)   # ar's output of this example, once ar has run on it (the oracle's hints)
        rows, ar_margins = {}, None
        warm_len = min(blocks[i], len(prompt) - 1) if warm_tools else 0
        for name, fn in methods.items():
            if settle is not None:
                settle()
            if warm_len:
                fn.warm(prompt[:warm_len], ctx)
            time_s, res = _timed(fn, prompt, ctx)
            rows[name] = _row(rec["id"], name, len(prompt), time_s, res, tokenizer, fp)
            rows[name]["warm_tokens"] = warm_len
            if name == BASELINE:
                ar_margins = res.margins
                ctx.set_reference(rec["id"], res.tokens)
        compare_rows(rows, ar_margins, tie_tol, reference)
        examples.extend(rows.values())
        if on_example is not None:
            on_example(_results(examples, list(methods), tie_tol, roofline))
    return _results(examples, list(methods), tie_tol, roofline)


def _results(examples: list[dict], order: list[str], tie_tol: float, roofline: dict | None) -> dict:
    return json_safe({"methods": summarize(examples, order, roofline=roofline), "examples": examples,
                      "tie_margin": tie_tol})


# ------------------------------------------------------------------------------------------ summary math


def json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float (nan / inf) replaced by None, so the JSON stays standard."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def summarize_method(rows: Sequence[dict], baseline: dict[str, dict], roofline: dict | None = None,
                     peer: dict[str, dict] | None = None) -> dict:
    """Summary of one method's rows against the baseline's rows ``{id: row}`` (same ids).

    ``peer``: the ``llama.cpp`` peer's rows ``{id: row}`` when it ran; ``vs_llamacpp`` is then the ratio of its
    mean time to this method's over the same ids (> 1: faster than llama.cpp's plain greedy decoding).

    Every metric is one of :mod:`ooospec.runtime.metrics`. Worked example: AR times ``[1.0, 3.0]``, method times
    ``[0.5, 2.0]`` -> ``mean_s`` 1.25, ``speedup`` 2.0 / 1.25 = 1.6, per-example ratios ``[2.0, 1.5]`` ->
    ``speedup_median`` 1.75.
    """
    if not rows:
        raise ValueError("no rows to summarize")
    missing = [r["id"] for r in rows if r["id"] not in baseline]
    if missing:
        raise ValueError(f"{rows[0]['method']}: examples without a baseline row: {missing[:5]}")
    times = [r["time_s"] for r in rows]
    base_times = [baseline[r["id"]]["time_s"] for r in rows]
    decode = [r["decode_s"] for r in rows]
    base_decode = [baseline[r["id"]]["decode_s"] for r in rows]
    tokens = sum(r["new_tokens"] for r in rows)
    forwards = sum(r["forwards"] for r in rows)
    trees = [t for r in rows for t in r["tree_sizes"]]
    proposed = [p for r in rows for p in (r.get("proposed") or [])]
    mismatches = [r["mismatch"] for r in rows if r.get("mismatch")]
    exact_hf = [r["exact_hf"] for r in rows if r.get("exact_hf") is not None]
    out = {
        "n": len(rows),
        "mean_s": statistics.fmean(times),
        "median_s": statistics.median(times),
        "mean_prefill_s": statistics.fmean(r["prefill_s"] for r in rows),
        "mean_decode_s": statistics.fmean(decode),
        "speedup": metrics.speedup(statistics.fmean(base_times), statistics.fmean(times)),
        "speedup_median": statistics.median(metrics.speedup(b, t) for b, t in zip(base_times, times)),
        "decode_speedup": metrics.speedup(statistics.fmean(base_decode), statistics.fmean(decode)),
        "mat": metrics.mat(tokens, forwards),
        "new_tokens": tokens,
        "forwards": forwards,
        "mean_tree_size": metrics.mean_tree_size(trees),
        "mean_proposed_nodes": statistics.fmean(proposed) if proposed else None,
        "tokens_per_s": metrics.per_second(tokens, sum(times)),
        "exact_rate": sum(bool(r["exact"]) for r in rows) / len(rows),
        "exact_hf_rate": sum(exact_hf) / len(exact_hf) if exact_hf else None,
        "near_ties": sum(m["kind"] == "near_tie" for m in mismatches),
        "defects": sum(m["kind"] == "defect" for m in mismatches),
        "overshoot_tokens": sum(r.get("overshoot", 0) for r in rows),
    }
    if peer and all(r["id"] in peer for r in rows):
        out["vs_llamacpp"] = metrics.speedup(statistics.fmean(peer[r["id"]]["time_s"] for r in rows),
                                             statistics.fmean(times))
    hint_summary = summarize_hints(rows)
    if hint_summary is not None:
        out["hints"] = hint_summary
    if all("prefill_flops" in r for r in rows):
        out["prefill_flops_per_s"] = metrics.per_second(sum(r["prefill_flops"] for r in rows),
                                                        sum(r["prefill_s"] for r in rows))
        out["decode_bytes_per_s"] = metrics.per_second(sum(r["decode_bytes"] for r in rows), sum(decode))
        if roofline is not None:
            out["prefill_peak_frac"] = out["prefill_flops_per_s"] / roofline["peak_flops"]
            out["decode_peak_frac"] = out["decode_bytes_per_s"] / roofline["peak_bytes_per_s"]
    return out


def summarize(examples: Sequence[dict], order: Sequence[str] | None = None, baseline: str = BASELINE,
              roofline: dict | None = None) -> dict:
    """``{method: summary}`` in ``order`` (default: first appearance), each against ``baseline``'s rows."""
    by_method: dict[str, list[dict]] = {}
    for row in examples:
        by_method.setdefault(row["method"], []).append(row)
    if baseline not in by_method:
        raise ValueError(f"no {baseline!r} rows to compare against (methods: {sorted(by_method)})")
    base = {r["id"]: r for r in by_method[baseline]}
    peer = {r["id"]: r for r in by_method.get(LLAMACPP_REFERENCE, [])}
    return {m: summarize_method(by_method[m], base, roofline, peer) for m in (order or by_method)}


# ------------------------------------------------------------------------------------------- environment


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(PACKAGE_ROOT), *args], capture_output=True, text=True, timeout=10,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def environment(threads: tuple[int, str], dtype: tuple[str, str], dtype_requested: str, model,
                roofline: dict | None) -> dict:
    """Versions, threads and dtype (with the reasons they were chosen), CPU, roofline, footprint and commit.

    ``commit_dirty``: uncommitted changes were present.
    """
    import transformers

    status = _git("status", "--porcelain", "--untracked-files=no")
    info = hardware.cpu_info()
    return {
        "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
        "threads": threads[0], "threads_reason": threads[1],
        "dtype": dtype[0], "dtype_requested": dtype_requested, "dtype_reason": dtype[1],
        "cpu": info["model"], "cpu_flags": info["flags"], "cpu_count": os.cpu_count(),
        "cores_available": info["cores"], "roofline": roofline, "footprint": dataclasses.asdict(footprint(model)),
        "commit": _git("rev-parse", "HEAD"), "commit_dirty": None if status is None else bool(status),
        "loadavg_start": list(os.getloadavg()),
    }


def backend_env(backend: tuple[str, str], model) -> dict:
    """The backend, why it was chosen, and for llama.cpp its bindings' version and the GGUF's weight format."""
    out = {"backend": backend[0], "backend_reason": backend[1]}
    if backend[0] == "llama.cpp":
        from ooospec.runtime import llamacpp

        out.update(llama_cpp=llamacpp.available()[1], weights=model.weight_type, gguf=str(model.path),
                   llama_threads=model.threads)
    return out


# ------------------------------------------------------------------------------------------ hint sources


@dataclass(frozen=True)
class HintOptions:
    """Where method ``ooospec`` takes its hints from (``ooospec bench --hints/--sidecar-*``, the transfer stage).

    ``source="gold"``: the gold call at time zero, no sidecar; ``source="oracle"``: the call ``ar`` wrote for the
    same request, at time zero, no sidecar (the ceilings). ``source="sidecar"``: the sidecar
    server at ``sidecar_url``, or, when None, one started for the run from ``sidecar_adapter`` (None:
    ``$OOOSPEC_SIDECAR_ADAPTER``, else the shipped adapter) at ``dtype``, placed as deployment ``sidecar_deploy``
    (:data:`~ooospec.eval.ooospec_method.DEPLOYMENTS`); ``sidecar_model`` is the served model name.
    ``sidecar_gate``: send each request's wave only when it pays, cut to the queries that pay
    (:func:`~ooospec.eval.ooospec_method.wave_gate_for`, the deployment's prior); False: always the full wave.
    ``warm_tools``: the bench's ``--warm-tools``: the started server keeps block KV across waves and each
    request's toolbox is prefilled before its clock starts; False (cold): the started server keeps none.
    """

    source: methods.HintSourceName = "sidecar"
    sidecar_url: str | None = None
    sidecar_model: str = "sidecar"
    sidecar_adapter: str | None = None
    sidecar_deploy: str = DEFAULT_DEPLOYMENT
    sidecar_gate: bool = False
    dtype: str = "auto"
    warm_tools: bool = False

    def __post_init__(self):
        if self.source not in methods.HINT_SOURCES:
            raise ValueError(f"hint source {self.source!r}: expected one of {list(methods.HINT_SOURCES)}")
        if self.sidecar_deploy not in DEPLOYMENTS:
            raise ValueError(f"sidecar deployment {self.sidecar_deploy!r}: expected one of {sorted(DEPLOYMENTS)}")


def start_hints(options: HintOptions, bench_threads: int):
    """``(server process or None, hint source)`` for method ``ooospec``; the caller stops the process.

    Args:
        options: where the hints come from.
        bench_threads: the threads the bench runs at (the deployment places the server around them).
    """
    from ooospec.eval.ooospec_method import TIME_ZERO_HINTS, SidecarHints, server_placement, wave_gate_for

    if options.source != "sidecar":
        return None, TIME_ZERO_HINTS[options.source]()
    from ooospec.runtime.sidecar_client import SidecarClient, launch_sidecar

    deploy = DEPLOYMENTS[options.sidecar_deploy]
    proc, url = None, options.sidecar_url
    if url is None:
        cpus, server_threads = server_placement(deploy, bench_threads)
        print(f"starting the sidecar ({options.sidecar_adapter or 'shipped adapter'}, deployment {deploy.name}: "
              f"cpus {cpus or 'all'}, {server_threads} thread(s))", file=sys.stderr)
        # cold runs start every wave from nothing; warm runs keep the block KV (a toolbox is prefilled once)
        proc = launch_sidecar(options.sidecar_adapter, threads=server_threads, cpus=cpus, dtype=options.dtype,
                              prefix_cache_tokens=None if options.warm_tools else 0)
        url = proc.url
    hints = SidecarHints(SidecarClient(url, model=options.sidecar_model), deploy, bench_threads)
    if options.sidecar_gate:
        hints.client.gate = wave_gate_for(deploy)
    return proc, hints


ADAPTER_WEIGHTS = "adapter_model.safetensors"   # the peft weights file in a sidecar adapter folder


def adapter_record(adapter: str | os.PathLike) -> dict:
    """``{"path", "sha256", "layout_version"}`` of the sidecar adapter folder ``adapter``: its absolute path, the
    sha256 (hex) of its :data:`ADAPTER_WEIGHTS` and its ``sidecar.json`` ``layout_version`` (None for a file
    that is missing, and for a ``sidecar.json`` that cannot be read)."""
    from ooospec.runtime.sidecar_prompts import METADATA_FILE

    path = Path(adapter).resolve()
    weights, meta_path = path / ADAPTER_WEIGHTS, path / METADATA_FILE
    layout = None
    if meta_path.is_file():
        try:
            layout = json.loads(meta_path.read_text(encoding="utf-8")).get("layout_version")
        except (ValueError, AttributeError):
            layout = None
    return {"path": str(path), "sha256": sha256_file(weights) if weights.is_file() else None,
            "layout_version": layout}


def sidecar_adapter_record(options: HintOptions) -> dict | None:
    """Which adapter made the sidecar hints of a run with ``options`` (the results' ``env.sidecar_adapter``):
    :func:`adapter_record` of ``sidecar_adapter`` (None: ``$OOOSPEC_SIDECAR_ADAPTER``, else the shipped adapter,
    as :func:`start_hints` launches it) plus ``url``, the already running server if one was named. For such a
    server without ``sidecar_adapter`` the adapter is unknown: ``path``, ``sha256`` and ``layout_version`` are
    None. None when the hints come from no sidecar (``gold``, ``oracle``)."""
    if options.source != "sidecar":
        return None
    if options.sidecar_url is not None and options.sidecar_adapter is None:
        return {"path": None, "sha256": None, "layout_version": None, "url": options.sidecar_url}
    return {**adapter_record(sidecar_adapter_dir(options.sidecar_adapter)), "url": options.sidecar_url}
