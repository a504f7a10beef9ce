"""Print rows as an aligned plain-text table, the way every ``lorafleet`` list looks.

Only layout: callers decide the columns, and offer ``--json`` for scripts.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["print_table"]


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Print ``header`` and ``rows``, each column as wide as its widest cell."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        cells = [f"{cell!s:<{width}}" for cell, width in zip(row, widths, strict=True)]
        print("  ".join(cells).rstrip())
