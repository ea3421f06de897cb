"""What a vLLM step costs by the tokens it verifies, learnt from the engine's own steps, and the chain price it sets.

A step verifies ``N`` tokens over the whole batch (each running request's root + its chain). Its seconds are fit
online as ``T(N) = a + b * N`` from the gaps between consecutive :meth:`OoOSpecProposer.propose` calls (the
engine's forward and sampling of the chains handed over at the end of the previous call), keeping only steps whose
batch is the previous step's (no prefill of a new request inside them). In one-token-forward units of the request
alone, one more verified token costs ``slope = b / (a + b)``.

Chains priced by the batch: the batch's throughput is ``sum(c_i) / T(N)`` (``c_i`` = tokens request ``i``
commits); a draft with acceptance probability ``p`` adds ``p`` to the sum and ``b`` to ``T``, so it pays when
``p > b * sum(c_i) / T(N)``, which with about one committed token per request per step is ``p > slope * B`` at
batch ``B``. Each request's chain is therefore chosen with :class:`~ooospec.runtime.vllm.chain.ChainCost`
``(slope * B)``: at batch 1 as before, and under load chains shorten until, where drafts no longer pay, none are
proposed. Worked example: slope 0.02 -> batch 1 keeps a 16-token chain whose tokens are accepted with p >= 0.02
(its rate beats the root's); at batch 16 the price is 0.32 and only drafts likely above a third stay.

Until ``min_samples`` steps with at least two distinct ``N`` are seen, the configured slope stands
(``chain_cost_slope``).
"""

from __future__ import annotations

import statistics
from collections import deque

MAX_SLOPE = 1.0          # a verified token never costs more than a whole one-token step


class StepCost:
    """Online least-squares fit of step seconds by tokens verified (module docstring).

    Args:
        prior_slope: the slope used until the fit has enough steps.
        window: the most recent steps kept.
        min_samples: steps needed (with two distinct token counts at least) before the fit is used.
    """

    def __init__(self, prior_slope: float, *, window: int = 256, min_samples: int = 16):
        if prior_slope < 0 or window < 2 or min_samples < 2:
            raise ValueError(f"need prior_slope >= 0, window >= 2, min_samples >= 2; got {prior_slope}, {window}, "
                             f"{min_samples}")
        self.prior_slope, self.min_samples = prior_slope, min_samples
        self.samples: deque[tuple[int, float]] = deque(maxlen=window)
        self._fit: tuple[float, float] | None = None
        self._stale = False

    def observe(self, tokens: int, seconds: float) -> None:
        """One step verified ``tokens`` tokens in ``seconds``."""
        if tokens >= 1 and seconds > 0:
            self.samples.append((int(tokens), float(seconds)))
            self._stale = True

    def fit(self) -> tuple[float, float] | None:
        """``(a, b)`` of ``T(N) = a + b N`` over the kept steps (stalls -- steps over 5x the median -- left out);
        None until there are enough of them or while every step verified the same number of tokens. Refit only
        after a new step (every request's chain asks for it each step)."""
        if self._stale:
            self._fit, self._stale = self._fit_now(), False
        return self._fit

    def _fit_now(self) -> tuple[float, float] | None:
        if len(self.samples) < self.min_samples:
            return None
        median = statistics.median(s for _, s in self.samples)
        kept = [(n, s) for n, s in self.samples if s <= 5 * median]
        xs = [n for n, _ in kept]
        if len(kept) < self.min_samples or len(set(xs)) < 2:
            return None
        mx, my = statistics.fmean(xs), statistics.fmean(s for _, s in kept)
        sxx = sum((x - mx) ** 2 for x in xs)
        b = sum((x - mx) * (s - my) for x, s in kept) / sxx
        b = max(b, 0.0)
        a = my - b * mx
        return (a, b) if a + b > 0 else None

    def slope(self) -> float:
        """One more verified token's cost in one-token forwards of a request alone: ``b / (a + b)``."""
        ab = self.fit()
        if ab is None:
            return self.prior_slope
        a, b = ab
        return min(max(b / (a + b), 0.0), MAX_SLOPE)

    def price(self, batch: int) -> float:
        """The chain slope for a request in a batch of ``batch`` decoding requests: ``slope * batch``."""
        return self.slope() * max(batch, 1)


class StepClock:
    """Times the engine's steps between two ``propose`` calls for a :class:`StepCost`.

    ``start(req_ids)`` at the top of ``propose`` observes the gap since the last ``end`` when the batch is the same
    requests (no new prefill inside the step); ``end(tokens)`` when the chains are handed to vLLM, with the tokens
    the next step verifies (every request's root + chain)."""

    def __init__(self, cost: StepCost, clock):
        self.cost, self.clock = cost, clock
        self._last: tuple[tuple[str, ...], int, float] | None = None

    def start(self, req_ids) -> None:
        now = self.clock()
        if self._last is not None:
            ids, tokens, t = self._last
            if ids == tuple(req_ids):
                self.cost.observe(tokens, now - t)
        self._ids = tuple(req_ids)

    def end(self, tokens: int) -> None:
        self._last = (self._ids, tokens, self.clock())
