"""The bench harness: the timed run of every method on every example, and the row each call leaves.

A library API with typed arguments (the command line is :mod:`ooospec.eval.bench.cli`, ``ooospec bench``; the
``transfer`` stage calls the same functions)::

    factories, notes = build_methods(["pld", "toolspec"], model, tokenizer, eos_token_ids=eos_ids(model, tokenizer))
    results = run_bench(model, tokenizer, load_examples(path, limit=30), factories, fmt=detect_format(tokenizer))
    # -> {"methods": {name: summary}, "examples": [row, ...], "tie_margin": float}

The methods come from :mod:`ooospec.eval.bench.methods`, the examples from :mod:`ooospec.eval.bench.data`, the
per-method summaries (``methods``) from :mod:`ooospec.eval.bench.summaries`.

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
recorded top-2 logit margins: ``near_tie`` (margin within bf16 rounding, the target's ``tie_margin``) or
``defect``.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable, Sequence

from tqdm import tqdm

from ooospec.eval.bench.data import prompt_ids_of, toolbox_blocks
from ooospec.eval.bench.method_api import BenchContext, BenchMethod, MethodFactory, MethodResult
from ooospec.eval.bench.methods import eos_ids
from ooospec.eval.bench.summaries import json_safe, summarize
from ooospec.runtime import metrics
from ooospec.runtime.backends.cost_model import Footprint
from ooospec.runtime.backends.target import as_target
from ooospec.runtime.methods import BASELINE, HF_REFERENCE, REFERENCES

WARMUP_TOKENS = 16  # budget of a warm-up call


def make_stop(tokenizer, fmt) -> Callable[[Sequence[int]], bool]:
    """The end-of-call predicate every method shares: ``fmt.is_complete`` on the decoded generated text."""

    def stop(generated: Sequence[int]) -> bool:
        return fmt.is_complete(tokenizer.decode(list(generated), skip_special_tokens=False))

    return stop


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


def _timed(fn: BenchMethod, prompt_ids: list[int], ctx: BenchContext) -> tuple[float, MethodResult]:
    gc.collect()
    t0 = time.perf_counter()
    res = fn(prompt_ids, ctx)
    return time.perf_counter() - t0, res


def run_bench(model, tokenizer, records: Sequence[dict], factories: dict[str, MethodFactory], *, fmt,
              max_new_tokens: int = 256, warmup: int = 1, progress: bool = True,
              on_example: Callable[[dict], None] | None = None, roofline: dict | None = None,
              settle: Callable[[], None] | None = None, warm_tools: bool = False) -> dict:
    """Run every method on every record (interleaved, fixed order) and return ``{"methods", "examples"}``.

    Args:
        model, tokenizer: the target.
        records: benchmark records (run in id order).
        factories: ``{name: factory}`` from :func:`~ooospec.eval.bench.methods.build_methods`; must contain ``"ar"``.
        fmt: the tool-call format module (``render_prompt``, ``is_complete``).
        max_new_tokens: generation budget per call.
        warmup: untimed calls per method on the first prompt (at most ``WARMUP_TOKENS`` new tokens each),
            by a throw-away instance.
        on_example: called after each example with the results so far (e.g. to save a partial JSON).
        settle: called before every timed call, untimed (e.g. wait until a sidecar server has finished a
            wave that an earlier call cancelled, so that it does not slow the next method down).
        warm_tools: before every timed call, prefill the request's system + tools block
            (:func:`~ooospec.runtime.agent.chat.system_tools_block`) into the method's cache, untimed, for every method
            alike: the agent setting, where one toolbox serves many requests. Every method needs a ``warm`` hook.
        roofline: ``{"peak_flops", "peak_bytes_per_s"}`` of this machine
        (:func:`ooospec.runtime.backends.hardware.roofline`)
            to give each method's achieved prefill FLOP/s and decode bytes/s as fractions of them.
    """
    if BASELINE not in factories:
        raise ValueError(f"methods must include the baseline {BASELINE!r}, got {list(factories)}")
    ctx = BenchContext(model, tokenizer, fmt, eos_ids(model, tokenizer), max_new_tokens, make_stop(tokenizer, fmt))
    target = as_target(model)
    tie_tol, reference, fp = target.tie_margin, REFERENCES[target.backend], target.footprint()
    records = sorted(records, key=lambda r: r["id"])
    prompts = [prompt_ids_of(rec, tokenizer, fmt) for rec in records]
    _warm_up(factories, records[0], prompts[0], warmup,
             dataclasses.replace(ctx, record=records[0], max_new_tokens=min(WARMUP_TOKENS, max_new_tokens)))
    fns = {name: factory() for name, factory in factories.items()}
    blocks = _toolbox_blocks(fns, records, prompts, tokenizer, fmt) if warm_tools else [0] * len(records)
    examples: list[dict] = []
    for rec, prompt, block in tqdm(list(zip(records, prompts, blocks)), desc="bench", disable=not progress):
        warm_len = min(block, len(prompt) - 1) if warm_tools else 0
        examples += _run_example(fns, rec, prompt, ctx, warm_len=warm_len, settle=settle, fp=fp, tie_tol=tie_tol,
                                 reference=reference)
        if on_example is not None:
            on_example(_results(examples, list(fns), tie_tol, roofline))
    return _results(examples, list(fns), tie_tol, roofline)


def _warm_up(factories: dict[str, MethodFactory], record: dict, prompt: list[int], warmup: int,
             ctx: BenchContext) -> None:
    """``warmup`` untimed calls of each method on the first prompt with a short budget (kernels, allocator, caches),
    by instances that are then thrown away."""
    for name, factory in factories.items():
        fn = factory()
        for _ in range(warmup):
            res = fn(prompt, ctx)
            if name == BASELINE:   # the oracle hint source's reference (ar runs first: build_methods' order)
                ctx.set_reference(record["id"], res.tokens)


def _toolbox_blocks(fns: dict[str, BenchMethod], records: Sequence[dict], prompts: list[list[int]], tokenizer,
                    fmt) -> list[int]:
    """``warm_tools``: every prompt's system + tools block; every method must be able to start from one."""
    cold_only = [name for name, fn in fns.items() if fn.warm is None]
    if cold_only:
        raise ValueError(f"--warm-tools: method(s) {cold_only} cannot start from a cached prefix")
    return toolbox_blocks(records, prompts, tokenizer, fmt)


def _run_example(fns: dict[str, BenchMethod], rec: dict, prompt: list[int], ctx: BenchContext, *, warm_len: int,
                 settle: Callable[[], None] | None, fp: Footprint, tie_tol: float, reference: str) -> list[dict]:
    """One example: every method in order, each timed (after ``settle`` and, with ``warm_len``, its warm prefix,
    both untimed); the rows compared with ``ar``'s."""
    ctx.record = rec
    ctx.set_reference(None, None)   # ar's output of this example, once ar has run on it (the oracle's hints)
    rows, ar_margins = {}, None
    for name, fn in fns.items():
        if settle is not None:
            settle()
        if warm_len:
            fn.warm(prompt[:warm_len], ctx)
        time_s, res = _timed(fn, prompt, ctx)
        rows[name] = _row(rec["id"], name, len(prompt), time_s, res, ctx.tokenizer, fp)
        rows[name]["warm_tokens"] = warm_len
        if name == BASELINE:
            ar_margins = res.margins
            ctx.set_reference(rec["id"], res.tokens)
    compare_rows(rows, ar_margins, tie_tol, reference)
    return list(rows.values())


def _results(examples: list[dict], order: list[str], tie_tol: float, roofline: dict | None) -> dict:
    return json_safe({"methods": summarize(examples, order, roofline=roofline), "examples": examples,
                      "tie_margin": tie_tol})
