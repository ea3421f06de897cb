"""Reading a transfer run's ``transfer.json``: what both the tables (:mod:`ooospec.eval.transfer_report`) and the
plots (:mod:`ooospec.eval.transfer_plots`) need, so neither imports the other."""

from __future__ import annotations

from pathlib import Path


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
