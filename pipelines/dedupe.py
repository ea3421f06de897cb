"""DVC stage ``dedupe``: remove duplicates, hold out the benchmarks, and keep training free of evaluation leaks.

    python -m ooospec.pipelines.dedupe data/ingest/records.jsonl data/dedupe

Keys (all on :func:`ooospec.runtime.calls.norm_text`: Unicode NFKC, casefold, whitespace collapsed):

* exact key       the canonical JSON of the record without its id/split/meta (byte-level duplicate)
* normalized key  normalized context (every message, tool calls canonicalized) + canonical gold calls
                  (sorted keys, normalized values, ``5`` == ``5.0``)
* request keys    the normalized first and last user message of a record
* pair keys       (request key, canonical gold calls)

Steps:
1. Every record whose (source, split) is listed in ``eval_sets`` goes to that benchmark's file. Benchmarks are kept
   as published (their internal duplicates are counted, and dropped only with ``drop_eval_duplicates``).
2. Training records (``train_splits``) lose exact and normalized duplicates, within and across sources; the first
   record in id order is kept.
3. Leaks: a training record is removed if it shares a request key or a pair key with any evaluation record, if it
   comes from the same source dialogue as an evaluation record (``meta.dialogue``: API-Bank's level-1/2 tests are
   cut from the lv1/lv2 sample dialogues), or if it carries a benchmark's tool docs (``meta.bfcl_distractor``).

Your own sources (``ingest.user_sources``, whose records carry ``meta.user_source``) need no entry here: their
split ``heldout`` (whole conversations, chosen at ingest) is the benchmark named like the source, and their split
``train`` is training data, checked for duplicates and leaks like the rest (so a training request that repeats a
held-out one is removed). ``train_splits: []`` trains on your data alone.

Input lines go through :func:`records.load_records` (the records validation of ingest): a bad line fails the stage
with ``file:line``, the reason and the field, or with ``on_reject: skip`` is left out and counted (``input`` in the
metrics).

Writes ``train.jsonl`` and ``eval/<benchmark>.jsonl`` (sorted by id), ``metrics/dedupe.json`` and one data card per
produced dataset (``data_cards/train.md``, ``data_cards/eval/<benchmark>.md``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tqdm import tqdm

from ooospec.pipelines.params import add_path_arguments, as_dict, load_section, module_main
from ooospec.pipelines.records import load_records, write_json, write_jsonl
from ooospec.runtime.calls import canonical_calls, canonical_json, norm_text

DEFAULT_EVAL_SETS = {
    "apibank-l1": "apibank/test-l1",
    "apibank-l2": "apibank/test-l2",
    "apibank-l3": "apibank/test-l3",
    "toolalpaca-real": "toolalpaca/eval-real",
    "toolalpaca-sim": "toolalpaca/eval-sim",
    "bfcl-simple-python": "bfcl/simple-python",
    "bfcl-java": "bfcl/simple-java",
    "bfcl-javascript": "bfcl/simple-javascript",
    "bfcl-multiple": "bfcl/multiple",
    "bfcl-parallel": "bfcl/parallel",
    "sealtools-test-in": "sealtools/test-in",
    "sealtools-test-out": "sealtools/test-out",
}
DEFAULT_TRAIN_SPLITS = ("apibank/train-l3", "apibank/samples-l1", "apibank/samples-l2", "sealtools/dev",
                        "glaive/en", "glaive/zh", "toolrl/sft")


@dataclass(frozen=True)
class DedupeParams:
    eval_sets: dict = field(default_factory=lambda: dict(DEFAULT_EVAL_SETS))   # benchmark -> "source/split"
    train_splits: tuple[str, ...] = DEFAULT_TRAIN_SPLITS                      # "source/split"
    drop_eval_duplicates: bool = False
    drop_bfcl_distractors: bool = True
    on_reject: Literal["skip", "fail"] = "fail"   # an input line that is not a valid record: fail, or skip + count


# ---------------------------------------------------------------- keys (pure)

def _message_view(m: dict) -> dict:
    v = {"role": m["role"], "content": norm_text(m.get("content") or "")}
    if m.get("tool_calls"):
        v["tool_calls"] = canonical_calls([tc.get("function", tc) for tc in m["tool_calls"]])
    return v


def exact_key(rec: dict) -> str:
    return canonical_json({k: rec[k] for k in ("source", "tools", "messages", "calls")})


def normalized_key(rec: dict) -> str:
    return canonical_json([_message_view(m) for m in rec["messages"]]) + "||" + canonical_calls(rec["calls"])


def request_keys(rec: dict) -> set[str]:
    users = [norm_text(m["content"]) for m in rec["messages"] if m["role"] == "user" and m.get("content")]
    return {u for u in (users[:1] + users[-1:]) if u}


def pair_keys(rec: dict) -> set[str]:
    calls = canonical_calls(rec["calls"])
    return {f"{r}||{calls}" for r in request_keys(rec)}


def dialogue_key(rec: dict) -> str | None:
    d = (rec.get("meta") or {}).get("dialogue")
    return f"{rec['source']}:{d}" if d else None


# ---------------------------------------------------------------- the stage

def with_user_sources(params: DedupeParams, records: list[dict]) -> DedupeParams:
    """``params`` with each user source's ``heldout`` split as the benchmark named like it and its ``train`` split
    as training (a user source's records carry ``meta.user_source``, set by ingest)."""
    users = sorted({r["source"] for r in records if (r.get("meta") or {}).get("user_source")})
    clash = sorted(set(users) & set(params.eval_sets))
    if clash:
        raise ValueError(f"user source(s) {clash} are named like a benchmark of dedupe.eval_sets: rename them")
    return dataclasses.replace(params, eval_sets={**params.eval_sets, **{u: f"{u}/heldout" for u in users}},
                               train_splits=tuple(params.train_splits) + tuple(f"{u}/train" for u in users))


def route(params: DedupeParams, records: list[dict]) -> tuple[dict[str, list[dict]], list[dict], Counter]:
    """Records in id order -> ({benchmark: records}, training records, {"source/split": count} of the unused)."""
    split_to_bench = {v: k for k, v in params.eval_sets.items()}
    train_splits = set(params.train_splits)
    evals: dict[str, list[dict]] = defaultdict(list)
    train_in: list[dict] = []
    unused: Counter = Counter()
    for rec in sorted(records, key=lambda r: r["id"]):
        key = f"{rec['source']}/{rec['split']}"
        if key in split_to_bench:
            evals[split_to_bench[key]].append(rec)
        elif key in train_splits:
            train_in.append(rec)
        else:
            unused[key] += 1
    return evals, train_in, unused


def benchmark(params: DedupeParams, recs: list[dict]) -> tuple[list[dict], dict]:
    """One benchmark as published: its internal normalized duplicates counted (dropped with
    ``drop_eval_duplicates``); returns (records, stats)."""
    seen, kept, dups = set(), [], 0
    for r in recs:
        k = normalized_key(r)
        if k in seen:
            dups += 1
            if params.drop_eval_duplicates:
                continue
        seen.add(k)
        kept.append(r)
    return kept, {"records": len(kept), "normalized_duplicates": dups,
                  "dropped_duplicates": dups if params.drop_eval_duplicates else 0,
                  "calls": sum(len(r["calls"]) for r in kept)}


def filter_train(params: DedupeParams, train_in: list[dict],
                 evals: dict[str, list[dict]]) -> tuple[list[dict], dict[str, Counter]]:
    """Training records without duplicates and leaks: (kept, {reason: per-source count of the removed})."""
    eval_requests, eval_pairs, eval_dialogues = set(), set(), set()
    for recs in evals.values():
        for r in recs:
            eval_requests |= request_keys(r)
            eval_pairs |= pair_keys(r)
            if (d := dialogue_key(r)) is not None:
                eval_dialogues.add(d)
    removed: dict[str, Counter] = defaultdict(Counter)
    seen_exact: set[str] = set()
    seen_norm: set[str] = set()
    train: list[dict] = []
    for r in tqdm(train_in, desc="dedupe train", unit="rec", leave=False):
        src = r["source"]
        ek, nk = exact_key(r), normalized_key(r)
        if ek in seen_exact:
            removed["exact_duplicate"][src] += 1
            continue
        seen_exact.add(ek)
        if nk in seen_norm:
            removed["normalized_duplicate"][src] += 1
            continue
        seen_norm.add(nk)
        if (d := dialogue_key(r)) is not None and d in eval_dialogues:
            removed["leak_same_dialogue"][src] += 1
        elif request_keys(r) & eval_requests:
            removed["leak_request"][src] += 1
        elif pair_keys(r) & eval_pairs:
            removed["leak_request_call_pair"][src] += 1
        elif params.drop_bfcl_distractors and (r.get("meta") or {}).get("bfcl_distractor"):
            removed["leak_benchmark_tool_docs"][src] += 1
        else:
            train.append(r)
    return train, removed


def dedupe(params: DedupeParams, records: list[dict]) -> tuple[list[dict], dict[str, list[dict]], dict]:
    """Split records into (train, {benchmark: records}, stats). Pure: no I/O."""
    params = with_user_sources(params, records)
    evals, train_in, unused = route(params, records)
    stats: dict = {"eval": {}, "train": {}, "unused_splits": dict(sorted(unused.items())),
                   "eval_sets": dict(sorted(params.eval_sets.items()))}
    for bench in sorted(params.eval_sets):
        evals[bench], stats["eval"][bench] = benchmark(params, evals.get(bench, []))
    train, removed = filter_train(params, train_in, evals)
    per_source_in, per_source_out = Counter(r["source"] for r in train_in), Counter(r["source"] for r in train)
    per_split_out = Counter(f"{r['source']}/{r['split']}" for r in train)
    stats["train"] = {
        "records": len(train),
        "calls": sum(len(r["calls"]) for r in train),
        "input_by_source": dict(sorted(per_source_in.items())),
        "output_by_source": dict(sorted(per_source_out.items())),
        "output_by_split": dict(sorted(per_split_out.items())),
        "removed": {reason: dict(sorted(c.items())) for reason, c in sorted(removed.items())},
        "removed_total": {reason: sum(c.values()) for reason, c in sorted(removed.items())},
    }
    return train, dict(evals), stats


def check_no_leak(train: list[dict], evals: dict[str, list[dict]]) -> list[str]:
    """Ids of training records that still share a normalized request with an evaluation record (should be [])."""
    eval_requests = set().union(*(request_keys(r) for recs in evals.values() for r in recs)) if evals else set()
    return [r["id"] for r in train if request_keys(r) & eval_requests]


def run(params: DedupeParams, records_path: Path, out_dir: Path, *, metrics_path: Path, cards_dir: Path | None,
        ingest_metrics: Path | None) -> dict:
    read = load_records(records_path, params.on_reject, what="ingest records", knob="dedupe.on_reject")
    train, evals, stats = dedupe(params, read.rows)
    stats["input"] = read.summary()
    leaks = check_no_leak(train, evals)
    if leaks:  # cannot happen by construction; guard against a future edit of dedupe()
        raise AssertionError(f"{len(leaks)} training records still leak, e.g. {leaks[:3]}")
    out_dir = Path(out_dir)
    write_jsonl(out_dir / "train.jsonl", train)
    for bench, recs in sorted(evals.items()):
        write_jsonl(out_dir / "eval" / f"{bench}.jsonl", recs)
    stats["params"] = as_dict(params)
    write_json(metrics_path, stats)
    if cards_dir is not None:
        from ooospec.pipelines.data_cards import dedupe_cards
        ingest_stats = None
        if ingest_metrics is not None and Path(ingest_metrics).exists():
            import json
            ingest_stats = json.loads(Path(ingest_metrics).read_text())
        dedupe_cards(stats, ingest_stats, Path(cards_dir))
    if read.bad:
        print(f"dedupe: skipped {len(read.bad)} bad input records {stats['input']['bad_by_reason']}", file=sys.stderr)
    print(f"dedupe: train {len(train)} records; removed {stats['train']['removed_total']}; "
          f"eval {{{', '.join(f'{b}: {len(v)}' for b, v in sorted(evals.items()))}}}", file=sys.stderr)
    return stats


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_path_arguments(p, {"records": "records.jsonl from the ingest stage",
                           "out_dir": "folder for train.jsonl and eval/<benchmark>.jsonl"},
                       metrics="metrics/dedupe.json", cards="data_cards", ingest_metrics="metrics/ingest.json")


def run_cli(args: argparse.Namespace) -> int:
    run(load_section(DedupeParams, "dedupe", args.params), args.records, args.out_dir,
        metrics_path=args.metrics, cards_dir=args.cards, ingest_metrics=args.ingest_metrics)
    return 0


def main(argv: list[str] | None = None) -> int:
    return module_main("ooospec.pipelines.dedupe", __doc__, add_arguments, run_cli, argv)


if __name__ == "__main__":
    sys.exit(main())
