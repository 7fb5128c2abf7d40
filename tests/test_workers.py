"""``digiq.workers``: jobs in worker processes give what they give in the stage's own process, in job order."""

import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from digiq.config import (
    ComputeConfig,
    DeviceConfig,
    DiagnosticsConfig,
    EnvConfig,
    EvalConfig,
    JudgeConfig,
    load_settings,
)
from digiq.data.candidates import read_candidates
from digiq.data.trajectories import TrajectoryStore
from digiq.env.taskgen import generate_tasks
from digiq.env.tasks import parse_task
from digiq.evaluate import EvalJob, evaluate_job
from digiq.models.critic import Critic
from digiq.paths import Paths
from digiq.rollout import device_pool
from digiq.stages import diagnostics
from digiq.stages.critic import run as critic_stage
from digiq.stages.launch import run_stage
from digiq.workers import IN_PROCESS, map_jobs, threads_per_worker

pytestmark = pytest.mark.slow  # worker processes, each loading torch

WIDTH = 108


def _draws(seed: int) -> list[int]:
    """A job that seeds itself and samples, as each critic, actor and evaluation job does."""
    torch.manual_seed(seed)
    x = torch.randn(64, 64)
    return torch.multinomial(torch.softmax(x @ x.T / 8, -1), 1)[:, 0].tolist()


def test_seeded_jobs_draw_the_same_in_workers_and_come_back_in_order():
    seeds = [3, 1, 4, 1, 5]
    here = [_draws(s) for s in seeds]
    assert len({tuple(d) for d in here}) == 4  # the draws differ by seed: equality below is not vacuous
    assert map_jobs(_draws, seeds, ComputeConfig(workers=2)) == here


def _jobs(checkpoint, n_tasks: int = 4) -> list[EvalJob]:
    tasks = {ts: [parse_task(t, ts) for t in generate_tasks(ts, "test", n_tasks)] for ts in ("general", "webshop")}
    cfg = EvalConfig(n_envs=3, seed=7, temperature=0.8)
    return [EvalJob(checkpoint, f"seed {s}", s, tasks, cfg, EnvConfig(width=WIDTH), False) for s in (0, 1)]


def test_evaluations_in_workers_match_the_stage_s_process(values_root):
    """Stage 08's jobs on the untrained tiny base: workers make their own simulated devices, episodes in list order."""
    jobs = _jobs(Paths(values_root).base_policy)
    with device_pool(DeviceConfig(), EnvConfig(width=WIDTH), JudgeConfig(), 3) as pool:
        here = [evaluate_job(job, pool) for job in jobs]
    there = map_jobs(evaluate_job, jobs, ComputeConfig(workers=2))
    assert there == here  # every episode: its task, success and number of steps
    assert [r.index for r in there[1]["webshop"]] == list(range(4))
    assert [r.task for r in there[0]["general"]] == [t.instruction for t in jobs[0].tasks["general"]]


def test_a_failing_job_raises_its_error_here(values_root, tmp_path):
    good, _ = _jobs(Paths(values_root).base_policy, n_tasks=1)
    bad = EvalJob(tmp_path / "no_checkpoint", "missing", 0, good.tasks, good.cfg, good.env, False)
    with pytest.raises(FileNotFoundError, match="no_checkpoint"):
        map_jobs(evaluate_job, [good, bad], ComputeConfig(workers=2))


def write_or_read(job: tuple[str, Path]) -> str:
    """The job "write" writes the file after a while, "quick" returns at once, "read" reads the file (or fails)."""
    kind, path = job
    if kind == "write":
        time.sleep(2)
        path.write_text("written")
        return "wrote"
    return "quick" if kind == "quick" else path.read_text()


def test_a_job_given_one_to_wait_for_starts_once_it_has_finished(tmp_path):
    """Stage 09's second half of a run resumes what its first half wrote: it must not start before."""
    out = tmp_path / "out.txt"
    jobs = [("write", out), ("quick", out), ("read", out)]
    # The second worker, free after "quick", would read the file before it is written, if it did not wait.
    assert map_jobs(write_or_read, jobs, ComputeConfig(workers=2), after=[None, None, 0]) == [
        "wrote",
        "quick",
        "written",
    ]
    with pytest.raises(ValueError, match="an earlier job's index"):
        map_jobs(len, ["a", "b"], ComputeConfig(workers=2), after=[None, 1])


def test_worker_counts_are_checked_and_share_the_cores():
    with pytest.raises(ValueError, match="workers must be >= 1"):
        map_jobs(len, ["a"], ComputeConfig(workers=0))
    assert map_jobs(len, ["a", "bb"], IN_PROCESS) == [1, 2]
    assert threads_per_worker(1) >= threads_per_worker(2) >= 1 and threads_per_worker(10**6) == 1


def critic_root(values_root: Path, dest: Path, compute: dict) -> Paths:
    """Stage 06 on the tiny pipeline's data with ``compute`` as its params' group: two rows, two seeds, a few steps."""
    shutil.copytree(values_root, dest)
    params = yaml.safe_load((dest / "params.yaml").read_text())
    params["compute"] = compute
    params["critic"].update({"steps": 6, "hidden": 16, "batch_size": 16, "penalty_states": 5})
    params["experiment"]["seeds"] = 2
    params["ablations"].update({"untuned_vlm": False, "blind_vlm": False})
    params["variants"] = {"digiq_cql": {"conservative": 0.3, "conservative_gate": True}}
    (dest / "params.yaml").write_text(yaml.safe_dump(params))
    return Paths(dest)


def test_the_critic_stage_on_two_workers_matches_one_process(values_root, tmp_path):
    """Four critics (two rows, two seeds) fitted in two worker processes: the stage's metrics and weights."""
    one, two = (critic_root(values_root, tmp_path / name, {"workers": w}) for name, w in (("one", 1), ("two", 2)))
    m1, m2 = (run_stage(critic_stage, p, p.root / "params.yaml") for p in (one, two))
    assert set(m1["by_critic"]) == {"digiq", "digiq_cql"}
    for key in ("wall_time_s",):
        m1.pop(key), m2.pop(key)
    assert m2 == m1
    for seed in (0, 1):
        for row in ("digiq", "digiq_cql"):
            a, b = (Critic.load(p.critic(seed, row, "general")).state_dict() for p in (one, two))
            for name, w in a.items():
                torch.testing.assert_close(b[name], w, atol=1e-5, rtol=1e-5, msg=f"{row} seed {seed} {name}")
    seed0, seed1 = (next(iter(Critic.load(one.critic(s, "digiq", "general")).state_dict().values())) for s in (0, 1))
    assert not torch.equal(seed0, seed1)  # each job seeds itself: the seeds' critics differ


def test_the_oracle_diagnostic_in_workers_matches_one_process(values_root, monkeypatch):
    """Stage 08's true values, base log-likelihoods and behaviour values, in chunks over two workers."""
    monkeypatch.setattr(diagnostics, "ORACLE_CHUNK", 3)  # two chunks of the six states below
    paths = Paths(values_root)
    settings = load_settings(values_root / "params.yaml")
    steps, cands = TrajectoryStore(paths.offline).read().to_pandas(), read_candidates(paths).to_pandas()
    cfg = DiagnosticsConfig(oracle_states=6, oracle_rollouts=2, behaviour_rollouts=1)
    env, collect = settings.env, settings.collect
    pool = np.arange(len(steps))
    one, two = (diagnostics.oracle_sample(cfg, env, collect, 0.9, steps, cands, pool, paths, ComputeConfig(workers=w))
                for w in (1, 2))  # fmt: skip
    assert set(one) == set(two) == {"idx", "valid", "oracle", "loglik", "behaviour"}
    assert one["oracle"].shape == one["behaviour"].shape == (6, 3)
    assert one["oracle"].max() > 0 and len(np.unique(one["loglik"])) > 1  # equality below is not vacuous
    for key in ("idx", "valid", "oracle", "behaviour"):  # simulator rollouts, the base's sampled actions
        np.testing.assert_array_equal(two[key], one[key], err_msg=key)
    np.testing.assert_allclose(two["loglik"], one["loglik"], rtol=1e-5)  # float sums on other thread counts
