"""Stage 11: PAE's practice on the proposed tasks, judged without ground truth, beside the same on human tasks.

1. **the learned evaluator** (``pae.evaluator: learned``): the pretrained VLM fine-tuned on the steps of the
   offline data and of stage 00's demonstrations to answer "is this task finished?", with swapped-task negatives
   (:mod:`digiq.pae.learned`); its threshold is the best F1 over the base policy's episodes of the validation
   lists, each ended at its first "done" as practice ends them, kept in ``data/pae/evaluator/threshold_episodes``;
2. **practice**, each row per seed and task set, as DigiRL's online rows run (the same rounds, episodes per
   round, environment-step budget and actor updates: ``digirl``), from the base policy, in rounds of: draw
   tasks uniformly with replacement from the row's pool, roll out, let the evaluator end each episode and
   give its reward, keep the successes with PAE's shortest-20% rule (:func:`digiq.algos.pae.pae_picks`),
   update. The rows (``pae.rows``):

   - ``pae``: the proposals (``data/pae/proposals.jsonl``), judged by ``pae.evaluator``;
   - ``pae_oracle``: the same proposals, judged by the device's own check (the simulator's ground truth);
   - ``pae_human``: the human train lists, judged by the device's own check.

   A task set with no proposal of its own practises on all of them, at its own step limit.

The device's own check of every practice episode is written beside its round (``ground_truth.json``) and
read only by the reports: the evaluator panel (precision, recall and agreement of the verdicts against it,
per family and round) and the learning curves by both counts. The proposer panel measures the proposals with
the task parser (validity, family), the scripted expert (feasible where it parses) and the task lists
(family mix against the test mix; overlap with the train and test lists, by instruction and by goal), and
lists the test tasks no proposal matches (stage 12 reports the rows on them apart).

Writes ``data/pae`` (``evaluator/``, ``runs/``), ``metrics/pae.json`` and ``plots/pae.png``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from digiq.algos.digirl_online import GROUND_TRUTH_FILE, OnlineJob, Practice, run_online_job, split_runs
from digiq.config import (
    ActorConfig,
    ComputeConfig,
    DeviceConfig,
    DigiRLConfig,
    EnvConfig,
    JudgeConfig,
    PAEConfig,
    Settings,
)
from digiq.data.task_lists import read_tasks
from digiq.data.trajectories import TrajectoryStore
from digiq.env.state import Dynamics
from digiq.env.tasks import TASK_SETS, Task, UnsupportedInstruction, parse_task, unchecked_task
from digiq.io import StageError, require
from digiq.models.agents import ModelPolicy
from digiq.models.policy import AutoUIPolicy
from digiq.models.vlm import ScreenVLM
from digiq.pae.learned import (
    OTHER_FAMILY,
    SAME_FAMILY,
    LearnedEvaluator,
    choose_threshold,
    fit_evaluator,
    stored_examples,
)
from digiq.pae.proposals import Proposal, read_proposals
from digiq.paths import Paths
from digiq.rollout import ExpertPolicy, rollout
from digiq.stages.common import (
    one_run_at_a_time,
    per_seed_total,
    save_figure,
    seed_curve,
    timed,
    write_metrics,
    written_whole,
)
from digiq.tables import TASK_SET_NAMES
from digiq.viz.colours import row_colours
from digiq.workers import IN_PROCESS, job_slots, map_jobs

__all__ = ["practice_task", "proposal_pools", "fit_learned_evaluator", "proposer_panel", "evaluator_panel",
           "practice_curves_figure", "run_pae", "run"]  # fmt: skip

THRESHOLD_EPISODES = "threshold_episodes"  # in the evaluator's folder: the validation episodes its threshold is from


def practice_task(proposal: Proposal) -> Task:
    """The task a device runs for a proposal: the parser's, whose check is the ground truth the reports read, or one
    with no check where the parser cannot map it. The parser measures a proposal; it never drops one."""
    try:
        return parse_task(proposal.instruction, proposal.task_set)
    except UnsupportedInstruction:
        return unchecked_task(proposal.instruction, proposal.task_set)


def proposal_pools(proposals: Sequence[Proposal]) -> dict[str, tuple[Task, ...]]:
    """Each task set's practice pool: its own proposals, or all of them (at its step limit) where it has none."""
    pools = {}
    for ts in TASK_SETS:
        own = [p for p in proposals if p.task_set == ts]
        pools[ts] = tuple(practice_task(p if own else replace(p, task_set=ts)) for p in (own or proposals))
    return pools


def fit_learned_evaluator(cfg: PAEConfig, digirl: DigiRLConfig, env: EnvConfig, paths: Paths) -> dict[str, Any]:
    """Fine-tune the pretrained VLM on the stored steps (the offline data's and the demonstrations'), choose its
    threshold on validation episodes, save it to :attr:`Paths.pae_evaluator`; its metrics (the threshold's
    precision, recall and F1 over those episodes, and how often it calls a finishing step done for the episode's
    own task and for a swapped one)."""
    vlm = ScreenVLM.load(paths.vlm_pretrained)
    # Every stored episode whose outcome is known: the offline data, and the demonstrations where stage 00 made them.
    stores = [TrajectoryStore(p) for p in (paths.offline, paths.demos) if TrajectoryStore(p).stored_ids()]
    examples = [e for store in stores for e in stored_examples(store, vlm, cfg.seed, need_success=False)]
    if not any(e.label for e in examples):
        raise StageError(f"stage pae: no stored step of {' or '.join(str(s.root) for s in stores)} finished its task, "
                         "so the learned evaluator has no 'finished' to learn: set pae.evaluator to judge or oracle, "
                         "or collect episodes that succeed")  # fmt: skip
    curve = fit_evaluator(vlm, examples, epochs=cfg.evaluator_epochs, batch_size=cfg.evaluator_batch,
                          lr=cfg.evaluator_lr, last_layers=cfg.evaluator_last_layers, seed=cfg.seed)  # fmt: skip
    tasks = [t for ts in TASK_SETS for t in read_tasks(paths, ts, "val", None, "pae")[: cfg.threshold_episodes]]
    store = TrajectoryStore(paths.pae_evaluator / THRESHOLD_EPISODES)
    base = AutoUIPolicy.load(paths.base_policy)
    rollout(ModelPolicy(base, digirl.temperature), tasks, n_envs=digirl.n_envs, seed=cfg.seed,
            dynamics=Dynamics.of(env), width=env.width, store=store, desc="threshold episodes",
            screen_text=base.cfg.screen_text)  # fmt: skip
    held = stored_examples(store, vlm, cfg.seed, need_success=False)  # none done: the threshold says never (1.0)
    probabilities = np.concatenate([vlm.embed([e.image for e in held[i : i + 64]], [e.prompt for e in held[i : i + 64]])[1]
                                    for i in range(0, len(held), 64)])  # fmt: skip
    swap = np.array([e.swap or "" for e in held])
    plain = swap == ""
    labels = np.array([e.label for e in held])
    episodes = np.array([e.traj_id for e in held])
    threshold, stats = choose_threshold(probabilities[plain], labels[plain], episodes[plain])
    said = probabilities >= threshold
    metrics = {
        "examples": len(examples),
        "examples_yes": sum(e.label for e in examples),
        "updates": len(curve),
        "loss_first": round(float(np.mean(curve[:20])), 4),
        "loss_last": round(float(np.mean(curve[-20:])), 4),
        "threshold": round(threshold, 6),
        "threshold_episodes": len(np.unique(episodes)),
        "threshold_episodes_done": len(np.unique(episodes[plain & (labels == 1)])),
        **{f"threshold_{k}": v for k, v in stats.items()},
        # Per finishing step of the validation episodes, how often the same screens and action are called done
        # for the episode's own task and for a swapped one: a model that reads the task says done for its own only.
        **{f"{name}_said_done": round(float(said[which].mean()), 4) if which.any() else None
           for name, which in (("own_task", plain & (labels == 1)), ("other_family", swap == OTHER_FAMILY),
                               ("same_family", swap == SAME_FAMILY))},
    }  # fmt: skip
    LearnedEvaluator(vlm, threshold).save(paths.pae_evaluator, **metrics)
    return metrics


def _jobs(cfg: PAEConfig, digirl: DigiRLConfig, actor: ActorConfig, env: EnvConfig, paths: Paths, seeds: int,
          devices: DeviceConfig, judge: JudgeConfig, device_compute: ComputeConfig,
          proposals: Sequence[Proposal]) -> list[OnlineJob]:  # fmt: skip
    pools = proposal_pools(proposals)
    human = (
        {ts: tuple(read_tasks(paths, ts, "train", None, "pae")) for ts in TASK_SETS} if "pae_human" in cfg.rows else {}
    )
    practice = {
        "pae": lambda ts: Practice(pools[ts], cfg.evaluator, paths.pae_runs, paths.pae_evaluator),
        "pae_oracle": lambda ts: Practice(pools[ts], "oracle", paths.pae_runs),
        "pae_human": lambda ts: Practice(human[ts], "oracle", paths.pae_runs),
    }
    return [OnlineJob(paths, row, s, ts, digirl, actor, env, devices, judge, device_compute, practice=practice[row](ts))
            for row in cfg.rows for s in range(seeds) for ts in TASK_SETS]  # fmt: skip


def _families(tasks: Sequence[Task]) -> dict[str, float]:
    counts = Counter(t.family for t in tasks)
    return {f: round(n / max(1, len(tasks)), 4) for f, n in sorted(counts.items())}


def proposer_panel(proposals: Sequence[Proposal], paths: Paths, env: EnvConfig) -> dict[str, Any]:
    """What the proposals are, measured: validity (the parser maps them), feasibility (the scripted expert does
    those it can), diversity, family mix against the test lists', overlap with the train and test lists (by
    instruction and by goal), and per task set the test tasks (by line) whose goal no proposal has."""
    tasks = [practice_task(p) for p in proposals]
    checkable = [t for t in tasks if t.checkable]
    ran = rollout(ExpertPolicy(seed=0), checkable, n_envs=32, dynamics=Dynamics.of(env), width=env.width,
                  desc="expert on proposals") if checkable else []  # fmt: skip
    lists = {(ts, split): read_tasks(paths, ts, split, None, "pae") for ts in TASK_SETS for split in ("train", "test")}
    goals = {t.goal for t in checkable}
    texts = {p.instruction.lower() for p in proposals}
    overlap = {}
    for split in ("train", "test"):
        listed = [t for ts in TASK_SETS for t in lists[ts, split]]
        overlap[split] = {"same_instruction": round(np.mean([t.instruction.lower() in texts for t in listed]), 4),
                          "same_goal": round(np.mean([t.goal in goals for t in listed]), 4)}  # fmt: skip
    words = [w for p in proposals for w in p.instruction.lower().split()]
    return {
        "proposals": len(proposals),
        "valid": round(len(checkable) / max(1, len(tasks)), 4),
        "expert_success_on_valid": round(float(np.mean([r.success for r in ran])), 4) if ran else None,
        "distinct_instructions": len(texts),
        "distinct_frames": len({p.frame for p in proposals if p.frame}),
        "distinct_words_share": round(len(set(words)) / max(1, len(words)), 4),
        "family_mix": _families(tasks),
        "test_family_mix": {ts: _families(lists[ts, "test"]) for ts in TASK_SETS},
        "overlap_with_lists": overlap,
        "test_lines_unmatched": {
            ts: [i for i, t in enumerate(lists[ts, "test"]) if t.goal not in goals] for ts in TASK_SETS
        },  # fmt: skip
    }


def evaluator_panel(runs: Path, row: str) -> dict[str, Any]:
    """The verdicts of ``row``'s practice episodes against the device's own check, where it has one: precision,
    recall and agreement over all, per family (the parser's) and per round."""

    def scores(pairs: list[tuple[bool, bool]]) -> dict[str, Any]:
        v, t = np.array([a for a, _ in pairs], bool), np.array([b for _, b in pairs], bool)
        return {"episodes": len(pairs),
                "precision": round(float((v & t).sum() / v.sum()), 4) if v.any() else None,
                "recall": round(float((v & t).sum() / t.sum()), 4) if t.any() else None,
                "agreement": round(float((v == t).mean()), 4) if len(pairs) else None}  # fmt: skip

    every: list[tuple[bool, bool]] = []
    by_family: dict[str, list[tuple[bool, bool]]] = {}
    by_round: dict[int, list[tuple[bool, bool]]] = {}
    for file in sorted(runs.glob(f"seed*/{row}/*/round*/{GROUND_TRUTH_FILE}")):
        store = TrajectoryStore(file.parent).read().to_pandas()
        family_of = dict(zip(store.traj_id, store.family))
        r = int(file.parent.name.removeprefix("round"))
        for index, verdict, truth in json.loads(file.read_text()):
            if truth is None or index not in family_of:  # no check, or an abandoned episode (not stored)
                continue
            pair = (bool(verdict), bool(truth))
            every.append(pair)
            by_family.setdefault(family_of[index], []).append(pair)
            by_round.setdefault(r, []).append(pair)
    return {"all": scores(every), "by_family": {f: scores(p) for f, p in sorted(by_family.items())},
            "by_round": {str(r): scores(p) for r, p in sorted(by_round.items())}}  # fmt: skip


def practice_curves_figure(rows: dict[str, Any], judged: Collection[str]) -> Figure:
    """Each row's practice, one panel per task set: success of each round's episodes against the environment steps
    collected, by the device's own check (solid; mean over seeds, band: their range) and, for the rows in
    ``judged``, by the evaluator's verdicts (dashed). The gap between a row's two curves is the evaluator's optimism;
    a row judged by the device's own check has one curve, its verdicts being that check.

    ``rows`` is ``metrics/pae.json``'s ``rows``; a row's seeds are drawn over the rounds every seed has.
    """
    task_sets = [ts for ts in TASK_SETS if any(ts in entry["by_task_set"] for entry in rows.values())]
    fig = Figure(figsize=(11, 3.8))
    axes = fig.subplots(1, max(len(task_sets), 1), sharey=True, squeeze=False)
    colours = row_colours(list(rows))
    for row, colour in colours.items():
        for ax, ts in zip(axes[0], task_sets, strict=False):
            seeds = rows[row]["by_task_set"].get(ts, {"per_seed": []})["per_seed"]
            if (truth := seed_curve(seeds, "ground_truth_success")) is None:
                continue
            steps, mean, low, high = truth
            ax.plot(steps, mean, marker="o", ms=3, color=colour, label=f"{row}: the device's check")
            ax.fill_between(steps, low, high, color=colour, alpha=0.15)
            if row in judged and (verdicts := seed_curve(seeds, "success")) is not None:
                ax.plot(steps, verdicts[1], linestyle="--", marker="o", ms=3, color=colour,
                        label=f"{row}: the evaluator's verdicts")  # fmt: skip
    for ax, ts in zip(axes[0], task_sets, strict=False):
        ax.set(title=TASK_SET_NAMES[ts], xlabel="environment steps collected in practice")
        ax.grid(alpha=0.3)
    axes[0][0].set(ylabel="success of the round's episodes")
    if task_sets:
        axes[0][-1].legend(fontsize=8, loc="best")
    return fig


@one_run_at_a_time("pae")
def run_pae(cfg: PAEConfig, digirl: DigiRLConfig, actor: ActorConfig, env: EnvConfig, paths: Paths, *, seeds: int,
            devices: DeviceConfig | None = None, judge: JudgeConfig | None = None,
            compute: ComputeConfig = IN_PROCESS) -> dict[str, Any]:  # fmt: skip
    """The learned evaluator (when a row uses it), every practice row for every seed, and the panels."""
    devices, judge = devices or DeviceConfig(), judge or JudgeConfig()
    require("pae", paths.pae_proposals, paths.base_policy / "config.json", paths.tasks)
    learned = "pae" in cfg.rows and cfg.evaluator == "learned"
    if learned:
        require("pae", paths.offline, paths.demos, paths.vlm_pretrained / "config.json")
    proposals = read_proposals(paths.pae_proposals)
    metrics: dict[str, Any] = {}
    with timed(metrics):
        if learned:
            with written_whole(paths, "pae_evaluator") as writing, timed(metrics, "evaluator_wall_time_s"):
                metrics["evaluator"] = fit_learned_evaluator(cfg, digirl, env, writing)
        # The stage's outputs, empty when no row uses the learned evaluator, or pae.rows is [].
        paths.pae_evaluator.mkdir(parents=True, exist_ok=True)
        paths.pae_runs.mkdir(parents=True, exist_ok=True)
        on_sim = devices.backend == "sim"
        jobs = _jobs(cfg, digirl, actor, env, paths, seeds, devices, judge, IN_PROCESS if on_sim else compute,
                     proposals)  # fmt: skip
        runs_on = compute if on_sim else IN_PROCESS
        parts, after = split_runs(jobs, job_slots(runs_on))
        records = map_jobs(run_online_job, parts, runs_on, after)[len(parts) - len(jobs) :]
    rows: dict[str, Any] = {}
    for job, record in zip(jobs, records, strict=True):
        by_set = rows.setdefault(job.row, {"by_task_set": {}})["by_task_set"]
        by_set.setdefault(job.task_set, {"per_seed": []})["per_seed"].append(record["rounds"])
    for entry in rows.values():
        entry["env_steps"] = round(per_seed_total(entry["by_task_set"], "env_steps", seeds), 1)
    metrics.update({
        "rows": rows,
        "proposer_panel": proposer_panel(proposals, paths, env),
        "evaluator_panel": {row: evaluator_panel(paths.pae_runs, row) for row in cfg.rows},
        "workers": job_slots(compute),
    })  # fmt: skip
    write_metrics(paths, "pae", metrics)
    judged = {job.row for job in jobs if job.practice is not None and job.practice.evaluator != "oracle"}
    fig = practice_curves_figure(rows, judged)
    fig.suptitle("Stage 11: PAE's practice" + ("" if rows else ": off (pae.rows is [])"))
    fig.tight_layout()
    save_figure(fig, paths.plots / "pae.png")
    return metrics


def run(settings: Settings, paths: Paths) -> dict[str, Any]:
    """Stage 11 as ``params.yaml`` sets it."""
    return run_pae(
        settings.pae, settings.digirl,
        settings.actor, settings.env, paths,
        seeds=settings.experiment.seeds,
        devices=settings.devices, judge=settings.judge,
        compute=settings.compute,
    )  # fmt: skip
