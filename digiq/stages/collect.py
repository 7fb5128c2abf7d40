"""Stage 01: roll the base policy out on train tasks; this is the offline dataset.

As released Digi-Q's data: each task set's episodes on tasks drawn at random, with repetition, from its train
tasks (those past the ones the base policy was demonstrated); a task drawn twice is two episodes on different
devices' seeds.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from digiq.config import CollectConfig, ComputeConfig, DeviceConfig, EnvConfig, JudgeConfig, Settings
from digiq.data.task_lists import read_tasks, tasks_digest
from digiq.data.trajectories import TrajectoryStore, store_made_whole
from digiq.env.catalog import stable_int
from digiq.env.state import Dynamics
from digiq.env.tasks import TASK_SETS, Task
from digiq.io import StageError, require
from digiq.models.agents import ModelPolicy
from digiq.models.checkpoint import checkpoint_digest, read_meta
from digiq.models.policy import AutoUIPolicy
from digiq.paths import Paths
from digiq.rollout import device_pool, rollout, success_by
from digiq.stages.common import one_run_at_a_time, timed, write_metrics

__all__ = ["run", "run_collect", "episode_tasks"]


def _first_tasks(cfg: CollectConfig, paths: Paths) -> dict[str, int]:
    """Per task set, the index of the first train task rolled out: past those the base was demonstrated (none if released)."""
    shown = read_meta(paths.base_policy).get("demo_tasks", 0) if cfg.skip_demonstrated else 0
    return {ts: int(shown) for ts in TASK_SETS}


def _rollout_tasks(cfg: CollectConfig, paths: Paths, task_set: str, first: int) -> list[Task]:
    """``cfg.tasks_per_set`` train tasks of ``task_set`` from index ``first`` on, or a clear error."""
    # The whole list, so that a short one gets the message naming the knobs that set its length.
    tasks = read_tasks(paths, task_set, "train", None, "collect")[first:]
    if len(tasks) < cfg.tasks_per_set:
        raise StageError(
            f"stage collect: {paths.task_list(task_set, 'train')} has {first + len(tasks)} tasks; collect.tasks_per_set "
            f"{cfg.tasks_per_set} after the {first} the base policy was demonstrated needs {first + cfg.tasks_per_set} "
            "(raise tasks.n_train, or lower base_policy.demo_tasks or collect.tasks_per_set)"
        )
    return tasks[: cfg.tasks_per_set]


def episode_tasks(cfg: CollectConfig, task_set: str, pool: list[Task]) -> list[Task]:
    """The task of each of ``task_set``'s episodes: drawn uniformly with replacement from ``pool``, as released
    Digi-Q draws its data's tasks from the train lists (seeded by ``cfg.seed`` and the task set), or each once."""
    episodes = cfg.episodes_general if task_set == "general" else cfg.episodes_webshop
    if episodes is None:
        return pool
    rng = np.random.default_rng(stable_int("collect tasks", cfg.seed, task_set))
    return [pool[i] for i in rng.integers(0, len(pool), episodes)]


@one_run_at_a_time("collect")
def run_collect(cfg: CollectConfig, env: EnvConfig, paths: Paths, devices: DeviceConfig | None = None,
                judge: JudgeConfig | None = None, compute: ComputeConfig | None = None) -> dict[str, Any]:  # fmt: skip
    """Roll the base policy out on ``devices`` (default: the in-process simulator).

    Success on a real emulator (or on ``adb-sim`` with ``judge.on_adb_sim``) is the VLM ``judge``'s verdict.
    With ``compute.backend: ray`` the episodes are spread over the devices of every node of the cluster that
    offers some (:func:`digiq.rollout.device_pool`).
    """
    devices = devices or DeviceConfig()
    require("collect", paths.base_policy / "config.json")
    metrics: dict[str, Any] = {}
    with timed(metrics):
        model = AutoUIPolicy.load(paths.base_policy)
        first = _first_tasks(cfg, paths)
        tasks = [t for ts in TASK_SETS for t in episode_tasks(cfg, ts, _rollout_tasks(cfg, paths, ts, first[ts]))]
        # What decides the episodes: a run with other settings, or another base policy, starts the store anew.
        made_with = {"stage": "collect", "collect": cfg.model_dump(), "env": env.model_dump(), "tasks": tasks_digest(tasks),
                     "devices": devices.backend, "judge": (judge or JudgeConfig()).model_dump(),
                     "policy": checkpoint_digest(paths.base_policy)}  # fmt: skip
        with (
            store_made_whole(paths.offline, made_with) as store,
            device_pool(devices, env, judge or JudgeConfig(), min(cfg.n_envs, len(tasks)), compute) as make_env,
        ):
            ran = rollout(ModelPolicy(model, cfg.temperature), tasks, n_envs=cfg.n_envs, seed=cfg.seed,
                          dynamics=Dynamics.of(env), width=env.width, gamma=cfg.gamma, store=store, desc="collect",
                          env_factory=make_env, screen_text=model.cfg.screen_text,
                          hierarchies=cfg.view_hierarchy)  # fmt: skip
    table = TrajectoryStore(paths.offline).read()
    # From the stored data, not this run's results: a resumed collection counts every trajectory. An episode
    # given up after device faults is not stored (a rerun tries it again) and counts as a failure here.
    episodes = table.to_pandas().groupby("traj_id").first()
    episodes["success"] = episodes.trajectory_reward > 0
    abandoned = [r for r in ran if r.abandoned]
    results = list(episodes.itertuples()) + abandoned
    metrics.update(
        {
            "trajectories": len(episodes),
            "abandoned": len(abandoned),  # faults.jsonl says why
            "first_train_task": first,
            "transitions": table.num_rows,
            "success_rate_by_task_set": success_by(results, "task_set"),
            "success_rate_by_family": success_by(results, "family"),
            "valid_action_rate": round(sum(table.column("valid").to_pylist()) / max(1, table.num_rows), 4),
        }
    )
    write_metrics(paths, "collect", metrics)
    return metrics


def run(settings: Settings, paths: Paths) -> dict[str, Any]:
    """Stage 01 as ``params.yaml`` sets it."""
    return run_collect(settings.collect, settings.env, paths,
                       devices=settings.devices,
                       judge=settings.judge,
                       compute=settings.compute)  # fmt: skip
