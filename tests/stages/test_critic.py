"""Stage 06's TD critic: the update, the conservative term and its gate, the fit diagnostics."""

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import digiq.stages.critic as critic_module
from digiq.algos.digiq import conservative_penalty, moved_forward, td_fit, td_losses
from digiq.config import load_settings
from digiq.data.trajectories import data_task_sets, heldout_rows
from digiq.models.critic import Critic, CriticNetConfig, per_task_set
from digiq.paths import Paths
from digiq.stages.critic import rewarded_fit
from digiq.stages.critic import run as critic_stage


@pytest.mark.parametrize("twin", ["min", "each"])
def test_td_learning_recovers_values_of_a_two_step_chain(twin):
    # s0 -a-> s1 -a-> end (reward 1): V(s1) = 1, V(s0) = gamma.
    torch.manual_seed(0)
    s = torch.eye(3)
    batch = {
        "state": s[[0, 1]],
        "next_state": s[[1, 2]],
        "action": s[[0, 1]],
        "reward": torch.tensor([0.0, 1.0]),
        "done": torch.tensor([0.0, 1.0]),
    }
    critic = Critic(CriticNetConfig(feature_dim=3, hidden=32, twin=twin))
    untrained = td_fit(critic, batch, gamma=0.9)
    target = critic.target()
    opt = torch.optim.Adam(critic.parameters(), lr=3e-3)
    for _ in range(1500):
        q_loss, v_loss = td_losses(critic, target, batch, gamma=0.9)
        opt.zero_grad()
        (q_loss + v_loss).backward()
        opt.step()
        target.soft_update(critic, 0.1)
    v = critic.joined(critic.v(s[[0, 1]])).detach()
    assert torch.allclose(v, torch.tensor([0.9, 1.0]), atol=0.05)
    # The stage's fit diagnostic: Q of the taken actions on its TD target, and level with V.
    fit = td_fit(critic, batch, gamma=0.9)
    assert fit["q_td_rmse"] < 0.05 and abs(fit["q_taken_minus_v"]) < 0.05
    assert untrained["q_td_rmse"] > 0.3


def test_rewarded_fit_reads_q_at_the_rewarded_steps_each_critic_trained_on_per_family():
    import pandas as pd

    torch.manual_seed(0)
    critic = Critic(CriticNetConfig(feature_dim=2, hidden=8))
    state = torch.randn(5, 2)
    feats = {"state": state.numpy(), "candidates": state[:, None].numpy()}
    q = torch.minimum(*critic.q(state, state)).detach().numpy()
    steps = pd.DataFrame({"reward": [1.0, 0.0, 1.0, 1.0, 1.0], "task_set": ["webshop"] * 4 + ["general"],
                          "family": ["select_first", "select_first", "select_first", "site_search", "search"]})  # fmt: skip
    # seed A trained on rows 0-3, seed B on 0 and 4: the unrewarded row 1 and untrained rows never count
    by_set = {"general": critic, "webshop": critic}  # each task set's critic (here one network for both)
    report = rewarded_fit([(by_set, np.array([0, 1, 2, 3])), (by_set, np.array([0, 4]))], feats, steps)
    assert set(report) == {"general", "webshop"} and set(report["webshop"]) == {"select_first", "site_search"}
    assert report["webshop"]["select_first"]["steps"] == 1.5  # 2 rows for seed A, 1 for seed B
    expected = ((q[0] + q[2]) / 2 + q[0]) / 2
    assert report["webshop"]["select_first"]["q_taken"] == pytest.approx(expected, abs=1e-4)
    assert report["general"]["search"] == {"steps": 1.0, "q_taken": pytest.approx(q[4], abs=1e-4)}


def test_moved_forward_keeps_steps_that_raised_the_value_or_whose_episode_succeeded():
    target = Critic(CriticNetConfig(feature_dim=1, hidden=4))
    target.v = lambda state: (state[:, 0], state[:, 0] + 1.0)  # V(s) = the feature (the lower head)
    batch = {"state": torch.tensor([[0.5], [0.5], [0.5], [0.5]]), "next_state": torch.tensor([[0.9], [0.1], [0.1], [0.9]]),
             "reward": torch.tensor([0.0, 0.0, 0.0, 1.0]), "done": torch.tensor([0.0, 0.0, 0.0, 1.0]),
             "mc_return": torch.tensor([0.0, 0.0, 0.3, 0.0])}  # fmt: skip
    # 0.95 * 0.9 > 0.5; 0.95 * 0.1 < 0.5 (a slip); the same, but its episode went on to succeed; a final success
    assert moved_forward(target, batch, gamma=0.95).tolist() == [True, False, True, True]


def test_conservative_term_keeps_untried_candidates_below_the_taken_action():
    # Every state took action 0 (reward 0.5, end); candidate 1 was never tried, candidate 2 does not parse.
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    state, cands = torch.randn(64, 4, generator=gen), torch.randn(64, 3, 4, generator=gen)
    valid = torch.tensor([[True, True, False]]).expand(64, -1)
    batch = {"state": state, "next_state": state, "action": cands[:, 0], "reward": torch.full((64,), 0.5),
             "done": torch.ones(64)}  # fmt: skip

    def fit(conservative: float) -> torch.Tensor:
        torch.manual_seed(0)
        critic = Critic(CriticNetConfig(feature_dim=4, hidden=32))
        target, opt = critic.target(), torch.optim.Adam(critic.parameters(), lr=3e-3)
        for _ in range(400):
            q_loss, v_loss = td_losses(critic, target, batch, gamma=0.9)
            loss = q_loss + v_loss + conservative * conservative_penalty(critic, state, cands, valid).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            target.soft_update(critic, 0.1)
        return critic.advantage(state, cands)[0]

    plain, conservative = fit(0.0), fit(1.0)
    assert (plain[:, 1] > plain[:, 0]).float().mean() > 0.2  # TD alone leaves untried actions anywhere
    assert (conservative[:, 1] < conservative[:, 0]).all()
    assert torch.allclose(conservative[:, 0], torch.tensor(0.5), atol=0.1)  # the taken action's value stays
    # The invalid candidate is left out of the log-sum-exp: changing its features changes nothing.
    critic = Critic(CriticNetConfig(feature_dim=4, hidden=8))
    moved = cands.clone()
    moved[:, 2] += 100
    assert torch.equal(
        conservative_penalty(critic, state, cands, valid), conservative_penalty(critic, state, moved, valid)
    )


def test_conservative_floor_stops_pushing_an_untried_candidate_below_it():
    # Untried candidates already below the floor get no gradient from the term; without a floor they still do,
    # and the taken action's side is the same either way.
    torch.manual_seed(0)
    critic = Critic(CriticNetConfig(feature_dim=4, hidden=16))
    state, cands = torch.randn(8, 4), torch.randn(8, 3, 4, requires_grad=True)
    scored = torch.ones(8, 3, dtype=torch.bool)
    q = torch.minimum(*critic.q(state[:, None].expand(-1, 3, -1), cands)).detach()
    floor = float(q[:, 1:].max()) + 1.0  # every untried candidate is below it
    (grad_floor,) = torch.autograd.grad(conservative_penalty(critic, state, cands, scored, floor).sum(), cands)
    (grad_plain,) = torch.autograd.grad(conservative_penalty(critic, state, cands, scored).sum(), cands)
    assert torch.count_nonzero(grad_floor[:, 1:]) == 0 and torch.count_nonzero(grad_plain[:, 1:]) > 0
    assert torch.count_nonzero(grad_floor[:, 0]) > 0
    # A floor under every Q changes nothing.
    low = float(q.min()) - 10.0
    torch.testing.assert_close(conservative_penalty(critic, state, cands, scored, low),
                               conservative_penalty(critic, state, cands, scored))  # fmt: skip


def test_a_critic_stage_cut_short_leaves_the_previous_run_whole(values_root, tmp_path, monkeypatch):
    """Seeds 0-1 trained, then a run of the stage dies after seed 0: the folder must still be the first run's."""
    root = tmp_path / "root"
    shutil.copytree(values_root, root)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["compute"] = {"processes": 1, "cpu": True, "workers": 1}
    params["critic"].update({"steps": 8, "hidden": 16, "batch_size": 16})
    params["experiment"]["seeds"] = 2
    params["ablations"].update({"untuned_vlm": False, "blind_vlm": False})
    params["variants"] = {}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    paths = Paths(root)

    def weights() -> dict[str, bytes]:
        return {
            str(f.relative_to(paths.critics)): f.read_bytes() for f in sorted(paths.critics.rglob("*")) if f.is_file()
        }

    critic_stage(load_settings(root / "params.yaml"), paths)
    first = weights()
    assert {f"seed{s}/digiq/general/config.json" for s in (0, 1)} <= set(first)  # one critic per task set
    real_fit = critic_module.fit_critic_job

    def dies_at_seed_1(job):
        if job.seed == 1:
            raise KeyboardInterrupt
        return real_fit(job)

    params["critic"]["lr"] = params["critic"].get("lr", 1e-3) * 3  # this run's seed 0 differs from the first's
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.setattr(critic_module, "fit_critic_job", dies_at_seed_1)
    with pytest.raises(KeyboardInterrupt):
        critic_stage(load_settings(root / "params.yaml"), paths)
    assert weights() == first
    monkeypatch.setattr(critic_module, "fit_critic_job", real_fit)
    critic_stage(load_settings(root / "params.yaml"), paths)  # a whole run replaces it, and tidies up
    assert set(weights()) == set(first) and weights() != first
    assert [p.name for p in paths.critics.parent.iterdir() if p.name.startswith(".")] == []


def test_only_output_folders_can_be_redirected():
    with pytest.raises(ValueError, match="'offline' is not one of"):
        Paths().writing("offline", Path("/tmp/x"))


def test_each_row_is_scored_by_its_own_task_set_s_critic():
    torch.manual_seed(0)
    critics = {ts: Critic(CriticNetConfig(feature_dim=2, hidden=8)) for ts in ("general", "webshop")}
    state = np.random.default_rng(0).normal(size=(5, 2)).astype(np.float32)
    task_sets = np.array(["webshop", "general", "webshop", "general", "general"])

    def v(critic: Critic, rows: np.ndarray) -> np.ndarray:
        return critic.joined(critic.v(torch.from_numpy(state[rows]))).detach().numpy()

    scored = per_task_set(task_sets, critics, v)
    for i, ts in enumerate(task_sets):
        assert scored[i] == pytest.approx(float(v(critics[ts], np.array([i]))[0]), abs=1e-6)
    with pytest.raises(ValueError, match=r"no critic for task set\(s\) \['webshop'\]"):
        per_task_set(task_sets, {"general": critics["general"]}, v)


def test_each_task_set_holds_out_its_own_share_of_trajectories():
    traj = np.repeat(np.arange(20), 3)  # 20 trajectories of 3 steps, the first 10 General
    task_sets = np.where(traj < 10, "general", "webshop")
    held = heldout_rows(traj, 0.2, seed=4, task_sets=task_sets)
    for ts in ("general", "webshop"):
        mine = task_sets == ts
        assert len(np.unique(traj[held & mine])) == 2  # a fifth of each task set's 10
        np.testing.assert_array_equal(held[mine], heldout_rows(traj[mine], 0.2, seed=4))  # as its critic drew them
    assert data_task_sets(["webshop", "general", "webshop"]) == ["general", "webshop"]
    assert data_task_sets(["webshop"]) == ["webshop"]


def test_a_critic_discount_other_than_the_stored_returns_is_refused(tmp_path):
    """Stage 01 records the discount of the returns it stores; a critic fit with another one is named, not run."""
    from digiq.config import ConfigError
    from digiq.data.trajectories import returns_discount, store_made_whole
    from digiq.io import StageError

    paths = Paths(tmp_path)
    with store_made_whole(paths.offline, {"stage": "collect", "collect": {"gamma": 0.95}}):
        pass
    assert returns_discount(paths.offline) == 0.95 and returns_discount(tmp_path / "imported") is None
    settings = load_settings()
    with pytest.raises(ConfigError, match=r"critic\.gamma differs from 0\.95.*\(digiq 0\.9"):
        critic_stage(settings.model_copy(update={"critic": settings.critic.but(gamma=0.9)}), paths)
    with pytest.raises(StageError, match="features"):  # the same discount: on to the stage's inputs
        critic_stage(settings, paths)
