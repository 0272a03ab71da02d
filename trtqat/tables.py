"""Plain-text and Markdown tables of the reports (compare, demo, sensitivity)."""

from __future__ import annotations

from collections.abc import Sequence


def text_table(header: Sequence[object], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell, a dashed rule under the header."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]

    def line(cells: Sequence[object]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths))

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def markdown_table(header: Sequence[object], rows: Sequence[Sequence[object]]) -> list[str]:
    """The lines of a Markdown table."""
    return ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(map(str, r)) + " |" for r in rows)]
