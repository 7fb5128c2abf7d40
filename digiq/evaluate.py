"""Stage 07: roll every policy out on held-out test tasks; success by task set and family.

Protocol (DESIGN.md section 8): the first ``n_tasks`` tasks of each test list,
in order; 10 steps for General, 20 for Web Shopping; success when the task's
condition holds. Every seed's policies are evaluated with that seed's device
and sampling seed (the base policy too, so its spread is sampling noise).

Writes ``metrics/eval.json`` for the four policies of the paper's comparison
and ``metrics/ablations.json`` for Digi-Q's variants, both as
``{policy: {task_set: {"success_rate", "success_rate_std", "per_seed",
"n_episodes", "by_family", "tasks_by_family"}}}`` (rates are means over seeds;
``n_episodes`` and each family's test tasks per seed).

With ``eval.train_tasks`` it also rolls every policy out on train tasks,
the tasks of the first trajectories per task set in the offline data, into
``metrics/eval_train.json`` (same layout, main policies and ablations;
``{"off": why}`` without them): the train columns of the paper's table,
which tell a failure to generalise to unseen entities from a failure on
the very tasks the data hold.

On the simulator it also writes ``metrics/skills.json``: the base policy of
the first seed again, with one skill at a time taken from the expert
(:class:`digiq.oracle.ExpertSkill`), as ``{skill: {task_set: {"success_rate",
"n_episodes", "by_family"}}}`` beside ``none``, the base alone on the same devices.
"""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from digiq.config import DeviceConfig, EnvConfig, EvalConfig, JudgeConfig
from digiq.data.trajectories import TrajectoryStore
from digiq.env.backends import EnvFactory
from digiq.env.tasks import TASK_SETS, Task, UnsupportedInstruction, parse_task
from digiq.judge import evaluator_for
from digiq.models.checkpoint import read_config
from digiq.models.policy import AutoUIPolicy
from digiq.oracle import ExpertSkill
from digiq.paths import Paths
from digiq.rollout import rollout, success_by
from digiq.stagekit import read_tasks, require, timed, write_metrics
from digiq.train.policy_fit import ModelPolicy

__all__ = ["run_eval"]


def _checkpoint(paths: Paths, policy: str, seed: int) -> Path:
    return paths.base_policy if policy == "base" else paths.actor(policy, seed)


def train_tasks(paths: Paths, n: int) -> dict[str, list[Task]]:
    """Per task set, the tasks of the first ``n`` trajectories in the offline data (by ``traj_id``).

    Those are the train tasks the data hold, as the paper's train columns
    count them. Instructions the simulator cannot parse (imported real data)
    are passed over; a task set with no trajectory gets no list.
    """
    require("eval", paths.offline)
    table = TrajectoryStore(paths.offline).read().select(["traj_id", "task_set", "task"]).to_pandas()
    firsts = table.groupby("traj_id", sort=True).first()
    out: dict[str, list[Task]] = {}
    for ts in TASK_SETS:
        tasks = []
        for text in firsts.task[firsts.task_set == ts]:
            try:
                tasks.append(parse_task(text, ts))
            except UnsupportedInstruction:
                continue
            if len(tasks) == n:
                break
        if tasks:
            out[ts] = tasks
    return out


def _summary(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and spread over seeds of one policy on one task set."""
    rates = [r["success_rate"] for r in per_seed]
    families = sorted({f for r in per_seed for f in r["by_family"]})
    return {
        "success_rate": round(float(np.mean(rates)), 4),
        "success_rate_std": round(float(np.std(rates)), 4),
        "per_seed": rates,
        "n_episodes": per_seed[0]["n_episodes"],
        "by_family": {f: round(float(np.mean([r["by_family"].get(f, 0.0) for r in per_seed])), 4) for f in families},
        "tasks_by_family": per_seed[0]["tasks_by_family"],
    }


def run_eval(cfg: EvalConfig, env: EnvConfig, paths: Paths, *, seeds: int, main: list[str], ablations: list[str],
             ablation_seeds: int | None = None, devices: DeviceConfig | None = None,
             judge: JudgeConfig | None = None) -> dict[str, Any]:  # fmt: skip
    """Evaluate ``base`` + ``main`` (into eval.json) and ``ablations`` (into ablations.json).

    The main policies for every seed, the ablations for the first ``ablation_seeds`` (default: every seed).

    On ``devices`` (default: the in-process simulator); success on a real
    emulator (or on ``adb-sim`` with ``judge.on_adb_sim``) is the VLM ``judge``'s verdict.
    """
    devices = devices or DeviceConfig()
    policies = ["base", *main, *ablations]

    def trained(s: int) -> list[str]:
        """The policies seed ``s`` has: the ablations only for the first ``ablation_seeds``."""
        return policies if s < (ablation_seeds or seeds) else ["base", *main]

    for s in range(seeds):
        for p in trained(s):
            require("eval", _checkpoint(paths, p, s) / "config.json")
    tasks = {ts: read_tasks(paths, ts, "test", cfg.n_tasks, "eval") for ts in TASK_SETS}
    held_in = train_tasks(paths, cfg.train_tasks) if cfg.train_tasks else {}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {p: {ts: [] for ts in TASK_SETS} for p in policies}
    train_runs: dict[str, dict[str, list[dict[str, Any]]]] = {p: {ts: [] for ts in held_in} for p in policies}
    timing: dict[str, Any] = {}
    evaluator = evaluator_for(devices, judge or JudgeConfig())
    # Every policy here descends from the base: its prompts read the screen when the base's did.
    screen_text = bool(read_config(_checkpoint(paths, "base", 0), "policy").get("screen_text", False))
    with timed(timing), EnvFactory(devices, env.dynamics(), env.width, evaluator) as factory:
        # One env per device, reused by every rollout below (a device backend has only so many).
        longest = max([cfg.n_tasks, *map(len, held_in.values())])
        pool = itertools.cycle([factory() for _ in range(min(cfg.n_envs, longest))])

        def run(agent: Any, policy: str, seed: int, split: str = "test") -> dict[str, dict[str, Any]]:
            """One seed's episodes of ``agent`` on every task set's ``split`` tasks (test, or the data's train tasks)."""
            out = {}
            for ts, listed in (tasks if split == "test" else held_in).items():
                results = rollout(agent, listed, n_envs=cfg.n_envs, seed=cfg.seed + seed, dynamics=env.dynamics(),
                                  width=env.width, desc=f"eval {policy} {ts} {split} (seed {seed})",
                                  env_factory=lambda: next(pool), screen_text=screen_text)  # fmt: skip
                out[ts] = {
                    "success_rate": round(sum(r.success for r in results) / len(results), 4),
                    "n_episodes": len(results),
                    "by_family": success_by(results, "family"),
                    "tasks_by_family": dict(sorted(Counter(r.family for r in results).items())),
                }
            return out

        def agent(policy: str, seed: int) -> ModelPolicy:
            """The checkpoint as a sampling policy, with the seed's own sampling stream."""
            torch.manual_seed(cfg.seed + seed)
            model = AutoUIPolicy.load(_checkpoint(paths, policy, seed))
            return ModelPolicy(model, temperature=cfg.temperature or 1.0, greedy=cfg.temperature == 0)

        for s in range(seeds):
            for policy in trained(s):
                for ts, r in run(agent(policy, s), policy, s).items():
                    runs[policy][ts].append(r)
                if held_in:  # reloaded on the seed's own stream: these episodes do not hang on the test ones' draws
                    for ts, r in run(agent(policy, s), policy, s, "train").items():
                        train_runs[policy][ts].append(r)
        skills: dict[str, Any] = {"off": "the expert reads the device's state: needs devices.backend sim"}
        if devices.backend == "sim":
            skills = {"policy": "base", "seed": 0, "none": {ts: runs["base"][ts][0] for ts in TASK_SETS}}
            for skill in cfg.expert_skills:
                skills[skill] = run(ExpertSkill(agent("base", 0), skill), f"base + expert {skill}", 0)
    summary = {p: {ts: _summary(runs[p][ts]) for ts in TASK_SETS} for p in policies}
    report = {p: summary[p] for p in ["base", *main]}
    write_metrics(paths, "eval", report)
    write_metrics(paths, "ablations", {p: summary[p] for p in ["digiq", *ablations] if p in summary})
    write_metrics(paths, "skills", skills)
    if held_in:
        train: dict[str, Any] = {p: {ts: _summary(r) for ts, r in sets.items()} for p, sets in train_runs.items()}
    else:
        train = {"off": "eval.train_tasks is 0" if cfg.train_tasks == 0 else "no task of the offline data parses"}
    write_metrics(paths, "eval_train", train)
    write_metrics(paths, "eval_timing", timing)
    return summary
