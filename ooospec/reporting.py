"""Rendering shared by every report and card: markdown tables and their cells.

One table renderer for the bench, agent-bench, sidecar and transfer reports, the data cards and the adapter card::

    md_table(["method", "median s", "speedup"], [["ar", "4.20", "1.00x"], ["toolspec", "1.45", "2.90x"]])

Alignment: ``align`` is one letter per column (``l`` left, ``r`` right); by default the first ``labels`` columns
are left-aligned and the rest (numbers) right-aligned. Cells are rendered with ``str``; a ``|`` inside a cell is
escaped so it cannot split the row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def fmt_cell(value: Any, spec: str) -> str:
    """One table cell; ``-`` for a missing or non-finite value.

    >>> fmt_cell(1.5, "{:.2f}x"), fmt_cell(None, "{:.2f}"), fmt_cell(0.5, "{:.0%}")
    ('1.50x', '-', '50%')
    """
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return spec.format(value)


def pct(value: Any, missing: str = "") -> str:
    """A fraction as a percentage with one decimal (``missing`` for None or a non-number).

    >>> pct(0.9333), pct(None), pct(None, "n/a")
    ('93.3%', '', 'n/a')
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return missing
    return f"{100 * value:.1f}%"


def md_text(value: Any) -> str:
    return str(value).replace("|", "\\|")


def md_table(headers: Sequence[Any], rows: Sequence[Sequence[Any]], *, align: str | None = None,
             labels: int = 1) -> str:
    """A markdown table (no trailing newline); ``align``: ``l``/``r`` per column, default ``labels`` x ``l`` then
    ``r``. Raises ValueError when a row's width or ``align``'s length differs from the headers'."""
    n = len(headers)
    align = align if align is not None else "l" * min(labels, n) + "r" * max(0, n - labels)
    if len(align) != n or set(align) - {"l", "r"}:
        raise ValueError(f"align {align!r}: need one of 'l'/'r' per column ({n} columns)")
    for i, row in enumerate(rows):
        if len(row) != n:
            raise ValueError(f"row {i} has {len(row)} cells, the table has {n} columns")
    lines = ["| " + " | ".join(md_text(h) for h in headers) + " |",
             "|" + "".join("---|" if a == "l" else "---:|" for a in align)]
    lines += ["| " + " | ".join(md_text(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
