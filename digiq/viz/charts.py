"""The results as bar charts: what the evaluation's notebook draws and the README shows (``plots/*.png``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from digiq.io import atomic_path
from digiq.tables import TASK_SET_NAMES, evaluated_sets

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["ROW_COLOURS", "row_colours", "results_chart", "save_results_chart"]

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


def results_chart(results: dict[str, Any], title: str) -> Figure:
    """Grouped bars (policy x task set) with standard-deviation error bars, each policy its own colour, the legend
    beside the axes."""
    import matplotlib.pyplot as plt

    policies = list(results)
    sets = evaluated_sets(results)
    x = np.arange(len(sets))
    width = 0.8 / len(policies)
    colours = row_colours(policies)
    fig, ax = plt.subplots(figsize=(9, 3.8))
    for i, p in enumerate(policies):
        means = [100 * results[p][ts]["success_rate"] for ts in sets]
        stds = [100 * (results[p][ts].get("success_rate_std") or 0.0) for ts in sets]  # null: one seed
        ax.bar(x + (i - (len(policies) - 1) / 2) * width, means, width, yerr=stds, capsize=3, label=p,
               color=colours[p])  # fmt: skip
    ax.set_xticks(x, [f"{TASK_SET_NAMES[ts]} test" for ts in sets])
    ax.set_ylabel("success rate (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)  # beside the bars, not on them
    fig.tight_layout()
    return fig


def save_results_chart(results: dict[str, Any], path: Path, title: str) -> Path:
    """:func:`results_chart` as a PNG at ``path``, written whole."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = results_chart(results, title)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return path
