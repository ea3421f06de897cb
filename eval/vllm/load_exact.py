"""Is a ``vllm-load`` answer plain's at the same level, and if not, is it a near tie or a defect.

The answer compared is the content and each tool call's name and arguments (:func:`canonical`).

Batching reorders float sums (a batch of 8 is not 8 batches of 1), and so does verifying a chain of drafts; in bf16
a token whose top-2 logprobs lie within ``tie_margin`` can flip either way, for plain decoding across concurrency
levels as for a drafter. Each answer whose content or tool calls differ from plain's is compared with it by token
ids (vLLM's ``return_token_ids``, asked of every method alike); plain's top-2 margin at the first differing token
comes from one untimed forward of plain's prompt and its tokens up to there (vLLM in the bench's process, drafts
off, batch 1): ``near_tie`` at or under ``tie_margin``, else ``defect``; ``unclassified`` when a row has no token ids
(a run saved before they were asked for). A row whose tokens run past the end of plain's is a ``defect``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence

from ooospec.eval.vllm.runs import first_divergence, next_token_margins
from ooospec.runtime.methods import VLLM_REFERENCE

NEAR_TIE, DEFECT, UNCLASSIFIED = "near_tie", "defect", "unclassified"


def probe_of(row: dict, ref: dict) -> tuple[int | None, list[int] | None]:
    """Where ``row``'s tokens leave ``ref``'s (None: the same tokens) and the prompt whose next token decided it:
    ``ref``'s prompt ids and its tokens before that position (None when ``row`` runs past ``ref``'s end)."""
    theirs = ref["token_ids"]
    pos = first_divergence(theirs, row["token_ids"])
    if pos is None or pos >= len(theirs):
        return pos, None
    return pos, list(ref["prompt_token_ids"]) + list(theirs[:pos])


def classify(pairs: Sequence[tuple[dict, dict]], margins_of: Callable[[list[list[int]]], list[float | None]],
             tie_margin: float) -> None:
    """``row["mismatch"] = {position, margin, kind}`` for each ``(row, ref)`` of ``pairs`` (answers that differ);
    ``margins_of(prompts)`` gives plain's top-2 logprob margin of the next token after each prompt, in one call."""
    keys = ("token_ids", "prompt_token_ids")
    known = [(row, ref) for row, ref in pairs if row.get(keys[0]) is not None
             and all(ref.get(k) is not None for k in keys)]
    for row, ref in pairs:
        row["mismatch"] = {"position": None, "margin": None, "kind": UNCLASSIFIED}
    probes = [probe_of(row, ref) for row, ref in known]
    wanted = [prompt for _, prompt in probes if prompt is not None]
    margins = iter(margins_of(wanted) if wanted else [])
    for (row, _), (pos, prompt) in zip(known, probes):
        if pos is None:
            continue                           # the same tokens, parsed differently: left unclassified
        margin = next(margins) if prompt is not None else None
        near = margin is not None and margin <= tie_margin
        row["mismatch"] = {"position": pos, "margin": margin, "kind": NEAR_TIE if near else DEFECT}


def vllm_margins(model_dir: str, dtype: str, max_model_len: int) -> Callable[[list[list[int]]], list[float | None]]:
    """``margins_of`` on plain vLLM in this process (started on the first call, batch 1, drafts off)."""
    def margins_of(prompts: list[list[int]]) -> list[float | None]:
        from vllm import LLM

        llm = LLM(model=model_dir, tokenizer=model_dir, dtype=dtype, max_model_len=max_model_len, seed=0,
                  max_num_seqs=1, enable_prefix_caching=True)
        return next_token_margins(llm, prompts)

    return margins_of


def canonical(row: dict) -> tuple:
    """What ``identical`` compares: the content and each tool call's name and arguments (parsed as JSON when they
    parse, so key spacing does not count; the raw text otherwise)."""
    calls = []
    for tc in row.get("tool_calls") or []:
        try:
            args = json.loads(tc["arguments"]) if tc["arguments"] else None
        except ValueError:
            args = tc["arguments"]
        calls.append((tc["name"], json.dumps(args, sort_keys=True)))
    return row.get("content") or "", tuple(calls)


def differing(rows: list[dict], reference: list[dict]) -> list[tuple[dict, dict]]:
    """``(row, reference row of the same id)`` for each row whose answer (:func:`canonical`) differs."""
    ref = {r["id"]: r for r in reference}
    return [(r, ref[r["id"]]) for r in rows if canonical(r) != canonical(ref[r["id"]])]


def compare_rows(rows: list[dict], reference: list[dict]) -> dict:
    """``identical`` (share of ``rows`` equal to the reference row of the same id), the ids that differ and, of
    those, the near ties and defects (rows classified by :func:`classify_levels`)."""
    differ = [row for row, _ in differing(rows, reference)]
    kinds = [(row.get("mismatch") or {}).get("kind") for row in differ]
    return {"identical": 1 - len(differ) / len(rows), "differ": [r["id"] for r in differ],
            "near_ties": kinds.count(NEAR_TIE), "defects": kinds.count(DEFECT)}


def classify_levels(args, runs: dict[str, dict], max_model_len: int, margins_of=None) -> int:
    """Classify every answer that differs from plain's at its level (:func:`classify`); the
    number of differing answers."""
    ref = {(lv["concurrency"], lv["stream"]): lv["rows"] for lv in runs[VLLM_REFERENCE]["levels"]}
    pairs = [pair for method, run in runs.items() if method != VLLM_REFERENCE for lv in run["levels"]
             for pair in differing(lv["rows"], ref[(lv["concurrency"], lv["stream"])])]
    if pairs:
        print(f"[vllm-load] classifying {len(pairs)} differing answer(s) (untimed)", file=sys.stderr)
        classify(pairs, margins_of or vllm_margins(args.model_dir, args.dtype, max_model_len), args.tie_margin)
    return len(pairs)
