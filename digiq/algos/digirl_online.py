"""DigiRL's online loop, a run of rounds on one task set for one seed: collect, fit the value functions, filter,
update (stage 09's rows, and stage 11's practice on proposed tasks, run it).

A run (:class:`OnlineJob`, :func:`run_online_job`) writes its rounds whole
after each one, so an interrupted run resumes after its last finished round;
:func:`split_runs` cuts the runs that do not divide among the workers into
halves the workers share. Stage 09 (``digiq.stages.digirl_online``) says
what each row starts from and imitates.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from digiq.algos.digirl import (
    DigiRLValues,
    StepFeatures,
    fit_and_select,
    read_offline_step_features,
    step_features,
    store_steps,
)
from digiq.algos.filtered_bc import filtered_bc_picks
from digiq.algos.pae import pae_picks
from digiq.config import (
    ActorConfig,
    ComputeConfig,
    DeviceConfig,
    DigiRLConfig,
    EnvConfig,
    JudgeConfig,
)
from digiq.data.task_lists import read_tasks
from digiq.data.trajectories import TrajectoryStore
from digiq.env.state import Dynamics
from digiq.env.tasks import TASK_SETS, Task
from digiq.io import atomic_write_text, swap_in
from digiq.models.agents import ModelPolicy
from digiq.models.policy import AutoUIPolicy
from digiq.models.policy_fit import FitRow, fit_policy, load_screens
from digiq.pae.evaluators import Evaluator, JudgedEnv, JudgeEvaluator
from digiq.pae.learned import LearnedEvaluator
from digiq.paths import Paths
from digiq.rollout import EpisodeResult, device_pool, rollout
from digiq.workers import IN_PROCESS

__all__ = ["OnlineJob", "Practice", "GROUND_TRUTH_FILE", "ground_truth_counts", "run_online_job", "round_tasks",
           "practice_tasks", "split_runs", "start_checkpoint"]  # fmt: skip

OFFLINE = "offline"  # the buffer's name for the offline data (off2on)
GROUND_TRUTH_FILE = "ground_truth.json"  # beside a practice round's store: its episodes by the device's own check


def start_checkpoint(paths: Paths, row: str, seed: int, task_set: str) -> Path:
    """The policy an online row starts from: offline DigiRL's of the same seed and task set for off2on, else the base."""
    return paths.actor("digirl_offline", seed, task_set) if row == "digirl_off2on" else paths.base_policy


def round_tasks(cfg: DigiRLConfig, train: list[Task], seed: int, task_set: str, round_: int) -> list[Task]:
    """The round's episodes: ``cfg.episodes_per_round`` drawn uniformly without replacement from ``task_set``'s
    train list ``train``.

    The draw depends on the seed, the task set and the round only, so every
    row of a seed sees the same tasks in the same round.
    """
    rng = np.random.default_rng([cfg.seed, seed, TASK_SETS.index(task_set), round_])
    return [train[j] for j in rng.choice(len(train), min(cfg.episodes_per_round, len(train)), replace=False)]


def ground_truth_counts(ran: Sequence[EpisodeResult], tasks: Sequence[Task]) -> dict[str, Any]:
    """A practice round's episodes by the device's own check, beside the verdicts that decided them.

    ``episodes``: ``[index, verdict, ground truth]`` per episode, the last None where the device cannot check the
    task; ``checked_episodes``: how many it could check; ``ground_truth_success``: the share of all episodes the
    device's check passed (an episode it cannot check counts as not shown done). For reports only: nothing the
    actor learns from reads them.
    """
    episodes = []
    for r in ran:
        truth = r.ground_truth if r.ground_truth is not None else (r.success if tasks[r.index].checkable else None)
        episodes.append([r.index, bool(r.success), truth])
    return {"episodes": episodes, "checked_episodes": sum(e[2] is not None for e in episodes),
            "ground_truth_success": round(sum(bool(e[2]) for e in episodes) / max(1, len(episodes)), 4)}  # fmt: skip


def practice_tasks(cfg: DigiRLConfig, pool: Sequence[Task], seed: int, task_set: str, round_: int) -> list[Task]:
    """A practice round's episodes: ``cfg.episodes_per_round`` drawn uniformly with replacement from ``pool``, as PAE
    draws from its proposed tasks; by seed, task set and round, so every practice row of a seed draws alike."""
    rng = np.random.default_rng([cfg.seed, seed, TASK_SETS.index(task_set), round_, 1])
    return [pool[j] for j in rng.integers(len(pool), size=cfg.episodes_per_round)]


class Practice(NamedTuple):
    """What makes an online run PAE's practice (:mod:`digiq.stages.pae`): tasks drawn with replacement from
    ``pool``, success said by ``evaluator`` (``learned``: the one saved in ``evaluator_dir``; ``judge``: the VLM
    judge; ``oracle``: the device's own check), the actor imitating :func:`~digiq.algos.pae.pae_picks`, the run
    kept under ``runs``."""

    pool: tuple[Task, ...]
    evaluator: str
    runs: Path
    evaluator_dir: Path | None = None

    def judge(self, judge: JudgeConfig) -> Evaluator | None:
        """The evaluator that decides the run's episodes; None: the device's own check."""
        if self.evaluator == "learned":
            if self.evaluator_dir is None:
                raise ValueError("a practice run judged by the learned evaluator needs its folder (evaluator_dir)")
            return LearnedEvaluator.load(self.evaluator_dir)
        return JudgeEvaluator(judge) if self.evaluator == "judge" else None


class OnlineJob(NamedTuple):
    """One online run: ``row`` for seed index ``seed`` on ``task_set``; with ``until``, its rounds up to that many only.

    ``practice`` makes it a PAE row's run.
    """

    paths: Paths
    row: str
    seed: int
    task_set: str
    cfg: DigiRLConfig
    actor: ActorConfig
    env: EnvConfig
    devices: DeviceConfig
    judge: JudgeConfig
    device_compute: ComputeConfig = IN_PROCESS  # whose devices its rollouts step: this process's, or a Ray cluster's
    until: int | None = None
    practice: Practice | None = None

    @property
    def run(self) -> Path:
        """The run's folder: its rounds' stores and ``latest/``."""
        if self.practice is None:
            return self.paths.online_run(self.row, self.seed, self.task_set)
        return self.practice.runs / f"seed{self.seed}" / self.row / self.task_set


class _Buffer:
    """Every episode a run learns from: the step tables, their frozen features (for DigiRL's value functions) and their
    screens, per source."""

    def __init__(self, base: AutoUIPolicy, features: bool = True) -> None:
        self.base, self.features = base, features
        self.steps: list[pd.DataFrame] = []
        self.feats: list[StepFeatures] = []
        self.screens: dict[str, Any] = {}

    def add(self, name: str, store: TrajectoryStore, task_set: str | None = None,
            feats: StepFeatures | None = None) -> pd.DataFrame:  # fmt: skip
        """Append the episodes of ``store`` under ``name`` (only ``task_set``'s, if given); their step table.

        ``feats``: their step features, computed before (stage 07's of the offline data); else computed here.
        """
        t = store_steps(store, task_set)
        key = f"{name}/"
        loaded = load_screens(self.base, store, [*t.image_path, *t.next_image_path])
        self.screens.update({key + p: v for p, v in loaded.items()})
        self.steps.append(t.assign(source=name, key=key + t.image_path))
        if self.features:
            self.feats.append(step_features(self.base, t, loaded) if feats is None else feats)
        return t

    def table(self) -> tuple[pd.DataFrame, StepFeatures | None]:
        """All steps, numbered by ``episode`` in buffer order, and their features (None: the buffer keeps none)."""
        t = pd.concat(self.steps, ignore_index=True)
        t["episode"] = t.groupby(["source", "traj_id"], sort=False).ngroup().to_numpy()
        return t, StepFeatures.concat(self.feats) if self.features else None


def _resume(run: Path) -> Path | None:
    """The folder of the last finished round's state, if any (also one a kill left mid-swap)."""
    if (run / "latest" / "state.json").exists():
        return run / "latest"
    left = sorted(run.glob(".latest.old-*"))  # swap_in moved the old state aside and was cut before the new one
    return left[-1] if left and (left[-1] / "state.json").exists() else None


def run_online_job(job: OnlineJob) -> dict[str, Any]:
    """Run (or resume) one online run to its end, or to ``job.until`` rounds; its record: ``{"rounds": [...], ...}``."""
    cfg, paths, practice = job.cfg, job.paths, job.practice
    run = job.run
    run.mkdir(parents=True, exist_ok=True)
    seed = cfg.seed + job.seed
    base = AutoUIPolicy.load(paths.base_policy)  # frozen: the value functions' features
    done = _resume(run)
    start = start_checkpoint(paths, job.row, job.seed, job.task_set)
    # The start inside the repository by its relative path, so that the record is the same bytes in any clone.
    where = start.relative_to(paths.root).as_posix() if start.is_relative_to(paths.root) else str(start)
    state: dict[str, Any] = json.loads((done / "state.json").read_text()) if done else {"rounds": [], "start": where}
    policy = AutoUIPolicy.load(done / "policy" if done else start)
    values = DigiRLValues(base.cfg.d_model, seed=seed) if practice is None else None  # PAE's rule uses none
    if done and values is not None:
        values.load_state(done)
    # Only DigiRL's rule reads value functions; Filtered BC's and PAE's read the outcomes alone.
    buffer = _Buffer(base, features=practice is None and job.row != "filtered_bc_online")
    if job.row == "digirl_off2on":
        offline = read_offline_step_features(paths, job.task_set, "digirl_online")  # stage 07's: the same floats
        buffer.add(OFFLINE, TrajectoryStore(paths.offline), job.task_set, offline)
    for r in range(len(state["rounds"])):
        buffer.add(f"round{r:03d}", TrajectoryStore(run / f"round{r:03d}"))
    train = read_tasks(paths, job.task_set, "train", None, "digirl_online") if practice is None else []
    dynamics = Dynamics.of(job.env)
    evaluator = practice.judge(job.judge) if practice is not None else None

    def spent() -> int:
        return sum(r["env_steps"] for r in state["rounds"])

    last = cfg.rounds if job.until is None else min(job.until, cfg.rounds)
    while len(state["rounds"]) < last and (cfg.env_steps is None or spent() < cfg.env_steps):
        r = len(state["rounds"])
        round_seed = seed * 1000 + r  # the round's draws, devices and fits: a resumed run repeats an unbroken one
        began = time.perf_counter()
        name = f"round{r:03d}"
        store = TrajectoryStore(run / name)
        tasks = (round_tasks(cfg, train, job.seed, job.task_set, r) if practice is None
                 else practice_tasks(cfg, practice.pool, job.seed, job.task_set, r))  # fmt: skip
        with device_pool(job.devices, job.env, job.judge, min(cfg.n_envs, len(tasks)), job.device_compute) as make_env:
            judged = make_env if evaluator is None else (lambda: JudgedEnv(make_env(), evaluator))
            ran = rollout(ModelPolicy(policy, cfg.temperature), tasks, n_envs=cfg.n_envs, seed=round_seed,
                          dynamics=dynamics, width=job.env.width, store=store,
                          desc=f"{job.row} {job.task_set} {name}",
                          env_factory=judged, screen_text=policy.cfg.screen_text)  # fmt: skip
        collected = buffer.add(name, store)
        steps, feats = buffer.table()
        truth: dict[str, Any] = {}
        if practice is not None:  # what the device's own check says, beside the verdicts: for reports only
            truth = ground_truth_counts(ran, tasks)
            atomic_write_text(store.root / GROUND_TRUTH_FILE, json.dumps(truth["episodes"]) + "\n")
            kept = pae_picks(steps, round_seed).states
            stats: dict[str, Any] = {"kept_steps": len(kept), "buffer_episodes": int(steps.episode.nunique())}
        elif job.row == "filtered_bc_online":
            kept = filtered_bc_picks(steps).states
            stats: dict[str, Any] = {"kept_steps": len(kept), "buffer_episodes": int(steps.episode.nunique())}
        else:
            assert values is not None and feats is not None
            kept, stats = fit_and_select(values, feats, steps, cfg, round_seed)
        rows = [FitRow(steps.observation.iat[i], steps.key.iat[i], steps.action.iat[i]) for i in kept]
        if rows:
            a = job.actor
            fit_policy(policy, rows, buffer.screens, updates=cfg.actor_updates, batch_size=a.batch_size, lr=a.lr,
                       seed=round_seed, weight_decay=a.weight_decay, grad_clip=a.grad_clip, one_cycle=False,
                       draws_from=len(rows), desc=f"{job.row} {job.task_set} {name} update")  # fmt: skip
        episodes = collected.groupby("traj_id").trajectory_reward.first() > 0
        abandoned = [e for e in ran if e.abandoned]
        state["rounds"].append({
            "round": r,
            "episodes": len(episodes) + len(abandoned),
            "env_steps": len(collected) + sum(e.steps for e in abandoned),
            "success": round(float(episodes.sum()) / max(1, len(episodes) + len(abandoned)), 4),
            **{k: v for k, v in truth.items() if k != "episodes"},
            **stats,
            "wall_time_s": round(time.perf_counter() - began, 2),
        })  # fmt: skip
        _save_round(run, policy, values, state, job, r)
    return state


def split_runs(jobs: list[OnlineJob], workers: int) -> tuple[list[OnlineJob], list[int | None]]:
    """The runs as jobs for ``workers`` processes, in starting order, and the job each waits for.

    Runs are about equally long and each is one chain of rounds, so the
    ``len(jobs) % workers`` runs left over (nine runs on two workers: one)
    would end the stage alone. Where there are more runs than workers, each
    of the last that many is cut in two at half its rounds instead: its
    first half starts first, its second half (a resume of the same run,
    which computes what an unbroken run computes) last, so the workers share
    it. The last ``len(jobs)`` jobs are the runs in their order, each
    returning its whole record; ``after`` is :func:`digiq.workers.map_jobs`'s.
    """
    rounds = jobs[0].cfg.rounds if jobs else 0
    left = len(jobs) % workers if 1 < workers < len(jobs) and rounds >= 2 else 0
    cut = jobs[len(jobs) - left :]
    # First halves, then every run in its order: the unbroken ones, then the second halves of the cut ones.
    parts = [*(job._replace(until=rounds // 2) for job in cut), *jobs]
    after = [None] * len(jobs) + list(range(left))
    return parts, after


def _save_round(run: Path, policy: AutoUIPolicy, values: DigiRLValues | None, state: dict[str, Any],
                job: OnlineJob, round_: int) -> None:  # fmt: skip
    """Write the policy, the value functions (DigiRL's rows) and the record after a round, whole, as ``latest/``."""
    partial = run / ".latest.partial"
    shutil.rmtree(partial, ignore_errors=True)
    policy.save(partial / "policy", stage="digirl_online", method=job.row, seed=job.cfg.seed + job.seed,
                rounds=round_ + 1)  # fmt: skip
    if values is not None:
        values.save(partial)
    atomic_write_text(partial / "state.json", json.dumps(state, indent=1))
    swap_in(partial, run / "latest")
    for left in run.glob(".latest.old-*"):  # a state a kill left mid-swap, now superseded
        shutil.rmtree(left, ignore_errors=True)
