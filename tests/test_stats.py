"""Paired bootstrap intervals and sample spread of evaluation outcomes (digiq.stats)."""

import time

import numpy as np
import pytest

from digiq.stats import cluster_bootstrap, comparisons, paired_bootstrap, sample_std


def _width(r: dict) -> float:
    return r["ci95"][1] - r["ci95"][0]


def test_hand_checkable_cases():
    rng = np.random.default_rng(0)
    a = (rng.random((3, 40)) < 0.5).astype(int)
    assert paired_bootstrap(a, a) == {"diff": 0.0, "ci95": [0.0, 0.0], "n_tasks": 40, "seeds": 3}
    ones, zeros = np.ones((2, 7), int), np.zeros((2, 7), int)
    assert paired_bootstrap(ones, zeros) == {"diff": 100.0, "ci95": [100.0, 100.0], "n_tasks": 7, "seeds": 2}
    assert paired_bootstrap(zeros, ones)["ci95"] == [-100.0, -100.0]


def test_known_mean_difference_lies_inside_its_interval():
    a = np.tile([1] * 7 + [0] * 3, (3, 10))  # 70% on every seed
    b = np.tile([1] * 4 + [0] * 6, (3, 10))  # 40%, its successes among a's
    assert a.mean() == 0.7 and b.mean() == 0.4
    r = paired_bootstrap(a, b, n_boot=4000, seed=1)
    assert r["diff"] == 30.0 and r["n_tasks"] == 100 and r["seeds"] == 3
    assert 0 < r["ci95"][0] < 30.0 < r["ci95"][1] < 100


def test_seed_is_reproducible_and_boolean_outcomes_work():
    rng = np.random.default_rng(2)
    a, b = rng.random((3, 50)) < 0.6, rng.random((3, 50)) < 0.4
    assert paired_bootstrap(a, b, seed=5) == paired_bootstrap(a.astype(int), b.astype(float), seed=5)


def test_interval_narrows_with_more_tasks():
    rng = np.random.default_rng(3)
    a, b = (rng.random((3, 50)) < 0.6).astype(int), (rng.random((3, 50)) < 0.4).astype(int)
    few, many = paired_bootstrap(a, b), paired_bootstrap(np.tile(a, 4), np.tile(b, 4))
    assert few["diff"] == many["diff"] and many["n_tasks"] == 200
    assert _width(many) < 0.7 * _width(few)  # four times the tasks: about half the width


def test_pairing_separates_what_unpaired_resampling_cannot():
    """Both policies solve the same easy half; a also solves 10 hard tasks: +10 points, clearly."""
    b = np.array([[1] * 50 + [0] * 50])
    a = b.copy()
    a[0, 50:60] = 1
    paired = paired_bootstrap(a, b, seed=0)
    assert paired["diff"] == 10.0 and paired["ci95"][0] > 0
    # Unpaired: each policy's tasks drawn on their own, so the task mix of each adds its own noise.
    rng = np.random.default_rng(0)
    ia, ib = rng.integers(0, 100, (10000, 100)), rng.integers(0, 100, (10000, 100))
    unpaired = 100 * (a[0][ia].mean(1) - b[0][ib].mean(1))
    assert np.percentile(unpaired, 2.5) < 0 < np.percentile(unpaired, 97.5)


def test_seeds_are_resampled_and_one_seed_resamples_tasks_only():
    # a beats b on every task of seed 0 and ties on seed 1: only seed resampling can vary the difference.
    a, b = np.array([[1] * 20, [0] * 20]), np.zeros((2, 20), int)
    r = paired_bootstrap(a, b)
    assert r["diff"] == 50.0 and r["ci95"] == [0.0, 100.0]
    assert paired_bootstrap(a[:1], b[:1])["ci95"] == [100.0, 100.0]
    assert paired_bootstrap(a[0], b[0])["seeds"] == 1  # a 1-D array is one seed


def test_ten_thousand_replicates_over_3_by_300_are_fast():
    rng = np.random.default_rng(4)
    a, b = rng.random((3, 300)) < 0.5, rng.random((3, 300)) < 0.4
    t0 = time.perf_counter()
    paired_bootstrap(a, b, n_boot=10000)
    assert time.perf_counter() - t0 < 1.0


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match=r"same \(seeds, tasks\) shape.*\(3, 10\).*\(3, 9\)"):
        paired_bootstrap(np.zeros((3, 10)), np.zeros((3, 9)))
    with pytest.raises(ValueError, match="other than 0 and 1"):
        paired_bootstrap(np.full((2, 3), 0.5), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="non-empty"):
        paired_bootstrap(np.zeros((2, 0)), np.zeros((2, 0)))
    with pytest.raises(ValueError, match="non-empty"):
        paired_bootstrap(np.zeros((2, 3, 4)), np.zeros((2, 3, 4)))


def test_comparisons_pair_seed_by_seed_skip_absent_policies_and_refuse_other_seeds():
    rng = np.random.default_rng(5)
    main = {ts: (rng.random((3, 30)) < 0.5).astype(int) for ts in ("general", "webshop")}
    ablation = {"general": main["general"].copy()}  # one task set only
    outcomes = {"digiq": main, "base": {ts: np.zeros_like(x) for ts, x in main.items()}, "digiq_n1": ablation}
    out = comparisons(outcomes, [("digiq", "base"), ("digiq_n1", "digiq"), ("digiq", "filtered_bc")], n_boot=500)
    assert set(out) == {"general", "webshop"}
    assert set(out["general"]) == {"digiq-base", "digiq_n1-digiq"} and set(out["webshop"]) == {"digiq-base"}
    assert out["general"]["digiq-base"]["seeds"] == 3
    assert out["general"]["digiq_n1-digiq"] == {"diff": 0.0, "ci95": [0.0, 0.0], "n_tasks": 30, "seeds": 3}
    assert out["webshop"]["digiq-base"]["diff"] == round(100 * main["webshop"].mean(), 2)
    with pytest.raises(ValueError):  # a row on fewer seeds is a bug, not something to compare around
        comparisons({"digiq": main, "digiq_n1": {"general": main["general"][:1]}}, [("digiq_n1", "digiq")])


def test_sample_std_is_ddof_1_and_undefined_below_two_values():
    assert sample_std([0.2, 0.4]) == pytest.approx(np.sqrt(0.02))
    assert sample_std(np.array([0.5, 0.5, 0.5])) == 0.0
    assert sample_std([0.3]) is None and sample_std([]) is None


def test_cluster_bootstrap_weighs_units_and_keeps_clusters_together():
    # Two episodes of 3 states at +1 each, one of 1 state at -1: the mean over states is (6 - 1) / 7 per seed.
    sums, counts = np.array([[3.0, 3.0, -1.0]] * 2), np.array([3.0, 3.0, 1.0])
    r = cluster_bootstrap(sums, counts, seed=1)
    assert r["diff"] == round(100 * 5 / 7, 2) and (r["units"], r["clusters"], r["seeds"]) == (7, 3, 2)
    assert -100.0 <= r["ci95"][0] < r["diff"] < r["ci95"][1] == 100.0  # a replicate of only the +1 episodes is 100
    # Splitting each episode into independent states narrows the interval: clusters are what vary.
    split = cluster_bootstrap(np.array([[1.0] * 6 + [-1.0]] * 2), np.ones(7), seed=1)
    assert split["diff"] == r["diff"] and _width(split) <= _width(r)


def test_paired_bootstrap_is_the_cluster_bootstrap_of_one_task_per_cluster():
    rng = np.random.default_rng(4)
    a, b = (rng.random((3, 60)) < 0.5).astype(int), (rng.random((3, 60)) < 0.3).astype(int)
    paired, clustered = paired_bootstrap(a, b, seed=2), cluster_bootstrap(a - b, np.ones(60), seed=2)
    assert (paired["diff"], paired["ci95"]) == (clustered["diff"], clustered["ci95"])


def test_cluster_bootstrap_names_bad_input():
    with pytest.raises(ValueError, match=r"\(seeds, clusters\).*\(2, 3\).*\(4,\)"):
        cluster_bootstrap(np.zeros((2, 3)), np.ones(4))
    with pytest.raises(ValueError, match="at least one unit"):
        cluster_bootstrap(np.zeros((2, 3)), np.zeros(3))
    with pytest.raises(ValueError, match="n_boot"):
        cluster_bootstrap(np.zeros((2, 3)), np.ones(3), n_boot=0)
