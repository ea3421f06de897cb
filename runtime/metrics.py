"""The only definitions of the speculative-decoding metrics, with their conventions.

* **MAT** (mean accepted tokens per forward): generated tokens / verification forwards. Conventionally it
  *includes the bonus token*, so plain greedy decoding has MAT = 1.0 and a step that accepts k drafts scores k + 1.
  The prefill forward is not counted.
* **Acceptance rate**: accepted draft tokens / draft tokens verified (tree nodes minus roots). For trees this is a
  per-node rate; a tree of 8 nodes in one chain of 8 can reach 1.0, a tree of 8 single-token branches at most 1/8.
* **Speedup**: baseline wall-clock seconds / method wall-clock seconds on the same requests, machine and
  threads; computed on end-to-end latency (prefill + decode) unless a caller says otherwise. Over several
  requests: the ratio of the mean times (``speedup(mean(base), mean(method))``); ``speedup_median`` is the
  median of the per-request ratios.
* **Mean tree size**: query tokens per verification forward, root included (1.0 for plain decoding).

The roofline (how far a run is from what the hardware allows; :mod:`ooospec.runtime.backends.cost_model` gives the
model's :class:`~ooospec.runtime.backends.cost_model.Footprint`, :mod:`ooospec.runtime.backends.hardware` the machine's
roofs):

* **Prefill FLOPs** of ``T`` prompt tokens: ``2 * body_params * T`` (every linear layer below the head) +
  ``2 * head_params`` (logits of the last token only) + ``2 * num_layers * T^2 * attn_dim`` (QK^T and AV over
  the causal half). Achieved prefill FLOP/s = that / prefill seconds; compared with the peak matmul FLOP/s.
* **Decode bytes**: each verification forward reads every weight once plus the KV cache of its context:
  ``num_forwards * (weight_bytes + kv_bytes_per_token * mean context)``, with the mean context taken as
  ``prompt + new_tokens / 2``. Achieved decode bytes/s = that / decode seconds; compared with the measured
  memory bandwidth. A tree forward moves the same bytes as a one-token forward, so a method that commits more
  tokens per forward needs *fewer* bytes/s for the same speed: this column says how memory-bound a run is,
  the speedup column how fast it is.

Quantiles: medians are ``statistics.median``; p90 is :func:`nearest_rank` (``q = 0.9``).

Near-tie diagnostics for low-precision runs: :func:`classify_mismatch` locates the first divergence between a
plain-greedy and a speculative output and says whether the greedy top-2 margin there was within rounding.
"""

from __future__ import annotations

import json
import math
import random
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypedDict

if TYPE_CHECKING:   # annotations only: the metrics stay importable without torch (pipelines use them)
    from ooospec.runtime.backends.cost_model import Footprint
    from ooospec.runtime.engine import GenerationResult


def mat(num_tokens: int, num_forwards: int) -> float:
    """MAT incl. bonus: generated tokens / verification forwards (nan without forwards)."""
    return num_tokens / num_forwards if num_forwards else math.nan


def mean_tree_size(tree_sizes: Sequence[int]) -> float:
    """Query tokens per verification forward, root included (nan without forwards)."""
    return sum(tree_sizes) / len(tree_sizes) if tree_sizes else math.nan


def speedup(baseline_s: float, method_s: float) -> float:
    """``baseline_s / method_s``: > 1 means the method is faster."""
    if method_s <= 0:
        raise ValueError(f"method time must be positive, got {method_s}")
    return baseline_s / method_s


def mean_accepted_tokens(results: Sequence[GenerationResult]) -> float:
    """:func:`mat` over several generations (1.0 for plain decoding)."""
    return mat(sum(len(r.tokens) for r in results), sum(r.n_forwards for r in results))


def acceptance_rate(results: Sequence[GenerationResult]) -> float:
    """Accepted draft tokens / draft tokens verified (nan when nothing was drafted)."""
    drafted = sum(s.tree_size - 1 for r in results for s in r.steps)
    accepted = sum(s.accepted for r in results for s in r.steps)
    return accepted / drafted if drafted else math.nan


def prefill_flops(fp: Footprint, num_tokens: int) -> float:
    """FLOPs of a causal prefill of ``num_tokens`` with logits for the last one (see the module docstring)."""
    return (2.0 * fp.body_params * num_tokens + 2.0 * fp.head_params
            + 2.0 * fp.num_layers * num_tokens ** 2 * fp.attn_dim)


def decode_bytes(fp: Footprint, num_forwards: int, prompt_tokens: int, new_tokens: int) -> float:
    """Bytes read by ``num_forwards`` verification forwards of one request (see the module docstring)."""
    context = prompt_tokens + new_tokens / 2
    return num_forwards * (fp.weight_bytes + fp.kv_bytes_per_token * context)


def per_second(amount: float, seconds: float) -> float:
    """``amount / seconds`` (nan for a zero or negative duration)."""
    return amount / seconds if seconds > 0 else math.nan


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
        "mean_tree_size": mean_tree_size([s.tree_size for s in steps]),
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


# ------------------------------------------------------------------------------- intervals and call accuracy


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` by nearest rank, ``sorted(values)[min(n - 1, int(q * n))]``: the p90 of every
    report (wave latency, slot latency). Raises ValueError on no values.

    >>> nearest_rank([5, 1, 4, 2, 3], 0.9), nearest_rank([1, 2], 0.5)
    (5, 2)
    """
    if not values:
        raise ValueError("nearest_rank of no values")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bootstrap_median_ci(values: Sequence[float], *, seed: int, num_resamples: int = 2000,
                        level: float = 0.95, statistic: Callable[[list[float]], float] = statistics.median
                        ) -> tuple[float, float]:
    """Percentile-bootstrap interval of the median of ``values`` (e.g. per-example speedup ratios), or of another
    ``statistic`` (``statistics.fmean``: the mean of paired differences).

    ``num_resamples`` times, draw ``len(values)`` values with replacement (``random.Random(seed)``, so the same
    seed gives the same interval) and take their median (the statistic); the interval is the ``(1 - level) / 2`` and
    ``(1 + level) / 2`` quantiles of those medians (nearest rank: with 2000 resamples at 95%, the 51st and the
    1950th smallest). With few examples the interval is wide and coarse: that is the honest answer.

    >>> bootstrap_median_ci([2.0], seed=0)
    (2.0, 2.0)
    >>> bootstrap_median_ci([1.0, 1.2, 1.5, 2.0, 3.0], seed=0)      # 5 values: the median is 1.0 in ~6% of draws
    (1.0, 3.0)
    >>> bootstrap_median_ci([0.9, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.8, 2.5], seed=0)
    (1.1, 1.8)
    """
    if not values:
        raise ValueError("bootstrap_median_ci needs at least one value")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if num_resamples < 1:
        raise ValueError(f"num_resamples must be >= 1, got {num_resamples}")
    rng = random.Random(seed)
    values = list(values)
    medians = sorted(statistic(rng.choices(values, k=len(values))) for _ in range(num_resamples))
    lo = medians[math.floor((1.0 - level) / 2.0 * num_resamples)]
    hi = medians[max(math.ceil((1.0 + level) / 2.0 * num_resamples) - 1, 0)]
    return lo, hi


class CallScore(TypedDict):
    parsed: bool   # the output holds a call at all
    name: bool     # its function name is the gold call's
    call: bool     # the name and every argument are right (see score_call)


_BFCL_DROP = re.compile(r"[ ,./\-_*^]")
_JAVA_NUMBER = re.compile(r"(-?[0-9]+(?:\.[0-9]+)?)[lLfFdD]")   # Java's typed literals: 42L, 1.5f


def _bfcl_str(s: str) -> str:
    """BFCL's string standardization: lowercase, spaces and ``, . / - _ * ^`` removed, ``'`` -> ``"``."""
    return _BFCL_DROP.sub("", s).lower().replace("'", '"')


def _same_value(a: Any, b: Any) -> bool:
    """Two argument values are the same: strings up to case and runs of whitespace, numbers numerically (a bool
    only equals a bool), lists item by item, objects key by key."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, str) and isinstance(b, str):
        return " ".join(a.split()).casefold() == " ".join(b.split()).casefold()
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    return False


def _allowed_value(value: Any, allowed: Any) -> bool:
    """``value`` matches one BFCL allowed value (an object's allowed value holds allowed lists per key)."""
    if isinstance(value, str) and not isinstance(allowed, str):
        java_number = _JAVA_NUMBER.fullmatch(value.strip())
        try:   # "true" for True, "3" or "3L" for 3: BFCL's Java/JavaScript arguments are strings
            value = json.loads(java_number.group(1) if java_number else value)
        except ValueError:
            return False
    if isinstance(allowed, dict):
        return isinstance(value, dict) and _allowed_args(value, allowed)
    if isinstance(allowed, str):
        return isinstance(value, str) and _bfcl_str(value) == _bfcl_str(allowed)
    if isinstance(allowed, list):
        return isinstance(value, list) and len(value) == len(allowed) and all(
            _allowed_value(v, a) for v, a in zip(value, allowed))
    return _same_value(value, allowed)


def _allowed_args(args: Mapping[str, Any], spec: Mapping[str, Sequence[Any]]) -> bool:
    """Every argument is declared and takes an allowed value; every missing one may be omitted (``""``)."""
    if any(k not in spec for k in args):
        return False
    for key, options in spec.items():
        if key not in args:
            if "" not in options:
                return False
        elif not any(_allowed_value(args[key], o) for o in options if not (isinstance(o, str) and o == "")):
            return False
    return True


def score_call(predicted: Sequence[Mapping], gold: Sequence[Mapping],
               allowed: Sequence[Mapping] | None = None) -> CallScore:
    """Score a target's (or the sidecar's) first call against the request's first gold call.

    The benchmarks' stop rule ends a generation after its first call, so the first call is what is compared.
    ``name``: the function names are equal. ``call``: the name is right and the arguments equal the gold call's
    (strings up to case and whitespace, numbers numerically, bools strictly, lists and objects recursively), or,
    when the benchmark lists ``allowed`` values (BFCL's ``meta.allowed``: ``[{name: {param: [values]}}]``), every
    argument takes one of its allowed values and every parameter left out lists ``""`` (BFCL: optional). Allowed
    strings compare after BFCL's standardization (lowercase; spaces and ``, . / - _ * ^`` removed), and a string
    holding the JSON of an allowed value matches it (``"true"`` for ``True``, also ``"42L"`` for ``42``: BFCL's
    Java and JavaScript tools take every argument as a string). Java collection literals (``new ArrayList<>(...)``)
    are not parsed; they count when they equal the gold call's text.

    >>> score_call([{"name": "area", "arguments": {"base": 10}}], [{"name": "area", "arguments": {"base": 10}}])
    {'parsed': True, 'name': True, 'call': True}
    >>> score_call([{"name": "area", "arguments": {"base": "10"}}], [{"name": "area", "arguments": {"base": 10}}])
    {'parsed': True, 'name': True, 'call': False}
    >>> allowed = [{"area": {"base": [10], "unit": ["units", ""]}}]
    >>> score_call([{"name": "area", "arguments": {"base": 10}}], [{"name": "area", "arguments": {"base": 10,
    ...            "unit": "units"}}], allowed)
    {'parsed': True, 'name': True, 'call': True}
    >>> score_call([], [{"name": "area", "arguments": {}}])
    {'parsed': False, 'name': False, 'call': False}
    """
    if not gold:
        raise ValueError("score_call needs a gold call")
    if not predicted:
        return {"parsed": False, "name": False, "call": False}
    pred, ref = predicted[0], gold[0]
    name_ok = pred["name"] == ref["name"]
    args = pred.get("arguments") or {}
    call_ok = name_ok and _same_value(dict(args), dict(ref.get("arguments") or {}))
    if name_ok and not call_ok and allowed:
        spec = allowed[0].get(pred["name"])
        call_ok = spec is not None and _allowed_args(args, spec)
    return {"parsed": True, "name": name_ok, "call": call_ok}


def call_accuracy(scores: Sequence[CallScore]) -> dict[str, float | int]:
    """Rates over requests: ``parsed`` (a call at all), ``name`` (right function), ``call`` (right call).

    >>> call_accuracy([{"parsed": True, "name": True, "call": False}, {"parsed": True, "name": True, "call": True}])
    {'n': 2, 'parsed': 1.0, 'name': 1.0, 'call': 0.5}
    """
    n = len(scores)
    if not n:
        raise ValueError("call_accuracy needs at least one score")
    return {"n": n, **{k: sum(bool(s[k]) for s in scores) / n for k in ("parsed", "name", "call")}}
