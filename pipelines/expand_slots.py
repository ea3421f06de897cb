"""DVC stage ``expand_slots``: expand each normalized call into the sidecar's slot supervision, one row per request.

    python -m ooospec.pipelines.expand_slots data/normalize/calls.jsonl data/slots/train.jsonl \
        data/slots/heldout.jsonl metrics/expand_slots.json data_cards/slots.md

A request is the k-th call of a record (the calls before it are shown as ``call:`` lines, see
``runtime.sidecar_prompts.context_view``). Its row holds the request's shared block and its slots, built with
:func:`ooospec.runtime.sidecar.prompts.build_wave` -- the exact code the runtime queries the sidecar with::

    {"id": "<record_id>#<k>", "record_id", "function": <called name>, "block": "Conversation:\\n...Tools:\\n...",
     "slots": [{"form": "function_index", "function": null, "parameter": null,
                "query": "Query: tool index\\n", "answer": "1"},
               {"form": "argument", "function": "f", "parameter": "city", "query": "Query: f.city\\n",
                "answer": "\\"Paris\\""},                         # null when omitted or f is not called
               ...,
               {"form": "direct_call", ..., "query": "Query: call\\n", "answer": "{\\"name\\":...}"}]}

``layout`` (params) is the prompt layout of the blocks (:data:`ooospec.runtime.sidecar.prompts.LAYOUTS`: 2
context first, 3 tools first); a row built in a layout other than 2 records it (``"layout": 3``), and
``train_sidecar`` writes the rows' layout into the adapter's ``sidecar.json``.

Slots come in wave order (index, every tool x parameter, direct call). Training packs one row into one sequence
(:mod:`ooospec.pipelines.packing`); evaluation answers the row's index + argument slots as the runtime's wave.

Null argument slots of uncalled tools can be capped per TRAIN request (``max_null_per_request``; null = keep
all, which is what the wave asks): the called tool's omitted parameters are always kept, then a sample (seeded
by ``seed`` and the request id, independent of other records) of the uncalled tools' parameters. Heldout rows
are never capped: they are the runtime's full wave.

Split: ``sha256(meta.dialogue or record_id)`` as a fraction in [0, 1) below ``heldout_fraction`` goes to
heldout, so all requests of a record (and all records cut from one dialogue, which share context) land on one
side, whatever else is in the file. Rows are sorted by id.

Input lines go through :func:`ooospec.pipelines.records.load_records`: a line that is not a valid record fails
the stage with ``file:line``, the reason and the field, or with ``on_reject: skip`` is left out and counted
(``input`` in the metrics).
"""

from __future__ import annotations

import argparse
import hashlib
import random
import statistics
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tqdm import tqdm

from ooospec.pipelines.params import add_path_arguments, as_dict, load_section, module_main
from ooospec.pipelines.records import atomic_write_text, load_records, write_json, write_jsonl
from ooospec.pipelines.slot_rows import request_row
from ooospec.reporting import md_table
from ooospec.runtime.sidecar import prompts as sp

SPLITS = ("train", "heldout")


@dataclass(frozen=True)
class ExpandSlotsParams:
    heldout_fraction: float = 0.1
    max_null_per_request: int | None = None      # uncalled-tool null slots kept per train request (None: all)
    forms: tuple[str, ...] = sp.FORMS             # which supervision forms to emit
    seed: int = 0
    on_reject: Literal["skip", "fail"] = "fail"   # an input line that is not a valid record: fail, or skip + count
    layout: int = sp.LAYOUT_VERSION               # prompt layout of the blocks (sp.LAYOUTS: 2 context / 3 tools first)

    def __post_init__(self) -> None:
        if isinstance(self.layout, bool) or self.layout not in sp.LAYOUTS:
            raise ValueError(f"expand_slots.layout must be one of {sorted(sp.LAYOUTS)} ({sp.LAYOUTS}), "
                             f"got {self.layout!r}")
        if not 0.0 <= self.heldout_fraction <= 1.0:
            raise ValueError(f"expand_slots.heldout_fraction must be in [0, 1], got {self.heldout_fraction}")
        if self.max_null_per_request is not None and self.max_null_per_request < 0:
            raise ValueError(f"expand_slots.max_null_per_request must be >= 0 or null, "
                             f"got {self.max_null_per_request}")
        unknown = sorted(set(self.forms) - set(sp.FORMS))
        if unknown or not self.forms:
            raise ValueError(f"expand_slots.forms: unknown or empty {unknown or list(self.forms)}; "
                             f"known: {list(sp.FORMS)}")


def split_of(record: dict, heldout_fraction: float) -> str:
    """``"heldout"`` when the hash fraction of the record's dialogue (or id) is below ``heldout_fraction``."""
    key = (record.get("meta") or {}).get("dialogue") or record["id"]
    fraction = int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:16], 16) / 2 ** 64
    return "heldout" if fraction < heldout_fraction else "train"


def cap_nulls(row: dict, params: ExpandSlotsParams) -> tuple[dict, int]:
    """``row`` with at most ``max_null_per_request`` uncalled-tool null slots; returns ``(row, dropped)``."""
    cap = params.max_null_per_request
    uncalled = [i for i, s in enumerate(row["slots"])
                if s["form"] == "argument" and s["function"] != row["function"]]
    if cap is None or len(uncalled) <= cap:
        return row, 0
    keep = set(random.Random(f"{params.seed}:{row['id']}").sample(uncalled, cap))
    slots = [s for i, s in enumerate(row["slots"]) if i not in uncalled or i in keep]
    return {**row, "slots": slots}, len(uncalled) - cap


def record_rows(record: dict, params: ExpandSlotsParams, split: str) -> tuple[list[dict], int]:
    """The request rows of one record (train rows capped, forms filtered) and the null slots dropped."""
    rows, dropped = [], 0
    for k in range(len(record["calls"])):
        row = request_row(record, k, params.layout)
        if split == "train":
            row, d = cap_nulls(row, params)
            dropped += d
        row["slots"] = [s for s in row["slots"] if s["form"] in params.forms]
        if row["slots"]:
            rows.append(row)
    return rows, dropped


def expand(params: ExpandSlotsParams, records: list[dict]) -> tuple[dict[str, list[dict]], dict]:
    """Rows per split (sorted by id) and stats."""
    out: dict[str, list[dict]] = {s: [] for s in SPLITS}
    num_records = Counter()
    dropped = 0
    for rec in tqdm(records, desc="expand_slots", unit="rec", leave=False):
        split = split_of(rec, params.heldout_fraction)
        rows, d = record_rows(rec, params, split)
        out[split] += rows
        num_records[split] += 1
        dropped += d
    for s in SPLITS:
        out[s].sort(key=lambda r: r["id"])
        ids = [r["id"] for r in out[s]]
        if len(set(ids)) != len(ids):
            dup = next(i for i, c in Counter(ids).items() if c > 1)
            raise ValueError(f"duplicate request id {dup!r}: duplicate record ids in the input?")
    stats = {"layout_version": params.layout,
             "num_records": {s: num_records[s] for s in SPLITS}, "num_null_slots_dropped": dropped,
             "requests": {s: len(out[s]) for s in SPLITS}, "slots": {}, "null_argument_slots": {},
             "slots_per_request": {}, "block_chars": {}}
    for s in SPLITS:
        forms = Counter(x["form"] for r in out[s] for x in r["slots"])
        stats["slots"][s] = {f: forms.get(f, 0) for f in sp.FORMS} | {"total": sum(forms.values())}
        stats["null_argument_slots"][s] = sum(x["form"] == "argument" and x["answer"] == "null"
                                              for r in out[s] for x in r["slots"])
        sizes = sorted(len(r["slots"]) for r in out[s])
        blocks = sorted(len(r["block"]) for r in out[s])
        stats["slots_per_request"][s] = {"median": statistics.median(sizes) if sizes else None,
                                         "max": sizes[-1] if sizes else None}
        stats["block_chars"][s] = {"median": statistics.median(blocks) if blocks else None,
                                   "max": blocks[-1] if blocks else None}
    return out, stats


def slots_card(stats: dict, path: Path) -> None:
    """``data_cards/slots.md``: requests and slots per form and split (the metrics file's numbers)."""
    rows = [[f, stats["slots"]["train"][f], stats["slots"]["heldout"][f]] for f in sp.FORMS]
    rows.append(["**total slots**", stats["slots"]["train"]["total"], stats["slots"]["heldout"]["total"]])
    rows.append(["requests (packed sequences)", stats["requests"]["train"], stats["requests"]["heldout"]])
    table = md_table(["slots", "train", "heldout"], rows)
    p = stats["params"]
    block_order = ("the numbered tools with their parameters, then the conversation" if p["layout"] == 3 else
                   "conversation, then the numbered tools with their parameters")
    per, blk = stats["slots_per_request"], stats["block_chars"]
    text = f"""<!-- generated by `dvc repro expand_slots` from metrics/expand_slots.json; do not edit by hand -->
# Dataset card: `data/slots/train.jsonl`, `data/slots/heldout.jsonl`

Slot supervision for the OoO-Spec sidecar, one row per request (one call of a record), built from the teacher's
normalized calls (`data/normalize/calls.jsonl`) with `runtime/sidecar/prompts.py` (prompt layout
{p['layout']}, {sp.LAYOUTS[p['layout']]}), the same code the runtime queries the sidecar with. Each row holds the
request's shared block ({block_order}) and its slots: the
`function_index` query (-> the tool's index), one `argument` query per tool x parameter (-> the compact JSON
value, or `null` when omitted or that tool is not called) and the `direct_call` query (-> the whole call).
Answers are compact JSON; the trainer appends EOS and packs a row into one sequence.

Records: {stats['num_records']['train']} train, {stats['num_records']['heldout']} heldout (split by a hash of
the source dialogue or record id, heldout fraction {p['heldout_fraction']}). Uncalled-tool null slots per train
request: at most {p['max_null_per_request']} (null = all; {stats['num_null_slots_dropped']} dropped, seed
{p['seed']}); heldout requests keep every slot (the runtime's full wave). Null argument slots:
{stats['null_argument_slots']['train']} train, {stats['null_argument_slots']['heldout']} heldout.

{table}

Slots per request: median {per['train']['median']} / max {per['train']['max']} (train), median
{per['heldout']['median']} / max {per['heldout']['max']} (heldout). Shared block: median
{blk['train']['median']} / max {blk['train']['max']} characters (train).
"""
    atomic_write_text(path, text)


def run(params: ExpandSlotsParams, calls_path: Path, train_path: Path, heldout_path: Path,
        metrics_path: Path | None, card_path: Path | None) -> dict:
    read = load_records(calls_path, params.on_reject, what="normalized records", knob="expand_slots.on_reject")
    records = sorted(read.rows, key=lambda r: r["id"])
    out, stats = expand(params, records)
    stats["input"] = read.summary()
    write_jsonl(train_path, out["train"])
    write_jsonl(heldout_path, out["heldout"])
    stats["params"] = as_dict(params)
    if metrics_path is not None:
        write_json(metrics_path, stats)
    if card_path is not None:
        slots_card(stats, Path(card_path))
    if read.bad:
        print(f"expand_slots: skipped {len(read.bad)} bad input records {stats['input']['bad_by_reason']}",
              file=sys.stderr)
    print(f"expand_slots: {stats['requests']['train']} train / {stats['requests']['heldout']} heldout requests "
          f"({stats['slots']['train']['total']} / {stats['slots']['heldout']['total']} slots) from "
          f"{len(records)} records", file=sys.stderr)
    return stats


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_path_arguments(p, {"calls": "normalized records (data/normalize/calls.jsonl)",
                           "train": "output train request rows (JSONL)",
                           "heldout": "output heldout request rows (JSONL)",
                           "metrics": "output metrics JSON (metrics/expand_slots.json)",
                           "card": "output data card (data_cards/slots.md)"})


def run_cli(args: argparse.Namespace) -> int:
    run(load_section(ExpandSlotsParams, "expand_slots", args.params), args.calls, args.train, args.heldout,
        args.metrics, args.card)
    return 0


def main(argv: list[str] | None = None) -> int:
    return module_main("ooospec.pipelines.expand_slots", __doc__, add_arguments, run_cli, argv)


if __name__ == "__main__":
    sys.exit(main())
