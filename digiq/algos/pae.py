"""PAE's learning rule: Filtered BC on the episodes the evaluator called successes, the shortest of each task's.

Each round adds its episodes to a buffer that keeps every episode. The actor
imitates the steps of successful episodes (reward from the evaluator, never
from ground truth), and where one instruction succeeded several times, only
the episodes no longer than the 20th percentile of its successful lengths:
the quick ways to do a task, not the detours. At most 1,024 episodes are
imitated per update, drawn at random when more qualify.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from digiq.data.picks import Picks

__all__ = ["MAX_IMITATED", "SHORTEST_QUANTILE", "pae_picks"]

SHORTEST_QUANTILE = 0.2
MAX_IMITATED = 1024


def pae_picks(steps: pd.DataFrame, seed: int, quantile: float = SHORTEST_QUANTILE,
              max_episodes: int = MAX_IMITATED) -> Picks:  # fmt: skip
    """The steps to imitate, with the actions taken, from a buffer's step table.

    ``steps`` needs ``episode`` (an id per episode), ``task`` and ``trajectory_reward``; the episode's length is its
    number of rows. Rows come back in table order.
    """
    episodes = steps.groupby("episode", sort=False).agg(task=("task", "first"), reward=("trajectory_reward", "first"),
                                                        length=("task", "size"))  # fmt: skip
    won = episodes[episodes.reward > 0]
    cut = won.groupby("task").length.transform(lambda n: np.quantile(n, quantile))
    kept = won.index[(won.length <= cut).to_numpy()].to_numpy()
    if len(kept) > max_episodes:
        kept = np.sort(np.random.default_rng(seed).choice(kept, max_episodes, replace=False))
    return Picks.taken(np.flatnonzero(steps.episode.isin(kept).to_numpy()))
