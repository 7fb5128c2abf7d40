"""The results as bar charts: what the evaluation's notebook draws and the README shows (``plots/*.png``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from digiq.env.tasks import TASK_SETS
from digiq.io import atomic_path
from digiq.tables import PAPER_CLAIMS, TASK_SET_NAMES, Claim, evaluated_sets, judge_claim
from digiq.viz.colours import row_colours

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["results_chart", "save_results_chart", "claims_chart"]


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


def claims_chart(comparisons: dict[str, Any], claims: Sequence[Claim] = PAPER_CLAIMS) -> Figure:
    """A forest plot of ``claims``: for each, on each task set, the claimed winner's lead in points with its 95%
    paired bootstrap interval (:func:`~digiq.tables.judge_claim`), beside the line of no difference, and the
    claim's verdict. A claim holds on a task set where its interval lies right of the line."""
    import textwrap

    import matplotlib.pyplot as plt

    colours = row_colours(list(TASK_SETS))
    fig, ax = plt.subplots(figsize=(10, 0.62 * len(claims) + 1.3))
    ax.axvline(0, color="black", lw=0.8)
    offsets = np.linspace(-0.15, 0.15, len(TASK_SETS))
    for y, claim in enumerate(claims):
        leads, verdict = judge_claim(claim, comparisons)
        for offset, (ts, lead) in zip(offsets, leads.items(), strict=True):
            if lead is not None:
                ax.errorbar(lead.diff, y + offset, xerr=[[lead.diff - lead.low], [lead.high - lead.diff]], fmt="o",
                            ms=4, capsize=3, color=colours[ts], label=TASK_SET_NAMES[ts] if y == 0 else None)  # fmt: skip
        ax.annotate(verdict, (1.01, y), xycoords=("axes fraction", "data"), va="center", fontsize=8)
    ax.set_yticks(range(len(claims)), [textwrap.fill(c.text, 48) for c in claims], fontsize=7)
    ax.set_ylim(len(claims) - 0.5, -0.5)  # the first claim on top, as in the claims table
    ax.set_xlabel("the claimed winner's lead (points), 95% paired bootstrap interval")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=len(TASK_SETS), borderaxespad=0.2)
    fig.tight_layout()
    return fig
