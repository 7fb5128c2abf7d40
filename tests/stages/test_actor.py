"""The actor stage: Best-of-N's pick, the extraction ablation's weights, and the stage at a tiny size."""

import shutil

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from digiq.algos.digiq import (
    best_of_n,
    best_of_n_picks,
    drawn_advantages,
    extraction_picks,
    extraction_weights,
)
from digiq.config import ActorConfig, load_params
from digiq.data.picks import read_picks
from digiq.models.critic import Critic, CriticNetConfig, trained_inputs
from digiq.models.policy import AutoUIPolicy
from digiq.paths import Paths
from digiq.stages.actor import run as actor_stage
from digiq.stages.launch import run_stage


class Fixed(Critic):
    """A critic whose Q is a candidate's only feature and whose V is the state's: A = candidate - state."""

    def advantage(self, state, actions):
        q = actions[..., 0]
        return q, state[:, 0], q - state[:, :1]


def _fixed_states():
    """Eight states of six candidates: drawn features, a validity mask (state 3: no valid candidate)."""
    rng = np.random.default_rng(0)
    cands = rng.normal(size=(8, 6, 1)).astype(np.float32)
    state = rng.normal(scale=0.3, size=(8, 1)).astype(np.float32)
    valid = rng.uniform(size=(8, 6)) > 0.3
    valid[3] = False
    return state, cands, valid


def test_best_of_n_picks_the_highest_valid_advantage():
    critic = Fixed(CriticNetConfig(feature_dim=1))
    cands = np.array([[[0.1], [0.9], [0.5]], [[0.3], [0.2], [0.1]]], np.float32)
    valid = np.array([[True, False, True], [True, True, True]])
    state = np.zeros((2, 1), np.float32)
    best, adv = best_of_n(drawn_advantages(critic, state, cands, valid, k=3, rng=np.random.default_rng(0)))
    assert best.tolist() == [2, 0] and np.allclose(adv, [0.5, 0.3])  # the invalid 0.9 is never chosen
    best, _ = best_of_n(drawn_advantages(critic, state, cands, valid, k=1, rng=np.random.default_rng(0)))
    assert best.tolist() == [0, 0]  # K = 1: only the taken action


def test_best_of_n_picks_are_those_of_the_stage_before_the_extraction_ablation():
    """The same seed draws the same candidates and keeps the same rows as Best-of-N did when it drew them itself.

    The expected picks were written down from that earlier code: a change in how candidates are drawn (the
    random stream, the order, the count) or scored changes them.
    """
    state, cands, valid = _fixed_states()
    critic = Fixed(CriticNetConfig(feature_dim=1))
    a = cands[..., 0] - state
    # (K, each state's pick, the states with no valid drawn candidate: K = 1 draws only the taken action)
    for k, expected, none in ((1, [0] * 8, [1, 3, 6]), (3, [0, 1, 5, 0, 0, 3, 2, 0], [3]),
                              (6, [0, 1, 5, 0, 0, 3, 5, 5], [3])):  # fmt: skip
        best, adv = best_of_n(drawn_advantages(critic, state, cands, valid, k, np.random.default_rng(7)))
        assert best.tolist() == expected, k
        assert np.array_equal(adv, np.where(np.isin(np.arange(8), none), -np.inf, a[np.arange(8), best])), k
    steps = pd.DataFrame({"task_set": ["general", "webshop"] * 4})
    adv = drawn_advantages(critic, state, cands, valid, 3, np.random.default_rng(7))
    picks, stats = best_of_n_picks(ActorConfig(), adv, steps)
    assert picks.states.tolist() == [1, 4, 5, 6, 7] and picks.columns.tolist() == [1, 0, 3, 2, 0]
    assert picks.weights is None and picks.row_weights().tolist() == [1.0] * 5  # every Best-of-N row weighs 1
    assert stats["kept_not_taken_fraction"] == pytest.approx(3 / 5)


def test_awr_and_reinforce_weigh_every_drawn_valid_candidate_and_nothing_else():
    inf = np.inf
    # State 0: candidate 1 not drawn or invalid; state 1: only candidates 1 and 2; state 2: nothing to imitate.
    adv = np.array([[0.1, -inf, 0.5, -0.2], [-inf, 0.0, 1.0, -inf], [-inf, -inf, -inf, -inf]])
    cfg = ActorConfig(awr_beta=0.1, awr_max_weight=20.0)
    awr = extraction_weights(cfg, "awr", adv)
    e = np.exp
    expected = np.array([[e(1.0), np.nan, 20.0, e(-2.0)], [np.nan, 1.0, 20.0, np.nan], [np.nan] * 4])
    np.testing.assert_allclose(awr, expected, rtol=1e-12)  # exp(5) and exp(10) are clipped at 20
    reinforce = extraction_weights(cfg, "reinforce", adv)
    np.testing.assert_array_equal(reinforce, np.where(np.isfinite(adv), adv, np.nan))  # the advantage itself
    assert extraction_weights(ActorConfig(awr_max_weight=2.0), "awr", adv)[0, 2] == 2.0  # the clip is the knob
    assert extraction_weights(ActorConfig(awr_beta=1.0), "awr", adv)[1, 2] == pytest.approx(e(1.0))
    with pytest.raises(ValueError, match="unknown extraction 'ppo'"):
        extraction_weights(cfg, "ppo", adv)

    picks, stats = extraction_picks(cfg, "awr", adv)
    assert list(zip(picks.states.tolist(), picks.columns.tolist(), strict=True)) == [(0, 0), (0, 2), (0, 3), (1, 1),
                                                                                     (1, 2)]  # fmt: skip
    np.testing.assert_allclose(picks.weights, [e(1.0), 20.0, e(-2.0), 1.0, 20.0])
    assert stats["clipped_fraction"] == pytest.approx(2 / 5) and stats["weight_max"] == 20.0
    picks, stats = extraction_picks(cfg, "reinforce", adv)
    np.testing.assert_array_equal(picks.weights, [0.1, 0.5, -0.2, 0.0, 1.0])
    assert stats["negative_fraction"] == pytest.approx(1 / 5) and stats["weight_min"] == -0.2
    assert stats["weight_mean"] == pytest.approx(1.4 / 5)


def test_the_extractions_imitate_exactly_the_candidates_best_of_n_drew():
    state, cands, valid = _fixed_states()
    critic = Fixed(CriticNetConfig(feature_dim=1))
    for k in (1, 3, 6):
        adv = drawn_advantages(critic, state, cands, valid, k, np.random.default_rng(7))
        best, best_adv = best_of_n(adv)
        for method in ("awr", "reinforce"):
            picks, _ = extraction_picks(ActorConfig(), method, adv)
            rows = set(zip(picks.states.tolist(), picks.columns.tolist(), strict=True))
            assert all(valid[s, c] for s, c in rows)  # never an invalid candidate
            per_state = np.bincount(picks.states, minlength=8)
            assert per_state[3] == 0 and per_state.max() <= k  # at most the K drawn, none where none is valid
            # Best-of-N's pick is among them wherever it has one
            assert {(s, int(best[s])) for s in np.flatnonzero(np.isfinite(best_adv))} <= rows
            if k == 1:  # only the taken action is drawn: it is the row where it is valid
                assert rows == {(s, 0) for s in np.flatnonzero(valid[:, 0])}
            if k == 6:  # every candidate drawn: every valid one is a row
                assert rows == set(zip(*np.nonzero(valid), strict=True))


@pytest.fixture
def actor_root(values_root, tmp_path):
    """The small pipeline root of tests/conftest.py with a second seed's critic; two fits per policy, 2 of 3 candidates drawn."""
    root = tmp_path / "root"
    shutil.copytree(values_root, root)
    torch.manual_seed(1)
    Critic(CriticNetConfig(feature_dim=8, hidden=16)).save(Paths(root).critic(1), stage="critic", gamma=0.9)
    params = load_params(root / "params.yaml")
    params["actor"].update({"updates": 2, "batch_size": 4, "k_candidates": 2})
    params["ablations"] = {"untuned_vlm": False, "blind_vlm": False, "n_candidates": [], "perfect_critic": False,
                           "extraction": ["awr", "reinforce"]}  # fmt: skip
    params["experiment"] = {"seeds": 2}
    params["variants"] = {}
    (root / "params.yaml").write_text(yaml.safe_dump(dict(params)))
    (root / "params").mkdir(exist_ok=True)
    (root / "params" / "compute.yaml").write_text(yaml.safe_dump({"compute": {"processes": 1, "workers": 1}}))
    return Paths(root)


def test_the_actor_stage_fits_awr_and_reinforce_on_digiq_s_critic_and_candidates_for_every_seed(actor_root):
    paths = actor_root
    metrics = run_stage(actor_stage, paths, paths.root / "params.yaml")
    cfg = ActorConfig(**{k: v for k, v in load_params(paths.root / "params.yaml")["actor"].items()})
    names = {"digiq", "filtered_bc", "digirl_offline", "digiq_awr", "digiq_reinforce"}
    for s in (0, 1):
        assert {p.name for p in (paths.actors / f"seed{s}").iterdir()} == names
        for name in ("digiq_awr", "digiq_reinforce"):
            AutoUIPolicy.load(paths.actor(name, s))  # a whole checkpoint
    picks = read_picks(paths)
    assert {"digiq_awr", "digiq_reinforce"} <= set(picks.policy)
    assert (picks.weight[~picks.policy.isin(["digiq_awr", "digiq_reinforce"])] == 1.0).all()  # the others weigh 1
    feats = trained_inputs(paths, ["digiq"])["digiq"]
    valid = np.array([[True, True, False]] * len(feats["state"]))  # the fixture's candidates
    for s in (0, 1):
        by = {name: rows for name, rows in picks[picks.seed == s].groupby("policy")}
        awr, reinforce = by["digiq_awr"], by["digiq_reinforce"]
        # The same rows for both, weighted from one advantage: A = beta log w where AWR's weight is not clipped.
        assert awr.state.tolist() == reinforce.state.tolist() and awr.column.tolist() == reinforce.column.tolist()
        free = awr.weight.to_numpy() < cfg.awr_max_weight
        np.testing.assert_allclose(cfg.awr_beta * np.log(awr.weight.to_numpy()[free]),
                                   reinforce.weight.to_numpy()[free], rtol=1e-5, atol=1e-6)  # fmt: skip
        # ... and that advantage is Best-of-N's: the seed's digiq critic on the candidates that seed drew.
        adv = drawn_advantages(Critic.load(paths.critic(s)), feats["state"], feats["candidates"], valid,
                               cfg.k_candidates, np.random.default_rng(cfg.seed + s))  # fmt: skip
        np.testing.assert_array_equal(reinforce.weight.to_numpy(), adv[reinforce.state, reinforce.column])
        assert len(reinforce) == int(np.isfinite(adv).sum())
        if "digiq" in by:  # Best-of-N's rows are among the candidates the extractions weigh
            assert set(zip(by["digiq"].state, by["digiq"].column, strict=True)) <= set(
                zip(awr.state, awr.column, strict=True))  # fmt: skip
    extraction = metrics["extraction"]
    assert set(extraction) == {"digiq_awr", "digiq_reinforce"}
    assert (
        extraction["digiq_awr"]["rows"]
        == metrics["kept_rows"]["digiq_awr"]
        == len(picks[picks.policy == "digiq_awr"]) / 2
    )
    assert 0 < extraction["digiq_awr"]["weight_min"] <= extraction["digiq_awr"]["weight_mean"]
    assert extraction["digiq_awr"]["weight_max"] <= cfg.awr_max_weight and "clipped_fraction" in extraction["digiq_awr"]
    assert "negative_fraction" in extraction["digiq_reinforce"]
    assert metrics["kept_fraction"]["digiq_awr"] <= 1.0  # states with a row, not rows per state
