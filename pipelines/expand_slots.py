"""DVC stage ``expand_slots``: expand each normalized call into the sidecar's three supervision forms.

    python -m ooospec.pipelines.expand_slots data/normalize/calls.jsonl data/slots/train.jsonl \
        data/slots/heldout.jsonl --metrics metrics/expand_slots.json

For the k-th call of a record (the calls before it are shown as ``call:`` lines, see
``runtime.sidecar_prompts.context_view``), with prompts built by :mod:`ooospec.runtime.sidecar_prompts` (the
exact code the runtime queries the sidecar with):

* ``function_index``  one row: the tool list -> the called tool's index, e.g. ``1``
* ``argument``        one row per candidate function x parameter (the runtime's one-wave query set):
                      the called function's parameters -> their compact JSON value, or ``null`` when omitted;
                      every other function's parameters -> ``null``
* ``direct_call``     one row: the tool list -> ``{"name":...,"arguments":{...}}``

Null argument rows outnumber the rest by far on records with many tools, so at most ``max_null_per_record``
are kept per record: the called functions' omitted parameters first, then a sample (seeded by ``seed`` and the
record id, so independent of the other records) of the uncalled functions' parameters.

Row: ``{"id", "record_id", "form", "function", "parameter", "prompt", "completion"}`` with
``id = "<record_id>#<k>/<form>[/<function>/<parameter>]"``; ``parameter`` is null except for argument rows,
``function`` is the called function for function_index / direct_call rows. Rows are sorted by id.

Split: ``sha256(meta.dialogue or record_id)`` as a fraction in [0, 1) below ``heldout_fraction`` goes to
heldout, so all rows of a record (and all records cut from one dialogue, which share context) land on one side,
whatever else is in the file. Also writes ``metrics/expand_slots.json`` and ``data_cards/slots.md``.

Heldout waves (``--waves data/slots/heldout_waves.jsonl``, as the DVC stage passes it): for every heldout request (one call of a
record) the UNCAPPED prompt list of :func:`ooospec.runtime.sidecar_prompts.slot_queries` -- what the runtime
sends at request arrival -- as ``{"request": "<record_id>#<k>", "record_id", "prompts": [...]}``, sorted by
request. ``eval_sidecar`` times these (the capped heldout rows are a subset of each wave's prompts).
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ooospec.pipelines.params import as_dict, load_section
from ooospec.pipelines.records import atomic_write_text, read_jsonl, write_json, write_jsonl
from ooospec.runtime import sidecar_prompts as sp

SPLITS = ("train", "heldout")


@dataclass(frozen=True)
class ExpandSlotsParams:
    heldout_fraction: float = 0.1
    max_null_per_record: int | None = 8           # null argument rows kept per record (None: all)
    forms: tuple[str, ...] = sp.FORMS             # which supervision forms to emit
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.heldout_fraction <= 1.0:
            raise ValueError(f"expand_slots.heldout_fraction must be in [0, 1], got {self.heldout_fraction}")
        if self.max_null_per_record is not None and self.max_null_per_record < 0:
            raise ValueError(f"expand_slots.max_null_per_record must be >= 0 or null, "
                             f"got {self.max_null_per_record}")
        unknown = sorted(set(self.forms) - set(sp.FORMS))
        if unknown or not self.forms:
            raise ValueError(f"expand_slots.forms: unknown or empty {unknown or list(self.forms)}; "
                             f"known: {list(sp.FORMS)}")


def split_of(record: dict, heldout_fraction: float) -> str:
    """``"heldout"`` when the hash fraction of the record's dialogue (or id) is below ``heldout_fraction``."""
    key = (record.get("meta") or {}).get("dialogue") or record["id"]
    fraction = int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:16], 16) / 2 ** 64
    return "heldout" if fraction < heldout_fraction else "train"


def _row(record_id: str, k: int, form: str, function: str, parameter: str | None, prompt: str,
         completion: str) -> dict:
    suffix = f"/{function}/{parameter}" if form == "argument" else ""
    return {"id": f"{record_id}#{k}/{form}{suffix}", "record_id": record_id, "form": form,
            "function": function, "parameter": parameter, "prompt": prompt, "completion": completion}


def call_rows(record: dict, k: int) -> tuple[list[dict], list[dict], list[dict]]:
    """Rows for the k-th call: (non-null rows, null rows of the called function, null rows of other functions).

    Non-null rows hold the function_index, direct_call and valued argument rows.
    """
    rid, tools, messages = record["id"], record["tools"], record["messages"]
    call, prior = record["calls"][k], record["calls"][:k]
    names = [t["function"]["name"] for t in tools]
    if call["name"] not in names:
        raise ValueError(f"record {rid!r}: call {k} names {call['name']!r}, not in its tools {names[:8]}")
    by_name = {t["function"]["name"]: t for t in tools}
    main, omitted, uncalled = [], [], []
    for q in sp.slot_queries(messages, tools, prior):
        if q.form == "function_index":
            main.append(_row(rid, k, q.form, call["name"], None, q.prompt,
                             sp.function_index_completion(names.index(call["name"]))))
            continue
        value = call["arguments"].get(q.parameter) if q.function == call["name"] else None
        row = _row(rid, k, q.form, q.function, q.parameter, q.prompt, sp.argument_completion(value))
        if value is not None:
            main.append(row)
        else:
            (omitted if q.function == call["name"] else uncalled).append(row)
    main.append(_row(rid, k, "direct_call", call["name"], None, sp.direct_call_prompt(messages, tools, prior),
                     sp.direct_call_completion(call, by_name[call["name"]])))
    return main, omitted, uncalled


def record_rows(record: dict, params: ExpandSlotsParams) -> tuple[list[dict], int]:
    """All kept rows of one record (unsorted) and the number of null rows dropped by the cap."""
    main, omitted, uncalled = [], [], []
    for k in range(len(record["calls"])):
        m, o, u = call_rows(record, k)
        main += m
        omitted += o
        uncalled += u
    nulls = omitted + uncalled
    cap = params.max_null_per_record
    if cap is not None and len(nulls) > cap:
        rng = random.Random(f"{params.seed}:{record['id']}")
        nulls = omitted[:cap] + rng.sample(uncalled, max(cap - len(omitted), 0))
    dropped = len(omitted) + len(uncalled) - len(nulls)
    rows = [r for r in main + nulls if r["form"] in params.forms]
    return rows, dropped


def expand(params: ExpandSlotsParams, records: list[dict]) -> tuple[dict[str, list[dict]], dict]:
    """Rows per split (sorted by id) and stats."""
    out: dict[str, list[dict]] = {s: [] for s in SPLITS}
    num_records = Counter()
    dropped = 0
    for rec in tqdm(records, desc="expand_slots", unit="rec", leave=False):
        rows, d = record_rows(rec, params)
        split = split_of(rec, params.heldout_fraction)
        out[split] += rows
        num_records[split] += 1
        dropped += d
    for s in SPLITS:
        out[s].sort(key=lambda r: r["id"])
        ids = [r["id"] for r in out[s]]
        if len(set(ids)) != len(ids):
            dup = next(i for i, c in Counter(ids).items() if c > 1)
            raise ValueError(f"duplicate slot row id {dup!r}: duplicate record ids in the input?")
    stats = {"num_records": {s: num_records[s] for s in SPLITS}, "num_null_rows_dropped": dropped,
             "rows": {}, "null_argument_rows": {}, "mean_prompt_chars": {}, "max_prompt_chars": {}}
    for s in SPLITS:
        forms = Counter(r["form"] for r in out[s])
        stats["rows"][s] = {f: forms.get(f, 0) for f in sp.FORMS} | {"total": len(out[s])}
        stats["null_argument_rows"][s] = sum(r["form"] == "argument" and r["completion"] == "null" for r in out[s])
    for f in sp.FORMS:
        lengths = [len(r["prompt"]) for s in SPLITS for r in out[s] if r["form"] == f]
        stats["mean_prompt_chars"][f] = round(sum(lengths) / len(lengths), 1) if lengths else None
        stats["max_prompt_chars"][f] = max(lengths, default=None)
    return out, stats


def heldout_waves(records: list[dict], heldout_fraction: float) -> list[dict]:
    """The runtime's full slot wave of every heldout request (index query + every function x parameter)."""
    waves = []
    for rec in records:
        if split_of(rec, heldout_fraction) != "heldout":
            continue
        for k in range(len(rec["calls"])):
            queries = sp.slot_queries(rec["messages"], rec["tools"], rec["calls"][:k])
            waves.append({"request": f"{rec['id']}#{k}", "record_id": rec["id"], "prompts": [q.prompt for q in queries]})
    waves.sort(key=lambda w: w["request"])
    return waves


def slots_card(stats: dict, path: Path) -> None:
    """``data_cards/slots.md``: rows per form and split (the metrics file's numbers)."""
    lines = [f"| {f} | {stats['rows']['train'][f]} | {stats['rows']['heldout'][f]} | "
             f"{stats['mean_prompt_chars'][f]} | {stats['max_prompt_chars'][f]} |" for f in sp.FORMS]
    lines.append(f"| **total** | {stats['rows']['train']['total']} | {stats['rows']['heldout']['total']} | | |")
    rows = "\n".join(lines)
    p = stats["params"]
    w = stats.get("heldout_waves")
    waves = (f"\nHeldout waves (`data/slots/heldout_waves.jsonl`, timed by `eval_sidecar`): {w['requests']} requests, "
             f"the runtime's uncapped query set (index + every function x parameter): median {w['median_rows']}, "
             f"max {w['max_rows']} prompts per wave.\n") if w else ""
    text = f"""<!-- generated by `dvc repro expand_slots` from metrics/expand_slots.json; do not edit by hand -->
# Dataset card: `data/slots/train.jsonl`, `data/slots/heldout.jsonl`

Prompt/completion pairs for the OoO-Spec sidecar, built from the teacher's normalized calls
(`data/normalize/calls.jsonl`) with `runtime/sidecar_prompts.py`, the same code the runtime queries the
sidecar with. Forms: `function_index` (tool list -> index), `argument` (one function's schema + a parameter
-> its compact JSON value or `null`, for every candidate function x parameter), `direct_call` (tool list ->
the whole call). Completions are compact JSON; the trainer appends EOS.

Records: {stats['num_records']['train']} train, {stats['num_records']['heldout']} heldout (split by a hash of
the source dialogue or record id, heldout fraction {p['heldout_fraction']}). Null argument rows: at most
{p['max_null_per_record']} per record ({stats['num_null_rows_dropped']} dropped, seed {p['seed']});
kept null rows: {stats['null_argument_rows']['train']} train, {stats['null_argument_rows']['heldout']} heldout.

| form | train | heldout | mean prompt chars | max prompt chars |
|---|---:|---:|---:|---:|
{rows}
{waves}"""
    atomic_write_text(path, text)


def run(params: ExpandSlotsParams, calls_path: Path, train_path: Path, heldout_path: Path, *,
        metrics_path: Path | None = Path("metrics/expand_slots.json"),
        card_path: Path | None = Path("data_cards/slots.md"), waves_path: Path | None = None) -> dict:
    records = sorted(read_jsonl(calls_path), key=lambda r: r["id"])
    out, stats = expand(params, records)
    write_jsonl(train_path, out["train"])
    write_jsonl(heldout_path, out["heldout"])
    if waves_path is not None:
        waves = heldout_waves(records, params.heldout_fraction)
        write_jsonl(waves_path, waves)
        sizes = sorted(len(w["prompts"]) for w in waves)
        stats["heldout_waves"] = {"requests": len(waves), "median_rows": sizes[len(sizes) // 2] if sizes else None,
                                  "max_rows": sizes[-1] if sizes else None}
    stats["params"] = as_dict(params)
    if metrics_path is not None:
        write_json(metrics_path, stats)
    if card_path is not None:
        slots_card(stats, Path(card_path))
    print(f"expand_slots: {stats['rows']['train']['total']} train rows, {stats['rows']['heldout']['total']} "
          f"heldout rows from {len(records)} records", file=sys.stderr)
    return stats


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("calls", type=Path, help="normalized records (data/normalize/calls.jsonl)")
    p.add_argument("train", type=Path, help="output train rows (JSONL)")
    p.add_argument("heldout", type=Path, help="output heldout rows (JSONL)")
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    p.add_argument("--metrics", type=Path, default=Path("metrics/expand_slots.json"))
    p.add_argument("--card", type=Path, default=Path("data_cards/slots.md"))
    p.add_argument("--waves", type=Path, default=None,
                   help="output: the runtime's full slot wave per heldout request, e.g. data/slots/heldout_waves.jsonl "
                        "(eval_sidecar times these; the DVC stage writes it); not written when omitted")


def run_cli(args: argparse.Namespace) -> int:
    run(load_section(ExpandSlotsParams, "expand_slots", args.params), args.calls, args.train, args.heldout,
        metrics_path=args.metrics, card_path=args.card, waves_path=args.waves)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ooospec.pipelines.expand_slots",
                                description=__doc__.splitlines()[0])
    add_arguments(p)
    return run_cli(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
