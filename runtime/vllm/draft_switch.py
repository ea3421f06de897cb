"""Whether to draft at all at this batch size, chosen by the throughput the engine measured both ways.

The chain price (:mod:`~.step_cost`) sees the engine's forward only, fit linear in the rows and drafts. Under load
two costs escape it: the proposer's own CPU time, which grows with the batch and runs on the cores the engine needs,
and kernels whose cost jumps with the rows of a batch (an int8 GEMM on AMX tiles of 16 rows). Measured on 2 Xeon
AMX cores, 0.5B target with int8 weights, 16 concurrent requests: chains priced at 0.45 one-token forwards per
token still made the server 0.67x plain's throughput (``eval/reports/cpu/quantized/xeon-amx/load/``).

So at each batch size (bucketed: 1, 2, 3, 4, 5-8, 9-16, 17-32, ...) the switch keeps the committed tokens per
second of whole steps (``propose`` to ``propose``: the proposer's time and the engine's step) with drafting on and
with it off, and drafts only where that measured rate is at least plain's. Below ``min_batch`` it always drafts
(drafts never lost there in any measurement). Until both modes have ``min_samples`` steps in a bucket it
alternates; after that it takes the better one and tries the other every ``explore_every`` steps, so a change in
traffic is seen. A step is timed only when its batch is the previous step's (no prefill inside). The switch changes
only which tokens are proposed, never what is committed: vLLM verifies every draft.
"""

from __future__ import annotations

import time
from collections import deque


def bucket(batch: int) -> int:
    """The batch size's bucket: itself up to 4, then the next power of two (5-8 -> 8, 9-16 -> 16)."""
    if batch <= 4:
        return max(batch, 1)
    return 1 << (batch - 1).bit_length()


class DraftSwitch:
    """Per batch bucket, tokens per second with drafting on and off; :meth:`decide` picks (module docstring).

        switch.start(req_ids, committed)   # top of propose: the step that just ran committed `committed` tokens
        draft = switch.decide(len(req_ids))
        ...                                # the chains (none when not draft)
    """

    def __init__(self, *, min_batch: int = 4, min_samples: int = 8, window: int = 64, explore_every: int = 16,
                 clock=time.perf_counter):
        if min_batch < 1 or min_samples < 1 or window < min_samples or explore_every < 2:
            raise ValueError(f"need min_batch >= 1, window >= min_samples >= 1, explore_every >= 2; got {min_batch}, "
                             f"{min_samples}, {window}, {explore_every}")
        self.min_batch, self.min_samples, self.explore_every = min_batch, min_samples, explore_every
        self.window = window
        self.clock = clock
        self.samples: dict[tuple[int, bool], deque[tuple[int, float]]] = {}
        self._last: tuple[tuple[str, ...], bool, float] | None = None
        self._ids: tuple[str, ...] = ()
        self._now = 0.0
        self.steps: dict[int, int] = {}        # bucket -> steps decided
        self.off_steps = 0

    def start(self, req_ids, committed: int) -> None:
        """The step since the last :meth:`decide` committed ``committed`` tokens over the batch ``req_ids``."""
        now = self.clock()
        ids = tuple(req_ids)
        if self._last is not None and committed > 0:
            last_ids, drafted, t = self._last
            if last_ids == ids and now > t:
                key = (bucket(len(ids)), drafted)
                self.samples.setdefault(key, deque(maxlen=self.window)).append((committed, now - t))
        self._ids, self._now = ids, now

    def rate(self, batch: int, drafting: bool) -> tuple[float, int] | None:
        """``(tokens per second, steps)`` of that mode in the batch's bucket; None without a step."""
        kept = self.samples.get((bucket(batch), drafting))
        if not kept:
            return None
        return sum(n for n, _ in kept) / sum(s for _, s in kept), len(kept)

    def decide(self, batch: int) -> bool:
        """Draft this step? (and remember the answer: the next :meth:`start` times it)."""
        b = bucket(batch)
        k = self.steps[b] = self.steps.get(b, 0) + 1
        draft = self._choose(batch, k)
        self.off_steps += not draft
        self._last = (self._ids, draft, self._now)
        return draft

    def _choose(self, batch: int, k: int) -> bool:
        if batch < self.min_batch:
            return True
        on, off = self.rate(batch, True), self.rate(batch, False)
        if on is None or on[1] < self.min_samples:
            return True
        if off is None or off[1] < self.min_samples:
            return k % 2 == 0              # alternate until plain has its samples too
        best = on[0] >= off[0]
        return (not best) if k % self.explore_every == 0 else best

    def summary(self) -> dict:
        """Per bucket seen: tokens/s drafting and not, steps of each, and the mode it takes now."""
        out = {}
        for b in sorted({b for b, _ in self.samples}):
            on, off = self.rate(b, True), self.rate(b, False)
            out[str(b)] = {"draft_tok_s": round(on[0], 2) if on else None, "draft_steps": on[1] if on else 0,
                           "plain_tok_s": round(off[0], 2) if off else None, "plain_steps": off[1] if off else 0}
        return {"buckets": out, "off_steps": self.off_steps, "min_batch": self.min_batch}
