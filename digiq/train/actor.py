"""Stage 06: Best-of-N policy extraction from the critic.

For each state, K of the N candidates (always with the action taken) are
scored by the critic, A = Q(s, a) - V(s); the best valid one is kept when
its advantage clears a threshold, and the policy (initialised from the base
policy) is fit by negative log-likelihood of the kept actions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from digiq.config import ActorConfig
from digiq.data.trajectories import TrajectoryStore
from digiq.models.critic import Critic
from digiq.models.policy import AutoUIPolicy
from digiq.paths import Paths
from digiq.stagekit import require, save_curve_plot, timed, write_metrics
from digiq.train.augment import read_candidates
from digiq.train.embed import load_features
from digiq.train.policy_fit import FitRow, fit_policy, load_screens

__all__ = ["run_actor", "best_of_n"]


def best_of_n(critic: Critic, state: np.ndarray, candidates: np.ndarray, valid: np.ndarray, k: int,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Per state: the index of the best valid candidate among K drawn (0 always in), and its advantage."""
    S, N = valid.shape
    drawn = np.zeros((S, N), bool)
    drawn[:, 0] = True
    for i in range(S):
        drawn[i, 1 + rng.permutation(N - 1)[: max(0, min(k, N) - 1)]] = True
    _, _, adv = critic.advantage(torch.from_numpy(np.asarray(state)), torch.from_numpy(np.asarray(candidates)))
    adv = adv.numpy()
    adv[~(drawn & valid)] = -np.inf
    best = adv.argmax(1)
    return best, adv[np.arange(S), best]


def run_actor(cfg: ActorConfig, paths: Paths) -> dict[str, Any]:
    require("actor", paths.critic / "config.json", paths.base_policy / "config.json")
    metrics: dict[str, Any] = {}
    with timed(metrics):
        rng = np.random.default_rng(cfg.seed)
        critic = Critic.load(paths.critic)
        feats = load_features(paths)
        cands = read_candidates(paths).to_pylist()
        store = TrajectoryStore(paths.offline)
        steps = store.read().select(["observation", "image_path", "task_set"]).to_pylist()
        valid = np.array([c["valid_list"] for c in cands])
        best, adv = best_of_n(critic, feats["state"], feats["candidates"], valid, cfg.k_candidates, rng)
        threshold = np.array(
            [cfg.threshold_webshop if s["task_set"] == "webshop" else cfg.threshold_general for s in steps]
        )
        keep = np.flatnonzero(adv > threshold)
        rows = [FitRow(steps[i]["observation"], steps[i]["image_path"], cands[i]["action_list"][best[i]]) for i in keep]
        model = AutoUIPolicy.load(paths.base_policy)
        curve: list[dict[str, float]] = []
        if rows:
            screens = load_screens(model, store, [r.image_path for r in rows])
            curve = fit_policy(model, rows, screens, epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
                               seed=cfg.seed, desc="fit Best-of-N actor")  # fmt: skip
        model.save(paths.actor("digiq"), stage="actor", method="best_of_n", kept=len(rows))
    metrics.update(
        {
            "states": len(steps),
            "kept": len(rows),
            "kept_fraction": round(len(rows) / max(1, len(steps)), 4),
            "kept_not_taken_fraction": round(float(np.mean(best[keep] != 0)) if len(keep) else 0.0, 4),
            "mean_kept_advantage": round(float(adv[keep].mean()) if len(keep) else 0.0, 4),
        }
    )
    if curve:
        save_curve_plot(paths.plots / "actor_loss.png", {"digiq": [p["loss"] for p in curve]}, "Stage 06: actor NLL")
    write_metrics(paths, "actor", metrics)
    return metrics
