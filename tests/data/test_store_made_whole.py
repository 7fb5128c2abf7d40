"""A store a stage collects is swapped in whole: a run cut short leaves the previous output as it was, and only a run
with the same settings resumes what it left."""

import pytest

from digiq.data.trajectories import TrajectoryStore, store_made_whole
from digiq.env import parse_task
from digiq.rollout import ExpertPolicy, rollout

TASKS = [parse_task(t, "general") for t in ("Open the settings", "Open the clock", "Open the calculator")]
SETTINGS = {"stage": "collect", "seed": 0}


class CutShort(Exception):
    """Stands for a kill: nothing after the point it is raised at runs."""


def _collect(root, settings, tasks, stop_after=None):
    """Roll the expert out on ``tasks`` into ``root``'s store; with ``stop_after``, the run ends there, cut short."""
    with store_made_whole(root, settings) as store:
        results = rollout(ExpertPolicy(), tasks, n_envs=1, width=108, store=store, part_size=1)
        if stop_after is not None and len(store.stored_ids()) >= stop_after:
            raise CutShort
    return results


def test_a_run_cut_short_leaves_the_previous_output_whole_and_the_same_settings_resume(tmp_path):
    root = tmp_path / "offline"
    _collect(root, SETTINGS, TASKS[:1])
    before = TrajectoryStore(root).read()
    with pytest.raises(CutShort):
        _collect(root, {**SETTINGS, "seed": 1}, TASKS[:2], stop_after=1)
    assert TrajectoryStore(root).read().equals(before)  # the old output, whole: no episode of the cut run in it
    ran = _collect(root, {**SETTINGS, "seed": 1}, TASKS)
    assert [r.task for r in ran] == [TASKS[2].instruction]  # the two stored before the cut are kept
    after = TrajectoryStore(root).read()
    assert sorted(set(after.column("traj_id").to_pylist())) == [0, 1, 2]
    assert set(after.column("task").to_pylist()) == {t.instruction for t in TASKS}


def test_a_partial_store_of_other_settings_is_started_anew(tmp_path):
    root = tmp_path / "offline"
    with pytest.raises(CutShort):
        _collect(root, SETTINGS, TASKS[1:], stop_after=1)
    partial = tmp_path / ".offline.partial"
    assert TrajectoryStore(partial).stored_ids() and not root.exists()
    _collect(root, {**SETTINGS, "seed": 2}, TASKS[:1])
    assert set(TrajectoryStore(root).read().column("task").to_pylist()) == {TASKS[0].instruction}
    assert not partial.exists()


def test_a_finished_output_of_the_same_settings_is_taken_up_and_its_fault_log_is_not_shared(tmp_path):
    root = tmp_path / "offline"
    _collect(root, SETTINGS, TASKS[:2])
    (root / "faults.jsonl").write_text("{}\n")
    before = TrajectoryStore(root).read()
    with store_made_whole(root, SETTINGS) as store:
        assert store.stored_ids() == {0, 1}  # nothing left to collect
        with open(store.root / "faults.jsonl", "a") as f:
            f.write("{}\n")
        assert (root / "faults.jsonl").read_text() == "{}\n"  # the output's own log is untouched until the swap
    assert TrajectoryStore(root).read().equals(before) and (root / "faults.jsonl").read_text() == "{}\n{}\n"
    assert (root / "made_with.json").exists()
