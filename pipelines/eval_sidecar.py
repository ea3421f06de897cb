"""DVC stage ``eval_sidecar``: the sidecar's answer quality and the latency of its one-pass wave, on held-out requests.

Each evaluated request is answered the way the runtime answers it: ONE wave (the index query + every tool x
parameter query, sharing the request's block; :class:`ooospec.runtime.sidecar.wave.Sidecar`), greedy, timed (prefill
and decode apart) after one warm-up wave. The direct-call query is answered in a second, untimed pass. Answers
are parsed with the runtime's own parsers and compared as canonical compact JSON::

    function_index.accuracy        predicted tool index == gold index
    argument.exact_match           predicted value == gold value, over every argument slot (null slots included)
    argument.exact_match_non_null  the same over slots whose gold value is not null (the values a hint carries)
    argument.exact_match_in_block  ... over non-null slots whose gold value is written verbatim in the request's
                                   block (a copy would do), next to ``n_in_block`` (how many such slots there are)
    direct_call.exact_match        the whole predicted call == gold call (argument order ignored)
    joined.exact_match             join_slots(index + argument answers) == gold call: the hint the runtime builds
    joined.name_accuracy           ... its function name is right
    null.precision / null.recall   "null" = the argument is omitted or its function is not called; over argument
                                   slots, precision = P(gold null | predicted null), recall = P(predicted null |
                                   gold null). An unparseable answer counts as a non-null prediction.

Next to them: ``baselines`` (what a constant answer scores on the same slots) and, with ``--base-only``, the
untrained base (no adapter) as a second floor. ``--records FILE_OR_BENCHMARK`` evaluates zero-shot on any
records (e.g. ``apibank-l1`` = ``data/dedupe/eval/apibank-l1.jsonl``) instead of heldout request rows. Prompts
are in the adapter's layout (``sidecar.json``): records are turned into rows in it, and heldout rows built in
another layout are refused.
``max_forwards`` bounds the work (requests are taken in seeded order until the decode forwards are spent), so the
default pipeline's evaluation of a barely trained adapter stays a few minutes.

    python -m ooospec.pipelines.eval_sidecar data/slots/heldout.jsonl models/sidecar/adapter metrics/eval_sidecar.json
    python -m ooospec.pipelines.eval_sidecar --records bfcl-simple-python models/sidecar/adapter out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ooospec.pipelines.params import as_dict, load_section, module_main
from ooospec.pipelines.records import load_records, write_json
from ooospec.pipelines.slot_rows import read_request_rows, request_rows, row_wave, rows_layout
from ooospec.runtime.calls import canonical_json
from ooospec.runtime.paths import BENCHMARK_DIR, sidecar_adapter_dir
from ooospec.runtime.sidecar import prompts as sp

logger = logging.getLogger(__name__)

ANCHOR = {"source": "public OoO-Spec reproduction: Qwen3-0.6B + LoRA sidecar, GPU",
          "function_index_accuracy": 0.963, "argument_exact_match": 0.861}
UNPARSEABLE = object()  # a prediction with no usable JSON value
MAX_EXAMPLES = 5


@dataclass(frozen=True)
class EvalSidecarParams:
    """params.yaml section ``eval_sidecar``. Defaults bound the CPU run."""

    max_requests: int = 24  # requests evaluated (seeded choice); 0 = all
    max_new_tokens: int = 48  # per answer; an argument value longer than this counts as wrong
    # decode forwards over the whole run (direct-call passes included); once spent, no further request starts
    # (0 = no bound). A weak adapter decodes every branch to max_new_tokens, a trained one stops after a few
    # forwards, so this bounds a smoke run's time without shrinking a good adapter's evaluation.
    max_forwards: int = 0
    threads: int = 0  # torch threads for the waves (latency is reported at this count); 0 = all cores
    dtype: str = "auto"  # sidecar weights: auto | bf16 | fp32 (auto: see ooospec.runtime.backends.hardware)
    direct_call: bool = True  # also answer (untimed) and score the direct-call query
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_forwards < 0:
            raise ValueError(f"eval_sidecar.max_forwards must be >= 0 (0 = no bound), got {self.max_forwards}")


# --------------------------------------------------------------------------------------------- selection

def select_requests(rows: Sequence[dict], max_requests: int, seed: int) -> list[dict]:
    """At most ``max_requests`` rows (0 = all), chosen by hash of ``seed:id``, in that hash order: any prefix
    (what a ``max_forwards`` budget leaves) is itself a seeded sample, not the first ids of one source."""
    if max_requests < 0:
        raise ValueError(f"max_requests must be >= 0 (0 = all), got {max_requests}")
    ranked = sorted(rows, key=lambda r: hashlib.sha256(f"{seed}:{r['id']}".encode()).hexdigest())
    return ranked if max_requests == 0 else ranked[:max_requests]


def resolve_records(name_or_path: str) -> Path:
    """A benchmark name (``data/dedupe/eval/<name>.jsonl``) or a path to records."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    bench = BENCHMARK_DIR / f"{name_or_path}.jsonl"
    if bench.is_file():
        return bench
    known = sorted(p.stem for p in bench.parent.glob("*.jsonl")) if bench.parent.is_dir() else []
    raise FileNotFoundError(f"{name_or_path!r} is neither a file nor a benchmark (known: {known}; "
                            "`dvc repro dedupe` makes them)")


def rows_from_records(path: Path, layout: int = sp.LAYOUT_VERSION) -> tuple[list[dict], int]:
    """Request rows (prompt ``layout``) of every record's calls; invalid records (:func:`records.load_records`,
    logged with ``file:line``) and records whose calls name no tool are skipped (and counted)."""
    read = load_records(path, "skip", what="benchmark records")
    rows, skipped = [], len(read.bad)
    for rec in read.rows:
        try:
            rows += request_rows(rec, layout)
        except (ValueError, KeyError, TypeError) as e:
            skipped += 1
            logger.warning("%s: record %r skipped: %s", path, rec.get("id") if isinstance(rec, dict) else "?", e)
    return rows, skipped


# --------------------------------------------------------------------------------------------- scoring

def parse_prediction(form: str, text: str, num_tools: int | None = None) -> Any:
    """The JSON value answered for a slot, or :data:`UNPARSEABLE`.

    ``parse_prediction("argument", ' "Paris"</s>junk')`` -> ``"Paris"``; ``("function_index", "x")`` ->
    UNPARSEABLE.
    """
    try:
        if form == "direct_call":
            return sp.parse_direct_call(text)
        if form == "function_index":
            return sp.parse_function_index(text, num_tools)
        return sp.parse_argument_value(text)
    except ValueError:
        return UNPARSEABLE


def _same(pred: Any, gold: Any) -> bool:
    return pred is not UNPARSEABLE and canonical_json(pred) == canonical_json(gold)


def _ratio(num: int, den: int) -> float | None:
    return round(num / den, 6) if den else None


def score(slots: Sequence[dict], answers: Sequence[str]) -> dict:
    """Quality metrics of raw answers against the slots' gold answers (``slots[i]`` answered by ``answers[i]``).

    Worked example: argument slots with gold ``["x", null, null]`` and answers ``["x", null, "y"]`` give
    exact_match 2/3, exact_match_non_null 1/1, null precision 1/1, null recall 1/2.
    """
    out: dict[str, dict] = {}
    null = {"tp": 0, "predicted_null": 0, "gold_null": 0}
    for form in sp.FORMS:
        pairs = [(s, a) for s, a in zip(slots, answers) if s["form"] == form]
        correct = unparseable = non_null = non_null_correct = in_block = in_block_correct = 0
        mistakes = []
        for s, a in pairs:
            gold = json.loads(s["answer"])
            pred = parse_prediction(form, a)
            ok = _same(pred, gold)
            correct += ok
            unparseable += pred is UNPARSEABLE
            if not ok and len(mistakes) < MAX_EXAMPLES:
                mistakes.append({"query": s["query"].strip(), "gold": s["answer"], "answer": a[:200]})
            if form == "argument":
                non_null += gold is not None
                non_null_correct += ok and gold is not None
                in_block += bool(s.get("in_block"))
                in_block_correct += ok and bool(s.get("in_block"))
                null["gold_null"] += gold is None
                null["predicted_null"] += pred is None
                null["tp"] += gold is None and pred is None
        key = "accuracy" if form == "function_index" else "exact_match"
        out[form] = {"n": len(pairs), "correct": correct, key: _ratio(correct, len(pairs)),
                     "unparseable": unparseable, "mistakes": mistakes}
        if form == "argument":
            out[form].update(n_non_null=non_null, exact_match_non_null=_ratio(non_null_correct, non_null))
            if any("in_block" in s for s, _ in pairs):
                out[form].update(n_in_block=in_block, exact_match_in_block=_ratio(in_block_correct, in_block))
    out["null"] = {**null, "precision": _ratio(null["tp"], null["predicted_null"]),
                   "recall": _ratio(null["tp"], null["gold_null"])}
    return out


def in_block(slot: dict, block: str) -> bool:
    """Whether an argument slot's gold value is non-null and written verbatim in ``block`` (a string as itself,
    anything else as its compact JSON): the values a model could copy rather than infer."""
    if slot["form"] != "argument":
        return False
    gold = json.loads(slot["answer"])
    if gold is None:
        return False
    return (gold if isinstance(gold, str) else canonical_json(gold)) in block


def trivial_baselines(slots: Sequence[dict]) -> dict:
    """What a constant answer scores on the same slots: the floor a trained sidecar must clear.

    ``function_index_always_0`` (the first tool: many requests offer one tool, or list the called one first) and
    ``argument_always_null`` (the share of null slots).
    """
    index = [json.loads(s["answer"]) for s in slots if s["form"] == "function_index"]
    args = [json.loads(s["answer"]) for s in slots if s["form"] == "argument"]
    return {"function_index_always_0": _ratio(sum(g == 0 for g in index), len(index)),
            "argument_always_null": _ratio(sum(g is None for g in args), len(args))}


def joined_score(joined: Sequence[dict | None], gold: Sequence[dict]) -> dict:
    """How often the runtime's joined hint is the gold call (name + arguments), and its name alone."""
    exact = sum(j is not None and canonical_json(j) == canonical_json(g) for j, g in zip(joined, gold))
    names = sum(j is not None and j["name"] == g["name"] for j, g in zip(joined, gold))
    return {"n": len(gold), "exact_match": _ratio(exact, len(gold)), "name_accuracy": _ratio(names, len(gold)),
            "none": sum(j is None for j in joined)}


def source_of(row: dict) -> str:
    """The dataset a request row comes from: its id's first part (``sealtools/dev/...#0`` -> ``sealtools``)."""
    return str(row.get("id", "?")).split("/", 1)[0]


def by_source(per_row: Sequence[tuple[str, list[dict], list[str], dict | None, dict | None]]) -> dict:
    """Per source, the headline metrics of its rows: ``per_row`` holds ``(source, slots, answers, joined, gold)``.

    Tells where the function choice fails (e.g. many-tool Seal-Tools requests vs one-tool API-Bank ones).
    """
    groups: dict[str, list] = {}
    for item in per_row:
        groups.setdefault(item[0], []).append(item)
    out = {}
    for name in sorted(groups):
        items = groups[name]
        slots = [s for it in items for s in it[1]]
        answers = [a for it in items for a in it[2]]
        sc = score(slots, answers)
        pairs = [(it[3], it[4]) for it in items if it[4] is not None]
        out[name] = {"requests": len(items),
                     "function_acc": sc["function_index"]["accuracy"],
                     "function_always_0": trivial_baselines(slots)["function_index_always_0"],
                     "argument_exact_match_non_null": sc["argument"]["exact_match_non_null"],
                     "joined_exact_match": joined_score([j for j, _ in pairs], [g for _, g in pairs])["exact_match"]}
    return out


def _summary(values: Sequence[float]) -> dict:
    from ooospec.runtime.metrics import nearest_rank

    ms = sorted(v * 1000 for v in values)
    if not ms:
        return {}
    return {"median_ms": round(statistics.median(ms), 2), "p90_ms": round(nearest_rank(ms, 0.9), 2),
            "mean_ms": round(statistics.fmean(ms), 2)}


# --------------------------------------------------------------------------------------------- stage

def load_sidecar(adapter_dir: Path | None, params: EvalSidecarParams, base: str | None = None):
    """The trained sidecar (``adapter_dir``) or, with ``base``, that model untrained; plus the dtype reason."""
    from ooospec.runtime.backends.hardware import resolve_dtype, resolve_threads
    from ooospec.runtime.backends.models import load_target
    from ooospec.runtime.sidecar.wave import Sidecar

    threads, _ = resolve_threads(params.threads)
    dtype, why = resolve_dtype(params.dtype, threads=threads)
    if base is not None:
        model, tok = load_target(base, dtype=dtype, threads=threads)
        return Sidecar(model, tok, max_new_tokens=params.max_new_tokens, metadata={"base": base}), dtype, why
    return (Sidecar.from_adapter(adapter_dir, threads=threads, dtype=dtype, max_new_tokens=params.max_new_tokens),
            dtype, why)


@dataclass
class Answered:
    """What the waves answered, request by request (:func:`answer_requests`)."""

    slots: list[dict] = field(default_factory=list)    # every slot asked (direct-call ones included) ...
    answers: list[str] = field(default_factory=list)   # ... and its raw answer
    joined: list[dict | None] = field(default_factory=list)   # per request with a gold call: the joined hint
    gold_calls: list[dict] = field(default_factory=list)      # ... and that gold call
    per_row: list[tuple] = field(default_factory=list)        # (source, slots, answers, joined, gold): by_source
    waves: dict[str, list] = field(default_factory=lambda: {k: [] for k in (
        "wave_s", "prefill_s", "decode_s", "queries", "forwards", "block_tokens")})   # per timed wave
    num_forwards: int = 0
    evaluated: int = 0


def answer_requests(sidecar: Any, chosen: Sequence[dict], params: EvalSidecarParams) -> Answered:
    """One timed wave per request (then, with ``direct_call``, an untimed direct-call pass), in ``chosen`` order,
    until ``max_forwards`` decode forwards are spent."""
    out = Answered()
    sidecar.answer(row_wave(chosen[0], sp.WAVE_FORMS)[0])  # warm-up: allocator, kernels, caches
    for row in tqdm(chosen, desc="eval_sidecar", unit="req"):
        if params.max_forwards and out.num_forwards >= params.max_forwards:
            logger.info("max_forwards=%d spent after %d of %d requests: stopping", params.max_forwards,
                        out.evaluated, len(chosen))
            break
        out.evaluated += 1
        wave, slots = row_wave(row, sp.WAVE_FORMS)
        slots = [{**s, "in_block": in_block(s, row["block"])} for s in slots]
        result = sidecar.answer(wave)
        for key, value in (("wave_s", result.wave_s), ("prefill_s", result.prefill_s),
                           ("decode_s", result.decode_s), ("queries", len(slots)),
                           ("forwards", result.n_forwards), ("block_tokens", result.block_tokens)):
            out.waves[key].append(value)
        out.num_forwards += result.n_forwards
        out.slots += slots
        out.answers += result.answers
        call_slot = next((s for s in row["slots"] if s["form"] == "direct_call"), None)
        gold = row_joined = None
        if call_slot is not None:
            gold = json.loads(call_slot["answer"])
            row_joined = sp.join_answers(row["tools"], wave, result.answers)
            out.gold_calls.append(gold)
            out.joined.append(row_joined)
        out.per_row.append((source_of(row), slots, list(result.answers), row_joined, gold))
        if call_slot is not None and params.direct_call:
            dc_wave, dc_slots = row_wave(row, ("direct_call",))
            dc_result = sidecar.answer(dc_wave)
            out.num_forwards += dc_result.n_forwards
            out.slots += dc_slots
            out.answers += dc_result.answers
    return out


def _latency(waves: dict[str, list], threads: int) -> dict:
    return {"what": "index + every tool x parameter, one pass", "threads": threads,
            "wave": _summary(waves["wave_s"]), "prefill": _summary(waves["prefill_s"]),
            "decode": _summary(waves["decode_s"]),
            "median_queries": statistics.median(waves["queries"]), "max_queries": max(waves["queries"]),
            "median_forwards": statistics.median(waves["forwards"]),
            "median_block_tokens": statistics.median(waves["block_tokens"])}


def run(params: EvalSidecarParams, rows: Sequence[dict], adapter_dir: str | os.PathLike | None,
        metrics_path: str | os.PathLike, base: str | None = None, source: str = "") -> dict:
    """Evaluate the sidecar of ``adapter_dir`` (or the untrained ``base``) on request ``rows``; write the metrics."""
    import torch

    from ooospec.runtime.backends.hardware import cpu_info

    torch.manual_seed(params.seed)
    chosen = select_requests(rows, params.max_requests, params.seed)
    if not chosen:
        raise ValueError("no requests to evaluate")
    layout = rows_layout(list(rows))
    if base is None:   # before loading any model: the adapter must be asked in the layout it learned
        learned = sp.read_metadata(sidecar_adapter_dir(adapter_dir))["layout_version"]
        if learned != layout:
            raise ValueError(f"{adapter_dir} learned prompt layout {learned} ({sp.LAYOUTS[learned]}), but the "
                             f"request rows are in layout {layout} ({sp.LAYOUTS[layout]}): rebuild them in the "
                             "adapter's layout (expand_slots.layout)")
    sidecar, dtype, dtype_why = load_sidecar(Path(adapter_dir) if adapter_dir else None, params, base)
    got = answer_requests(sidecar, chosen, params)
    metrics = {
        "adapter": str(adapter_dir) if base is None else None,
        "base": sidecar.metadata.get("base"),
        "layout_version": layout,
        "source": source,
        "dtype": dtype,
        "dtype_reason": dtype_why,
        "requests": got.evaluated,
        "requests_chosen": len(chosen),  # more than ``requests`` when max_forwards stopped the run
        "requests_available": len(rows),
        "num_forwards": got.num_forwards,
        **score(got.slots, got.answers),
        "joined": joined_score(got.joined, got.gold_calls),
        "baselines": trivial_baselines(got.slots),
        "by_source": by_source(got.per_row),
        "latency": _latency(got.waves, torch.get_num_threads()),
        "cpu": cpu_info(),
        "anchor": ANCHOR,
        "params": as_dict(params),
    }
    write_json(Path(metrics_path), metrics)
    return metrics


# --------------------------------------------------------------------------------------------- CLI

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("heldout", nargs="?", help="held-out request rows (data/slots/heldout.jsonl)")
    parser.add_argument("adapter", help="sidecar adapter folder (models/sidecar/adapter, adapters/sidecar)")
    parser.add_argument("metrics", help="metrics JSON (metrics/eval_sidecar.json)")
    parser.add_argument("--records", default=None,
                        help="evaluate zero-shot on these records instead: a benchmark name or a JSONL path")
    parser.add_argument("--base-only", default=None, metavar="BASE",
                        help="evaluate this base model WITHOUT an adapter (the untrained floor)")
    parser.add_argument("--params", default="params.yaml", help="params file (section eval_sidecar)")
    parser.add_argument("--max-requests", type=int, default=None, help="override params' max_requests (0 = all)")
    parser.add_argument("--threads", type=int, default=None, help="override params' threads")


def run_cli(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    params = load_section(EvalSidecarParams, "eval_sidecar", Path(args.params))
    if args.max_requests is not None:
        params = dataclasses.replace(params, max_requests=args.max_requests)
    if args.threads is not None:
        params = dataclasses.replace(params, threads=args.threads)
    if args.records:
        path = resolve_records(args.records)
        layout = (sp.LAYOUT_VERSION if args.base_only
                  else sp.read_metadata(sidecar_adapter_dir(args.adapter))["layout_version"])
        rows, skipped = rows_from_records(path, layout)
        source = f"{path} ({skipped} records skipped)"
    elif args.heldout:
        rows, source = read_request_rows(args.heldout), str(args.heldout)
    else:
        raise SystemExit("eval_sidecar: give heldout request rows or --records")
    m = run(params, rows, None if args.base_only else args.adapter, args.metrics, base=args.base_only,
            source=source)
    print(summary_line(m))
    return 0


def summary_line(m: dict) -> str:
    """The one line the command prints about the metrics ``m`` of a run."""
    return (f"eval_sidecar: {m['requests']} requests; function acc {m['function_index']['accuracy']}, "
            f"argument EM {m['argument']['exact_match']} (non-null {m['argument']['exact_match_non_null']}), "
            f"joined call EM {m['joined']['exact_match']}, direct-call EM {m['direct_call']['exact_match']}; "
            f"wave median {m['latency']['wave'].get('median_ms')} ms @ {m['latency']['threads']} thread(s), "
            f"{m['dtype']}")


def main(argv: list[str] | None = None) -> int:
    return module_main("ooospec.pipelines.eval_sidecar", __doc__, add_arguments, run_cli, argv)


if __name__ == "__main__":
    raise SystemExit(main())
