"""Stage 05: TD learning of double Q and V heads on frozen VLM features.

Q target: r + gamma * (1 - done) * V_target(s');  V target: Q_target(s, a_data)
(pessimistic minima of the twin heads), target networks soft-updated with tau.
This is Digi-Q's critic; the features stay frozen, so it trains in seconds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from digiq import parallel
from digiq.config import CriticConfig
from digiq.data.trajectories import DataError, TrajectoryStore
from digiq.models.critic import Critic, CriticNetConfig
from digiq.paths import Paths
from digiq.stagekit import require, save_curve_plot, timed, write_metrics
from digiq.train.embed import load_features
from digiq.train.vlm_finetune import split_trajectories

__all__ = ["run_critic", "fit_critic", "td_step"]


def td_step(
    critic: Critic, target: Critic, batch: dict[str, torch.Tensor], gamma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Q and V losses of one batch of transitions."""
    with torch.no_grad():
        v_next = torch.minimum(*target.v(batch["next_state"]))
        q_target = batch["reward"] + gamma * (1 - batch["done"]) * v_next
        v_target = torch.minimum(*target.q(batch["state"], batch["action"]))
    q1, q2 = critic.q(batch["state"], batch["action"])
    v1, v2 = critic.v(batch["state"])
    return F.mse_loss(q1, q_target) + F.mse_loss(q2, q_target), F.mse_loss(v1, v_target) + F.mse_loss(v2, v_target)


def fit_critic(cfg: CriticConfig, feats: dict[str, np.ndarray], steps: pd.DataFrame, seed: int) -> dict[str, Any]:
    """Train one critic by TD (seeded by ``seed``); the held-out V-vs-return correlation measures it."""
    torch.manual_seed(seed)
    held = split_trajectories(steps.traj_id.tolist(), cfg.holdout, seed)
    train_idx = np.flatnonzero(~steps.traj_id.isin(held).to_numpy())
    test_idx = np.flatnonzero(steps.traj_id.isin(held).to_numpy())
    data = {
        "state": torch.from_numpy(np.asarray(feats["state"])),
        "next_state": torch.from_numpy(np.asarray(feats["next_state"])),
        "action": torch.from_numpy(np.asarray(feats["candidates"][:, 0])),  # index 0: the action taken
        "reward": torch.tensor(steps.reward.to_numpy(), dtype=torch.float32),
        "done": torch.tensor(steps.done.to_numpy(), dtype=torch.float32),
    }
    dev = parallel.device()
    critic = Critic(CriticNetConfig(feature_dim=data["state"].shape[1], hidden=cfg.hidden)).to(dev)
    target = critic.target()
    opt = torch.optim.AdamW(critic.parameters(), lr=cfg.lr)
    q_curve, v_curve = [], []
    rng = np.random.default_rng(seed)
    for _ in tqdm(range(cfg.epochs), desc=f"TD epochs (seed {seed})", leave=False, disable=not parallel.is_main()):
        for _step in range(0, len(train_idx), cfg.batch_size):  # one epoch of random minibatches

            def losses(mine: list[int]) -> dict[str, torch.Tensor]:
                idx = torch.as_tensor(np.asarray(mine))
                q_loss, v_loss = td_step(critic, target, {k: t[idx].to(dev) for k, t in data.items()}, cfg.gamma)
                return {"q": q_loss, "v": v_loss}

            opt.zero_grad()  # every process draws the same batch and takes its share of it (digiq.parallel)
            batch = train_idx[rng.integers(0, len(train_idx), cfg.batch_size)]
            loss = parallel.backward_share(batch, losses, critic.parameters(), names=("q", "v"))
            opt.step()
            target.soft_update(critic, cfg.tau)
            q_curve.append(loss["q"])
            v_curve.append(loss["v"])
    critic.eval()
    with torch.no_grad():
        v_held = torch.minimum(*critic.v(data["state"][test_idx].to(dev))).cpu().numpy()
    mc = steps.mc_return.to_numpy()[test_idx]
    corr = float(np.corrcoef(v_held, mc)[0, 1]) if len(test_idx) > 2 and mc.std() > 0 else float("nan")
    return {"critic": critic, "q_curve": q_curve, "v_curve": v_curve, "corr": corr, "train": len(train_idx),
            "heldout": len(test_idx)}  # fmt: skip


def run_critic(cfg: CriticConfig, paths: Paths, seeds: int = 1, untuned: bool = False) -> dict[str, Any]:
    """One critic per seed on the fine-tuned VLM's features (and on the untuned ones, for the ablation)."""
    vlms = ("finetuned", "untuned") if untuned else ("finetuned",)
    for vlm in vlms:
        require("critic", paths.features(vlm))
    metrics: dict[str, Any] = {}
    with timed(metrics):
        steps = TrajectoryStore(paths.offline).read().select(["traj_id", "reward", "done", "mc_return"]).to_pandas()
        curves: dict[str, list[float]] = {}
        for vlm in vlms:
            feats = load_features(paths, vlm)
            if len(steps) != feats["state"].shape[0]:
                raise DataError(f"features in {paths.features(vlm)} have {feats['state'].shape[0]} rows but "
                                f"{paths.offline} has {len(steps)} steps; rerun embed")  # fmt: skip
            corrs = []
            for seed in range(seeds):
                fit = fit_critic(cfg, feats, steps, cfg.seed + seed)
                if parallel.is_main():
                    fit["critic"].save(paths.critic(seed, vlm), stage="critic", vlm=vlm, seed=cfg.seed + seed,
                                       steps=len(fit["q_curve"]), gamma=cfg.gamma)  # fmt: skip
                corrs.append(round(fit["corr"], 4))
                if seed == 0:
                    curves[f"Q loss ({vlm})"], curves[f"V loss ({vlm})"] = fit["q_curve"], fit["v_curve"]
                    if vlm == "finetuned":
                        metrics.update({"transitions_train": fit["train"], "transitions_heldout": fit["heldout"],
                                        "q_loss_last": round(float(np.mean(fit["q_curve"][-50:])), 5),
                                        "v_loss_last": round(float(np.mean(fit["v_curve"][-50:])), 5)})  # fmt: skip
            key = "v_mc_return_corr_heldout" + ("" if vlm == "finetuned" else "_untuned")
            metrics[key] = round(float(np.mean(corrs)), 4)
            metrics[key + "_per_seed"] = corrs
    if parallel.is_main():
        save_curve_plot(paths.plots / "critic_td_loss.png", curves, "Stage 05: TD losses (seed 0)")
        write_metrics(paths, "critic", metrics)
    parallel.barrier()
    return metrics
