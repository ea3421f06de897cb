"""Reading a transfer run's ``transfer.json``: what the tables, notes and page (:mod:`ooospec.eval.transfer.tables`,
:mod:`ooospec.eval.transfer.notes`, :mod:`ooospec.eval.transfer.html`) and the plots
(:mod:`ooospec.eval.transfer.plots`) need, so the plots import none of the others."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ooospec.runtime.methods import GOLD, OOOSPEC, hint_method

CEILING = hint_method(GOLD)            # toolspec + the gold call as hints at time zero: the ceiling of hints
GAIN, CEILING_GAIN = f"{OOOSPEC}_gain", f"{CEILING}_gain"   # the stage's per-target hint gains over toolspec


def bench_name(cell: dict) -> str:
    return Path(cell["benchmark"]).stem


def targets_of(results: dict) -> list[str]:
    """Targets in params order (the JSON's ``targets`` object is key-sorted on disk)."""
    return [t for t in results["params"]["targets"] if t in results["targets"]]


def methods_of(results: dict) -> list[str]:
    """Every method in run order over the cells."""
    order: list[str] = []
    for c in results["cells"]:
        order += [m for m in c["methods_run"] if m not in order]
    return order


def dig(obj: Any, *keys: str) -> Any:
    """``obj[k1][k2]...``, None as soon as a level is missing or None.

    >>> dig({"a": {"b": 1}}, "a", "b"), dig({"a": None}, "a", "b")
    (1, None)
    """
    for k in keys:
        if not isinstance(obj, dict) or obj.get(k) is None:
            return None
        obj = obj[k]
    return obj
