"""Stage 06: Digi-Q's critics (:func:`digiq.algos.digiq.fit_critic`) on the stored steps, one per row, seed and task set.

As released Digi-Q trains them, each task set's critic learns from that
task set's steps alone (and its actor, stage 07, from its picks there).

Each row's critic reads its VLM's features of every stored (state,
candidate) pair and the text features its settings add
(:mod:`digiq.models.critic_inputs`): ``digiq`` the paper's critic on the
fine-tuned VLM's features, the VLM ablations the same critic on another
VLM's, and each named variant (``variants`` in params.yaml) the paper's
critic with some settings changed. This module loads those inputs, shares
the fits among worker processes, saves every critic and writes the stage's
metrics; the learning rule itself is in :mod:`digiq.algos.digiq`.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch

from digiq import parallel
from digiq.algos.digiq import fit_critic
from digiq.config import (
    ComputeConfig,
    ConfigError,
    CriticConfig,
    Settings,
)
from digiq.data.candidates import read_candidates
from digiq.data.features import critic_inputs, load_text_features
from digiq.data.trajectories import DataError, TrajectoryStore, data_task_sets, returns_discount
from digiq.io import require
from digiq.models.critic import Critic, TextStart, load_critics, per_task_set
from digiq.paths import Paths
from digiq.rows import Row, all_rows, critic_rows
from digiq.stages.common import one_run_at_a_time, save_curve_plot, timed, write_metrics, written_whole
from digiq.workers import IN_PROCESS, map_jobs, process_cached

__all__ = [
    "run",
    "check_one_discount",
    "CriticSpec",
    "critic_specs",
    "run_critic",
    "CriticJob",
    "fit_critic_job",
    "transitions",
    "spec_inputs",
    "scored_candidates",
    "rewarded_fit",
]

# With compute.processes > 1, every process takes its share of each critic's TD batches (digiq.parallel).
DATA_PARALLEL = True


def scored_candidates(paths: Paths, targets: bool) -> np.ndarray:
    """(S, N) bool: the candidates the conservative term scores: those that parse, and with ``targets`` each action once.

    With ``targets`` (``critic.tap_targets``) an action is what it does,
    taps on the same element being one (the critic_inputs stage's
    ``distinct``, :func:`~digiq.models.critic_inputs.distinct_actions`), as
    for the perfect critic (stage 07). Without them a tap is only its point;
    counting distinct action strings would count taps a pixel apart as two and
    push the right tap down with its near copies, so every candidate stays.
    """
    table = read_candidates(paths)
    valid = np.stack(table.column("valid_list").to_numpy(zero_copy_only=False))
    if not targets:
        return valid
    words = load_text_features(paths)
    if "distinct" not in words:
        raise DataError(f"{paths.critic_inputs} has no distinct.npy: the view hierarchies were not stored with the "
                        "steps (collect with collect.view_hierarchy: true)")  # fmt: skip
    return valid & np.asarray(words["distinct"])


@torch.no_grad()
def rewarded_fit(critics: list[tuple[dict[str, Critic], np.ndarray]], feats: dict[str, np.ndarray],
                 steps: pd.DataFrame) -> dict[str, dict[str, dict[str, float]]]:  # fmt: skip
    """Per task set and family: the rewarded steps each critic trained on, and its Q of their taken action.

    ``critics`` pairs each seed's critics (by task set) with the rows they trained on
    (``fit_critic``'s ``train_rows``, as rows of ``steps``). A rewarded step ends its episode, so
    its TD target is exactly the reward, 1: a Q far below it means the critic
    cannot tell that step from the unrewarded ones it resembles, and no
    candidate that would finish the task there can stand out to Best-of-N.
    Both numbers are
    means over the seeds whose training split holds any of the family's
    rewarded steps; families with none in any split are left out.
    """
    per_seed = []
    for by_set, trained in critics:
        rows = trained[steps.reward.to_numpy()[trained] > 0]
        q = (per_task_set(steps.task_set.to_numpy()[rows], by_set, partial(_taken_q, feats=feats, rows=rows))
             if len(rows) else np.zeros(0))  # fmt: skip
        frame = steps.iloc[rows][["task_set", "family"]].assign(q=q)
        per_seed.append(frame.groupby(["task_set", "family"]).q.agg(["size", "mean"]))
    pooled = pd.concat(per_seed).groupby(level=[0, 1]).mean()
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (ts, family), row in pooled.iterrows():
        out.setdefault(str(ts), {})[str(family)] = {"steps": round(float(row["size"]), 1),
                                                    "q_taken": round(float(row["mean"]), 4)}  # fmt: skip
    return out


@torch.no_grad()
def _taken_q(critic: Critic, mine: np.ndarray, feats: dict[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
    """``critic``'s Q of the taken action at ``rows[mine]``, its heads joined."""
    x = critic.read(feats, rows[mine], ("state", "candidates"))
    return critic.joined(critic.q(x["state"], x["candidates"][:, 0])).cpu().numpy()


class CriticSpec(NamedTuple):
    """One critic stage 06 trains: whose VLM features it reads, and its settings."""

    vlm: str
    cfg: CriticConfig


def critic_specs(critic: CriticConfig, variants: dict[str, CriticConfig], table: Sequence[Row]
                 ) -> dict[str, CriticSpec]:  # fmt: skip
    """Every critic of the stage, by the row whose actor uses it (:func:`digiq.rows.critic_rows`).

    ``digiq`` is the paper's critic; the VLM ablations are the paper's critic on another VLM's features; each
    named variant changes some of its keys (``variants``, :attr:`digiq.config.Settings.variants`).
    """
    return {r.name: CriticSpec(r.vlm, variants.get(r.name, critic)) for r in critic_rows(table)}


class CriticJob(NamedTuple):
    """One critic of stage 06: a row's spec on one seed (``seed`` counts from 0; the fit's is ``cfg.seed + seed``)
    and one task set's steps."""

    paths: Paths
    row: str
    spec: CriticSpec
    seed: int
    task_set: str


def spec_inputs(paths: Paths, spec: CriticSpec) -> dict[str, np.ndarray]:
    """What the critic of ``spec`` reads per stored step: its VLM's features and the inputs its settings add."""
    cfg = spec.cfg
    return critic_inputs(paths, spec.vlm, text=cfg.text_features, towers=cfg.towers, targets=cfg.tap_targets,
                         typed=cfg.typed_match, entries=cfg.list_entries)  # fmt: skip


def _inputs(paths: Paths, spec: CriticSpec) -> dict[str, np.ndarray]:
    """The critic inputs of ``spec``, built once per process for each distinct set of inputs."""
    cfg = spec.cfg
    key = ("critic inputs", paths.root, spec.vlm, cfg.text_features, cfg.towers, cfg.tap_targets, cfg.typed_match,
           cfg.list_entries)  # fmt: skip
    return process_cached(key, lambda: spec_inputs(paths, spec))


def transitions(paths: Paths) -> pd.DataFrame:
    """The stored steps' columns the critics train and are judged on, in the features' row order."""
    columns = ["traj_id", "reward", "done", "mc_return", "task_set", "family"]
    require("critic", paths.offline)
    return TrajectoryStore(paths.offline).read().select(columns).to_pandas()


def fit_critic_job(job: CriticJob) -> dict[str, Any]:
    """Fit and save one critic on its task set's steps; its held-out correlation, TD fit, training rows (as rows of
    every stored step) and (seed 0) loss curves."""
    paths, (vlm, cfg) = job.paths, job.spec
    steps, feats = transitions(paths), _inputs(paths, job.spec)
    if len(steps) != feats["state"].shape[0]:
        raise DataError(f"features in {paths.features(vlm)} have {feats['state'].shape[0]} rows but "
                        f"{paths.offline} has {len(steps)} steps; rerun embed")  # fmt: skip
    mine = np.flatnonzero(steps.task_set.to_numpy() == job.task_set)
    scored = None
    if cfg.conservative > 0:
        scored = process_cached(
            ("scored", paths.root, cfg.tap_targets), lambda: scored_candidates(paths, cfg.tap_targets)
        )[mine]
    encoder = (process_cached(("text start", paths.root), lambda: TextStart.of(paths, str(parallel.device())))
               if cfg.towers else None)  # fmt: skip
    fit = fit_critic(cfg, {k: np.asarray(v)[mine] for k, v in feats.items()}, steps.iloc[mine].reset_index(drop=True),
                     cfg.seed + job.seed, scored, encoder)  # fmt: skip
    if parallel.is_main():
        fit["critic"].save(paths.critic(job.seed, job.row, job.task_set), stage="critic", row=job.row, vlm=vlm,
                           task_set=job.task_set, seed=cfg.seed + job.seed, steps=len(fit["curves"]["q"]),
                           gamma=cfg.gamma, holdout=cfg.holdout, split_seed=cfg.seed)  # fmt: skip
    return {"corr": round(fit["corr"], 4), "fit": {k: round(fit[k], 4) for k in ("q_td_rmse", "q_taken_minus_v")},
            "train_rows": mine[fit["train_rows"]], "train": fit["train"], "heldout": fit["heldout"],
            "curves": fit["curves"] if job.seed == 0 else {}}  # fmt: skip


@one_run_at_a_time("critic")
def run_critic(specs: dict[str, CriticSpec], paths: Paths, seeds: int = 1,
               compute: ComputeConfig = IN_PROCESS) -> dict[str, Any]:  # fmt: skip
    """One critic per (row, seed, task set): ``data/models/critic/seed<s>/<row>/<task set>``, the fits shared as
    ``compute`` says (:mod:`digiq.workers`).

    Metrics at the top level are Digi-Q's critics'; ``by_critic`` holds every critic's held-out
    V-vs-return correlation and TD fit per seed and task set.
    """
    for spec in specs.values():
        require("critic", paths.features(spec.vlm))
    metrics: dict[str, Any] = {}
    # Inside the block, paths.critics is a temporary folder, swapped in whole at its end.
    with written_whole(paths, "critics") as paths, timed(metrics):
        task_sets = data_task_sets(transitions(paths).task_set)
        jobs = [CriticJob(paths, row, spec, seed, ts) for row, spec in specs.items() for seed in range(seeds)
                for ts in task_sets]  # fmt: skip
        fits = dict(zip([(j.row, j.seed, j.task_set) for j in jobs], map_jobs(fit_critic_job, jobs, compute),
                        strict=True))  # fmt: skip
        curves: dict[str, list[float]] = {}
        by_critic: dict[str, Any] = {}
        for row, spec in specs.items():
            for ts in task_sets:
                curves.update({f"{loss} loss ({row}, {ts})": c for loss, c in fits[(row, 0, ts)]["curves"].items()})
            corrs = {ts: [fits[(row, seed, ts)]["corr"] for seed in range(seeds)] for ts in task_sets}
            # NaN where no critic's held-out returns vary (a tiny run), without numpy's empty-mean warning.
            finite = [c for per in corrs.values() for c in per if np.isfinite(c)]
            by_critic[row] = {"vlm": spec.vlm,
                              "v_mc_return_corr_heldout": round(float(np.mean(finite)), 4) if finite else float("nan"),
                              "v_mc_return_corr_heldout_per_seed": corrs,
                              "td_fit_per_seed": {ts: [fits[(row, seed, ts)]["fit"] for seed in range(seeds)]
                                                  for ts in task_sets}}  # fmt: skip
        paper = {ts: fits[("digiq", 0, ts)] for ts in task_sets}
        metrics.update({"transitions_train": {ts: f["train"] for ts, f in paper.items()},
                        "transitions_heldout": {ts: f["heldout"] for ts, f in paper.items()},
                        "v_mc_return_corr_heldout": by_critic["digiq"]["v_mc_return_corr_heldout"]})  # fmt: skip
        metrics.update({f"{loss}_loss_last": {ts: round(float(np.mean(f["curves"][loss][-50:])), 5)
                                              for ts, f in paper.items()}
                        for loss in paper[task_sets[0]]["curves"]})  # fmt: skip
        parallel.barrier()  # the main process saved the critics
        trained = [(load_critics(paths, seed, "digiq", task_sets),
                    np.sort(np.concatenate([fits[("digiq", seed, ts)]["train_rows"] for ts in task_sets])))
                   for seed in range(seeds)]  # fmt: skip
        metrics["rewarded_steps"] = rewarded_fit(trained, spec_inputs(paths, specs["digiq"]), transitions(paths))
        metrics["by_critic"] = by_critic
    if parallel.is_main():
        save_curve_plot(paths.plots / "critic_td_loss.png", curves, "Stage 06: TD losses (seed 0)")
        write_metrics(paths, "critic", metrics)
    parallel.barrier()
    return metrics


def check_one_discount(specs: dict[str, CriticSpec], returns_gamma: float) -> None:
    """Refuse critics whose TD discount is not the one the stored Monte-Carlo returns were discounted by
    (``returns_gamma``, the ``collect.gamma`` stage 01 recorded with its store): each critic's V is judged
    against those returns (``v_mc_return_corr``), and two discounts would skew that correlation without a word.

    Raises:
        ConfigError: naming each critic's discount and the returns'.
    """
    differ = {name: spec.cfg.gamma for name, spec in specs.items() if spec.cfg.gamma != returns_gamma}
    if differ:
        named = ", ".join(f"{name} {gamma}" for name, gamma in differ.items())
        raise ConfigError(f"critic.gamma differs from {returns_gamma}, the discount (collect.gamma) stage 01 stored "
                          f"its Monte-Carlo returns with, which every critic is judged against ({named}): one "
                          "discount, set them equal (a changed collect.gamma reruns stage 01)")  # fmt: skip


def run(settings: Settings, paths: Paths) -> dict[str, Any]:
    """Stage 06 as ``params.yaml`` sets it (:func:`digiq.stages.launch.run_stage` runs it in one process or several)."""
    variants = settings.variants
    table = all_rows(settings.ablations, list(variants))
    specs = critic_specs(settings.critic, variants, table)
    if (returns_gamma := returns_discount(paths.offline)) is not None:
        check_one_discount(specs, returns_gamma)
    return run_critic(
        specs,
        paths,
        seeds=settings.experiment.seeds,
        compute=settings.compute,
    )
