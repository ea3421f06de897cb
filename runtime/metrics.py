"""The only definitions of the speculative-decoding metrics, with their conventions.

* **MAT** (mean accepted tokens per forward): generated tokens / verification forwards. Conventionally it
  *includes the bonus token*, so plain greedy decoding has MAT = 1.0 and a step that accepts k drafts scores k + 1.
  The prefill forward is not counted.
* **Acceptance rate**: accepted draft tokens / draft tokens verified (tree nodes minus roots). For trees this is a
  per-node rate; a tree of 8 nodes in one chain of 8 can reach 1.0, a tree of 8 single-token branches at most 1/8.
* **Speedup**: baseline wall-clock seconds / method wall-clock seconds on the same requests, machine and
  threads; computed on end-to-end latency (prefill + decode) unless a caller says otherwise.

Near-tie diagnostics for low-precision runs: :func:`classify_mismatch` locates the first divergence between a
plain-greedy and a speculative output and says whether the greedy top-2 margin there was within rounding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, TypedDict

from ooospec.runtime.engine import GenerationResult


def mean_accepted_tokens(results: Sequence[GenerationResult]) -> float:
    """MAT incl. bonus: total generated tokens / total verification forwards (1.0 for plain decoding)."""
    forwards = sum(r.n_forwards for r in results)
    return sum(len(r.tokens) for r in results) / forwards if forwards else math.nan


def acceptance_rate(results: Sequence[GenerationResult]) -> float:
    """Accepted draft tokens / draft tokens verified (nan when nothing was drafted)."""
    drafted = sum(s.tree_size - 1 for r in results for s in r.steps)
    accepted = sum(s.accepted for r in results for s in r.steps)
    return accepted / drafted if drafted else math.nan


def speedup(baseline_s: float, method_s: float) -> float:
    """``baseline_s / method_s``: > 1 means the method is faster."""
    if method_s <= 0:
        raise ValueError(f"method time must be positive, got {method_s}")
    return baseline_s / method_s


def summarize(results: Sequence[GenerationResult]) -> dict[str, float]:
    """Counters and rates over requests, for a metrics JSON (all keys always present)."""
    tokens = sum(len(r.tokens) for r in results)
    prefill_s = sum(r.prefill_s for r in results)
    decode_s = sum(r.decode_s for r in results)
    steps = [s for r in results for s in r.steps]
    return {
        "num_requests": len(results),
        "num_tokens": tokens,
        "num_forwards": sum(r.n_forwards for r in results),
        "num_draft_tokens": sum(s.tree_size - 1 for s in steps),
        "num_tie_stops": sum(s.tie_stop for s in steps),
        "mean_accepted_tokens": mean_accepted_tokens(results),
        "acceptance_rate": acceptance_rate(results),
        "mean_tree_size": sum(s.tree_size for s in steps) / len(steps) if steps else math.nan,
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "draft_s": sum(s.t_draft for s in steps),
        "forward_s": sum(s.t_forward for s in steps),
        "decode_tokens_per_s": tokens / decode_s if decode_s > 0 else math.nan,
    }


class Mismatch(TypedDict):
    position: int                       # first index where the outputs differ
    margin: float                       # plain-greedy top-2 logit margin at that index (nan if unknown)
    kind: Literal["near_tie", "defect"]


def classify_mismatch(
    ar_tokens: Sequence[int],
    spec_tokens: Sequence[int],
    ar_logit_margins: Sequence[float],
    tol: float,
) -> Mismatch | None:
    """Compare a speculative output with plain greedy decoding of the same prompt.

    Args:
        ar_tokens: plain greedy output.
        spec_tokens: speculative output.
        ar_logit_margins: ``[len(ar_tokens)]`` top-2 margin of the logits that produced each AR token
            (``GenerationResult.margins`` of an engine run with ``record_margins=True``).
        tol: the margin under which a flip is explainable by rounding, e.g. ``default_tie_margin(torch.bfloat16)``.

    Returns:
        ``None`` when the outputs are identical, else the first divergence: a ``near_tie`` if the AR margin there
        is ``<= tol``, otherwise a ``defect`` (also when one output merely stops earlier: a length difference
        with no token difference is never a rounding effect of the argmax).

    Example: ``classify_mismatch([5, 6, 7], [5, 6, 9], [3.0, 2.5, 0.06], tol=0.25)``
    -> ``{"position": 2, "margin": 0.06, "kind": "near_tie"}``.
    """
    if len(ar_logit_margins) != len(ar_tokens):
        raise ValueError(f"need one margin per AR token: {len(ar_logit_margins)} margins, {len(ar_tokens)} tokens")
    common = min(len(ar_tokens), len(spec_tokens))
    position = next((i for i in range(common) if ar_tokens[i] != spec_tokens[i]), None)
    if position is None:
        if len(ar_tokens) == len(spec_tokens):
            return None
        margin = ar_logit_margins[common] if common < len(ar_tokens) else math.nan
        return {"position": common, "margin": margin, "kind": "defect"}
    margin = float(ar_logit_margins[position])
    return {"position": position, "margin": margin, "kind": "near_tie" if margin <= tol else "defect"}
