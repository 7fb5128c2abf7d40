"""Stage 09: DigiRL's online rounds at tiny size: the task draws, the rows, a run resumed after a kill, and the
offline step features off-to-online runs read from stage 07."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from digiq.algos import digirl_online
from digiq.algos.digirl import read_offline_step_features, step_features, write_offline_step_features
from digiq.algos.digirl_online import OnlineJob, round_tasks, run_online_job, split_runs
from digiq.config import ActorConfig, ComputeConfig, DeviceConfig, DigiRLConfig, EnvConfig, JudgeConfig
from digiq.data.picks import DIGIRL_STEP_FEATURES, stored_path
from digiq.data.trajectories import TrajectoryStore
from digiq.env.taskgen import generate_tasks
from digiq.env.tasks import TASK_SETS, parse_task
from digiq.io import StageError
from digiq.models.policy import AutoUIPolicy, PolicyConfig
from digiq.models.policy_fit import load_screens
from digiq.models.tokenizer import default_corpus, train_tokenizer
from digiq.paths import Paths
from digiq.rollout import ExpertPolicy, rollout
from digiq.stages.actor import StepFeaturesJob, step_features_job
from digiq.stages.digirl_online import run_digirl_online

WIDTH = 108
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "online_run.py"


def tiny_job(paths: Paths, row: str, rounds: int) -> OnlineJob:
    """``row`` for seed 0 on General at tiny size: 4 episodes a round, a few updates of everything."""
    cfg = DigiRLConfig(online=[row], rounds=rounds, episodes_per_round=4, env_steps=None, n_envs=4, value_updates=5,
                       value_batch=16, actor_updates=2)  # fmt: skip
    return OnlineJob(paths, row, 0, "general", cfg, ActorConfig(batch_size=4), EnvConfig(width=WIDTH), DeviceConfig(),
                     JudgeConfig())  # fmt: skip


@pytest.fixture(scope="module")
def online_root(tmp_path_factory) -> Paths:
    """Train lists, an untrained tiny base (also standing in for offline DigiRL's policy), offline data from the
    noisy expert, whose successes give off2on's filter steps to keep, and their step features as stage 07 stores
    them."""
    paths = Paths(tmp_path_factory.mktemp("online"))
    for ts in TASK_SETS:
        paths.task_list(ts, "train").parent.mkdir(parents=True, exist_ok=True)
        paths.task_list(ts, "train").write_text("\n".join(generate_tasks(ts, "train", 6, seed=3)) + "\n")
    torch.manual_seed(0)
    policy = AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, num_layers=1, image_dim=32),
                          train_tokenizer(default_corpus(n_tasks=50), vocab_size=400))  # fmt: skip
    policy.save(paths.base_policy)
    for ts in TASK_SETS:
        policy.save(paths.actor("digirl_offline", 0, ts))
    tasks = [parse_task(t, ts) for ts in TASK_SETS for t in generate_tasks(ts, "train", 4, seed=5)]
    rollout(ExpertPolicy(noise=0.2, seed=1), tasks, n_envs=4, width=WIDTH, store=TrajectoryStore(paths.offline))
    steps = TrajectoryStore(paths.offline).read().to_pandas()
    write_offline_step_features(paths, steps, {ts: step_features_job(StepFeaturesJob(paths, ts)) for ts in TASK_SETS})
    return paths


def test_a_round_draws_its_task_set_s_episodes_the_same_for_every_row():
    train = {ts: [parse_task(t, ts) for t in generate_tasks(ts, "train", 10, seed=3)] for ts in TASK_SETS}
    cfg = DigiRLConfig(episodes_per_round=7)
    drawn = round_tasks(cfg, train["general"], seed=0, task_set="general", round_=0)
    assert [t.task_set for t in drawn] == ["general"] * 7
    assert len({t.instruction for t in drawn}) == 7  # without replacement within a round
    # a function of the seed, task set and round alone, not of the row
    assert drawn == round_tasks(cfg, train["general"], 0, "general", 0)
    assert drawn != round_tasks(cfg, train["general"], 0, "general", 1)
    assert drawn != round_tasks(cfg, train["general"], 1, "general", 0)
    assert [t.task_set for t in round_tasks(cfg, train["webshop"], 0, "webshop", 0)] == ["webshop"] * 7
    assert len(round_tasks(DigiRLConfig(episodes_per_round=20), train["general"], 0, "general", 0)) == 10  # the list


def _copy(paths: Paths, to: Path) -> Paths:
    shutil.copytree(paths.root, to)
    return Paths(to)


def _records(state: dict) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "wall_time_s"} for r in state["rounds"]]


@pytest.mark.slow  # three runs of three rounds, one in a process killed part-way
def test_an_online_run_killed_after_a_round_resumes_there_and_ends_as_an_unbroken_run(online_root, tmp_path):
    row = "digirl_off2on"  # its buffer holds the expert's successes, so every round fits the policy
    unbroken = _copy(online_root, tmp_path / "unbroken")
    whole = run_online_job(tiny_job(unbroken, row, 3))
    assert len(whole["rounds"]) == 3 and all(r["kept_steps"] > 0 for r in whole["rounds"])

    broken = _copy(online_root, tmp_path / "broken")
    run = broken.online_run(row, 0, "general")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(broken.root), row, "3"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    state = run / "latest" / "state.json"
    deadline = time.monotonic() + 300
    while not state.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)  # nothing flushed: the run is somewhere in its second round
    proc.wait()
    assert state.exists(), proc.stderr.read().decode()[-2000:]
    finished = len(json.loads(state.read_text())["rounds"])
    assert 1 <= finished < 3
    first_round = TrajectoryStore(run / "round000").read()

    resumed = run_online_job(tiny_job(broken, row, 3))
    assert _records(resumed) == _records(whole)  # the same episodes, values, kept steps and successes
    assert TrajectoryStore(run / "round000").read().equals(first_round)  # what was collected is kept, not redone
    a, b = (AutoUIPolicy.load(p.online_policy(row, 0, "general")) for p in (broken, unbroken))
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        # equal up to the order of float sums, which the killed process's thread count may change
        assert torch.allclose(x, y, rtol=1e-4, atol=1e-5), name
    assert not list(run.glob(".latest*"))  # no state left beside latest/


def test_the_stage_runs_every_row_within_its_step_budget_and_counts_their_steps(online_root, tmp_path):
    paths = _copy(online_root, tmp_path / "root")
    cfg = DigiRLConfig(rounds=5, episodes_per_round=4, env_steps=30, n_envs=4, value_updates=3, value_batch=8,
                       actor_updates=1)  # fmt: skip
    out = run_digirl_online(cfg, ActorConfig(batch_size=4), EnvConfig(width=WIDTH), paths, seeds=1)
    offline = TrajectoryStore(paths.offline).read().num_rows
    assert set(out["rows"]) == set(cfg.online) and out["offline_env_steps"] == offline
    for row, entry in out["rows"].items():
        assert list(entry["by_task_set"]) == list(TASK_SETS)  # one run per task set
        total = 0
        for ts, part in entry["by_task_set"].items():
            (rounds,) = part["per_seed"]
            steps = [r["env_steps"] for r in rounds]
            assert sum(steps[:-1]) < 30 <= sum(steps) or len(rounds) == 5  # no round starts past the budget
            stored = [
                TrajectoryStore(paths.online_run(row, 0, ts) / f"round{r:03d}").read() for r in range(len(rounds))
            ]
            assert sum(t.num_rows for t in stored) == sum(steps)
            assert {x for t in stored for x in t.column("task_set").to_pylist()} == {ts}  # its own task set's tasks
            AutoUIPolicy.load(paths.online_policy(row, 0, ts))
            total += sum(steps)
        assert entry["online_env_steps"] == total
        assert entry["env_steps"] == total + (offline if row == "digirl_off2on" else 0)
    for part in out["rows"]["filtered_bc_online"]["by_task_set"].values():
        assert all(r["kept_steps"] == 0 for r in part["per_seed"][0])  # an untrained base never succeeds
    assert (paths.plots / "digirl_online.png").stat().st_size > 0
    assert json.loads((paths.metrics / "digirl_online.json").read_text())["rows"].keys() == out["rows"].keys()
    assert np.isfinite(out["wall_time_s"])


def test_an_online_round_runs_on_phones_over_adb_through_the_env_factory(online_root, tmp_path):
    paths = _copy(online_root, tmp_path / "root")
    job = tiny_job(paths, "digirl_online", 1)._replace(
        devices=DeviceConfig(backend="adb-sim", adb_port=0, sim_devices=4)  # an in-process adb server of 4 phones
    )
    (record,) = run_online_job(job)["rounds"]
    stored = TrajectoryStore(paths.online_run("digirl_online", 0, "general") / "round000").read()
    assert record["episodes"] == 4 and record["env_steps"] == stored.num_rows > 0


@pytest.mark.slow  # two runs of two rounds
def test_a_run_cut_in_two_ends_as_the_unbroken_run(online_root, tmp_path):
    """What stage 09 does with the runs its workers leave over: the second half resumes the first, to the bit."""
    row = "digirl_off2on"  # its buffer holds the expert's successes, so every round fits the policy
    unbroken, cut = _copy(online_root, tmp_path / "unbroken"), _copy(online_root, tmp_path / "cut")
    whole = run_online_job(tiny_job(unbroken, row, 2))
    assert len(run_online_job(tiny_job(cut, row, 2)._replace(until=1))["rounds"]) == 1
    resumed = run_online_job(tiny_job(cut, row, 2))
    assert _records(resumed) == _records(whole) and all(r["kept_steps"] > 0 for r in whole["rounds"])
    a, b = (AutoUIPolicy.load(p.online_policy(row, 0, "general")) for p in (cut, unbroken))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    values = [torch.load(p.online_run(row, 0, "general") / "latest" / "values.pt", weights_only=True)
              for p in (cut, unbroken)]  # fmt: skip
    for part in ("instruction", "step"):
        assert all(torch.equal(values[0][part][k], values[1][part][k]) for k in values[0][part])


def test_the_runs_left_over_by_the_workers_are_cut_in_two(online_root):
    jobs = [tiny_job(online_root, "digirl_online", 5)._replace(seed=s) for s in range(3)]
    parts, after = split_runs(jobs, 2)
    assert [(p.seed, p.until) for p in parts] == [(2, 2), (0, None), (1, None), (2, None)]
    assert after == [None, None, None, 0]  # the second half starts once the first has finished
    assert split_runs(jobs, 3) == split_runs(jobs, 1) == (jobs, [None] * 3)  # no run left over, or one process
    assert split_runs(jobs[:1], 2) == (jobs[:1], [None])  # no other run to share the workers with


@pytest.mark.slow  # worker processes, each loading torch
def test_on_two_workers_the_run_left_over_is_shared_and_returns_its_whole_record(online_root, tmp_path):
    paths = _copy(online_root, tmp_path / "root")
    cfg = DigiRLConfig(rounds=2, episodes_per_round=4, env_steps=None, n_envs=4, value_updates=3, value_batch=8,
                       actor_updates=1)  # fmt: skip
    out = run_digirl_online(cfg, ActorConfig(batch_size=4), EnvConfig(width=WIDTH), paths, seeds=1,
                            compute=ComputeConfig(workers=2))  # fmt: skip
    assert list(out["rows"]) == cfg.online  # six runs (three rows, two task sets)
    for row, entry in out["rows"].items():
        for ts, part in entry["by_task_set"].items():
            (rounds,) = part["per_seed"]
            assert [r["round"] for r in rounds] == [0, 1], row
            state = json.loads((paths.online_run(row, 0, ts) / "latest" / "state.json").read_text())
            assert _records(state) == _records({"rounds": rounds})


def test_off_to_online_reads_stage_07_s_offline_step_features_the_floats_it_computed_before(online_root, tmp_path,
                                                                                          monkeypatch):  # fmt: skip
    """Each task set's stored features are bit for bit what a run computed for itself from the same steps (before
    stage 07 stored them), and a run now encodes only the steps it collects."""
    paths = _copy(online_root, tmp_path / "root")
    base = AutoUIPolicy.load(paths.base_policy)
    store = TrajectoryStore(paths.offline)
    every = store.read().to_pandas()
    for ts in TASK_SETS:  # what an off-to-online run computed: its task set's steps, sorted, with their screens
        steps = every[every.task_set == ts].sort_values(["traj_id", "step_id"], kind="stable").reset_index(drop=True)
        want = step_features(base, steps, load_screens(base, store, [*steps.image_path, *steps.next_image_path]))
        got = read_offline_step_features(paths, ts, "digirl_online")
        for name in ("state", "next_state", "instruction"):
            assert np.array_equal(getattr(got, name), getattr(want, name)), (ts, name)
    encoded = []
    real = digirl_online.step_features
    monkeypatch.setattr(digirl_online, "step_features",
                        lambda policy, steps, screens: encoded.append(len(steps)) or real(policy, steps, screens))  # fmt: skip
    run_online_job(tiny_job(paths, "digirl_off2on", 1))
    round_steps = TrajectoryStore(paths.online_run("digirl_off2on", 0, "general") / "round000").read().num_rows
    assert encoded == [round_steps]  # the round's own steps; the offline ones are stage 07's


def test_off_to_online_without_stage_07_s_step_features_stops_naming_them(online_root, tmp_path):
    paths = _copy(online_root, tmp_path / "root")
    stored_path(paths, DIGIRL_STEP_FEATURES).unlink()
    cfg = DigiRLConfig(online=["digirl_off2on"], rounds=1, episodes_per_round=4, n_envs=4)
    with pytest.raises(StageError, match=r"stage digirl_online: missing input .*digirl_step_features\.npz"):
        run_digirl_online(cfg, ActorConfig(batch_size=4), EnvConfig(width=WIDTH), paths, seeds=1)
