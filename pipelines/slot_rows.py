"""The request-row format of ``data/slots/*.jsonl``: building rows from records, and reading them back.

One row per request (the k-th call of a record)::

    {"id": "<record_id>#<k>", "record_id", "function": <called name>, "tools": [the record's tools],
     "block": "Conversation:\\n...Tools:\\n...",
     "slots": [{"form", "function", "parameter", "query", "answer"}, ...],     # wave order, answers = gold
     "layout": 3}                     # the prompt layout of the block; only when not 2 (older rows have none)

``expand_slots`` writes them, ``train_sidecar`` packs them, ``eval_sidecar`` answers them -- and turns any
benchmark's records into rows with :func:`request_rows` for zero-shot evaluation.
"""

from __future__ import annotations

import os
from pathlib import Path

from ooospec.pipelines.records import iter_jsonl
from ooospec.runtime.sidecar import prompts as sp

ROW_KEYS = ("id", "record_id", "function", "tools", "block", "slots")
SLOT_KEYS = ("form", "function", "parameter", "query", "answer")
IMPLICIT_LAYOUT = 2   # rows without a "layout" key: the layout before there was a choice (such rows stay as they were)


def row_layout(row: dict) -> int:
    """The prompt layout ``row``'s block was built in (:data:`~ooospec.runtime.sidecar.prompts.LAYOUTS`)."""
    return row.get("layout", IMPLICIT_LAYOUT)


def rows_layout(rows: list[dict], what: str = "request rows") -> int:
    """The one layout of ``rows``; raises ValueError when they mix layouts or use an unknown one."""
    layouts = sorted({row_layout(r) for r in rows}, key=repr)
    if len(layouts) != 1:
        raise ValueError(f"{what} mix prompt layouts {layouts} (or are empty): build them with one layout")
    return sp.check_layout(layouts[0])


def request_row(record: dict, k: int, layout: int = sp.LAYOUT_VERSION) -> dict:
    """The k-th call of ``record`` as one request row with EVERY slot (index, all tool x parameter, call), its
    block built in ``layout``."""
    rid, tools, call = record["id"], record["tools"], record["calls"][k]
    wave = sp.build_wave(record["messages"], tools, record["calls"][:k], with_direct_call=True, layout=layout)
    try:
        answers = sp.gold_answers(wave.queries, tools, call)
    except ValueError as e:
        raise ValueError(f"record {rid!r}, call {k}: {e}") from None
    slots = [{"form": q.form, "function": q.function, "parameter": q.parameter, "query": q.text, "answer": a}
             for q, a in zip(wave.queries, answers)]
    row = {"id": f"{rid}#{k}", "record_id": rid, "function": call["name"], "tools": tools, "block": wave.block,
           "slots": slots}
    if layout != IMPLICIT_LAYOUT:
        row["layout"] = layout
    return row


def request_rows(record: dict, layout: int = sp.LAYOUT_VERSION) -> list[dict]:
    """One row per call of ``record``, built in ``layout``."""
    return [request_row(record, k, layout) for k in range(len(record["calls"]))]


def read_request_rows(path: str | os.PathLike) -> list[dict]:
    """Read request rows; a malformed row raises ValueError naming the file, line and field."""
    rows = []
    for i, row in iter_jsonl(Path(path)):  # the file's own line numbers (blank lines count)
        missing = [k for k in ROW_KEYS if k not in row]
        if missing:
            raise ValueError(f"{path}:{i}: request row {row.get('id')!r} lacks {missing}")
        if not isinstance(row["block"], str) or not isinstance(row["slots"], list) or not row["slots"]:
            raise ValueError(f"{path}:{i}: request row {row['id']!r}: block must be a string and slots a "
                             "non-empty list")
        for j, slot in enumerate(row["slots"]):
            bad = [k for k in SLOT_KEYS if k not in slot] if isinstance(slot, dict) else list(SLOT_KEYS)
            if bad:
                raise ValueError(f"{path}:{i}: request row {row['id']!r} slot {j} lacks {bad}")
            if slot["form"] not in sp.FORMS:
                raise ValueError(f"{path}:{i}: request row {row['id']!r} slot {j} has form {slot['form']!r}, "
                                 f"expected one of {sp.FORMS}")
            if not isinstance(slot["query"], str) or not isinstance(slot["answer"], str):
                raise ValueError(  # noqa: TRY004 - a bad line of a data file, like every record readerf"{path}:{i}: request row {row['id']!r} slot {j}: query and answer must be "
                                 "strings")
        rows.append(row)
    return rows


def row_wave(row: dict, forms: tuple[str, ...] = sp.FORMS) -> tuple[sp.Wave, list[dict]]:
    """The row's block and its slots of ``forms`` as a wave, and those slots (same order)."""
    slots = [s for s in row["slots"] if s["form"] in forms]
    queries = tuple(sp.SlotQuery(s["form"], s.get("function"), s.get("parameter"), s["query"]) for s in slots)
    return sp.Wave(row["block"], queries), slots
