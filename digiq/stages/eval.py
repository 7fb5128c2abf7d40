"""Stage 12: roll every policy out on held-out test tasks; success by task set and family.

Protocol (docs/experiments.md): the first ``n_tasks`` tasks of
each test list, in order; 10 steps for General, 20 for Web Shopping; success
when the task's condition holds. The paper's protocol is the first 96 tasks;
the whole list (320 General, 450 Web Shopping) carries the confidence intervals. Every
seed's policies are evaluated with that seed's device and sampling seed (the
base policy too, so its spread is sampling noise), which pairs seed ``s`` of
one policy with seed ``s`` of another for the paired bootstrap.

Writes, as ``{policy: {task_set: summary}}`` with each summary
``{"success_rate", "success_rate_std", "per_seed", "n_episodes", "by_family",
"tasks_by_family", "first96": {"success_rate", "success_rate_std", "per_seed",
"n_episodes"}}`` (rates are means over seeds, the std is the sample std over
seeds, null with one seed; ``n_episodes`` and each family's tasks per seed):

- ``metrics/eval.json``: the base, the paper's comparison (``main``), the
  online and PAE rows and Digi-Q's named ``variants`` (its rows beside the paper's method);
- ``metrics/ablations.json``: Digi-Q and its ``ablations``;
- ``metrics/eval_outcomes.json``: every episode's 0/1 success as
  ``{policy: {task_set: ["0110...", one string per seed]}}``, in task-list order;
- ``metrics/comparisons.json``: paired bootstrap intervals (:mod:`digiq.stats`)
  as ``{task_set: {"A-B": {"diff", "ci95", "n_tasks", "seeds"}}}`` in
  percentage points, for Digi-Q minus each other policy of ``eval.json`` and
  each variant or ablation minus Digi-Q;
- ``metrics/pae_eval.json``: :data:`PAE_PAIRS` the same way, on the whole
  lists (``all``) and on the test tasks whose goal no proposal has
  (``unmatched``, with ``unmatched_tasks`` per task set); ``{"off": why}``
  without PAE's rows.

With ``eval.train_tasks`` it also rolls the base, the paper's comparison
(``main``) and the online rows out on train tasks, the tasks of the first trajectories per task set in the
offline data, into ``metrics/eval_train.json`` (same layout; ``{"off": why}``
without them): the train columns of the paper's table, which tell a failure
to generalise to unseen entities from a failure on the very tasks the data hold.

On the simulator it also writes ``metrics/skills.json``: the base policy of
the first seed again on the first 96 test tasks, with one skill at a time taken from the expert
(:class:`digiq.models.agents.ExpertSkill`), as ``{skill: {task_set: {"success_rate",
"n_episodes", "by_family", "tasks_by_family"}}}`` beside ``none``, the base
alone on the same devices.

``python -m digiq.evaluate`` runs any checkpoint on any task file with the
same code (:mod:`digiq.evaluate`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from digiq.config import (
    ComputeConfig,
    DeviceConfig,
    EnvConfig,
    EvalConfig,
    JudgeConfig,
    Settings,
)
from digiq.data.task_lists import read_tasks
from digiq.data.trajectories import TrajectoryStore
from digiq.env.taskgen import PROTOCOL_TASKS
from digiq.env.tasks import TASK_SETS, Task, UnsupportedInstruction, parse_task
from digiq.evaluate import EvalJob, outcome_array, outcome_strings, run_jobs, seed_metrics, summarize
from digiq.io import require
from digiq.models.checkpoint import read_typed_config
from digiq.models.policy import PolicyConfig
from digiq.paths import Paths
from digiq.rollout import EpisodeResult
from digiq.rows import ONLINE_ROWS, PAE_ROWS, all_rows
from digiq.stages.common import one_run_at_a_time, timed, write_metrics
from digiq.stats import comparisons
from digiq.workers import IN_PROCESS, job_slots

__all__ = ["run", "run_eval", "train_tasks", "pae_comparisons", "ONLINE_PAIRS", "PAE_PAIRS"]

# The DigiRL paper's comparisons among its own rows, as "A - B", beside Digi-Q minus each.
ONLINE_PAIRS = (("digirl_online", "filtered_bc_online"), ("digirl_off2on", "digirl_offline"))
# PAE's: practice on proposed tasks against the base it started from, against the same practice on human tasks and
# against online Filtered BC on human tasks; and a perfect evaluator against the learned one.
PAE_PAIRS = (("pae", "base"), ("pae", "pae_human"), ("pae", "filtered_bc_online"), ("pae_oracle", "pae"))


def _checkpoint(paths: Paths, policy: str, seed: int, task_set: str) -> Path:
    """The policy ``policy`` plays ``task_set``'s tasks with: each row has one per seed and task set, as released
    Digi-Q trains one per task set; the base is one for both."""
    if policy == "base":
        return paths.base_policy
    if policy in ONLINE_ROWS:
        return paths.online_policy(policy, seed, task_set)
    if policy in PAE_ROWS:
        return paths.pae_policy(policy, seed, task_set)
    return paths.actor(policy, seed, task_set)


def _trained_task_sets(paths: Paths, policies: Sequence[str], seeds: int) -> list[str]:
    """The task sets every policy has a checkpoint for, on every seed: both, or the one imported data hold.

    A task set some trained policies hold and others lack is an unfinished
    upstream stage, named as such.
    """
    trained = [p for p in policies if p != "base"]  # the base plays every task set
    files = {ts: [_checkpoint(paths, p, s, ts) / "config.json" for p in trained for s in range(seeds)]
             for ts in TASK_SETS}  # fmt: skip
    held = [ts for ts in TASK_SETS if all(f.exists() for f in files[ts])]
    require("eval", paths.base_policy / "config.json")
    for ts in TASK_SETS:
        if ts not in held and (any(f.exists() for f in files[ts]) or not held):
            require("eval", *files[ts])
    return held


def train_tasks(paths: Paths, n: int) -> dict[str, list[Task]]:
    """Per task set, the first ``n`` distinct tasks of the offline data's trajectories (by ``traj_id``).

    Those are the train tasks the data hold, as the paper's train columns
    count them; a task the data drew twice is evaluated once. Instructions
    the simulator cannot parse (imported real data) are passed over; a task
    set with no trajectory gets no list.
    """
    require("eval", paths.offline)
    table = TrajectoryStore(paths.offline).read().select(["traj_id", "task_set", "task"]).to_pandas()
    firsts = table.groupby("traj_id", sort=True).first()
    out: dict[str, list[Task]] = {}
    for ts in TASK_SETS:
        tasks = []
        for text in dict.fromkeys(firsts.task[firsts.task_set == ts]):
            try:
                tasks.append(parse_task(text, ts))
            except UnsupportedInstruction:
                continue
            if len(tasks) == n:
                break
        if tasks:
            out[ts] = tasks
    return out


def pae_comparisons(arrays: dict[str, dict[str, np.ndarray]], unmatched: dict[str, list[int]]) -> dict[str, Any]:
    """PAE's comparisons (:data:`PAE_PAIRS`) on the whole test lists, and on the test tasks whose goal no proposal
    has (``unmatched``: their lines, per task set, from the pae stage's proposer panel) with how many those are."""
    subset = {p: {ts: a[:, [i for i in unmatched.get(ts, []) if i < a.shape[1]]] for ts, a in sets.items()}
              for p, sets in arrays.items()}  # fmt: skip
    some = {p: {ts: a for ts, a in sets.items() if a.shape[1]} for p, sets in subset.items()}
    return {"all": comparisons(arrays, PAE_PAIRS), "unmatched": comparisons(some, PAE_PAIRS),
            "unmatched_tasks": {ts: int(a.shape[1]) for ts, a in next(iter(subset.values()), {}).items()}}  # fmt: skip


@one_run_at_a_time("eval")
def run_eval(cfg: EvalConfig, env: EnvConfig, paths: Paths, *, seeds: int, main: list[str], ablations: list[str],
             variants: Sequence[str] = (), online: Sequence[str] = (), practice: Sequence[str] = (),
             devices: DeviceConfig | None = None, judge: JudgeConfig | None = None,
             compute: ComputeConfig = IN_PROCESS) -> dict[str, Any]:  # fmt: skip
    """Evaluate ``base`` + ``main`` + ``online`` + ``practice`` + ``variants`` (into eval.json) and ``ablations``
    (into ablations.json).

    ``practice`` are PAE's rows (the pae stage's), read from their runs' last
    policies and compared as :data:`PAE_PAIRS` says, on the whole test lists
    and on the test tasks no proposal matched (``metrics/pae_eval.json``).

    ``online`` are stage 09's rows (DigiRL online, off-to-online, Filtered BC
    online), read from their runs' last policies; they are compared with
    Digi-Q like the offline baselines, online DigiRL also with online Filtered
    BC and off-to-online DigiRL with offline DigiRL (the DigiRL paper's comparisons).

    Every policy for every seed, so that each comparison pairs the same
    seeds. Variants are Digi-Q with changes beyond the paper (``digiq_hierarchy``...):
    their rows stand beside the main ones, compared as "variant - digiq" like
    the ablations. The train-task columns cover the paper's rows (the base
    and ``main``); the expert-skill diagnostic the protocol's first 96 test tasks.

    On ``devices`` (default: the in-process simulator); success on a real
    emulator (or on ``adb-sim`` with ``judge.on_adb_sim``) is the VLM ``judge``'s verdict.
    On the simulator the (policy, seed) evaluations are jobs shared as
    ``compute`` says (local processes or a Ray cluster's tasks,
    :mod:`digiq.workers`); real devices are stepped from this process (on a
    Ray cluster, every node's that offers some). Returns every policy's summary (:func:`summarize`) per task set.
    """
    devices = devices or DeviceConfig()
    baselines = [*main, *online]  # the paper's rows and DigiRL's online ones
    table_rows = ["base", *baselines, *practice, *variants]  # the rows of eval.json; the ablations go to ablations.json
    policies = [*table_rows, *ablations]
    task_sets = _trained_task_sets(paths, policies, seeds)
    tasks = {ts: read_tasks(paths, ts, "test", cfg.n_tasks, "eval") for ts in task_sets}
    held_in = train_tasks(paths, cfg.train_tasks) if cfg.train_tasks else {}
    train_rows = ["base", *baselines] if held_in else []
    timing: dict[str, Any] = {}
    # Every policy here descends from the base: its prompts read the screen when the base's did.
    screen_text = read_typed_config(paths.base_policy, "policy", PolicyConfig).screen_text

    def job(policy: str, seed: int, listed: dict[str, list[Task]], name: str,
            skill: str | None = None) -> list[EvalJob]:  # fmt: skip
        """One job per task set: each plays its task set's tasks with its own checkpoint."""
        return [EvalJob(_checkpoint(paths, policy, seed, ts), name, seed, {ts: tasks}, cfg, env, screen_text, skill)
                for ts, tasks in listed.items()]  # fmt: skip

    # Each job reloads its checkpoint on its seed's own stream, so the train runs draw apart from the test runs.
    jobs = [j for s in range(seeds) for p in policies for j in job(p, s, tasks, p)]
    jobs += [j for s in range(seeds) for p in train_rows for j in job(p, s, held_in, f"{p} train")]
    on_sim = devices.backend == "sim"
    skills: dict[str, Any] = {"off": "the expert reads the device's state: needs devices.backend sim"}
    if on_sim:
        protocol = {ts: listed[:PROTOCOL_TASKS] for ts, listed in tasks.items()}
        jobs += [j for skill in cfg.expert_skills for j in job("base", 0, protocol, f"base + expert {skill}", skill)]
    with timed(timing):
        results = run_jobs(jobs, devices, judge or JudgeConfig(), compute)
    done: dict[tuple[str, int], dict[str, list[EpisodeResult]]] = {}
    for j, result in zip(jobs, results, strict=True):
        done.setdefault((j.name, j.seed), {}).update(result)
    runs = {p: {ts: [done[(p, s)][ts] for s in range(seeds)] for ts in task_sets} for p in policies}
    if on_sim:
        skills = {"policy": "base", "seed": 0,
                  "none": {ts: seed_metrics(runs["base"][ts][0][:PROTOCOL_TASKS]) for ts in task_sets}}  # fmt: skip
        for skill in cfg.expert_skills:
            skills[skill] = {ts: seed_metrics(r) for ts, r in done[(f"base + expert {skill}", 0)].items()}
    summary = {p: {ts: summarize(runs[p][ts]) for ts in task_sets} for p in policies}
    write_metrics(paths, "eval", {p: summary[p] for p in table_rows})
    write_metrics(paths, "ablations", {p: summary[p] for p in ["digiq", *ablations] if p in summary})
    write_metrics(
        paths, "eval_outcomes", {p: {ts: outcome_strings(r) for ts, r in sets.items()} for p, sets in runs.items()}
    )
    pairs = [("digiq", p) for p in ["base", *baselines] if p != "digiq"] + [
        (v, "digiq") for v in [*variants, *ablations]
    ]
    pairs += [(a, b) for a, b in ONLINE_PAIRS if a in online and b in table_rows]
    arrays = {p: {ts: outcome_array(r) for ts, r in sets.items()} for p, sets in runs.items()}
    write_metrics(paths, "comparisons", comparisons(arrays, pairs))
    if practice:
        require("eval", paths.metrics / "pae.json")
        unmatched = json.loads((paths.metrics / "pae.json").read_text())["proposer_panel"]["test_lines_unmatched"]
        write_metrics(paths, "pae_eval", pae_comparisons(arrays, unmatched))
    else:
        write_metrics(paths, "pae_eval", {"off": "pae.rows is []"})
    write_metrics(paths, "skills", skills)
    if held_in:
        train_summary: dict[str, Any] = {
            p: {ts: summarize([done[(f"{p} train", s)][ts] for s in range(seeds)]) for ts in held_in}
            for p in train_rows
        }
    else:
        train_summary = {
            "off": "eval.train_tasks is 0" if cfg.train_tasks == 0 else "no task of the offline data parses"
        }
    write_metrics(paths, "eval_train", train_summary)
    write_metrics(paths, "eval_timing", {**timing, "workers": job_slots(compute) if on_sim else 1})
    return summary


def run(settings: Settings, paths: Paths) -> dict[str, Any]:
    """Stage 12 as ``params.yaml`` sets it: the base and every row, the ablations into their own table."""
    table = all_rows(settings.ablations, list(settings.variants))
    main, variants, ablations = ([r.name for r in table if r.group == g] for g in ("paper", "variant", "ablation"))
    return run_eval(settings.eval, settings.env, paths,
                    seeds=settings.experiment.seeds, main=main, variants=variants,
                    online=settings.digirl.online, ablations=ablations,
                    practice=settings.pae.rows,
                    devices=settings.devices, judge=settings.judge,
                    compute=settings.compute)  # fmt: skip
