"""DVC stage ``normalize``: parse teacher traces into compact, schema-valid calls.

    python -m ooospec.pipelines.normalize data/dedupe/train.jsonl data/teacher/traces.jsonl \
        data/normalize/calls.jsonl data/normalize/rejects.jsonl --metrics metrics/normalize.json

Each trace is parsed in the format the teacher wrote it in (``trace["format"]``, ``formats.parse_any`` when
absent). The output record is the training record with ``calls`` replaced by the teacher's calls as plain
``{"name", "arguments"}`` objects (no template tokens, no call ids; written as canonical JSON), plus
``meta.teacher = {"backend", "model", "format", "args_match_gold"}``.

A trace is kept whole or rejected whole (the k-th call of a parallel answer depends on calls 0..k-1), and the
first failing check names the reason:

=======================  ===================================================================
``unparseable``          no call could be parsed from the text
``unknown_tool``         a call names a function that is not in the record's tools
``schema_violation``     a call's arguments do not validate against that tool's JSON Schema, or use a key
                         the schema's ``properties`` do not declare (a slot the sidecar cannot have;
                         ``allow_undeclared_arguments`` keeps them)
``uncheckable_schema``   a call's arguments cannot be checked against the tool's schema in bounded time (a
                         pattern that backtracks past ``schemas.PATTERN_BUDGET_S``, a ``$ref`` cycle the
                         arguments walk into): the same bounded validation as ingest (``runtime/schemas.py``)
``disagrees_with_gold``  the multiset of function names differs from the gold calls' names
=======================  ===================================================================

The records file is read with :func:`records.load_records` (ingest's validation) and every trace line is checked
for its fields; a bad line fails the stage with ``file:line``, the reason and the field, or with
``on_reject: skip`` is left out and counted (``input`` in the metrics).

Argument values that differ from the gold are kept: the sidecar learns the teacher's values (``args_match_gold``
counts how often they agree). Also writes ``metrics/normalize.json`` and ``data_cards/normalize.md``.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tqdm import tqdm

from ooospec.pipelines.params import add_path_arguments, as_dict, load_section, module_main
from ooospec.pipelines.records import (
    UNCHECKABLE_SCHEMA,
    atomic_write_text,
    load_records,
    load_rows,
    tool_by_name,
    write_json,
    write_jsonl,
)
from ooospec.reporting import md_table
from ooospec.runtime import formats, schemas
from ooospec.runtime.calls import canonical_calls

UNPARSEABLE = "unparseable"
UNKNOWN_TOOL = "unknown_tool"
SCHEMA_VIOLATION = "schema_violation"
DISAGREES_WITH_GOLD = "disagrees_with_gold"
REASONS = (UNPARSEABLE, UNKNOWN_TOOL, SCHEMA_VIOLATION, UNCHECKABLE_SCHEMA, DISAGREES_WITH_GOLD)
MALFORMED_TRACE = "malformed_trace"   # a traces.jsonl line without its fields (an input error, not a reject)


@dataclass(frozen=True)
class NormalizeParams:
    require_gold_agreement: bool = True   # reject traces whose function names differ from the gold's
    allow_undeclared_arguments: bool = False  # keep argument keys that the schema's properties do not declare
    max_reject_text_chars: int = 2000     # raw text kept per reject row
    on_reject: Literal["skip", "fail"] = "fail"  # an input line that is not a valid record/trace: fail, or skip


class Rejected(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def trace_problem(trace: dict) -> tuple[str, str] | None:
    """``(MALFORMED_TRACE, detail naming the field)`` when a traces.jsonl row lacks what normalize reads."""
    for key in ("id", "backend", "model", "text"):
        if not isinstance(trace.get(key), str) or (key == "id" and not trace[key]):
            got = "missing" if key not in trace else f"got {type(trace[key]).__name__}"
            return MALFORMED_TRACE, f"{key}: expected a{' non-empty' if key == 'id' else ''} string, {got}"
    fmt = trace.get("format")
    if fmt is not None and (not isinstance(fmt, str) or fmt not in formats.FORMATS):
        return MALFORMED_TRACE, f"format: expected null or one of {sorted(formats.FORMATS)}, got {str(fmt)[:40]!r}"
    return None


def parse_trace(trace: dict) -> list[dict]:
    """The calls in a trace's text, parsed in its format (``{"name", "arguments"}`` each)."""
    fmt = trace.get("format")
    calls = formats.get_format(fmt).parse_calls(trace["text"]) if fmt else formats.parse_any(trace["text"])
    return [{"name": c["name"], "arguments": c["arguments"]} for c in calls]


def check_calls(record: dict, calls: list[dict], params: NormalizeParams) -> None:
    """Raise :class:`Rejected` with the first failing reason (order of :data:`REASONS`)."""
    if not calls:
        raise Rejected(UNPARSEABLE, "no call found in the teacher text")
    tools = tool_by_name(record)
    for c in calls:
        if c["name"] not in tools:
            raise Rejected(UNKNOWN_TOOL, f"call {c['name']!r} not in tools {sorted(tools)[:8]}")
    for c in calls:
        parameters = tools[c["name"]]["parameters"]
        try:  # bounded: regexes under a time budget, depth capped, recursion caught (runtime/schemas.py)
            err = schemas.first_error(c["arguments"], parameters)
        except schemas.UncheckableSchema as e:
            raise Rejected(UNCHECKABLE_SCHEMA, f"call {c['name']!r}: {e}"[:300]) from None
        except Exception as e:  # noqa: BLE001 - e.g. a $ref the gold call never reached does not resolve
            raise Rejected(UNCHECKABLE_SCHEMA,
                           f"call {c['name']!r}: schema check failed ({type(e).__name__}: {e})"[:300]) from None
        if err is not None:
            path = "/".join(str(p) for p in err.absolute_path) or "<root>"
            raise Rejected(SCHEMA_VIOLATION, f"call {c['name']!r} at {path}: {err.message[:200]}")
        declared = schemas.properties(parameters)
        extra = sorted(set(c["arguments"]) - set(declared))
        if extra and not params.allow_undeclared_arguments:
            raise Rejected(SCHEMA_VIOLATION, f"call {c['name']!r}: undeclared argument(s) {extra[:5]} "
                                             f"(declared: {sorted(declared)[:8]})")
    if params.require_gold_agreement:
        got, want = Counter(c["name"] for c in calls), Counter(c["name"] for c in record["calls"])
        if got != want:
            raise Rejected(DISAGREES_WITH_GOLD, f"teacher called {sorted(got.elements())}, "
                                                f"gold {sorted(want.elements())}")


def normalize_one(record: dict, trace: dict, params: NormalizeParams) -> dict:
    """The record with the teacher's calls; raises :class:`Rejected`."""
    calls = parse_trace(trace)
    check_calls(record, calls, params)
    meta = dict(record.get("meta") or {})
    meta["teacher"] = {"backend": trace["backend"], "model": trace["model"], "format": trace.get("format"),
                       "args_match_gold": canonical_calls(calls) == canonical_calls(record["calls"])}
    return {**record, "calls": calls, "meta": meta}


def normalize(params: NormalizeParams, records: dict[str, dict], traces: list[dict]
              ) -> tuple[list[dict], list[dict], dict]:
    """(kept records, reject rows, stats), both lists sorted by id."""
    kept, rejects = [], []
    by_source: dict[str, Counter] = {}
    for trace in tqdm(sorted(traces, key=lambda t: t["id"]), desc="normalize", unit="trace", leave=False):
        record = records.get(trace["id"])
        if record is None:
            raise ValueError(f"trace {trace['id']!r} has no training record; were the traces made from "
                             f"another records file?")
        counts = by_source.setdefault(record["source"], Counter())
        try:
            kept.append(normalize_one(record, trace, params))
            counts["kept"] += 1
        except Rejected as r:
            rejects.append({"id": trace["id"], "reason": r.reason, "detail": r.detail,
                            "text": trace["text"][:params.max_reject_text_chars]})
            counts[r.reason] += 1
    reasons = Counter(r["reason"] for r in rejects)
    stats = {
        "num_traces": len(traces), "num_kept": len(kept), "num_rejected": len(rejects),
        "num_calls_kept": sum(len(r["calls"]) for r in kept),
        "num_args_match_gold": sum(r["meta"]["teacher"]["args_match_gold"] for r in kept),
        "kept_fraction": round(len(kept) / len(traces), 4) if traces else None,
        "rejects_by_reason": {k: reasons.get(k, 0) for k in REASONS},
        "by_source": {s: {k: c.get(k, 0) for k in ("kept", *REASONS)} for s, c in sorted(by_source.items())},
    }
    return kept, rejects, stats


def normalize_card(stats: dict, path: Path) -> None:
    """``data_cards/normalize.md`` from the stats (the numbers are the metrics file's numbers)."""
    per_source = md_table(["source", "kept", *REASONS],
                          [[s, *(c[k] for k in ("kept", *REASONS))] for s, c in stats["by_source"].items()])
    reasons = md_table(["reason", "traces"], [[f"`{k}`", v] for k, v in stats["rejects_by_reason"].items()])
    backends = ", ".join(stats["teacher_backends"]) or "none"
    agreement = ", and the teacher called the same functions as the gold" \
        if stats["params"]["require_gold_agreement"] else ""
    text = f"""<!-- generated by `dvc repro normalize` from metrics/normalize.json; do not edit by hand -->
# Dataset card: `data/normalize/calls.jsonl`

Training records whose gold calls are replaced by the teacher's calls (teacher backend: {backends}),
parsed from the teacher's raw text and normalized to compact `{{"name", "arguments"}}` JSON: no
chat-template tokens, no call ids. Every kept call names a listed tool and validates against its JSON
Schema{agreement}.
Rejected traces are in `data/normalize/rejects.jsonl` with their reason and raw text.

**{stats['num_kept']}** of {stats['num_traces']} traces kept ({stats['num_calls_kept']} calls);
{stats['num_args_match_gold']} kept records have exactly the gold arguments (normalized comparison).

## Rejects by reason

{reasons}

## Per source

{per_source}
"""
    atomic_write_text(path, text)


def run(params: NormalizeParams, records_path: Path, traces_path: Path, out_path: Path, rejects_path: Path, *,
        metrics_path: Path | None, card_path: Path | None) -> dict:
    read = load_records(records_path, params.on_reject, what="training records", knob="normalize.on_reject")
    read_traces = load_rows(traces_path, trace_problem, params.on_reject, what="teacher traces",
                           knob="normalize.on_reject")
    records = {r["id"]: r for r in read.rows}
    traces = read_traces.rows
    if params.on_reject == "skip":  # a skipped record takes its trace with it
        traces = [t for t in traces if t["id"] in records]
    kept, rejects, stats = normalize(params, records, traces)
    stats["input"] = {"records": read.summary(), "traces": read_traces.summary(),
                      "num_traces_without_record": len(read_traces.rows) - len(traces)}
    write_jsonl(out_path, kept)
    write_jsonl(rejects_path, rejects)
    stats["teacher_backends"] = sorted({t["backend"] for t in traces})
    stats["params"] = as_dict(params)
    if metrics_path is not None:
        write_json(metrics_path, stats)
    if card_path is not None:
        normalize_card(stats, Path(card_path))
    if read.bad or read_traces.bad:
        print(f"normalize: skipped {len(read.bad)} bad records, {len(read_traces.bad)} bad traces", file=sys.stderr)
    print(f"normalize: kept {stats['num_kept']}/{stats['num_traces']}; rejects {stats['rejects_by_reason']}",
          file=sys.stderr)
    return stats


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_path_arguments(p, {"records": "training records the traces were made from", "traces": "teacher traces.jsonl",
                           "out": "output calls.jsonl (records with the teacher's calls)",
                           "rejects": "output rejects.jsonl"},
                       metrics="metrics/normalize.json", card="data_cards/normalize.md")


def run_cli(args: argparse.Namespace) -> int:
    run(load_section(NormalizeParams, "normalize", args.params), args.records, args.traces, args.out,
        args.rejects, metrics_path=args.metrics, card_path=args.card)
    return 0


def main(argv: list[str] | None = None) -> int:
    return module_main("ooospec.pipelines.normalize", __doc__, add_arguments, run_cli, argv)


if __name__ == "__main__":
    sys.exit(main())
