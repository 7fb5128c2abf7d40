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
    assert expert_share(right, *Picks.taken(np.array([1, 2, 3])), task_sets) == {"general": 1.0, "webshop": 0.5}


def test_keep_by_group_pools_seeds_per_task_set_and_kind():
    task_sets = np.array(["webshop"] * 4)
    kinds = np.array(["PRESS_BACK", "PRESS_BACK", "TYPE", "TYPE"])
    kept = np.array([2, 1, 0, 2])  # over 2 seeds
    kept_right = np.array([0, 0, 0, 1])
    out = keep_by_group(kept, kept_right, 2, task_sets, kinds)
    assert out == {"webshop": {"PRESS_BACK": {"kept": 0.75, "expert": 0.0}, "TYPE": {"kept": 0.5, "expert": 0.5}}}
