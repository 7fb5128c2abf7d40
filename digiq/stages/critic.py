"""Stage 06: TD learning of double Q and V heads on frozen VLM features.

Q target: r + gamma * (1 - done) * V_target(s');  V target: Q_target(s, a_data)
(pessimistic minima of the twin heads), target networks soft-updated with tau.
This is Digi-Q's critic; the features stay frozen, so it trains in seconds.
Its inputs are the VLM's features and, as in Digi-Q, text features of the
goal and the actions (``text_features``; :mod:`digiq.models.critic_inputs`).

Beyond the paper, as named variants with their own rows (``variants`` in
params.yaml): ``conservative``, a CQL term (Kumar et al. 2020). TD fits Q on
the taken action only, yet stage 07 takes the argmax over 16 candidates, so
it picks whichever untaken candidate the heads happen to overestimate; the
term lowers the log-sum-exp of Q over a state's valid candidates against Q
of the taken action. With ``tap_targets`` the term counts each distinct
action of a state once (:func:`scored_candidates`), so that an action offered
many times over (Back) is not pushed down many times over.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from digiq import parallel
from digiq.config import (
    VLM_OF_ROW,
    AblationsConfig,
    ComputeConfig,
    CriticConfig,
    ExperimentConfig,
    load_section,
    load_variants,
    vlm_rows,
)
from digiq.data.candidates import read_candidates
from digiq.data.trajectories import DataError, TrajectoryStore, split_trajectories
from digiq.io import require
from digiq.models.critic import Critic, CriticNetConfig
from digiq.models.critic_inputs import critic_inputs, distinct_actions, tap_targets
from digiq.paths import Paths
from digiq.stages.common import one_run_at_a_time, save_curve_plot, timed, write_metrics, written_whole
from digiq.workers import map_jobs, process_cached

__all__ = [
    "from_params",
    "CriticSpec",
    "critic_specs",
    "run_critic",
    "CriticJob",
    "fit_critic_job",
    "fit_critic",
    "transitions",
    "spec_inputs",
    "transition_tensors",
    "build_critic",
    "td_step",
    "batch_losses",
    "td_fit",
    "scored_candidates",
    "rewarded_fit",
]


def _td_target(net: Critic, batch: dict[str, torch.Tensor], gamma: float) -> torch.Tensor:
    """r + gamma * (1 - done) * V(s'), V the pessimistic minimum of ``net``'s twin heads."""
    return batch["reward"] + gamma * (1 - batch["done"]) * torch.minimum(*net.v(batch["next_state"]))


def td_step(
    critic: Critic, target: Critic, batch: dict[str, torch.Tensor], gamma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Q and V losses of one batch of transitions."""
    with torch.no_grad():
        q_target = _td_target(target, batch, gamma)
        v_target = torch.minimum(*target.q(batch["state"], batch["action"]))
    q1, q2 = critic.q(batch["state"], batch["action"])
    v1, v2 = critic.v(batch["state"])
    return F.mse_loss(q1, q_target) + F.mse_loss(q2, q_target), F.mse_loss(v1, v_target) + F.mse_loss(v2, v_target)


def conservative_penalty(critic: Critic, state: torch.Tensor, candidates: torch.Tensor, scored: torch.Tensor,
                         floor: float | None = None) -> torch.Tensor:  # fmt: skip
    """Per state (B,): logsumexp of Q over its scored candidates minus Q of the taken one (column 0), both heads summed.

    Minimising it lowers the candidates the data never tried against the one
    it did, unless TD lifts them through shared features (CQL's regulariser,
    over the stored candidates instead of sampled actions).

    With ``floor``, an untried candidate's Q enters the sum as no less than
    ``floor``, so the term stops pushing it once it is there (the
    calibration of Cal-QL, with the lowest possible return as the bound).
    Without it, an action that is a candidate almost everywhere and rarely
    taken (Back, Home) has its Q pushed far below any return, where returns
    lie in [0, 1].
    """
    ok = scored.clone()
    ok[:, 0] = True  # the taken action counts even when it did not parse
    q_all = critic.q(state[:, None].expand(-1, candidates.shape[1], -1), candidates)
    if floor is not None:
        q_all = tuple(torch.cat([q[:, :1], q[:, 1:].clamp(min=floor)], 1) for q in q_all)
    return sum(torch.logsumexp(q.masked_fill(~ok, float("-inf")), 1) - q[:, 0] for q in q_all)


@torch.no_grad()
def moved_forward(target: Critic, batch: dict[str, torch.Tensor], gamma: float) -> torch.Tensor:
    """(B,) bool: the data's step raised the target critic's value (r + gamma V(s') > V(s)), or its episode succeeded.

    The conservative term lifts Q of the data's action against the other
    candidates; at every step it also lifts the base's slips, and the
    critic's wrong picks go to the commonest of them (Back).
    ``critic.conservative_gate`` keeps the term to these steps.
    """
    gain = _td_target(target, batch, gamma) - torch.minimum(*target.v(batch["state"]))
    return (gain > 0) | (batch["mc_return"] > 0)


def scored_candidates(paths: Paths, targets: bool) -> np.ndarray:
    """(S, N) bool: the candidates the conservative term scores: those that parse, and with ``targets`` each action once.

    With ``targets`` (``critic.tap_targets``) an action is what it does,
    taps on the same element being one (:func:`distinct_actions`), as for the
    perfect critic (stage 07). Without them a tap is only its point; counting
    distinct action strings would count taps a pixel apart as two and
    push the right tap down with its near copies, so every candidate stays.
    """
    table = read_candidates(paths)
    valid = np.stack(table.column("valid_list").to_numpy(zero_copy_only=False))
    if not targets:
        return valid
    lists = table.column("action_list").to_pylist()
    store = TrajectoryStore(paths.offline)
    return valid & distinct_actions(lists, tap_targets(store, store.read().column("image_path").to_pylist(), lists))


def transition_tensors(feats: dict[str, np.ndarray], steps: pd.DataFrame) -> dict[str, torch.Tensor]:
    """One row per stored step: the features of s, s' and the action taken (candidate 0), reward, done, MC return."""
    return {
        "state": torch.from_numpy(np.asarray(feats["state"])),
        "next_state": torch.from_numpy(np.asarray(feats["next_state"])),
        "action": torch.from_numpy(np.asarray(feats["candidates"][:, 0])),  # index 0: the action taken
        "reward": torch.tensor(steps.reward.to_numpy(), dtype=torch.float32),
        "done": torch.tensor(steps.done.to_numpy(), dtype=torch.float32),
        "mc_return": torch.tensor(steps.mc_return.to_numpy(), dtype=torch.float32),
    }


def build_critic(cfg: CriticConfig, feats: dict[str, np.ndarray]) -> Critic:
    """A fresh critic of ``cfg``'s shape for inputs ``feats`` (initialised from torch's current seed)."""
    net = CriticNetConfig(feature_dim=feats["state"].shape[1], hidden=cfg.hidden,
                          action_dim=feats["candidates"].shape[2], text=cfg.text_features, targets=cfg.tap_targets,
                          typed=cfg.typed_match, entries=cfg.list_entries)  # fmt: skip
    return Critic(net)


def batch_losses(cfg: CriticConfig, critic: Critic, target: Critic, data: dict[str, torch.Tensor],
                 mine: list[tuple[int, bool]], penalised: int) -> dict[str, torch.Tensor]:  # fmt: skip
    """The losses of one process's share of a batch: ``mine`` is (row, whether the conservative term scores it).

    TD on every row; with ``cfg.conservative``, the CQL term on the scored
    rows, scaled so that every process's share sums to the batch's mean.
    """
    dev = next(critic.parameters()).device
    idx = torch.as_tensor([i for i, _ in mine])
    q_loss, v_loss = td_step(critic, target, {k: t[idx].to(dev) for k, t in data.items()}, cfg.gamma)
    out = {"q": q_loss, "v": v_loss}
    if cfg.conservative > 0:  # the mean over all rows of (penalty * batch / penalised) on penalised rows
        pen = torch.as_tensor([i for i, p in mine if p], dtype=torch.long)
        rows = {k: t[pen].to(dev) for k, t in data.items()}
        marked = rows["scored"]
        if cfg.conservative_gate:
            marked = marked & moved_forward(target, rows, cfg.gamma)[:, None]
        term = (conservative_penalty(critic, rows["state"], rows["candidates"], marked, cfg.conservative_floor).sum()
                if len(pen) else q_loss * 0)  # fmt: skip
        out["conservative"] = cfg.conservative * term * cfg.batch_size / penalised / len(mine)
    return out


def fit_critic(cfg: CriticConfig, feats: dict[str, np.ndarray], steps: pd.DataFrame, seed: int,
               scored: np.ndarray | None = None) -> dict[str, Any]:  # fmt: skip
    """Train one critic by TD (seeded by ``seed``); the held-out V-vs-return correlation measures it.

    ``scored`` (states, N) marks the candidates the conservative term
    (``cfg.conservative`` > 0) pushes down, which needs it: stage 06 passes
    :func:`scored_candidates`.
    """
    if cfg.conservative > 0 and scored is None:
        raise ValueError("the conservative term needs the mask of the candidates it scores")
    torch.manual_seed(seed)
    held = split_trajectories(steps.traj_id.tolist(), cfg.holdout, seed)
    train_idx = np.flatnonzero(~steps.traj_id.isin(held).to_numpy())
    test_idx = np.flatnonzero(steps.traj_id.isin(held).to_numpy())
    data = transition_tensors(feats, steps)
    if cfg.conservative > 0:
        data["candidates"] = torch.from_numpy(np.asarray(feats["candidates"]))
        data["scored"] = torch.from_numpy(np.asarray(scored, bool))
    # The conservative term scores all N candidates of only the batch's first ``penalised`` states (all of them
    # would cost N TD steps); a row carries whether it is one, so that each process's share sums to the batch's.
    penalised = min(cfg.penalty_states, cfg.batch_size)
    names = ("q", "v", "conservative") if cfg.conservative > 0 else ("q", "v")
    dev = parallel.device()
    critic = build_critic(cfg, feats).to(dev)
    target = critic.target()
    opt = torch.optim.AdamW(critic.parameters(), lr=cfg.lr)
    curves: dict[str, list[float]] = {name: [] for name in names}
    rng = np.random.default_rng(seed)
    for _ in tqdm(range(cfg.epochs), desc=f"TD epochs (seed {seed})", leave=False, disable=not parallel.is_main()):
        for _step in range(0, len(train_idx), cfg.batch_size):  # one epoch of random minibatches
            opt.zero_grad()  # every process draws the same batch and takes its share of it (digiq.parallel)
            batch = train_idx[rng.integers(0, len(train_idx), cfg.batch_size)]
            rows = [(int(i), pos < penalised) for pos, i in enumerate(batch)]
            loss = parallel.backward_share(rows, lambda mine: batch_losses(cfg, critic, target, data, mine, penalised),
                                           critic.parameters(), names=names)  # fmt: skip
            opt.step()
            target.soft_update(critic, cfg.tau)
            for name in names:
                curves[name].append(loss[name])
    critic.eval()
    with torch.no_grad():
        v_held = torch.minimum(*critic.v(data["state"][test_idx].to(dev))).cpu().numpy()
    mc = steps.mc_return.to_numpy()[test_idx]
    corr = float(np.corrcoef(v_held, mc)[0, 1]) if len(test_idx) > 2 and mc.std() > 0 else float("nan")
    transitions = {k: data[k][train_idx].to(dev) for k in ("state", "next_state", "action", "reward", "done")}
    fit = td_fit(critic, transitions, cfg.gamma)
    return {"critic": critic, "curves": curves, "corr": corr, "train": len(train_idx), "heldout": len(test_idx),
            "train_rows": train_idx, **fit}  # fmt: skip


@torch.no_grad()
def td_fit(critic: Critic, data: dict[str, torch.Tensor], gamma: float) -> dict[str, float]:
    """How far Q of the taken actions is from its TD target, and from V, over ``data`` (the training transitions).

    Best-of-N keeps a pick when Q - V clears a fixed threshold, so Q and V
    must agree where they meet, at the taken action. A conservative term
    strong enough to outweigh TD moves Q off its target by a shift that
    differs from seed to seed, and with it the share of states kept.
    """
    q = torch.minimum(*critic.q(data["state"], data["action"]))
    target = _td_target(critic, data, gamma)
    gap = q - torch.minimum(*critic.v(data["state"]))
    return {"q_td_rmse": float(((q - target) ** 2).mean().sqrt()), "q_taken_minus_v": float(gap.mean())}


@torch.no_grad()
def rewarded_fit(critics: list[tuple[Critic, np.ndarray]], feats: dict[str, np.ndarray],
                 steps: pd.DataFrame) -> dict[str, dict[str, dict[str, float]]]:  # fmt: skip
    """Per task set and family: the rewarded steps each critic trained on, and its Q of their taken action.

    ``critics`` pairs each seed's critic with the rows it trained on
    (``fit_critic``'s ``train_rows``). A rewarded step ends its episode, so
    its TD target is exactly the reward, 1: a Q far below it means the critic
    cannot tell that step from the unrewarded ones it resembles, and no
    candidate that would finish the task there can stand out to Best-of-N.
    Both numbers are
    means over the seeds whose training split holds any of the family's
    rewarded steps; families with none in any split are left out.
    """
    per_seed = []
    for critic, rows in critics:
        rows = rows[steps.reward.to_numpy()[rows] > 0]
        dev = next(critic.parameters()).device
        state = torch.from_numpy(np.asarray(feats["state"])[rows]).to(dev)
        q = torch.minimum(*critic.q(state, torch.from_numpy(np.asarray(feats["candidates"])[rows, 0]).to(dev)))
        frame = steps.iloc[rows][["task_set", "family"]].assign(q=q.cpu().numpy())
        per_seed.append(frame.groupby(["task_set", "family"]).q.agg(["size", "mean"]))
    pooled = pd.concat(per_seed).groupby(level=[0, 1]).mean()
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (ts, family), row in pooled.iterrows():
        out.setdefault(str(ts), {})[str(family)] = {"steps": round(float(row["size"]), 1),
                                                    "q_taken": round(float(row["mean"]), 4)}  # fmt: skip
    return out


class CriticSpec(NamedTuple):
    """One critic stage 06 trains: whose VLM features it reads, and its settings."""

    vlm: str
    cfg: CriticConfig


def critic_specs(critic: CriticConfig, variants: dict[str, CriticConfig], rows: Sequence[str] = ("digiq",)
                 ) -> dict[str, CriticSpec]:  # fmt: skip
    """Every critic of the stage, by the row whose actor uses it.

    ``digiq`` is the paper's critic; each named variant changes some of its keys; the VLM ablations
    among ``rows`` (:func:`digiq.config.vlm_rows`) are the paper's critic on another VLM's features.
    """
    specs = {row: CriticSpec(VLM_OF_ROW[row], critic) for row in rows}
    specs.update({name: CriticSpec("finetuned", cfg) for name, cfg in variants.items()})
    return specs


class CriticJob(NamedTuple):
    """One critic of stage 06: a row's spec on one seed (``seed`` counts from 0; the fit's is ``cfg.seed + seed``)."""

    paths: Paths
    row: str
    spec: CriticSpec
    seed: int


def spec_inputs(paths: Paths, spec: CriticSpec) -> dict[str, np.ndarray]:
    """What the critic of ``spec`` reads per stored step: its VLM's features and the inputs its settings add."""
    cfg = spec.cfg
    return critic_inputs(paths, spec.vlm, text=cfg.text_features, targets=cfg.tap_targets, typed=cfg.typed_match,
                         entries=cfg.list_entries)  # fmt: skip


def _inputs(paths: Paths, spec: CriticSpec) -> dict[str, np.ndarray]:
    """The critic inputs of ``spec``, built once per process for each distinct set of inputs."""
    cfg = spec.cfg
    key = ("critic inputs", paths.root, spec.vlm, cfg.text_features, cfg.tap_targets, cfg.typed_match,
           cfg.list_entries)  # fmt: skip
    return process_cached(key, lambda: spec_inputs(paths, spec))


def transitions(paths: Paths) -> pd.DataFrame:
    """The stored steps' columns the critics train and are judged on, in the features' row order."""
    columns = ["traj_id", "reward", "done", "mc_return", "task_set", "family"]
    require("critic", paths.offline)
    return TrajectoryStore(paths.offline).read().select(columns).to_pandas()


def fit_critic_job(job: CriticJob) -> dict[str, Any]:
    """Fit and save one critic; its held-out correlation, TD fit, training rows and (seed 0) loss curves."""
    paths, (vlm, cfg) = job.paths, job.spec
    steps, feats = transitions(paths), _inputs(paths, job.spec)
    if len(steps) != feats["state"].shape[0]:
        raise DataError(f"features in {paths.features(vlm)} have {feats['state'].shape[0]} rows but "
                        f"{paths.offline} has {len(steps)} steps; rerun embed")  # fmt: skip
    scored = None
    if cfg.conservative > 0:
        scored = process_cached(
            ("scored", paths.root, cfg.tap_targets), lambda: scored_candidates(paths, cfg.tap_targets)
        )
    fit = fit_critic(cfg, feats, steps, cfg.seed + job.seed, scored)
    if parallel.is_main():
        fit["critic"].save(paths.critic(job.seed, job.row), stage="critic", row=job.row, vlm=vlm,
                           seed=cfg.seed + job.seed, steps=len(fit["curves"]["q"]), gamma=cfg.gamma)  # fmt: skip
    return {"corr": round(fit["corr"], 4), "fit": {k: round(fit[k], 4) for k in ("q_td_rmse", "q_taken_minus_v")},
            "train_rows": fit["train_rows"], "train": fit["train"], "heldout": fit["heldout"],
            "curves": fit["curves"] if job.seed == 0 else {}}  # fmt: skip


@one_run_at_a_time("critic")
def run_critic(specs: dict[str, CriticSpec], paths: Paths, seeds: int = 1, workers: int = 1) -> dict[str, Any]:
    """One critic per (row, seed): ``data/models/critic/seed<s>/<row>``, the fits shared among ``workers`` processes.

    Metrics at the top level are Digi-Q's critic's; ``by_critic`` holds every critic's held-out
    V-vs-return correlation and TD fit per seed.
    """
    for spec in specs.values():
        require("critic", paths.features(spec.vlm))
    metrics: dict[str, Any] = {}
    # Inside the block, paths.critics is a temporary folder, swapped in whole at its end.
    with written_whole(paths, "critics") as paths, timed(metrics):
        jobs = [CriticJob(paths, row, spec, seed) for row, spec in specs.items() for seed in range(seeds)]
        fits = dict(zip([(j.row, j.seed) for j in jobs], map_jobs(fit_critic_job, jobs, workers), strict=True))
        curves: dict[str, list[float]] = {}
        by_critic: dict[str, Any] = {}
        for row, spec in specs.items():
            mine = [fits[(row, seed)] for seed in range(seeds)]
            curves.update({f"{loss} loss ({row})": c for loss, c in mine[0]["curves"].items()})
            corrs = [f["corr"] for f in mine]
            by_critic[row] = {"vlm": spec.vlm, "v_mc_return_corr_heldout": round(float(np.mean(corrs)), 4),
                              "v_mc_return_corr_heldout_per_seed": corrs,
                              "td_fit_per_seed": [f["fit"] for f in mine]}  # fmt: skip
        paper = fits[("digiq", 0)]
        metrics.update({"transitions_train": paper["train"], "transitions_heldout": paper["heldout"],
                        "v_mc_return_corr_heldout": by_critic["digiq"]["v_mc_return_corr_heldout"]})  # fmt: skip
        metrics.update({f"{loss}_loss_last": round(float(np.mean(c[-50:])), 5)
                        for loss, c in paper["curves"].items()})  # fmt: skip
        parallel.barrier()  # the main process saved the critics
        trained = [(Critic.load(paths.critic(seed, "digiq")), fits[("digiq", seed)]["train_rows"])
                   for seed in range(seeds)]  # fmt: skip
        metrics["rewarded_steps"] = rewarded_fit(trained, spec_inputs(paths, specs["digiq"]), transitions(paths))
        metrics["by_critic"] = by_critic
    if parallel.is_main():
        save_curve_plot(paths.plots / "critic_td_loss.png", curves, "Stage 06: TD losses (seed 0)")
        write_metrics(paths, "critic", metrics)
    parallel.barrier()
    return metrics


def from_params(params: dict[str, Any], paths: Paths) -> dict[str, Any]:
    """Stage 06 as ``params.yaml`` sets it (:func:`digiq.stages.launch.run_stage` runs it in one process or several)."""
    specs = critic_specs(load_section(CriticConfig, "critic", params), load_variants(params),
                         vlm_rows(load_section(AblationsConfig, "ablations", params)))  # fmt: skip
    return run_critic(
        specs,
        paths,
        seeds=load_section(ExperimentConfig, "experiment", params).seeds,
        workers=load_section(ComputeConfig, "compute", params).workers,
    )
