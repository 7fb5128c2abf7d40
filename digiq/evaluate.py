"""Stage 07: roll every policy out on held-out test tasks; success by task set and family.

Protocol (DESIGN.md section 8): the first ``n_tasks`` tasks of each test list,
in order; 10 steps for General, 20 for Web Shopping; success when the task's
condition holds. Writes ``metrics/eval.json`` as
``{policy: {task_set: {"success_rate", "n_episodes", "by_family"}}}``.
"""

from __future__ import annotations

from typing import Any

import torch

from digiq.config import EnvConfig, EvalConfig
from digiq.models.policy import AutoUIPolicy
from digiq.paths import Paths
from digiq.rollout import rollout
from digiq.stagekit import read_tasks, require, timed, write_metrics
from digiq.train.collect import success_by
from digiq.train.policy_fit import ModelPolicy

__all__ = ["run_eval", "POLICIES"]

POLICIES = ("base", "digiq")


def _checkpoint(paths: Paths, policy: str):
    return paths.base_policy if policy == "base" else paths.actor(policy)


def run_eval(cfg: EvalConfig, env: EnvConfig, paths: Paths, policies: tuple[str, ...] = POLICIES) -> dict[str, Any]:
    for p in policies:
        require("eval", _checkpoint(paths, p) / "config.json")
    report: dict[str, Any] = {}
    timing: dict[str, Any] = {}
    with timed(timing):
        for policy in policies:
            torch.manual_seed(cfg.seed)
            model = AutoUIPolicy.load(_checkpoint(paths, policy))
            agent = ModelPolicy(model, temperature=cfg.temperature or 1.0, greedy=cfg.temperature == 0)
            report[policy] = {}
            for task_set in ("general", "webshop"):
                tasks = read_tasks(paths, task_set, "test", cfg.n_tasks, "eval")
                results = rollout(agent, tasks, n_envs=cfg.n_envs, seed=cfg.seed, dynamics=env.dynamics(),
                                  width=env.width, desc=f"eval {policy} {task_set}")  # fmt: skip
                report[policy][task_set] = {
                    "success_rate": round(sum(r.success for r in results) / len(results), 4),
                    "n_episodes": len(results),
                    "by_family": success_by(results, "family"),
                }
    write_metrics(paths, "eval", report)
    write_metrics(paths, "eval_timing", timing)
    return report
