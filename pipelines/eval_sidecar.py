"""DVC stage ``eval_sidecar``: offline quality of the trained sidecar and the latency of one slot wave on CPU.

Quality is measured on held-out slot rows (``data/slots/heldout.jsonl``), greedy, answers parsed with the
runtime's own parsers (``ooospec.runtime.sidecar_prompts``) and compared as canonical compact JSON::

    function_index.accuracy        predicted tool index == gold index
    argument.exact_match           predicted value == gold value, over every argument slot (null slots included)
    argument.exact_match_non_null  the same over slots whose gold value is not null (the values a hint carries)
    direct_call.exact_match        the whole predicted call == gold call (argument order ignored)
    null.precision / null.recall   "null" = the argument is omitted or its function is not called; over argument
                                   slots, precision = P(gold null | predicted null), recall = P(predicted null |
                                   gold null). An unparseable answer counts as a non-null prediction.

Latency is the OoO-Spec request-level wave: ONE request's queries generated as one left-padded batch, greedy,
with ``threads`` torch threads (1 by default), one warm-up wave first; we report the median (and p90) over the
evaluated requests. With ``--waves data/slots/heldout_waves.jsonl`` (the DVC stage passes it) the wave is the
runtime's full query set from ``slot_queries`` (index + every function x parameter, ``latency.wave: "full"``)
and the heldout rows are scored on the answers of that same batch (their prompts are a subset of it); without
it the wave is the request's heldout function_index + argument rows (capped nulls, so smaller:
``"heldout_rows"``). Reference from a public reproduction (Qwen3-0.6B sidecar on a
GPU): 96.3% function accuracy, 86.1% argument exact match (:data:`ANCHOR`).

    python -m ooospec.pipelines.eval_sidecar data/slots/heldout.jsonl models/sidecar metrics/eval_sidecar.json
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ooospec.pipelines.params import as_dict, load_section
from ooospec.pipelines.records import canonical_json, write_json
from ooospec.pipelines.train_sidecar import FORMS, load_base, load_recipe, read_slot_rows
from ooospec.runtime.sidecar_prompts import parse_argument_value, parse_direct_call, parse_function_index

logger = logging.getLogger(__name__)

ANCHOR = {"source": "public OoO-Spec reproduction: Qwen3-0.6B + LoRA sidecar, GPU",
          "function_index_accuracy": 0.963, "argument_exact_match": 0.861}
WAVE_FORMS = ("function_index", "argument")
UNPARSEABLE = object()  # a prediction with no usable JSON value
MAX_EXAMPLES = 5


@dataclass(frozen=True)
class EvalSidecarParams:
    """params.yaml section ``eval_sidecar``. Defaults bound the CPU run."""

    max_heldout_requests: int = 30  # requests (record_ids) evaluated; 0 = all
    max_new_tokens: int = 48  # per answer; an argument value longer than this counts as wrong
    threads: int = 1  # torch threads while generating (the latency is defined at 1 thread)
    direct_call_batch: int = 8  # direct_call rows are scored in batches of this size (not timed)
    merge_adapter: bool = True  # fold the LoRA into the base weights before generating (the deployed form)
    dtype: str = ""  # inference weights dtype, fp32 | bf16; "" = the training recipe's dtype
    seed: int = 0


# --------------------------------------------------------------------------------------------- selection

def request_key(row: dict) -> str:
    """The request (one wave) a row belongs to: one call of one record.

    expand_slots ids look like ``<record_id>#<k>/<form>[/<function>/<parameter>]``: the k-th call of a record
    is its own request (``"apibank/x#3#1/argument/f/p"`` with record_id ``"apibank/x#3"`` -> ``"apibank/x#3#1"``).
    Other ids fall back to the record id.
    """
    rid, rest = row["record_id"], row["id"][len(row["record_id"]):]
    if row["id"].startswith(rid) and rest.startswith("#") and "/" in rest:
        k = rest[1:rest.index("/")]
        if k.isdigit():
            return f"{rid}#{k}"
    return rid


def group_requests(rows: Sequence[dict]) -> dict[str, list[dict]]:
    """``request_key -> rows`` in file order; keys sorted."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(request_key(r), []).append(r)
    return dict(sorted(groups.items()))


def select_requests(groups: dict[str, list[dict]], max_requests: int, seed: int) -> dict[str, list[dict]]:
    """At most ``max_requests`` requests (0 = all), chosen by hash of ``seed:request``; keys sorted."""
    if max_requests < 0:
        raise ValueError(f"max_heldout_requests must be >= 0 (0 = all), got {max_requests}")
    ranked = sorted(groups, key=lambda k: hashlib.sha256(f"{seed}:{k}".encode()).hexdigest())
    keep = ranked if max_requests == 0 else ranked[:max_requests]
    return {k: groups[k] for k in sorted(keep)}


# --------------------------------------------------------------------------------------------- scoring

def parse_prediction(form: str, text: str) -> Any:
    """The JSON value answered for a slot, or :data:`UNPARSEABLE`.

    ``parse_prediction("argument", ' "Paris"</s>junk')`` -> ``"Paris"``; ``("function_index", "x")`` ->
    UNPARSEABLE. A function_index answer may be null (no call), else it must be a non-negative integer.
    """
    try:
        if form == "direct_call":
            return parse_direct_call(text)
        value = parse_argument_value(text)
        if form == "function_index" and value is not None:
            return parse_function_index(text)
        return value
    except ValueError:
        return UNPARSEABLE


def _same(pred: Any, gold: Any) -> bool:
    return pred is not UNPARSEABLE and canonical_json(pred) == canonical_json(gold)


def _ratio(num: int, den: int) -> float | None:
    return round(num / den, 6) if den else None


def score(rows: Sequence[dict], predictions: dict[str, str]) -> dict:
    """Quality metrics of raw answer texts ``predictions[row_id]`` against the rows' gold completions.

    Worked example: argument slots with gold ``["x", null, null]`` and answers ``["x", null, "y"]`` give
    exact_match 2/3, exact_match_non_null 1/1, null precision 1/1, null recall 1/2.
    """
    missing = [r["id"] for r in rows if r["id"] not in predictions]
    if missing:
        raise ValueError(f"no prediction for {len(missing)} row(s), e.g. {missing[:3]}")
    out: dict[str, dict] = {}
    null = {"tp": 0, "predicted_null": 0, "gold_null": 0}
    for form in FORMS:
        sub = [r for r in rows if r["form"] == form]
        correct = unparseable = non_null = non_null_correct = 0
        mistakes = []
        for r in sub:
            gold = json.loads(r["completion"])
            pred = parse_prediction(form, predictions[r["id"]])
            ok = _same(pred, gold)
            correct += ok
            unparseable += pred is UNPARSEABLE
            if not ok and len(mistakes) < MAX_EXAMPLES:
                mistakes.append({"id": r["id"], "gold": r["completion"], "answer": predictions[r["id"]][:200]})
            if form == "argument":
                non_null += gold is not None
                non_null_correct += ok and gold is not None
                null["gold_null"] += gold is None
                null["predicted_null"] += pred is None
                null["tp"] += gold is None and pred is None
        key = "accuracy" if form == "function_index" else "exact_match"
        out[form] = {"n": len(sub), "correct": correct, key: _ratio(correct, len(sub)),
                     "unparseable": unparseable, "mistakes": mistakes}
        if form == "argument":
            out[form].update(n_non_null=non_null, exact_match_non_null=_ratio(non_null_correct, non_null))
    out["null"] = {**null, "precision": _ratio(null["tp"], null["predicted_null"]),
                   "recall": _ratio(null["tp"], null["gold_null"])}
    return out


def trivial_baselines(rows: Sequence[dict]) -> dict:
    """What a constant answer scores on the same rows: the floor a trained sidecar must clear.

    ``function_index_always_0`` (the first tool: many requests offer one tool, or list the called one first) and
    ``argument_always_null`` (the share of null slots).
    """
    index = [json.loads(r["completion"]) for r in rows if r["form"] == "function_index"]
    args = [json.loads(r["completion"]) for r in rows if r["form"] == "argument"]
    return {"function_index_always_0": _ratio(sum(g == 0 for g in index), len(index)),
            "argument_always_null": _ratio(sum(g is None for g in args), len(args))}


# --------------------------------------------------------------------------------------------- generation

def greedy_answers(model, tokenizer, prompts: Sequence[str], max_new_tokens: int) -> list[str]:
    """Greedy answers for ``prompts`` as ONE left-padded batch; each decoded up to its EOS (specials dropped)."""
    import torch

    if not prompts:
        return []
    tokenizer.padding_side = "left"
    enc = tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    new = out[:, enc["input_ids"].shape[1]:]  # [batch, <= max_new_tokens]
    return tokenizer.batch_decode(new, skip_special_tokens=True)


def run_waves(requests: dict[str, list[dict]], answer: Callable[[list[str]], list[str]],
              full_waves: dict[str, list[str]] | None = None) -> tuple[dict, list[float], list[int]]:
    """Answer each request's wave as one batch; ``(answers by row id, seconds per wave, prompts per wave)``.

    The wave is ``full_waves[request]`` when given (the runtime's full query set; each heldout function_index /
    argument row takes the answer of its identical prompt in that batch), else the request's own
    function_index + argument rows. A heldout row whose prompt is not in its full wave is a data bug: raises.
    The first wave is run twice and its first timing dropped (warm-up: allocator, kernels, caches).
    """
    answers, seconds, sizes = {}, [], []
    for i, (rid, rows) in enumerate(requests.items()):
        scored = [r for r in rows if r["form"] in WAVE_FORMS]
        prompts = list(full_waves[rid]) if full_waves is not None else [r["prompt"] for r in scored]
        if not prompts:
            continue
        if i == 0:
            answer(prompts)
        t0 = time.perf_counter()
        texts = answer(prompts)
        seconds.append(time.perf_counter() - t0)
        sizes.append(len(prompts))
        by_prompt = dict(zip(prompts, texts))
        for r in scored:
            if r["prompt"] not in by_prompt:
                raise ValueError(f"heldout row {r['id']!r}: its prompt is not in the full wave of request {rid!r} "
                                 "(heldout_waves.jsonl and heldout.jsonl from different expand_slots runs?)")
            answers[r["id"]] = by_prompt[r["prompt"]]
    return answers, seconds, sizes


def read_waves(path: str | os.PathLike, requests: Sequence[str]) -> dict[str, list[str]]:
    """``request -> prompts`` from ``heldout_waves.jsonl`` for the given requests; a missing one raises."""
    waves = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            w = json.loads(line)
            waves[w["request"]] = w["prompts"]
    missing = [r for r in requests if r not in waves]
    if missing:
        raise ValueError(f"{path}: no wave for {len(missing)} evaluated request(s), e.g. {missing[:3]}")
    return {r: waves[r] for r in requests}


def latency_summary(seconds: Sequence[float], wave_sizes: Sequence[int], threads: int, wave: str) -> dict:
    if not seconds:
        return {"waves": 0}
    ms = sorted(s * 1000 for s in seconds)
    return {"waves": len(ms), "wave": wave, "threads": threads, "median_ms": round(statistics.median(ms), 2),
            "p90_ms": round(ms[min(len(ms) - 1, int(0.9 * len(ms)))], 2), "mean_ms": round(statistics.fmean(ms), 2),
            "median_wave_rows": statistics.median(wave_sizes), "max_wave_rows": max(wave_sizes)}


def load_sidecar(model_dir: Path, merge: bool, threads: int, dtype: str = ""):
    """``(model, tokenizer, recipe)``: the recipe's base with ``model_dir/adapter`` applied (merged if asked)."""
    from peft import PeftModel

    recipe = load_recipe(model_dir / "recipe.yaml")
    base, _ = load_base(dataclasses.replace(recipe, dtype=dtype) if dtype else recipe, threads)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir / "adapter")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = PeftModel.from_pretrained(base, model_dir / "adapter")
    if merge:
        model = model.merge_and_unload()
    return model.eval(), tok, recipe


# --------------------------------------------------------------------------------------------- stage

def run(params: EvalSidecarParams, heldout_path: str | os.PathLike, model_dir: str | os.PathLike,
        metrics_path: str | os.PathLike, waves_path: str | os.PathLike | None = None) -> dict:
    """Evaluate ``model_dir`` (a train_sidecar output) on held-out slot rows; write and return the metrics.

    ``waves_path``: ``heldout_waves.jsonl`` of expand_slots; the timed wave is then the runtime's full one.
    """
    import torch

    if params.threads > 0:
        torch.set_num_threads(params.threads)
    torch.manual_seed(params.seed)
    all_rows = read_slot_rows(heldout_path)
    requests = select_requests(group_requests(all_rows), params.max_heldout_requests, params.seed)
    rows = [r for rs in requests.values() for r in rs]
    model, tok, recipe = load_sidecar(Path(model_dir), params.merge_adapter, params.threads, params.dtype)

    def answer(prompts: list[str]) -> list[str]:
        return greedy_answers(model, tok, prompts, params.max_new_tokens)

    full = read_waves(waves_path, list(requests)) if waves_path is not None else None
    answers, seconds, sizes = run_waves(requests, answer, full)
    direct = [r for r in rows if r["form"] == "direct_call"]
    for i in range(0, len(direct), params.direct_call_batch):
        chunk = direct[i:i + params.direct_call_batch]
        answers.update(zip([r["id"] for r in chunk], answer([r["prompt"] for r in chunk])))
    metrics = {
        "base": recipe.base,
        "base_model_id": recipe.base_model_id,
        "dtype": params.dtype or recipe.dtype,
        "requests": len(requests),
        "requests_available": len(group_requests(all_rows)),
        "rows": len(rows),
        **score(rows, answers),
        "baselines": trivial_baselines(rows),
        "latency": latency_summary(seconds, sizes, torch.get_num_threads(),
                                   "full" if full is not None else "heldout_rows"),
        "anchor": ANCHOR,
        "params": as_dict(params),
    }
    write_json(Path(metrics_path), metrics)
    return metrics


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("heldout", help="held-out slot rows (data/slots/heldout.jsonl)")
    parser.add_argument("model_dir", help="train_sidecar output (models/sidecar)")
    parser.add_argument("metrics", help="metrics JSON (metrics/eval_sidecar.json)")
    parser.add_argument("--params", default="params.yaml", help="params file (section eval_sidecar)")
    parser.add_argument("--max-heldout-requests", type=int, default=None,
                        help="override params' max_heldout_requests (0 = all)")
    parser.add_argument("--waves", default=None,
                        help="data/slots/heldout_waves.jsonl: time the runtime's full wave (default: heldout rows)")


def run_cli(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    params = load_section(EvalSidecarParams, "eval_sidecar", Path(args.params))
    if args.max_heldout_requests is not None:
        params = dataclasses.replace(params, max_heldout_requests=args.max_heldout_requests)
    m = run(params, args.heldout, args.model_dir, args.metrics, args.waves)
    print(f"eval_sidecar: {m['requests']} requests; function acc {m['function_index']['accuracy']}, "
          f"argument EM {m['argument']['exact_match']}, direct-call EM {m['direct_call']['exact_match']}, "
          f"{m['latency'].get('wave')} wave latency median {m['latency'].get('median_ms')} ms @ {params.threads} thread(s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ooospec.pipelines.eval_sidecar", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_cli(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
