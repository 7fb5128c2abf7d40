"""The diagnostics' reports: the expert's share of each policy's rows, kept rows by group."""

import numpy as np

from digiq.data.picks import Picks
from digiq.diagnostics.reports import expert_share, keep_by_group


def test_expert_share_judges_the_picked_candidate_per_task_set():
    right = np.array([[False, True], [True, False], [True, True], [False, False]])
    task_sets = np.array(["general", "general", "webshop", "webshop"])
    # General: state 0's column 1 is the expert's, state 1's column 1 is not; Web Shopping keeps no row.
    assert expert_share(right, np.array([0, 1]), np.array([1, 1]), task_sets) == {
        "general": 0.5,
        "webshop": None,
    }
    # The data's own actions (column 0): state 1 right, state 2 right, state 3 wrong.
    taken = Picks.taken(np.array([1, 2, 3]))
    assert expert_share(right, taken.states, taken.columns, task_sets, taken.row_weights()) == {
        "general": 1.0,
        "webshop": 0.5,
    }


def test_expert_share_of_weighted_rows_counts_their_positive_weight():
    """AWR's and REINFORCE's rows: every candidate of a state, each by its weight; a pushed-down row not at all."""
    right = np.array([[False, True], [True, False], [True, True], [False, False]])
    task_sets = np.array(["general", "general", "webshop", "webshop"])
    states, columns = np.array([0, 0, 1, 2, 3]), np.array([0, 1, 1, 0, 0])
    # General: the expert's row (state 0, column 1) weighs 3 of 1 + 3 + 0 (the -2 row is pushed down, not imitated).
    weights = np.array([1.0, 3.0, -2.0, 0.5, 0.5])
    assert expert_share(right, states, columns, task_sets, weights) == {"general": 0.75, "webshop": 0.5}
    # Only pushed-down rows in a task set: nothing is imitated there.
    assert expert_share(right, states, columns, task_sets, np.array([-1.0, -1.0, -1.0, 1.0, 0.0])) == {
        "general": None,
        "webshop": 1.0,
    }


def test_keep_by_group_pools_seeds_per_task_set_and_kind():
    task_sets = np.array(["webshop"] * 4)
    kinds = np.array(["PRESS_BACK", "PRESS_BACK", "TYPE", "TYPE"])
    kept = np.array([2, 1, 0, 2])  # over 2 seeds
    kept_right = np.array([0, 0, 0, 1])
    out = keep_by_group(kept, kept_right, 2, task_sets, kinds)
    assert out == {"webshop": {"PRESS_BACK": {"kept": 0.75, "expert": 0.0}, "TYPE": {"kept": 0.5, "expert": 0.5}}}
