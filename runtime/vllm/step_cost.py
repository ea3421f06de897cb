"""What a vLLM step costs by the rows and drafts it verifies, learnt from the engine's own steps, and the chain price.

A step verifies ``B`` rows (each decoding request's root) and ``D`` drafts (their chains). Its seconds are fit
online as ``T = a + b_row * B + b_draft * D`` from the gaps between consecutive :meth:`OoOSpecProposer.propose`
calls (the engine's forward and sampling of the chains handed over at the end of the previous call), keeping only
steps whose batch is the previous step's (no prefill of a new request inside them). Two slopes, because nothing
makes a draft cost what a row costs (a step with drafts runs vLLM's spec path: query lengths above one, logits for
every draft); where they come out alike, the price below is still the throughput criterion, which one slope's
``slope * B`` was not. Fitted on 2 Zen 4 cores (0.5B, int8 weights, 16 requests in flight): ``a`` 25-28 ms,
``b_row`` 2.3-2.4 ms, ``b_draft`` 2.4-2.5 ms (the ``fit_s`` of the proposer's metrics lines in the server logs of
``eval/reports/cpu/quantized/epyc-avx512bf16/load-two-slope/`` and ``load-probe/``).

Chains priced by the batch: the batch's throughput is ``C / T`` (``C`` = tokens the step commits, about one per
row); a draft with acceptance probability ``p`` adds ``p`` to ``C`` and ``b_draft`` to ``T``, so it pays when
``p > b_draft * C / T``, which with ``C ~ B`` and ``T ~ a + b_row * B`` is the price

    price(B) = b_draft * B / (a + b_row * B)        (at B = 1: ``b_draft / (a + b_row)``, :meth:`StepCost.slope`)

and each request's chain is chosen with :class:`~ooospec.runtime.vllm.chain.ChainCost` ``(price(B))``: a chain is
kept when its drafts' mean planned acceptance beats the price. Worked example (the load bench's fit above: 25.0,
2.40, 2.45 ms): price 0.09 at batch 1, 0.44 at 8, 0.62 at 16. The one-slope price it replaces, ``b / (a + b) * B``,
took the step at batch B for a one-token step: ~1.4 at 16, above any acceptance.

Until ``min_samples`` steps with at least two distinct token counts are seen, the configured slope stands
(``chain_cost_slope``: price ``slope * B``). Where rows or drafts never vary (one batch size only, or no chain
yet), the fit is one slope over ``B + D`` for both.
"""

from __future__ import annotations

import statistics
from collections import deque

MAX_SLOPE = 1.0          # a verified token at batch 1 never costs more than a whole one-token step
COLLINEAR = 1e-9         # |correlation|^2 of rows and drafts above 1 - this: one slope for both


def least_squares(samples) -> tuple[float, float, float] | None:
    """``(a, b_row, b_draft)`` of ``seconds = a + b_row * rows + b_draft * drafts`` over ``(rows, drafts, seconds)``;
    one slope for both where either never varies or they move together; None where the token count never varies.
    Slopes below zero (noise) are taken as zero."""
    xs = [(r, d, s) for r, d, s in samples]
    m1, m2, my = (statistics.fmean(x[i] for x in xs) for i in range(3))
    s11 = sum((r - m1) ** 2 for r, _, _ in xs)
    s22 = sum((d - m2) ** 2 for _, d, _ in xs)
    s12 = sum((r - m1) * (d - m2) for r, d, _ in xs)
    s1y = sum((r - m1) * (y - my) for r, _, y in xs)
    s2y = sum((d - m2) * (y - my) for _, d, y in xs)
    det = s11 * s22 - s12 * s12
    if s11 > 0 and s22 > 0 and det > COLLINEAR * s11 * s22:
        b_row, b_draft = max((s22 * s1y - s12 * s2y) / det, 0.0), max((s11 * s2y - s12 * s1y) / det, 0.0)
    else:                                              # one slope over the tokens verified
        snn = s11 + 2 * s12 + s22
        if snn <= 0:
            return None
        b_row = b_draft = max((s1y + s2y) / snn, 0.0)
    return my - b_row * m1 - b_draft * m2, b_row, b_draft


class StepCost:
    """Online least-squares fit of step seconds by rows and drafts verified (module docstring).

    Args:
        prior_slope: the price per batch row used until the fit has enough steps.
        window: the most recent steps kept.
        min_samples: steps needed (with two distinct token counts at least) before the fit is used.
    """

    def __init__(self, prior_slope: float, *, window: int = 256, min_samples: int = 16):
        if prior_slope < 0 or window < 2 or min_samples < 2:
            raise ValueError(f"need prior_slope >= 0, window >= 2, min_samples >= 2; got {prior_slope}, {window}, "
                             f"{min_samples}")
        self.prior_slope, self.min_samples = prior_slope, min_samples
        self.samples: deque[tuple[int, int, float]] = deque(maxlen=window)
        self._fit: tuple[float, float, float] | None = None
        self._stale = False

    def observe(self, rows: int, drafts: int, seconds: float) -> None:
        """One step verified ``rows`` roots and ``drafts`` drafts in ``seconds``."""
        if rows >= 1 and drafts >= 0 and seconds > 0:
            self.samples.append((int(rows), int(drafts), float(seconds)))
            self._stale = True

    def fit(self) -> tuple[float, float, float] | None:
        """``(a, b_row, b_draft)`` over the kept steps (stalls -- steps over 5x the median -- left out); None until
        there are enough of them or while every step verified the same number of tokens. Refit only after a new
        step (every request's chain asks for it each step)."""
        if self._stale:
            self._fit, self._stale = self._fit_now(), False
        return self._fit

    def _fit_now(self) -> tuple[float, float, float] | None:
        if len(self.samples) < self.min_samples:
            return None
        median = statistics.median(s for _, _, s in self.samples)
        kept = [x for x in self.samples if x[2] <= 5 * median]
        if len(kept) < self.min_samples or len({r + d for r, d, _ in kept}) < 2:
            return None
        fit = least_squares(kept)
        return fit if fit is not None and fit[0] + fit[1] > 0 else None

    def price(self, batch: int) -> float:
        """The chain slope for a request in a batch of ``batch`` decoding requests: ``b_draft * B / (a + b_row * B)``
        (``prior_slope * B`` before the fit)."""
        batch = max(batch, 1)
        fit = self.fit()
        if fit is None:
            return self.prior_slope * batch
        a, b_row, b_draft = fit
        plain = a + b_row * batch
        return b_draft * batch / plain if plain > 0 else MAX_SLOPE * batch

    def slope(self) -> float:
        """One more draft's cost at batch 1 in one-token forwards of a request alone: ``b_draft / (a + b_row)``."""
        if self.fit() is None:
            return self.prior_slope
        return min(max(self.price(1), 0.0), MAX_SLOPE)


class StepClock:
    """Times the engine's steps between two ``propose`` calls for a :class:`StepCost`.

    ``start(req_ids)`` at the top of ``propose`` observes the gap since the last ``end`` when the batch is the same
    requests (no new prefill inside the step); ``end(rows, drafts)`` when the chains are handed to vLLM, with what
    the next step verifies (every request's root, and the chains' tokens)."""

    def __init__(self, cost: StepCost, clock):
        self.cost, self.clock = cost, clock
        self._last: tuple[tuple[str, ...], int, int, float] | None = None

    def start(self, req_ids) -> None:
        now = self.clock()
        if self._last is not None:
            ids, rows, drafts, t = self._last
            if ids == tuple(req_ids):
                self.cost.observe(rows, drafts, now - t)
        self._ids = tuple(req_ids)

    def end(self, rows: int, drafts: int) -> None:
        self._last = (self._ids, rows, drafts, self.clock())
