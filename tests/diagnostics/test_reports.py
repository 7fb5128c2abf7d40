"""The diagnostics' reports: the expert's share of each policy's rows, kept rows by group, the critic's margin."""

import numpy as np
import pytest

from digiq.data.picks import Picks
from digiq.diagnostics.reports import expert_share, keep_by_group, mean_over_seeds, pick_margin


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


def test_pick_margin_is_the_pick_minus_the_uninformed_level_over_informative_states():
    # Candidates: state 0 offers the expert's action once among 2 distinct decisions (uninformed 1/2), drawn twice
    # among 3 draws; state 1 has 1 right of 4 distinct (1/4); state 2 has no right candidate (not informative).
    right = np.array([[True, True, False, False], [True, False, False, False], [False, False, False, False]])
    valid = np.ones((3, 4), bool)
    valid[0, 3] = False
    distinct = np.array([[True, False, True, True], [True, True, True, True], [True, True, True, True]])
    hits = np.array([[9.0, 0, 1, 0], [0, 9.0, 1, 0], [9.0, 0, 0, 0]])  # seed 0: right at state 0 only
    misses = np.array([[0, 0, 9.0, 9.0], [9.0, 0, 0, 0], [9.0, 0, 0, 0]])  # seed 1: the invalid 9 is skipped
    episodes, groups = np.array([7, 8, 8]), np.array(["general", "webshop", "webshop"])
    m = pick_margin(right, valid, distinct, [hits, misses], episodes, groups)
    assert list(m) == ["all", "general", "webshop"]
    # seed 0: (1 - 1/2) + (0 - 1/4); seed 1: (0 - 1/2) + (1 - 1/4); over 4 (seed, state) pairs: 0.5 / 4.
    assert m["all"]["diff"] == 12.5 and (m["all"]["units"], m["all"]["clusters"], m["all"]["seeds"]) == (2, 2, 2)
    assert m["general"]["diff"] == 0.0 and m["webshop"]["diff"] == 25.0
    assert m["webshop"]["units"] == 1  # state 2 of the same episode offers nothing right: not counted


def test_a_share_s_mean_over_seeds_skips_the_seeds_without_rows_there():
    per_seed = [
        {"general": 0.5, "webshop": None},
        {"general": 0.25, "webshop": None},
        {"general": None, "webshop": 0.1},
    ]
    assert mean_over_seeds(per_seed) == {"general": 0.375, "webshop": 0.1}
    assert mean_over_seeds([{"general": None}]) == {"general": None}


def test_pick_margin_against_another_critic_is_the_paired_difference_of_their_hits():
    right = np.array([[True, False, False], [False, True, False], [False, False, True]])
    valid, distinct = np.ones((3, 3), bool), np.ones((3, 3), bool)
    first = np.array([[9.0, 0, 0], [0, 9.0, 0], [9.0, 0, 0]])  # right at states 0 and 1
    second = np.array([[9.0, 0, 0], [9.0, 0, 0], [0, 0, 9.0]])  # right at states 0 and 2
    episodes, groups = np.array([1, 2, 3]), np.array(["typing", "other", "other"])
    m = pick_margin(right, valid, distinct, [first], episodes, groups, against=[second])
    assert m["all"]["diff"] == 0.0 and m["other"]["diff"] == 0.0 and m["typing"]["diff"] == 0.0
    m = pick_margin(right, valid, distinct, [first, first], episodes, groups, against=[second, first])
    assert m["all"]["diff"] == pytest.approx(0.0) and m["other"]["diff"] == 0.0
    both = pick_margin(right, valid, distinct, [first], episodes, np.array(["x", "x", "y"]), against=[second])
    assert both["x"]["diff"] == 50.0 and both["y"]["diff"] == -100.0  # state 1 won, state 2 lost
    with pytest.raises(ValueError, match="seeds"):
        pick_margin(right, valid, distinct, [first, first], episodes, groups, against=[second])
