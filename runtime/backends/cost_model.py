"""What a target forward costs: measured seconds by query length, and the FLOPs and bytes it moves.

The budget policy (:mod:`ooospec.runtime.budget`) weighs the tokens a tree is expected to commit against what
verifying it costs, so it needs ``T(n)``: the seconds of one verification forward with ``n`` query tokens on top
of a realistic context. That curve depends on the machine far more than on the model: on a CPU without native
bf16 a 16-node tree costs ~2.5 one-token steps, with AMX or on a GPU nearly one. So it is measured, not assumed:

    cost = forward_cost(target)     # T(n) for n = 1, 2, 4, ..., 64 at a 512-token context; cached
    cost.seconds(12)                # piecewise linear between the measured sizes
    cost.relative(12)               # T(12) / T(1)

:func:`forward_cost` measures once per target fingerprint (model, dtype, threads, device, torch version, CPU:
:meth:`~ooospec.runtime.backends.target.Target.cost_fingerprint`) and caches the table on disk in
``$OOOSPEC_CACHE/forward_cost.json`` (and in memory for the process); a change of any part of that key measures
again. Each size is timed ``repeats`` times, interleaved across sizes so that a load spike hits them alike;
the fastest reading is kept (on a shared machine every slower one includes someone else's time slice), and the
curve is made non-decreasing (a bigger forward is never cheaper).

:class:`Footprint` is the analytic side of a forward for the roofline columns of ``ooospec bench``: matmul
parameters (FLOPs per token = 2 x that), the bytes of weights a forward reads, and the KV bytes per context token;
each backend counts its own (``target.footprint()``).
"""

from __future__ import annotations

import logging
import random
import time
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ooospec.runtime.paths import cache_dir, read_json_cache, write_json_cache
from ooospec.runtime.tree import chain_tree

if TYPE_CHECKING:
    from ooospec.runtime.backends.target import Target

logger = logging.getLogger(__name__)

QUERY_SIZES = (1, 2, 4, 8, 16, 32, 64)     # query lengths measured
CALIBRATION_CONTEXT = 512                  # cached tokens under the measured forwards (a tool-call prompt)


@dataclass(frozen=True)
class ForwardCost:
    """``T(n)``: seconds of one verification forward with ``n`` query tokens (root included).

    Worked example: ``ForwardCost((1, 2, 4), (0.10, 0.11, 0.15))``: ``seconds(3) == 0.13`` (linear between 2 and
    4), ``seconds(6) == 0.19`` (the last slope, 0.02 per token, continued), ``relative(4) == 1.5``.
    """

    sizes: tuple[int, ...]       # [K] measured query lengths, increasing, sizes[0] == 1
    times: tuple[float, ...]     # [K] seconds, non-decreasing
    key: str = ""                # what it was measured for (see :func:`calibration_key`)

    def __post_init__(self):
        if not self.sizes or self.sizes[0] != 1 or len(self.sizes) != len(self.times):
            raise ValueError(f"need sizes starting at 1 and one time per size, got {self.sizes}, {self.times}")
        if any(b <= a for a, b in zip(self.sizes, self.sizes[1:])) or self.times[0] <= 0:
            raise ValueError(f"sizes must increase and times be positive, got {self.sizes}, {self.times}")

    def seconds(self, n: int) -> float:
        """``T(n)`` for ``n >= 1``: measured, interpolated, or extrapolated with the last slope."""
        if n < 1:
            raise ValueError(f"a forward has at least the root, got n={n}")
        sizes, times = self.sizes, self.times
        if len(sizes) == 1:
            return times[0] * n
        i = min(max(bisect_left(sizes, n), 1), len(sizes) - 1)
        (n0, n1), (t0, t1) = sizes[i - 1:i + 1], times[i - 1:i + 1]
        return t0 + (t1 - t0) * (n - n0) / (n1 - n0)

    def relative(self, n: int) -> float:
        """``T(n) / T(1)``: the forward's cost in one-token steps."""
        return self.seconds(n) / self.times[0]

    @property
    def max_size(self) -> int:
        return self.sizes[-1]

    @classmethod
    def linear(cls, per_token: float, sizes: Sequence[int] = QUERY_SIZES) -> ForwardCost:
        """A synthetic curve ``T(n) = 1 + per_token * (n - 1)`` (in one-token steps), e.g. for tests."""
        return cls(tuple(sizes), tuple(1.0 + per_token * (n - 1) for n in sizes), key=f"linear({per_token})")

    @classmethod
    def from_measurements(cls, sizes: Sequence[int], samples: Sequence[Sequence[float]], key: str = "") -> ForwardCost:
        """The fastest of each size's samples, then a running maximum (the curve never decreases)."""
        best = [min(s) for s in samples]
        times = [max(best[:i + 1]) for i in range(len(best))]
        return cls(tuple(sizes), tuple(times), key)


# ------------------------------------------------------------------------------------------- measuring


def calibration_key(target: Target, context: int = CALIBRATION_CONTEXT) -> str:
    """Everything the forward cost depends on: the target's cost fingerprint and the context length."""
    return f"{target.cost_fingerprint()}|context={context}"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_forward_cost(
    target: Target,
    sizes: Sequence[int] = QUERY_SIZES,
    context: int = CALIBRATION_CONTEXT,
    repeats: int = 5,
    seed: int = 0,
) -> ForwardCost:
    """Time verification forwards (chain trees through the target's cache, as the engine runs them) by size.

    Args:
        target: the target.
        sizes: query lengths to time; must start at 1.
        context: cached tokens under every timed forward (random ids; attention cost depends on the length only).
        repeats: timed forwards per size (after one untimed warm-up each), interleaved across sizes.
    """
    vocab = target.vocab_size
    rng = random.Random(seed)
    kv = target.new_kv_cache()
    kv.prefill([rng.randrange(vocab) for _ in range(context)])
    trees = {n: chain_tree([rng.randrange(vocab) for _ in range(n)]) for n in sizes}
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    for rep in range(repeats + 1):
        for n in sizes:
            _sync(target.device)
            t0 = time.perf_counter()
            kv.forward_tree(trees[n]).argmax(dim=-1).tolist()   # the engine reads the argmax too (a sync)
            elapsed = time.perf_counter() - t0
            kv.commit([])                                      # drop the tree: the context stays `context`
            if rep:
                samples[n].append(elapsed)
    return ForwardCost.from_measurements(sizes, [samples[n] for n in sizes], key=calibration_key(target, context))


def cost_sizes(target: Target) -> tuple[int, ...]:
    """The query lengths to time on ``target``: its ``cost_sizes`` where it has one (a backend whose kernels take
    query rows in groups, so that ``T(n)`` is step-shaped between powers of two), else :data:`QUERY_SIZES`."""
    return tuple(getattr(target, "cost_sizes", None) or QUERY_SIZES)


def _cache_file() -> Path:
    return cache_dir() / "forward_cost.json"


_MEMO: dict[str, ForwardCost] = {}


def forward_cost(target: Target, use_cache: bool = True) -> ForwardCost:
    """The target's :class:`ForwardCost` on this machine: from memory, from disk, or measured (a few seconds).

    The cache key is :func:`calibration_key`; a change of model, dtype, threads, device, torch or CPU misses it,
    and so does a cached curve measured at other sizes than :func:`cost_sizes` asks for now.
    """
    key, sizes = calibration_key(target), cost_sizes(target)
    if use_cache and key in _MEMO:
        return _MEMO[key]
    path = _cache_file()
    table = read_json_cache(path) if use_cache else {}
    if key in table and tuple(table[key]["sizes"]) == sizes:
        row = table[key]
        cost = ForwardCost(tuple(row["sizes"]), tuple(row["times"]), key)
    else:
        t0 = time.perf_counter()
        cost = measure_forward_cost(target, sizes=sizes)
        logger.info("measured the forward cost in %.1fs: %s (T(n)/T(1) for n=%s; %s)", time.perf_counter() - t0,
                    [round(cost.relative(n), 2) for n in cost.sizes], list(cost.sizes), key)
        if use_cache:
            table[key] = {"sizes": list(cost.sizes), "times": [float(f"{t:.4g}") for t in cost.times],
                          "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
            write_json_cache(path, table)
    if use_cache:
        _MEMO[key] = cost
    return cost


# ------------------------------------------------------------------------------------------- footprint


@dataclass(frozen=True)
class Footprint:
    """Static facts of a target that the roofline's FLOP and byte counts need (:mod:`ooospec.runtime.metrics`);
    from :meth:`~ooospec.runtime.backends.target.Target.footprint`."""

    body_params: int            # weights multiplied per token below the LM head (all other linear layers)
    head_params: int            # the LM head's weights (vocab x hidden), multiplied only where logits are kept
    weight_bytes: int           # bytes a forward reads: every weight except input-embedding rows not looked up
    kv_bytes_per_token: int     # K + V bytes per cached token, all layers
    num_layers: int
    attn_dim: int               # query heads x head dim (the width of QK^T and AV)
