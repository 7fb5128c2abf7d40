"""The results as bar charts: what the evaluation's notebook draws and the README shows (``plots/*.png``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from digiq.io import atomic_path
from digiq.tables import TASK_SET_NAMES, evaluated_sets

__all__ = ["save_results_chart"]


def save_results_chart(results: dict[str, Any], path: Path, title: str) -> Path:
    """Grouped bars (policy x task set) with standard-deviation error bars, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(results)
    sets = evaluated_sets(results)
    x = np.arange(len(sets))
    width = 0.8 / len(policies)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for i, p in enumerate(policies):
        means = [100 * results[p][ts]["success_rate"] for ts in sets]
        stds = [100 * (results[p][ts].get("success_rate_std") or 0.0) for ts in sets]  # null: one seed
        ax.bar(x + (i - (len(policies) - 1) / 2) * width, means, width, yerr=stds, capsize=3, label=p)
    ax.set_xticks(x, [f"{TASK_SET_NAMES[ts]} test" for ts in sets])
    ax.set_ylabel("success rate (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title)
    ax.legend(fontsize=8, ncols=min(4, len(policies)))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return path
