"""PAE's rule: successes only, the shortest fifth of each task's, at most so many episodes."""

import pandas as pd

from digiq.algos.pae import pae_picks


def _table(episodes: list[tuple[str, float, int]]) -> pd.DataFrame:
    """One row per step of each (task, trajectory reward, length) episode, episodes numbered in order."""
    rows = [{"episode": e, "task": task, "trajectory_reward": reward, "step_id": t}
            for e, (task, reward, length) in enumerate(episodes) for t in range(length)]  # fmt: skip
    return pd.DataFrame(rows)


def test_only_successes_and_of_each_task_the_shortest_fifth():
    steps = _table([("a", 1.0, 3), ("a", 1.0, 5), ("a", 1.0, 8), ("a", 1.0, 9), ("a", 1.0, 9),  # 20th pct: 4.6
                    ("b", 0.0, 2), ("c", 1.0, 7)])  # fmt: skip
    picked = steps.iloc[pae_picks(steps, seed=0).states]
    assert sorted(picked.episode.unique()) == [0, 6]  # a's 3-step episode, and c's only success
    assert (picked.groupby("episode").size() == [3, 7]).all()


def test_at_most_so_many_episodes_are_imitated_drawn_by_seed():
    steps = _table([(f"t{i}", 1.0, 2) for i in range(10)])
    some = pae_picks(steps, seed=0, max_episodes=4)
    assert steps.iloc[some.states].episode.nunique() == 4
    assert list(pae_picks(steps, seed=0, max_episodes=4).states) == list(some.states)
    assert list(pae_picks(steps, seed=1, max_episodes=4).states) != list(some.states)
    assert len(pae_picks(steps, seed=0).states) == 20
