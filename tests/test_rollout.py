import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import digiq.rollout as rollout_module
from digiq.config import CollectConfig, DeviceConfig, EnvConfig, JudgeConfig
from digiq.data import DataError, TrajectoryStore, mc_returns, observation_text
from digiq.data.trajectories import Step
from digiq.env import AndroidSimEnv, Dynamics, parse_task
from digiq.env.taskgen import generate_tasks
from digiq.paths import Paths
from digiq.rollout import FAULTS_FILE, ExpertPolicy, device_pool, rollout
from digiq.stages.collect import run_collect
from digiq.stages.eval import train_tasks

# Stage 01 on each of its few train tasks once, rather than the released episode counts drawn from them.
EACH_TASK_ONCE = {"episodes_general": None, "episodes_webshop": None}

TASKS = [parse_task(t) for t in generate_tasks("general", "train", 10, seed=4)]


def test_mc_returns():
    assert mc_returns([0, 0, 1], 0.5) == [0.25, 0.5, 1.0]
    assert mc_returns([], 0.9) == []


def test_observation_text_keeps_the_decision_of_the_last_action():
    a = 'Action Plan: [PRESS_HOME] ; Action Decision: "action_type": "PRESS_HOME"'
    assert (
        observation_text([a], "Open the clock") == 'Previous Actions: "action_type": "PRESS_HOME" Goal: Open the clock'
    )
    assert observation_text([], "Open the clock") == "Previous Actions: Goal: Open the clock"


def test_expert_rollout_writes_complete_trajectories(tmp_path):
    store = TrajectoryStore(tmp_path)
    results = rollout(ExpertPolicy(), TASKS, n_envs=4, width=108, store=store, part_size=3)
    assert [r.index for r in results] == list(range(10)) and all(r.success for r in results)
    table = store.read().to_pandas()
    assert table.traj_id.nunique() == 10 and len(store.parts()) == 4  # 3 + 3 + 3 + 1
    for _, traj in table.groupby("traj_id"):
        assert list(traj.step_id) == list(range(len(traj)))
        assert traj.done.iloc[-1] and not traj.done.iloc[:-1].any()
        assert traj.reward.iloc[-1] == 1.0 and traj.trajectory_reward.iloc[0] == 1.0
        assert np.allclose(traj.mc_return, mc_returns(list(traj.reward), 0.95))
    second = int(np.flatnonzero(table.step_id.to_numpy() == 1)[0])  # a step after another of its episode
    row = table.iloc[second]
    assert row.image_path == table.iloc[second - 1].next_image_path
    assert store.load_image(row.image_path).shape == (228, 108, 3)


class FailsAfter(ExpertPolicy):
    """The expert, until its ``calls``-th batch after which it raises ``error``."""

    def __init__(self, calls: int, error: BaseException) -> None:
        super().__init__()
        self.left, self.error = calls, error

    def act(self, batch):
        self.left -= 1
        if self.left < 0:
            raise self.error
        return super().act(batch)


def _collect_calm(policy: ExpertPolicy, store: TrajectoryStore, *, n_envs: int, part_size: int) -> None:
    """Roll ``policy`` out on TASKS into ``store`` on calm phones (the interruption tests' first run)."""
    rollout(policy, TASKS, n_envs=n_envs, width=108, store=store, part_size=part_size, dynamics=Dynamics.calm())


def test_interrupted_collection_resumes_without_losing_parts(tmp_path):
    store = TrajectoryStore(tmp_path)

    with pytest.raises(KeyboardInterrupt):
        _collect_calm(FailsAfter(12, KeyboardInterrupt()), store, n_envs=1, part_size=1)
    done = len(store.stored_ids())
    assert 0 < done < 10 and not list(tmp_path.glob(".*tmp*"))
    rollout(ExpertPolicy(), TASKS, n_envs=2, width=108, store=store, part_size=4)
    assert sorted(store.read().to_pandas().traj_id.unique()) == list(range(10))


def test_corrupt_or_missing_data_is_named(tmp_path):
    with pytest.raises(DataError, match="no trajectory data"):
        TrajectoryStore(tmp_path).read()
    store = TrajectoryStore(tmp_path)
    rollout(ExpertPolicy(), TASKS[:2], n_envs=2, width=108, store=store)
    part = store.parts()[0]
    original = part.read_bytes()
    part.write_bytes(b"not parquet")
    with pytest.raises(DataError, match=rf"corrupt trajectory part {part}: its SHA-256 digest"):
        store.read()
    store.manifest.unlink()  # as a store written before manifests: its parts are checked only as they are read
    with pytest.raises(DataError, match="corrupt trajectory part"):
        store.read()
    part.write_bytes(original)
    pq.write_table(pq.read_table(part).drop_columns(["reward"]), part)
    with pytest.raises(DataError, match=r"lacks field\(s\) \['reward'\]"):
        store.read()


def test_eval_train_tasks_are_the_data_s_first_distinct_tasks(tmp_path):
    """The paper's train columns: per task set, the first N distinct tasks of the trajectories (a task the data drew
    twice is one), unparseable ones passed over."""
    paths = Paths(tmp_path)
    texts = [t.instruction for t in TASKS[:4]]
    rows = [("general", texts[3]), ("general", "Teach my cat to juggle"), ("general", texts[0]), ("general", texts[3]),
            ("general", texts[1])]  # fmt: skip
    steps = [Step(traj_id=i, step_id=0, task=text, task_set=ts, family="", observation="", next_observation="",
                  image_path="", next_image_path="", action="", valid=True, reward=0.0, done=True, mc_return=0.0,
                  trajectory_reward=0.0) for i, (ts, text) in reversed(list(enumerate(rows)))]  # fmt: skip
    TrajectoryStore(paths.offline).write_part(steps)
    held_in = train_tasks(paths, 3)
    assert list(held_in) == ["general"]  # no Web Shopping trajectory: no list, not an empty one
    assert [t.instruction for t in held_in["general"]] == [texts[3], texts[0], texts[1]]  # traj_id order, once each
    assert len(train_tasks(paths, 10)["general"]) == 3  # fewer distinct tasks than asked: all of them


def test_an_exception_still_writes_the_finished_episodes(tmp_path):
    store = TrajectoryStore(tmp_path)

    with pytest.raises(RuntimeError, match="fell over"):  # parts of 64: nothing would be written without the flush
        _collect_calm(FailsAfter(10, RuntimeError("the policy's GPU fell over")), store, n_envs=2, part_size=64)
    finished = store.stored_ids()
    assert finished and len(store.parts()) == 1
    rollout(ExpertPolicy(), TASKS, n_envs=2, width=108, store=store, part_size=64)
    assert sorted(store.read().to_pandas().traj_id.unique()) == list(range(10))


def test_a_duplicated_part_is_named_not_read_twice(tmp_path):
    store = TrajectoryStore(tmp_path)
    rollout(ExpertPolicy(), TASKS[:3], n_envs=3, width=108, store=store)
    shutil.copy(store.parts()[0], tmp_path / "steps-00001.parquet")
    with pytest.raises(DataError, match=r"steps-00001.parquet is not in .*manifest.json"):
        store.read()
    store.manifest.unlink()  # as a store written before manifests
    with pytest.raises(DataError, match=r"trajectory 0 step 0 is stored twice .*steps-00000.parquet.*steps-00001"):
        store.read()


@pytest.mark.slow  # a subprocess collects 160 episodes, killed part-way, then the rest
@pytest.mark.parametrize("parts_before_kill", [0, 1, 2])
def test_a_collection_killed_at_any_point_stores_every_task_exactly_once(tmp_path, parts_before_kill):
    """Killed (SIGKILL: nothing flushed) once ``parts_before_kill`` parts are written, then run again."""
    script = Path(__file__).parent / "scripts" / "collect_until_killed.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path), "0.01"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    store = TrajectoryStore(tmp_path)
    deadline = time.monotonic() + 300
    while len(store.parts()) < parts_before_kill and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if parts_before_kill == 0:
        time.sleep(1.0)  # killed before any part is written: some episodes finished, none stored
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = store.stored_ids()
    assert len(store.parts()) == parts_before_kill and len(before) == 64 * parts_before_kill
    if parts_before_kill:
        assert before != set(range(len(before)))  # out of id order: resuming after the highest id would lose some
    again = subprocess.run([sys.executable, str(script), str(tmp_path), "0"], env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-2000:]
    table = store.read().to_pandas()  # read() refuses a trajectory stored twice
    assert sorted(table.traj_id.unique()) == list(range(160))


class FaultyPhone(AndroidSimEnv):
    """A simulated phone whose every step faults while it runs one of ``cursed`` tasks, or always when ``broken``."""

    def __init__(self, cursed: set[str], broken: bool = False, serial: str = "") -> None:
        super().__init__(width=108, dynamics=Dynamics.calm())
        self.cursed, self.broken, self.serial = cursed, broken, serial

    def step(self, action):
        obs, reward, term, trunc, info = super().step(action)
        if self.broken or self.task.instruction in self.cursed:
            return obs, 0.0, False, True, {**info, "fault": "input timed out", "gone": False}
        return obs, reward, term, trunc, info


def test_a_faulted_episode_moves_to_another_device_and_a_failing_device_is_retired(tmp_path):
    phones = iter([FaultyPhone(set(), broken=True, serial="bad"), FaultyPhone(set(), serial="good")])
    store = TrajectoryStore(tmp_path)
    results = rollout(ExpertPolicy(), TASKS[:6], n_envs=2, store=store, env_factory=lambda: next(phones))
    assert [r.success for r in results] == [True] * 6 and not any(r.abandoned for r in results)
    faults = [json.loads(line) for line in (tmp_path / FAULTS_FILE).read_text().splitlines()]
    # Each fault on the bad phone sent its episode to the good one; after 3 in a row the bad phone was out.
    assert [f["device"] for f in faults] == ["bad"] * 3 and all(f["then"] == "restarted" for f in faults)
    assert len({f["episode"] for f in faults}) == 3
    assert sorted(store.read().to_pandas().traj_id.unique()) == list(range(6))


def test_a_device_known_to_be_gone_is_retired_before_it_costs_an_episode_a_fault(tmp_path):
    """A device of a lost cluster node that was idle when the node went: it takes no episode, so none faults on it."""
    gone = FaultyPhone(set(), broken=True, serial="gone")
    gone.gone = True
    phones = iter([gone, FaultyPhone(set(), serial="good")])
    results = rollout(ExpertPolicy(), TASKS[:3], n_envs=2, store=TrajectoryStore(tmp_path),
                      env_factory=lambda: next(phones))  # fmt: skip
    assert [r.success for r in results] == [True] * 3
    assert not (tmp_path / FAULTS_FILE).exists()


def test_a_device_pool_opens_only_the_devices_a_rollout_asks_for(monkeypatch):
    """Made when first asked for, then handed out in turn: a resumed run with fewer tasks opens fewer devices."""
    made = []

    class CountedPhones:  # stands in for EnvFactory
        def __init__(self, *args, **kwargs) -> None:
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            pass

        def __call__(self) -> AndroidSimEnv:
            made.append(AndroidSimEnv(width=108))
            return made[-1]

    monkeypatch.setattr(rollout_module, "EnvFactory", CountedPhones)
    with device_pool(DeviceConfig(), EnvConfig(width=108), JudgeConfig(), 4) as make:
        rollout(ExpertPolicy(), TASKS[:2], n_envs=4, env_factory=make)
        assert len(made) == 2
        handed = [make() for _ in range(6)]
    assert len(made) == 4 and handed == made[2:] + made  # the next two new, then all four in turn


def test_an_abandoned_episode_is_a_counted_failure_not_missing(tmp_path):
    cursed = {TASKS[2].instruction}
    phones = iter([FaultyPhone(cursed, serial=f"p{i}") for i in range(2)])
    store = TrajectoryStore(tmp_path)
    results = rollout(ExpertPolicy(), TASKS[:5], n_envs=2, store=store, env_factory=lambda: next(phones))
    assert [r.index for r in results] == list(range(5))  # every task has its result
    assert [(r.success, r.abandoned) for r in results] == [(True, False)] * 2 + [(False, True)] + [(True, False)] * 2
    faults = [json.loads(line) for line in (tmp_path / FAULTS_FILE).read_text().splitlines()]
    assert [f["then"] for f in faults] == ["restarted", "restarted", "abandoned"]
    assert {f["device"] for f in faults} == {"p0", "p1"}  # restarted on the other phone each time
    assert sorted(store.read().to_pandas().traj_id.unique()) == [0, 1, 3, 4]


def test_collect_counts_an_abandoned_episode_as_a_failure_and_stores_the_rest(collect_root, monkeypatch):
    """Stage 01 whose phones fault on one task: 3 of 4 stored, the fourth a counted failure, and a rerun retries it."""
    tasks = {ts: collect_root.task_list(ts, "train").read_text().split("\n")[0] for ts in ("general", "webshop")}
    cursed = {parse_task(tasks["general"]).instruction}

    class FaultyPhones:  # stands in for EnvFactory: the device pool's phones, each faulting while it runs a cursed task
        def __init__(self, *args, **kwargs) -> None:
            self.made = 0

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            pass

        def __call__(self) -> FaultyPhone:
            self.made += 1
            return FaultyPhone(cursed, serial=f"p{self.made}")

    monkeypatch.setattr(rollout_module, "EnvFactory", FaultyPhones)
    metrics = run_collect(
        CollectConfig(tasks_per_set=2, n_envs=2, **EACH_TASK_ONCE), EnvConfig(width=108), collect_root
    )
    assert metrics["trajectories"] == 3 and metrics["abandoned"] == 1
    assert sorted(TrajectoryStore(collect_root.offline).stored_ids()) == [1, 2, 3]
    cursed.clear()
    again = run_collect(CollectConfig(tasks_per_set=2, n_envs=2, **EACH_TASK_ONCE), EnvConfig(width=108), collect_root)
    assert again["trajectories"] == 4 and again["abandoned"] == 0


def test_a_full_disk_under_the_fault_log_names_it(tmp_path):
    (tmp_path / FAULTS_FILE).symlink_to("/dev/full")  # a real device whose every write fails with ENOSPC
    phones = iter([FaultyPhone(set(), broken=True, serial="bad"), FaultyPhone(set(), serial="good")])
    with pytest.raises(OSError, match=rf"cannot write {tmp_path / FAULTS_FILE}: .*\(the disk is full\)"):
        rollout(ExpertPolicy(), TASKS[:2], n_envs=2, store=TrajectoryStore(tmp_path), env_factory=lambda: next(phones))
