"""Token-id sequences: what every layer compares them with (torch-free, imports nothing)."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix: ``common_prefix_len([1, 2, 3], [1, 2, 4, 5]) -> 2``."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
