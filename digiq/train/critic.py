"""Stage 05: TD learning of double Q and V heads on frozen VLM features.

Q target: r + gamma * (1 - done) * V_target(s');  V target: Q_target(s, a_data)
(pessimistic minima of the twin heads), target networks soft-updated with tau.
This is Digi-Q's critic; the features stay frozen, so it trains in seconds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from digiq.config import CriticConfig
from digiq.data.trajectories import TrajectoryStore
from digiq.models.critic import Critic, CriticNetConfig
from digiq.paths import Paths
from digiq.stagekit import require, save_curve_plot, timed, write_metrics
from digiq.train.embed import load_features
from digiq.train.vlm_finetune import split_trajectories

__all__ = ["run_critic", "td_step"]


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


def run_critic(cfg: CriticConfig, paths: Paths) -> dict[str, Any]:
    require("critic", paths.features)
    metrics: dict[str, Any] = {}
    with timed(metrics):
        torch.manual_seed(cfg.seed)
        feats = load_features(paths)
        steps = TrajectoryStore(paths.offline).read().select(["traj_id", "reward", "done", "mc_return"]).to_pandas()
        if len(steps) != feats["state"].shape[0]:
            raise ValueError(f"features in {paths.features} have {feats['state'].shape[0]} rows but {paths.offline} "
                             f"has {len(steps)} steps; rerun embed")  # fmt: skip
        held = split_trajectories(steps.traj_id.tolist(), cfg.holdout, cfg.seed)
        train_idx = np.flatnonzero(~steps.traj_id.isin(held).to_numpy())
        test_idx = np.flatnonzero(steps.traj_id.isin(held).to_numpy())
        data = {
            "state": torch.from_numpy(np.asarray(feats["state"])),
            "next_state": torch.from_numpy(np.asarray(feats["next_state"])),
            "action": torch.from_numpy(np.asarray(feats["candidates"][:, 0])),  # index 0: the action taken
            "reward": torch.tensor(steps.reward.to_numpy(), dtype=torch.float32),
            "done": torch.tensor(steps.done.to_numpy(), dtype=torch.float32),
        }
        critic = Critic(CriticNetConfig(feature_dim=data["state"].shape[1], hidden=cfg.hidden))
        target = critic.target()
        opt = torch.optim.AdamW(critic.parameters(), lr=cfg.lr)
        q_curve, v_curve = [], []
        rng = np.random.default_rng(cfg.seed)
        for _ in tqdm(range(cfg.epochs), desc="TD epochs", leave=False):
            for _step in range(0, len(train_idx), cfg.batch_size):  # one epoch of random minibatches
                idx = torch.from_numpy(train_idx[rng.integers(0, len(train_idx), cfg.batch_size)])
                q_loss, v_loss = td_step(critic, target, {k: v[idx] for k, v in data.items()}, cfg.gamma)
                opt.zero_grad()
                (q_loss + v_loss).backward()
                opt.step()
                target.soft_update(critic, cfg.tau)
                q_curve.append(float(q_loss))
                v_curve.append(float(v_loss))
        critic.eval()
        critic.save(paths.critic, stage="critic", steps=len(q_curve), gamma=cfg.gamma)
        with torch.no_grad():
            v_held = torch.minimum(*critic.v(data["state"][test_idx])).numpy()
        mc = steps.mc_return.to_numpy()[test_idx]
        corr = float(np.corrcoef(v_held, mc)[0, 1]) if len(test_idx) > 2 and mc.std() > 0 else float("nan")
    metrics.update(
        {
            "transitions_train": int(len(train_idx)),
            "transitions_heldout": int(len(test_idx)),
            "q_loss_last": round(float(np.mean(q_curve[-50:])), 5),
            "v_loss_last": round(float(np.mean(v_curve[-50:])), 5),
            "v_mc_return_corr_heldout": round(corr, 4),
        }
    )
    save_curve_plot(paths.plots / "critic_td_loss.png", {"Q loss": q_curve, "V loss": v_curve}, "Stage 05: TD losses")
    write_metrics(paths, "critic", metrics)
    return metrics
