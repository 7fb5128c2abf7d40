"""Digi-Q's learning rule (digiq.algos.digiq): the twin heads' two conventions, the critic's optimiser, and the
critic's scoring of every stored candidate (each state's share of the first layer once, each distinct candidate once)."""

import numpy as np
import pandas as pd
import pytest
import torch

from digiq.algos.digiq import build_critic, drawn_advantages, drawn_among, fit_critic, q_targets, td_losses
from digiq.config import CriticConfig
from digiq.models.critic import SCORE_BLOCK, Critic, CriticNetConfig, mlp, pair_mlp, same_candidates


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
    cfg = CriticConfig(steps=9, batch_size=4, hidden=8, holdout=0.25, lr=1e-2, weight_decay=0.0, text_encoder="frozen")
    free, clipped = _moved(cfg), _moved(cfg.but(grad_clip=1e-12))
    assert free > 1e-2 and clipped < free / 100


def test_every_seed_s_critic_holds_out_the_same_trajectories():
    """The diagnostics judge every seed's critic on trajectories none trained on: one held-out set per config."""
    feats, steps = _chain_data(trajectories=10)
    cfg = CriticConfig(steps=2, batch_size=4, hidden=8, holdout=0.3, text_encoder="frozen")
    fits = [fit_critic(cfg, feats, steps, seed) for seed in (1, 2)]
    assert np.array_equal(fits[0]["train_rows"], fits[1]["train_rows"]) and fits[0]["heldout"] == 6  # 3 of 10
    other = fit_critic(cfg.but(seed=cfg.seed + 1), feats, steps, 1)
    assert not np.array_equal(other["train_rows"], fits[0]["train_rows"])  # drawn by critic.seed


def _candidates(states: int, n: int, width: int, seed: int) -> np.ndarray:
    """(states, n, width) features in which each state repeats some of its candidates, as the base's samples do,
    and two candidates differ in one feature by one unit in the last place."""
    rng = np.random.default_rng(seed)
    rows = (rng.normal(size=(states, n, width)) + 3.0).astype(np.float32)  # off zero: the layer norm's mean counts
    picks = rng.integers(0, n // 2, size=(states, n))
    picks[:, 0] = 0
    out = np.take_along_axis(rows, picks[..., None], 1)
    out[0, -1] = out[0, 0]
    out[0, -1, 3] = np.nextafter(out[0, 0, 3], np.float32(np.inf))  # all but equal: a distinct candidate
    return out


def test_same_candidates_marks_each_repeat_by_its_first_equal_column_and_nothing_else():
    c = _candidates(SCORE_BLOCK + 37, 8, 12, seed=0)  # more states than one block holds
    want = np.array([[next(j for j in range(8) if np.array_equal(row[j], row[k])) for k in range(8)] for row in c])
    got = same_candidates(torch.from_numpy(c)).numpy()
    assert np.array_equal(got, want)
    assert got[0, -1] == 7  # one bit apart is not a repeat
    assert (got != np.arange(8)).mean() > 0.3  # the repeats are there to be found


@pytest.mark.parametrize("hidden", [16, None])
def test_pair_mlp_is_the_net_on_the_concatenated_rows_to_float_rounding_gradients_too(hidden):
    """What the critic's heads and the expert rankers read: the LayerNorm and first layer split between the state's
    columns and the candidate's, each distinct candidate once, against the net on every (state, candidate) row."""
    rng = np.random.default_rng(1)
    state = torch.from_numpy((rng.normal(size=(40, 10)) - 2.0).astype(np.float32))
    cands = torch.from_numpy(_candidates(40, 6, 7, seed=2))
    torch.manual_seed(0)
    net = mlp(17, hidden) if hidden else torch.nn.Sequential(torch.nn.LayerNorm(17), torch.nn.Linear(17, 1))
    with torch.no_grad():  # an affine layer norm that is not the identity
        net[0].weight.uniform_(0.5, 1.5)
        net[0].bias.normal_()
    whole = net(torch.cat([state[:, None].expand(-1, 6, -1), cands], -1))[..., 0]
    split = pair_mlp(net, state, cands)
    torch.testing.assert_close(split, whole, rtol=0, atol=2e-6 * float(whole.abs().max()))
    weights = torch.randn(whole.shape)
    for a, b in zip(torch.autograd.grad((whole * weights).sum(), list(net.parameters())),
                    torch.autograd.grad((split * weights).sum(), list(net.parameters())), strict=True):  # fmt: skip
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5 * float(a.abs().max()))
    assert torch.equal(pair_mlp(net, state, cands, same_candidates(cands)), split)  # the map given or computed


def test_pair_mlp_names_inputs_that_do_not_make_the_net_s_rows():
    with pytest.raises(ValueError, match=r"states \(3, 4\) and candidates \(3, 2, 4\) do not make the 9-wide rows"):
        pair_mlp(mlp(9, 4), torch.zeros(3, 4), torch.zeros(3, 2, 4))
    with pytest.raises(ValueError, match="starts with an affine LayerNorm and a Linear"):
        pair_mlp(torch.nn.Sequential(torch.nn.Linear(9, 1)), torch.zeros(3, 4), torch.zeros(3, 2, 5))


@pytest.mark.parametrize("twin", ["min", "each"])
def test_the_critic_s_scores_are_q_and_v_of_every_row_to_float_rounding(twin):
    """Critic.advantage, which stage 07 stores for every critic and seed, against each head on the concatenated rows
    (how it scored before), over more states than one block."""
    S = SCORE_BLOCK + 100
    rng = np.random.default_rng(3)
    state = torch.from_numpy(rng.normal(size=(S, 12)).astype(np.float32))
    cands = torch.from_numpy(_candidates(S, 8, 9, seed=4))
    torch.manual_seed(1)
    critic = Critic(CriticNetConfig(feature_dim=12, action_dim=9, hidden=32, twin=twin)).eval()
    q, v, a = critic.advantage(state, cands)
    with torch.no_grad():
        want_q = critic.joined(critic.q(state[:, None].expand(-1, 8, -1), cands))
        want_v = critic.joined(critic.v(state))
    assert torch.equal(v, want_v) and torch.equal(a, q - v[:, None])
    torch.testing.assert_close(q, want_q, rtol=0, atol=1e-6)
    same = same_candidates(cands)
    assert torch.equal(q, q.gather(1, same))  # repeats share one value, as they share one set of features


def test_advantages_computed_once_are_drawn_from_as_the_critic_s_own():
    """drawn_among over a stored A = Q - V draws and masks exactly as drawn_advantages asking the critic."""
    rng = np.random.default_rng(5)
    state = rng.normal(size=(30, 6)).astype(np.float32)
    cands = _candidates(30, 5, 6, seed=6)
    valid = rng.uniform(size=(30, 5)) > 0.3
    critic = Critic(CriticNetConfig(feature_dim=6, hidden=8)).eval()
    _, _, adv = critic.advantage(torch.from_numpy(state), torch.from_numpy(cands))
    for k in (1, 3, 5):
        asked = drawn_advantages(critic, {"state": state, "candidates": cands}, valid, k, np.random.default_rng(k))
        assert np.array_equal(drawn_among(adv.numpy(), valid, k, np.random.default_rng(k)), asked)
