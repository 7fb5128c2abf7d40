"""Filtered BC: imitate every step of the trajectories that succeeded, with the action taken there.

The simplest use of outcome-only rewards, and the baseline both Digi-Q and
DigiRL compare with: a trajectory's steps are kept whole when its reward is
positive and dropped whole when it is not, and the base policy is fit to the
kept (state, action) pairs by maximum likelihood
(:func:`digiq.models.policy_fit.fit_policy`). Offline on the stored data
(stage 07) and online on its own rollouts, round after round (stage 09).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from digiq.data.picks import Picks

__all__ = ["filtered_bc_picks"]


def filtered_bc_picks(steps: pd.DataFrame) -> Picks:
    """Every step of the successful trajectories (``trajectory_reward`` > 0), with the action taken."""
    return Picks.taken(np.flatnonzero(steps.trajectory_reward.to_numpy() > 0))
