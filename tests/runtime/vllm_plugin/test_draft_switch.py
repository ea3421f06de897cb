"""The draft switch: whole steps timed with drafting on and off per batch bucket; the faster mode is taken, the other
explored; chains skipped by it never change the output."""

from __future__ import annotations

import pytest

from ooospec.runtime.vllm.draft_switch import DraftSwitch, bucket


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def run(switch: DraftSwitch, clock: Clock, ids, steps: int, seconds: dict[bool, float], tokens: dict[bool, int]):
    """``steps`` steps of batch ``ids``: each takes ``seconds[mode]`` and commits ``tokens[mode]``; the modes."""
    modes, committed = [], 0
    for _ in range(steps):
        switch.start(ids, committed)
        draft = switch.decide(len(ids))
        modes.append(draft)
        clock.t += seconds[draft]
        committed = tokens[draft]
    return modes


def test_buckets():
    assert [bucket(b) for b in (0, 1, 2, 3, 4, 5, 8, 9, 16, 17)] == [1, 1, 2, 3, 4, 8, 8, 16, 16, 32]


def test_small_batches_always_draft():
    clock = Clock()
    switch = DraftSwitch(min_batch=4, clock=clock)
    assert all(run(switch, clock, ["a", "b", "c"], 50, {True: 1.0, False: 0.1}, {True: 3, False: 3}))


def test_drafting_stops_where_plain_steps_commit_more_per_second():
    clock = Clock()
    switch = DraftSwitch(min_batch=4, min_samples=4, explore_every=8, clock=clock)
    ids = [f"r{i}" for i in range(16)]
    # drafting: 0.30 s per step for 40 tokens (133/s); plain: 0.08 s for 16 (200/s)
    modes = run(switch, clock, ids, 200, {True: 0.30, False: 0.08}, {True: 40, False: 16})
    late = modes[100:]
    assert sum(late) <= len(late) / 8 + 1          # plain, with a drafted step every explore_every to look again
    summary = switch.summary()["buckets"]["16"]
    assert summary["plain_tok_s"] == pytest.approx(200.0) and summary["draft_tok_s"] == pytest.approx(133.33, 0.01)


def test_drafting_stays_where_it_pays_and_the_batch_must_hold_still_to_be_timed():
    clock = Clock()
    switch = DraftSwitch(min_batch=4, min_samples=4, explore_every=8, clock=clock)
    ids = [f"r{i}" for i in range(8)]
    modes = run(switch, clock, ids, 200, {True: 0.15, False: 0.08}, {True: 30, False: 8})   # 200/s vs 100/s
    assert sum(modes[100:]) >= 100 * 7 / 8 - 1
    before = dict(switch.samples)
    switch.start(ids[:-1], 5)                      # a request finished: this step is not timed
    assert {k: len(v) for k, v in switch.samples.items()} == {k: len(v) for k, v in before.items()}


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        DraftSwitch(min_batch=0)
    with pytest.raises(ValueError):
        DraftSwitch(min_samples=10, window=4)
