"""Digi-Q's learning rule (digiq.algos.digiq): the twin heads' two conventions and the critic's optimiser."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from digiq.algos.digiq import build_critic, fit_critic, q_targets, td_losses
from digiq.config import CriticConfig
from digiq.models.critic import Critic, CriticNetConfig


def constant_critic(twin: str, q: tuple[float, float], v: tuple[float, float]) -> Critic:
    """A critic whose heads output constants: Q_1, Q_2 = ``q`` and V_1, V_2 = ``v`` whatever the input."""
    critic = Critic(CriticNetConfig(feature_dim=3, hidden=4, twin=twin))
    with torch.no_grad():
        for head, value in zip((critic.q1, critic.q2, critic.v1, critic.v2), (*q, *v), strict=True):
            head[-1].weight.zero_()
            head[-1].bias.fill_(value)
    return critic


BATCH = {"state": torch.zeros(2, 3), "next_state": torch.zeros(2, 3), "action": torch.zeros(2, 3),
         "reward": torch.tensor([0.0, 1.0]), "done": torch.tensor([0.0, 1.0])}  # fmt: skip


def test_each_head_regresses_on_its_own_target_head_or_both_on_their_minimum():
    own = q_targets(constant_critic("each", (0.5, 0.9), (0.2, 0.6)), BATCH, gamma=0.5)
    assert torch.allclose(own[0], torch.tensor([0.1, 1.0])) and torch.allclose(own[1], torch.tensor([0.3, 1.0]))
    low = q_targets(constant_critic("min", (0.5, 0.9), (0.2, 0.6)), BATCH, gamma=0.5)
    assert torch.allclose(low[0], torch.tensor([0.1, 1.0])) and torch.equal(low[0], low[1])
    # V_j's target is the target critic's Q_j of the action taken (each), or their minimum for both (min).
    target = constant_critic("each", (0.5, 0.9), (0.2, 0.6))
    zero = constant_critic("each", (0.0, 0.0), (0.0, 0.0))
    _, v_loss = td_losses(zero, target, BATCH, gamma=0.5)
    assert v_loss.item() == pytest.approx(0.5**2 + 0.9**2)
    _, v_loss = td_losses(zero, constant_critic("min", (0.5, 0.9), (0.2, 0.6)), BATCH, gamma=0.5)
    assert v_loss.item() == pytest.approx(2 * 0.5**2)


def test_the_actor_reads_the_minimum_of_the_heads_or_released_digiq_s_maximum():
    actions = torch.zeros(1, 4, 3)
    _, _, low = constant_critic("min", (0.5, 0.9), (0.2, 0.3)).advantage(torch.zeros(1, 3), actions)
    _, _, high = constant_critic("each", (0.5, 0.9), (0.2, 0.3)).advantage(torch.zeros(1, 3), actions)
    assert torch.allclose(low, torch.full((1, 4), 0.3)) and torch.allclose(high, torch.full((1, 4), 0.6))
    with pytest.raises(ValueError, match="twin must be one of"):
        CriticNetConfig(feature_dim=3, twin="mean")
    with pytest.raises(ValueError, match="twin_heads must be one of"):
        CriticConfig(twin_heads="mean")


def _chain_data(trajectories: int = 8) -> tuple[dict[str, np.ndarray], pd.DataFrame]:
    """Two-step episodes s0 -> s1 -> end with reward 1 at the end; features one-hot, two candidates per state."""
    eye = np.eye(3, dtype=np.float32)
    state = np.tile(eye[[0, 1]], (trajectories, 1))
    feats = {"state": state, "next_state": np.tile(eye[[1, 2]], (trajectories, 1)),
             "candidates": np.stack([state, state[:, ::-1]], axis=1)}  # fmt: skip
    steps = pd.DataFrame({"traj_id": np.repeat(np.arange(trajectories), 2), "reward": [0.0, 1.0] * trajectories,
                          "done": [False, True] * trajectories, "mc_return": [0.95, 1.0] * trajectories})  # fmt: skip
    return feats, steps


def _moved(cfg: CriticConfig, seed: int = 3) -> float:
    """The largest change of any weight over ``cfg``'s fit on the chain."""
    feats, steps = _chain_data()
    torch.manual_seed(seed)  # fit_critic seeds torch with its seed before it builds the critic
    start = build_critic(cfg, feats)
    fitted = fit_critic(cfg, feats, steps, seed)["critic"]
    return max(
        float((a - b).detach().abs().max()) for a, b in zip(start.parameters(), fitted.parameters(), strict=True)
    )


def test_the_critic_s_gradient_is_clipped_to_its_norm():
    """Clipped to a norm far below Adam's epsilon, every step is about epsilon's share of a full one."""
    cfg = CriticConfig(steps=9, batch_size=4, hidden=8, holdout=0.25, lr=1e-2, weight_decay=0.0)
    free, clipped = _moved(cfg), _moved(dataclasses.replace(cfg, grad_clip=1e-12))
    assert free > 1e-2 and clipped < free / 100


def test_every_seed_s_critic_holds_out_the_same_trajectories():
    """The diagnostics judge every seed's critic on trajectories none trained on: one held-out set per config."""
    feats, steps = _chain_data(trajectories=10)
    cfg = CriticConfig(steps=2, batch_size=4, hidden=8, holdout=0.3)
    fits = [fit_critic(cfg, feats, steps, seed) for seed in (1, 2)]
    assert np.array_equal(fits[0]["train_rows"], fits[1]["train_rows"]) and fits[0]["heldout"] == 6  # 3 of 10
    other = fit_critic(dataclasses.replace(cfg, seed=cfg.seed + 1), feats, steps, 1)
    assert not np.array_equal(other["train_rows"], fits[0]["train_rows"])  # drawn by critic.seed
