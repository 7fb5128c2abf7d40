"""Stage 09: DigiRL online, in rounds on train tasks, beside Filtered BC online.

Each online row (``digirl.online``) runs per seed and task set (one policy
per task set, as stage 07 fits them), in rounds:

1. **collect** ``digirl.episodes_per_round`` episodes of the task set's train
   tasks (drawn uniformly; the same draws for every row of a seed) with the
   current policy, into the round's own trajectory store;
2. **fit the value functions** V_inst and V_step on every episode collected
   so far (the buffer), on the frozen base policy's features;
3. **compute the advantages and filter**: DigiRL's doubly-robust step
   advantage, the 1/H step filter and the curriculum's top share of episodes
   (:func:`digiq.algos.digirl.fit_and_select`);
4. **update** the policy by maximum likelihood on the kept steps for
   ``digirl.actor_updates`` optimizer steps, as stage 07 fits its actors.

The rows differ in where they start and what they imitate:
``digirl_online`` starts from the base policy; ``digirl_off2on`` from offline
DigiRL's policy of the same seed and task set (stage 07), with the task set's
offline data in its buffer (their step features stage 07's, stored beside
its picks); ``filtered_bc_online`` from the base, imitating every step of the
buffer's successful episodes (DigiRL's online baseline).

A run stops after ``digirl.rounds`` rounds, or before a round once its
episodes have taken ``digirl.env_steps`` environment steps. After each round
the policy, the value functions and the run's record are written whole to
``latest/`` (:func:`digiq.io.swap_in`); an interrupted run resumes after its
last finished round, and the round cut short resumes its store, so nothing
already collected is lost.

Writes ``metrics/digirl_online.json`` (per row, task set and seed, each
round's success, environment steps, kept rows and wall time) and the learning curves
``plots/digirl_online.png``, with the offline data's success on its train
tasks as a line (the base policy's, where stage 01 collected them).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from digiq.algos.digirl_online import OnlineJob, run_online_job, split_runs, start_checkpoint
from digiq.config import (
    ActorConfig,
    ComputeConfig,
    DeviceConfig,
    DigiRLConfig,
    EnvConfig,
    JudgeConfig,
    Settings,
)
from digiq.data.picks import DIGIRL_STEP_FEATURES, stored_path
from digiq.data.trajectories import TrajectoryStore
from digiq.env.tasks import TASK_SETS
from digiq.io import require
from digiq.paths import Paths
from digiq.stages.common import (
    one_run_at_a_time,
    online_curves_figure,
    per_seed_total,
    save_figure,
    timed,
    write_metrics,
)
from digiq.workers import IN_PROCESS, job_slots, map_jobs

__all__ = ["run_digirl_online", "run"]


def _offline_success(offline: pa.Table) -> dict[str, float]:
    """The offline data's success per task set.

    Collected by the base policy this is the level ``digirl_online`` starts
    from; imported, it is whatever policy collected the file.
    """
    episodes = offline.select(["traj_id", "task_set", "trajectory_reward"]).to_pandas().drop_duplicates("traj_id")
    return {str(ts): float(r) for ts, r in episodes.groupby("task_set").trajectory_reward.apply(
        lambda r: (r > 0).mean()).items()}  # fmt: skip


@one_run_at_a_time("digirl_online")
def run_digirl_online(cfg: DigiRLConfig, actor: ActorConfig, env: EnvConfig, paths: Paths, *, seeds: int,
                      devices: DeviceConfig | None = None, judge: JudgeConfig | None = None,
                      compute: ComputeConfig = IN_PROCESS) -> dict[str, Any]:  # fmt: skip
    """Every online row for every seed; writes ``metrics/digirl_online.json`` and the learning curves.

    On the simulator the runs are jobs shared as ``compute`` says
    (:mod:`digiq.workers`), each stepping its own simulated phones; on
    other devices they run here, one after the other, on ``compute``'s
    devices (a Ray cluster's: every node's that offers some).
    """
    devices = devices or DeviceConfig()
    require("digirl_online", paths.base_policy / "config.json",
            *(start_checkpoint(paths, row, s, ts) / "config.json" for row in cfg.online for s in range(seeds)
              for ts in TASK_SETS))  # fmt: skip
    if "digirl_off2on" in cfg.online:
        require("digirl_online", paths.offline, stored_path(paths, DIGIRL_STEP_FEATURES))
    paths.online.mkdir(parents=True, exist_ok=True)  # the stage's output, empty when digirl.online is []
    on_sim = devices.backend == "sim"
    jobs = [OnlineJob(paths, row, s, ts, cfg, actor, env, devices, judge or JudgeConfig(),
                      IN_PROCESS if on_sim else compute) for row in cfg.online for s in range(seeds) for ts in TASK_SETS]  # fmt: skip
    runs_on = compute if on_sim else IN_PROCESS
    metrics: dict[str, Any] = {}
    with timed(metrics):
        parts, after = split_runs(jobs, job_slots(runs_on))
        records = map_jobs(run_online_job, parts, runs_on, after)[len(parts) - len(jobs) :]
    offline = TrajectoryStore(paths.offline).read() if paths.offline.exists() else None
    offline_steps = offline.num_rows if offline is not None else 0
    rows: dict[str, Any] = {}
    for job, record in zip(jobs, records, strict=True):
        by_set = rows.setdefault(job.row, {"by_task_set": {}})["by_task_set"]
        by_set.setdefault(job.task_set, {"per_seed": []})["per_seed"].append(record["rounds"])

    for row, entry in rows.items():
        entry["online_env_steps"] = round(per_seed_total(entry["by_task_set"], "env_steps", seeds), 1)
        # What the policies learnt from in all: off2on's offline data too.
        entry["env_steps"] = entry["online_env_steps"] + (offline_steps if row == "digirl_off2on" else 0)
        entry["wall_time_s"] = round(per_seed_total(entry["by_task_set"], "wall_time_s", seeds), 2)
    metrics.update({"rows": rows, "offline_env_steps": offline_steps, "workers": job_slots(compute)})
    write_metrics(paths, "digirl_online", metrics)
    levels = ({f"offline data, {ts} (train tasks)": level for ts, level in _offline_success(offline).items()}
              if offline is not None else {})  # fmt: skip
    curves = {f"{row} ({ts})": part for row, entry in rows.items() for ts, part in entry["by_task_set"].items()}
    fig = online_curves_figure(curves, levels)
    fig.suptitle("Stage 09: online rounds" + ("" if rows else ": off (digirl.online is [])"))
    fig.tight_layout()  # again, to leave room for the title
    save_figure(fig, paths.plots / "digirl_online.png")
    return metrics


def run(settings: Settings, paths: Paths) -> dict[str, Any]:
    """Stage 09 as ``params.yaml`` sets it."""
    return run_digirl_online(
        settings.digirl, settings.actor,
        settings.env, paths, seeds=settings.experiment.seeds,
        devices=settings.devices, judge=settings.judge,
        compute=settings.compute,
    )  # fmt: skip
