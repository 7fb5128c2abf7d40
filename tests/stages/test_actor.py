"""Stage 06: Best-of-N's pick."""

import numpy as np
import torch

from digiq.models.critic import Critic, CriticNetConfig
from digiq.stages.actor import best_of_n


def test_best_of_n_picks_the_highest_valid_advantage():
    class Fixed(Critic):
        def advantage(self, state, actions):
            q = actions[..., 0]
            return q, torch.zeros(len(state)), q

    critic = Fixed(CriticNetConfig(feature_dim=1))
    cands = np.array([[[0.1], [0.9], [0.5]], [[0.3], [0.2], [0.1]]], np.float32)
    valid = np.array([[True, False, True], [True, True, True]])
    best, adv = best_of_n(critic, np.zeros((2, 1), np.float32), cands, valid, k=3, rng=np.random.default_rng(0))
    assert best.tolist() == [2, 0] and np.allclose(adv, [0.5, 0.3])  # the invalid 0.9 is never chosen
    best, _ = best_of_n(critic, np.zeros((2, 1), np.float32), cands, valid, k=1, rng=np.random.default_rng(0))
    assert best.tolist() == [0, 0]  # K = 1: only the taken action
