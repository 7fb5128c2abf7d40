"""One colour per row of a figure, the same in every figure that draws the rows in the same order.

Its own module, importing nothing of the package: the stages that draw their figures (09, 11) import it, and
so their fingerprints (:mod:`digiq.fingerprint`) hold it and nothing of the results' tables and charts.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ROW_COLOURS", "row_colours"]

# Twenty colours told apart in pairs (matplotlib's tab20, dark then light): every row of a figure its own.
ROW_COLOURS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
    "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5",
)  # fmt: skip


def row_colours(rows: Sequence[str]) -> dict[str, str]:
    """Each of ``rows`` its own colour, in order; more rows than colours is an error, not a repeat (draw them as
    panels instead)."""
    if len(set(rows)) > len(ROW_COLOURS):
        raise ValueError(f"{len(set(rows))} rows to tell apart, and {len(ROW_COLOURS)} colours: draw them as panels")
    return dict(zip(dict.fromkeys(rows), ROW_COLOURS, strict=False))
