"""The bench's examples: benchmark records read, filtered by id, sampled and cut; the prompt each one gives.

    records = load_examples(path, limit=30)              # valid records sorted by id, the first 30
    prompt = prompt_ids_of(records[0], tokenizer, fmt)    # the target's chat template with the tools, tokenized

Examples are sorted by id and taken in that order (``limit=N`` = the first N ids). :func:`toolbox_blocks` gives
each prompt's system + tools block, what ``--warm-tools`` caches before a request's clock starts.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from ooospec.pipelines.records import iter_jsonl, load_records


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


def toolbox_blocks(records: Sequence[dict], prompts: Sequence[list[int]], tokenizer, fmt) -> list[int]:
    """Per request, how many leading prompt tokens are its system + tools block: what ``--warm-tools`` caches before
    the request's clock starts (``ooospec bench`` and ``ooospec vllm-bench`` alike)."""
    from ooospec.runtime.agent.chat import system_tools_block
    from ooospec.runtime.backends.kv_cache import common_prefix_len

    return [common_prefix_len(system_tools_block(fmt, tokenizer, r["messages"], r["tools"]), p)
            for r, p in zip(records, prompts)]
