"""Evaluate policy checkpoints on task lists: episodes, success by task set and family, seeds paired.

Every seed's policies are evaluated on that seed's devices, with sampling
noise keyed by that seed's episodes and steps (the base policy too, so its
spread is sampling noise), which pairs seed ``s`` of one policy with seed
``s`` of another for the paired bootstrap. Stage 12 (:mod:`digiq.stages.eval`) and ``python -m
digiq.evaluate`` (:func:`main`: any checkpoint on any task file) run the
same code.

``python -m digiq.evaluate`` loads every checkpoint it is given before the
first episode, and plays the seeds of those that load: a folder that does
not (missing or truncated weights, tensors of the wrong shape) is named on
stderr, its seeds are left out, and the run ends with status 2 once the
others are done. ``--out`` is written as the seeds finish, marked
``partial`` until all of them have, so a run stopped later keeps every seed
already measured.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from digiq.config import (
    PARAMS,
    ComputeConfig,
    DeviceConfig,
    EnvConfig,
    EvalConfig,
    ExperimentConfig,
    JudgeConfig,
    load_settings,
)
from digiq.env.backends import EnvFactory
from digiq.env.gym_env import PhoneEnv
from digiq.env.state import Dynamics
from digiq.env.taskgen import PROTOCOL_TASKS
from digiq.env.tasks import TASK_SETS, Task, UnsupportedInstruction, parse_task
from digiq.io import atomic_write_text, check_writable, printable, text_lines
from digiq.judge import evaluator_for
from digiq.models.agents import ExpertSkill, ModelPolicy
from digiq.models.checkpoint import read_typed_config
from digiq.models.policy import AutoUIPolicy, PolicyConfig
from digiq.rollout import EpisodeResult, Policy, device_pool, rollout, success_by
from digiq.stats import sample_std
from digiq.workers import map_jobs, process_cached

__all__ = [
    "EvalJob", "evaluate_job", "run_jobs", "evaluate_policy", "load_agent", "seed_metrics", "summarize",
    "outcome_strings", "outcome_array", "read_task_file", "policy_for", "main",
]  # fmt: skip


def load_agent(checkpoint: Path, cfg: EvalConfig) -> ModelPolicy:
    """The checkpoint as a policy sampling at ``cfg.temperature`` (greedy at 0).

    Its noise comes from the rollout: each step's key names the episode's
    seed and the step, so every policy of an evaluation seed draws the same
    noise on the same episode, and its episodes pair with theirs.
    """
    model = AutoUIPolicy.load(checkpoint)
    return ModelPolicy(model, temperature=cfg.temperature or 1.0, greedy=cfg.temperature == 0)


def evaluate_policy(agent: Policy, tasks: Mapping[str, Sequence[Task]], cfg: EvalConfig, env: EnvConfig, *,
                    seed: int, env_factory: Callable[[], PhoneEnv], screen_text: bool = False,
                    name: str = "policy") -> dict[str, list[EpisodeResult]]:  # fmt: skip
    """One seed's episodes of ``agent`` on each task set's tasks, in list order.

    The one rollout loop of stage 12 and of ``python -m digiq.evaluate``:
    devices seeded by ``cfg.seed + seed`` (the same for every policy of a
    seed), ``cfg.n_envs`` at a time, each task's own step limit.
    """
    return {
        ts: rollout(agent, listed, n_envs=cfg.n_envs, seed=cfg.seed + seed, dynamics=Dynamics.of(env), width=env.width,
                    desc=f"eval {name} {ts} (seed {seed})", env_factory=env_factory, screen_text=screen_text)
        for ts, listed in tasks.items()
    }  # fmt: skip


def _rate(results: Sequence[EpisodeResult]) -> float:
    return round(sum(r.success for r in results) / len(results), 4)


def _std(rates: Sequence[float]) -> float | None:
    std = sample_std(rates)
    return None if std is None else round(std, 4)


def seed_metrics(results: Sequence[EpisodeResult]) -> dict[str, Any]:
    """One seed's success on one task set: overall, per family, and how many tasks each family has."""
    return {
        "success_rate": _rate(results),
        "n_episodes": len(results),
        "abandoned": sum(r.abandoned for r in results),  # given up after device faults, counted as failures
        "by_family": success_by(results, "family"),
        "tasks_by_family": dict(sorted(Counter(r.family for r in results).items())),
    }


def summarize(per_seed: Sequence[Sequence[EpisodeResult]]) -> dict[str, Any]:
    """Mean and sample spread over seeds of one policy on one task set, on the whole list and on its first 96.

    Every seed runs the same task list, so the first seed's counts stand for all.
    """
    rates = [_rate(r) for r in per_seed]
    first = [_rate(r[:PROTOCOL_TASKS]) for r in per_seed]
    metrics = [seed_metrics(r) for r in per_seed]
    families = sorted({f for m in metrics for f in m["by_family"]})
    return {
        "success_rate": round(float(np.mean(rates)), 4),
        "success_rate_std": _std(rates),
        "per_seed": rates,
        "n_episodes": metrics[0]["n_episodes"],
        "by_family": {f: round(float(np.mean([m["by_family"].get(f, 0.0) for m in metrics])), 4) for f in families},
        "tasks_by_family": metrics[0]["tasks_by_family"],
        "first96": {
            "success_rate": round(float(np.mean(first)), 4),
            "success_rate_std": _std(first),
            "per_seed": first,
            "n_episodes": min(PROTOCOL_TASKS, metrics[0]["n_episodes"]),
        },
    }


def outcome_strings(per_seed: Sequence[Sequence[EpisodeResult]]) -> list[str]:
    """Each seed's episode successes as one "0110..." string, in task-list order (compact in JSON)."""
    return ["".join("1" if r.success else "0" for r in results) for results in per_seed]


def outcome_array(per_seed: Sequence[Sequence[EpisodeResult]]) -> np.ndarray:
    return np.array([[r.success for r in results] for results in per_seed], dtype=np.int8)


@dataclass(frozen=True)
class EvalJob:
    """One checkpoint's episodes on one seed, for :func:`evaluate_job` (here or in a worker process)."""

    checkpoint: Path
    name: str
    seed: int
    tasks: dict[str, list[Task]]
    cfg: EvalConfig
    env: EnvConfig
    screen_text: bool
    skill: str | None = None  # an expert skill lent to the checkpoint (:class:`~digiq.models.agents.ExpertSkill`)


def _worker_envs(env: EnvConfig, size: int) -> Callable[[], PhoneEnv]:
    """A worker process's own simulated devices, made on its first job (a worker steps the simulator only)."""

    def build() -> Callable[[], PhoneEnv]:
        factory = EnvFactory(DeviceConfig(), Dynamics.of(env), env.width, evaluator_for(DeviceConfig(), JudgeConfig()))
        pool = itertools.cycle([factory() for _ in range(size)])
        return lambda: next(pool)

    return process_cached(("simulated devices", env, size), build)


def evaluate_job(job: EvalJob, env_factory: Callable[[], PhoneEnv] | None = None) -> dict[str, list[EpisodeResult]]:
    """:func:`evaluate_policy` of ``job``'s checkpoint, on ``env_factory`` (default: this process's simulated devices)."""
    agent: Policy = load_agent(job.checkpoint, job.cfg)
    if job.skill is not None:
        agent = ExpertSkill(agent, job.skill)
    if env_factory is None:
        env_factory = _worker_envs(job.env, min(job.cfg.n_envs, max(map(len, job.tasks.values()))))
    return evaluate_policy(agent, job.tasks, job.cfg, job.env, seed=job.seed, env_factory=env_factory,
                           screen_text=job.screen_text, name=job.name)  # fmt: skip


def _shared(devices: DeviceConfig, compute: ComputeConfig) -> bool:
    """Whether jobs are shared among processes (the simulator's, as ``compute`` says) rather than run here."""
    return devices.backend == "sim" and (compute.workers > 1 or compute.backend == "ray")


def run_jobs(jobs: Sequence[EvalJob], devices: DeviceConfig, judge: JudgeConfig, compute: ComputeConfig,
             on_done: Callable[[int, dict[str, list[EpisodeResult]]], None] | None = None,
             ) -> list[dict[str, list[EpisodeResult]]]:  # fmt: skip
    """Every job's episodes: on the simulator jobs shared as ``compute`` says (local processes or a Ray cluster's
    tasks, :mod:`digiq.workers`), on other devices one after the other from this process, on ``compute``'s devices.
    ``on_done(i, episodes)`` is called as job ``i`` finishes."""
    if _shared(devices, compute):
        return map_jobs(evaluate_job, jobs, compute, on_done=on_done)
    longest = max(len(listed) for job in jobs for listed in job.tasks.values())
    results = []
    with device_pool(devices, jobs[0].env, judge, min(jobs[0].cfg.n_envs, longest), compute) as pool:
        for i, job in enumerate(jobs):
            results.append(evaluate_job(job, pool))
            if on_done is not None:
                on_done(i, results[-1])
    return results


def read_task_file(path: Path, task_set: str | None = None) -> tuple[dict[str, list[Task]], list[dict[str, Any]]]:
    """The tasks of a file of instructions, one a line, per task set; and the lines that do not parse.

    Blank lines are skipped. Without ``task_set`` each instruction goes to
    the task set its shape says (shopping-site instructions to ``webshop``,
    the rest to ``general``; :func:`~digiq.env.tasks.parse_task`). A line the
    simulator cannot check, one longer than
    :data:`~digiq.env.tasks.MAX_INSTRUCTION_CHARS` or one that is not UTF-8
    is reported as ``{"line": n, "text": ..., "why": ...}`` (1-based; the
    text as :func:`~digiq.io.printable` shows it) rather than stopping the
    run, so one odd line does not cost a whole list.
    """
    tasks: dict[str, list[Task]] = {}
    unparsed: list[dict[str, Any]] = []
    for n, line, why in text_lines(path):
        if not line.strip():
            continue
        if why is None:
            try:
                task = parse_task(line.strip(), task_set)
            except UnsupportedInstruction as e:
                why = str(e)
        if why is not None:
            unparsed.append({"line": n, "text": printable(line), "why": printable(why)})
            continue
        tasks.setdefault(task.task_set, []).append(task)
    return {ts: tasks[ts] for ts in TASK_SETS if ts in tasks}, unparsed


def _table(runs: Mapping[str, Sequence[Sequence[EpisodeResult]]]) -> str:
    """Success per task set and family: mean over seeds and sample std (in %), as a plain-text table."""

    def row(ts: str, family: str, n: int, rates: Sequence[float]) -> str:
        std = sample_std(rates)
        spread = "-" if std is None else f"{100 * std:.1f}"
        return f"{ts:<9} {family:<14} {n:>5} {100 * float(np.mean(rates)):>9.1f} {spread:>6}"

    lines = [f"{'task set':<9} {'family':<14} {'tasks':>5} {'success %':>9} {'std':>6}"]
    for ts, per_seed in runs.items():
        lines.append(row(ts, "(all)", len(per_seed[0]), [_rate(r) for r in per_seed]))
        for family, n in sorted(Counter(r.family for r in per_seed[0]).items()):
            lines.append(row(ts, family, n, [_rate([e for e in r if e.family == family]) for r in per_seed]))
    return "\n".join(lines)


def _held_task_sets(folder: Path) -> list[str]:
    """The task sets ``folder`` holds a checkpoint for, if it is a folder of one per task set (else none)."""
    return [ts for ts in TASK_SETS if (folder / ts / "config.json").is_file()]


def policy_for(folder: Path, task_set: str) -> Path:
    """The checkpoint that plays ``task_set``'s tasks: ``folder`` itself, or its ``task_set`` folder where it holds
    one per task set (stage 07 trains one policy per task set)."""
    return folder / task_set if _held_task_sets(folder) else folder


def _unloadable(folder: Path, task_sets: Sequence[str]) -> str | None:
    """Why ``folder`` cannot play ``task_sets``' tasks, or ``None``: each checkpoint it plays them with is loaded whole.

    Loading is the check that leaves nothing out: config, tokenizer, and
    every tensor of the weights there, at the shape the config asks.
    """
    for checkpoint in dict.fromkeys(policy_for(folder, ts) for ts in task_sets):
        try:
            AutoUIPolicy.load(checkpoint)
        except (OSError, ValueError) as e:  # they name the file: a missing one, truncated weights, wrong shapes
            return str(e)
        except Exception as e:  # a tokenizer's own errors name no file
            return f"cannot load the checkpoint {checkpoint}: {type(e).__name__}: {e}"
    return None


def _report(done: Mapping[int, Mapping[str, list[EpisodeResult]]], missing: Mapping[int, tuple[Path, str]],
            unparsed: list[dict[str, Any]], policy: Sequence[Path], tasks_file: Path) -> dict[str, Any]:  # fmt: skip
    """The JSON of the seeds ``done``, in seed order; ``missing`` (seed: its folder and why) makes it partial.

    A partial report has every field of a whole one, over the seeds it
    holds (``seeds`` counts them), plus ``partial``: which seeds those are,
    and which are not there and why.
    """
    seeds = sorted(done)
    runs = _runs(done)
    report: dict[str, Any] = {ts: summarize(r) for ts, r in runs.items()}
    report.update({
        "outcomes": {ts: outcome_strings(r) for ts, r in runs.items()},
        "unparsed": unparsed,
        "policy": [str(folder) for folder in policy],
        "tasks_file": str(tasks_file),
        "seeds": len(seeds),
    })  # fmt: skip
    if missing:
        report["partial"] = {
            "seeds_done": seeds,
            "seeds_missing": [{"seed": s, "policy": str(folder), "why": why}
                              for s, (folder, why) in sorted(missing.items())],
        }  # fmt: skip
    return report


def _runs(done: Mapping[int, Mapping[str, list[EpisodeResult]]]) -> dict[str, list[list[EpisodeResult]]]:
    """Each task set's episodes of the seeds ``done``, in seed order."""
    seeds = sorted(done)
    return {ts: [done[s][ts] for s in seeds] for ts in done[seeds[0]]}


def _write_report(path: Path, report: Mapping[str, Any]) -> None:
    atomic_write_text(path, json.dumps(report, indent=2, sort_keys=True) + "\n")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Evaluate a policy checkpoint on a file of instructions; print a table, optionally write JSON.

    Runs :func:`evaluate_policy` as stage 12 does, with the params file's
    ``eval`` group (temperature, n_envs, device seed) and seeds ``0..N-1``, so
    the stage's checkpoints on the stage's task lists give the stage's figures.
    One ``--policy`` folder runs on every seed; several (one per seed, as
    stage 07 trains them) run seed ``s`` with the ``s``-th folder. A folder
    is a checkpoint, or holds one per task set (``general/``, ``webshop/``,
    as stage 07 writes a row's policies of one seed): each task set's tasks
    are then played by its own. On the
    simulator the seeds are shared among ``--workers`` processes (default:
    the params' ``compute.workers``), as stage 12 shares its evaluations.
    Bad input (a missing checkpoint or task file, a file with no parseable
    line, an ``--out`` that cannot be written, checked before the run) exits
    with status 2 and a message naming it.

    Every checkpoint is loaded before the first episode. A ``--policy``
    folder that does not load is named on stderr, with why, and its seeds
    are not played; the other folders' seeds are, and their report is
    written, marked partial, before the run exits with status 2 (when no
    folder loads, nothing runs). ``--out`` is written as each seed finishes
    (all its task sets), with the seeds done so far: a failure later on
    leaves those on disk. Until every
    seed is in, the JSON has ``partial`` (``seeds_done``, and
    ``seeds_missing``: each seed's folder and why it is not there), and its
    figures and ``seeds`` are those of the seeds done; a complete one has
    no ``partial`` key.
    """
    ap = argparse.ArgumentParser(
        prog="python -m digiq.evaluate",
        description="Evaluate a policy checkpoint on a file of instructions (one per line), as stage 12 does.",
    )
    ap.add_argument("--policy", required=True, type=Path, nargs="+",
                    help="policy checkpoint folder (config.json + weights), or a folder of one per task set (a stage-07 "
                         "row's seed folder); several: one per seed, in seed order. Each is loaded before the run: "
                         "one that does not load is named, its seeds skipped, and the exit status is 2")  # fmt: skip
    ap.add_argument("--tasks", required=True, type=Path, help="text file, one instruction per line")
    ap.add_argument("--task-set", choices=TASK_SETS, default=None,
                    help="put every line in this task set (its step limit); default: each line's own by its shape")  # fmt: skip
    ap.add_argument("--seeds", type=int, default=None,
                    help="seeds 0..N-1 (devices and sampling, as stage 12's); default: the params' experiment.seeds")  # fmt: skip
    ap.add_argument("--out", type=Path, default=None,
                    help="write the results here as JSON, as each seed ends (with a 'partial' key until "
                         "every seed is in)")  # fmt: skip
    ap.add_argument("--params", type=Path, default=PARAMS, help="params file (eval, env, devices, judge groups)")
    ap.add_argument("--workers", type=int, default=None,
                    help="local backend: processes sharing the seeds on the simulator; default: the params' "
                         "compute.workers (compute.backend: ray shares them among the cluster's nodes)")  # fmt: skip
    ap.add_argument("--on-devices", action="store_true",
                    help="step the params' devices backend (judge: its judge group) instead of the in-process simulator")  # fmt: skip
    args = ap.parse_args(argv)

    for folder in args.policy:
        if not folder.is_dir():
            ap.error(f"--policy {folder}: no such checkpoint folder")
    try:
        # A folder of one checkpoint per task set: they descend from one base, whose prompts they share.
        configs = [read_typed_config(folder / held[0] if (held := _held_task_sets(folder)) else folder, "policy",
                                     PolicyConfig) for folder in args.policy]  # fmt: skip
        settings = load_settings(args.params)
        cfg, env, judge, experiment, compute = (settings.eval, settings.env, settings.judge, settings.experiment,
                                                settings.compute)  # fmt: skip
        devices = settings.devices if args.on_devices else DeviceConfig()
    except (FileNotFoundError, ValueError) as e:  # a ConfigError is a ValueError
        ap.error(str(e))
    if args.workers is not None:
        try:
            compute = compute.but(workers=args.workers)
        except ValueError as e:
            ap.error(f"--workers: {e}")
    seeds = args.seeds if args.seeds is not None else experiment.seeds if len(args.policy) == 1 else len(args.policy)
    try:
        ExperimentConfig(seeds=seeds)  # the bounds of the params' experiment.seeds: each seed is a whole evaluation
    except ValueError as e:
        ap.error(f"--seeds: {e}")
    if len(args.policy) > 1 and seeds != len(args.policy):
        ap.error(f"--seeds {seeds} with {len(args.policy)} --policy folders: give one folder per seed")
    if not args.tasks.is_file():
        ap.error(f"--tasks {args.tasks}: no such file")
    if args.out is not None:
        try:
            check_writable(args.out)
        except OSError as e:
            ap.error(f"--out: {e.strerror}")
    tasks, unparsed = read_task_file(args.tasks, args.task_set)
    for u in unparsed:
        print(f"{args.tasks}:{u['line']}: cannot parse, skipped: {u['text']} ({u['why']})", file=sys.stderr)
    if not tasks:
        ap.error(f"--tasks {args.tasks}: none of its {len(unparsed)} instruction(s) parses")

    for folder in args.policy:
        missing = sorted(set(tasks) - set(_held_task_sets(folder))) if _held_task_sets(folder) else []
        if missing:
            ap.error(f"--policy {folder}: no checkpoint for task set(s) {missing}")

    def folder_of(seed: int) -> Path:
        return args.policy[seed % len(args.policy)]

    refused = {folder: why for folder in dict.fromkeys(args.policy) if (why := _unloadable(folder, list(tasks)))}
    playing = [s for s in range(seeds) if folder_of(s) not in refused]
    if not playing:
        ap.error("\n".join(f"--policy {folder}: {why}" for folder, why in refused.items()))
    for folder, why in refused.items():
        skipped = [s for s in range(seeds) if folder_of(s) == folder]
        print(f"{ap.prog}: error: --policy {folder}: {why}; seed(s) {skipped} skipped", file=sys.stderr)
    not_run = {s: (folder_of(s), f"--policy {folder_of(s)}: {refused[folder_of(s)]}")
               for s in range(seeds) if folder_of(s) in refused}  # fmt: skip

    jobs = [EvalJob(policy_for(folder_of(s), ts), folder_of(s).name, s, {ts: listed}, cfg, env,
                    configs[s % len(args.policy)].screen_text)
            for s in playing for ts, listed in tasks.items()]  # one job per task set, as stage 12 runs them  # fmt: skip
    parts: dict[int, dict[str, list[EpisodeResult]]] = {}
    done: dict[int, dict[str, list[EpisodeResult]]] = {}

    def so_far(why: str) -> dict[str, Any]:
        """The report of the seeds done, the others to play missing for ``why``."""
        missing = {s: (folder_of(s), why) for s in playing if s not in done} | not_run
        return _report(done, missing, unparsed, args.policy, args.tasks)

    def finished(i: int, episodes: dict[str, list[EpisodeResult]]) -> None:
        """A job is done: once all of its seed's task sets are, that seed goes to ``--out`` with the others done."""
        seed = jobs[i].seed
        parts.setdefault(seed, {}).update(episodes)
        if len(parts[seed]) < len(tasks):
            return
        done[seed] = parts.pop(seed)
        if args.out is not None and len(done) < len(playing):
            try:
                _write_report(args.out, so_far("not evaluated yet (the run was still going when this was written)"))
            except OSError as e:
                print(_table(_runs(done)))
                ap.error(f"--out: {e.strerror}")

    try:
        run_jobs(jobs, devices, judge, compute, on_done=finished)
    except Exception as e:  # a job failed: what is done stays on disk, saying why the rest is not there
        if args.out is not None and done:
            try:
                _write_report(args.out, so_far(f"the run stopped: {type(e).__name__}: {e}"))
                print(f"{ap.prog}: seed(s) {sorted(done)} done, written to {args.out} (partial)", file=sys.stderr)
            except OSError:
                pass  # the error to show is the run's
        raise
    report = _report(done, not_run, unparsed, args.policy, args.tasks)
    print(_table(_runs(done)))
    if unparsed:
        print(f"{len(unparsed)} line(s) of {args.tasks} not parsed (listed on stderr)")
    if args.out is not None:
        try:
            _write_report(args.out, report)
        except OSError as e:
            ap.error(f"--out: {e.strerror}")
        print(f"wrote {args.out}" + (" (partial)" if refused else ""))
    if refused:
        print(f"{ap.prog}: error: seed(s) {sorted(not_run)} not evaluated: --policy {', '.join(map(str, refused))} "
              "cannot be loaded (above)", file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    return report


if __name__ == "__main__":
    main()
