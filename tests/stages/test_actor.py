"""The actor stage: Best-of-N's pick, the extraction ablation's weights, the stage at a tiny size, and what it
computes once and stores for the stages after it."""

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
    drawn_among,
    extraction_picks,
    extraction_weights,
)
from digiq.algos.digirl import read_offline_step_features, step_features
from digiq.config import ActorConfig, load_params, load_settings
from digiq.data.candidates import read_candidates
from digiq.data.picks import EXPERT_MATRIX, Picks, critic_scores_name, read_picks, read_stored
from digiq.data.trajectories import TrajectoryStore, heldout_rows
from digiq.diagnostics.ground_truth import expert_matrix
from digiq.models.critic import Critic, CriticNetConfig, load_critics, trained_inputs
from digiq.models.policy import AutoUIPolicy
from digiq.models.policy_fit import load_screens
from digiq.paths import Paths
from digiq.rows import Row, all_rows
from digiq.stages.actor import PICKS, PickInputs, run_actor
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
    best, adv = best_of_n(
        drawn_advantages(critic, {"state": state, "candidates": cands}, valid, k=3, rng=np.random.default_rng(0))
    )
    assert best.tolist() == [2, 0] and np.allclose(adv, [0.5, 0.3])  # the invalid 0.9 is never chosen
    best, _ = best_of_n(
        drawn_advantages(critic, {"state": state, "candidates": cands}, valid, k=1, rng=np.random.default_rng(0))
    )
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
        best, adv = best_of_n(
            drawn_advantages(critic, {"state": state, "candidates": cands}, valid, k, np.random.default_rng(7))
        )
        assert best.tolist() == expected, k
        assert np.array_equal(adv, np.where(np.isin(np.arange(8), none), -np.inf, a[np.arange(8), best])), k
    steps = pd.DataFrame({"task_set": ["general", "webshop"] * 4})
    adv = drawn_advantages(critic, {"state": state, "candidates": cands}, valid, 3, np.random.default_rng(7))
    picks, stats = best_of_n_picks(ActorConfig(), adv, steps)
    assert picks.states.tolist() == [1, 4, 5, 6, 7] and picks.columns.tolist() == [1, 0, 3, 2, 0]
    assert picks.weights is None and picks.row_weights().tolist() == [1.0] * 5  # every Best-of-N row weighs 1
    assert stats["kept_not_taken_fraction"] == pytest.approx(3 / 5)


def test_awr_and_reinforce_weigh_each_state_s_best_candidate_by_its_clamped_advantage():
    inf = np.inf
    # Best drawn valid candidates: state 0 column 2 (A 0.5), state 1 column 2 (A 1.4, clamped to 1), state 2
    # column 0 (A -0.3, clamped to 0), state 3 nothing valid.
    adv = np.array([[0.1, -inf, 0.5, -0.2], [-inf, 0.0, 1.4, -inf], [-0.3, -inf, -0.5, -inf], [-inf] * 4])
    cfg = ActorConfig(awr_beta=0.1)
    e = np.exp
    awr = extraction_weights(cfg, "awr", adv)
    # exp(A / beta) written as exp((A - 1) / beta): the same ratios, no overflow
    np.testing.assert_allclose(awr, [e(-5.0), 1.0, e(-10.0), 0.0], rtol=1e-12)
    np.testing.assert_allclose(extraction_weights(ActorConfig(awr_beta=0.01), "awr", adv)[:3],
                               [e(-50.0), 1.0, e(-100.0)], rtol=1e-12)  # fmt: skip
    np.testing.assert_array_equal(extraction_weights(cfg, "reinforce", adv), [0.5, 1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="unknown extraction 'ppo'"):
        extraction_weights(cfg, "ppo", adv)

    picks, stats = extraction_picks(cfg, "awr", adv)
    assert picks.states.tolist() == [0, 1, 2] and picks.columns.tolist() == [2, 2, 0]  # one row per state
    np.testing.assert_allclose(picks.weights, [e(-5.0), 1.0, e(-10.0)], rtol=1e-12)  # relative to the largest
    assert stats["rows_fraction"] == pytest.approx(3 / 4)
    assert stats["top_percent_weight_share"] == pytest.approx(1 / (1 + e(-5.0) + e(-10.0)))
    picks, stats = extraction_picks(cfg, "reinforce", adv)
    assert picks.states.tolist() == [0, 1] and picks.columns.tolist() == [2, 2]  # weight 0: no row
    np.testing.assert_allclose(picks.weights, [0.5, 1.0])


def test_the_extractions_imitate_best_of_n_s_pick_wherever_it_has_one():
    state, cands, valid = _fixed_states()
    critic = Fixed(CriticNetConfig(feature_dim=1))
    for k in (1, 3, 6):
        adv = drawn_advantages(critic, {"state": state, "candidates": cands}, valid, k, np.random.default_rng(7))
        best, best_adv = best_of_n(adv)
        awr, _ = extraction_picks(ActorConfig(), "awr", adv)
        assert awr.states.tolist() == np.flatnonzero(np.isfinite(best_adv)).tolist()  # every state with a valid one
        assert awr.columns.tolist() == best[awr.states].tolist()
        reinforce, _ = extraction_picks(ActorConfig(), "reinforce", adv)
        assert reinforce.states.tolist() == np.flatnonzero(best_adv > 0).tolist()


def _actor_root(values_root, root, ablations: dict) -> Paths:
    """The small pipeline root of tests/conftest.py with a second seed's critic and ``ablations``; two fits per
    policy, 2 of 3 candidates drawn."""
    shutil.copytree(values_root, root)
    torch.manual_seed(1)
    Critic(CriticNetConfig(feature_dim=8, hidden=16)).save(Paths(root).critic(1, "digiq", "general"), stage="critic",
                                                           gamma=0.9)  # fmt: skip
    params = load_params(root / "params.yaml")
    params["actor"].update({"updates": 2, "batch_size": 4, "k_candidates": 2})
    params["ablations"] = {"untuned_vlm": False, "blind_vlm": False, "n_candidates": [], "perfect_critic": False,
                           "extraction": [], **ablations}  # fmt: skip
    params["experiment"] = {"seeds": 2}
    params["variants"] = {}
    (root / "params.yaml").write_text(yaml.safe_dump(dict(params)))
    (root / "params").mkdir(exist_ok=True)
    (root / "params" / "compute.yaml").write_text(yaml.safe_dump({"compute": {"processes": 1, "workers": 1}}))
    return Paths(root)


@pytest.fixture
def actor_root(values_root, tmp_path):
    """The small pipeline root with the extraction ablation's rows."""
    return _actor_root(values_root, tmp_path / "root", {"extraction": ["awr", "reinforce"]})


def test_the_actor_stage_fits_awr_and_reinforce_on_digiq_s_critic_and_candidates_for_every_seed(actor_root):
    paths = actor_root
    metrics = run_stage(actor_stage, paths, paths.root / "params.yaml")
    cfg = load_settings(paths.root / "params.yaml").actor
    names = {"digiq", "filtered_bc", "digirl_offline", "digiq_awr", "digiq_reinforce"}
    for s in (0, 1):
        assert {p.name for p in (paths.actors / f"seed{s}").iterdir()} == names
        for name in names:  # one policy per task set the data hold: here General alone
            assert [p.name for p in (paths.actors / f"seed{s}" / name).iterdir()] == ["general"]
            AutoUIPolicy.load(paths.actor(name, s, "general"))  # a whole checkpoint
    picks = read_picks(paths)
    assert {"digiq_awr", "digiq_reinforce"} <= set(picks.policy)
    assert (picks.weight[~picks.policy.isin(["digiq_awr", "digiq_reinforce"])] == 1.0).all()  # the others weigh 1
    feats = trained_inputs(paths, ["digiq"])["digiq"]
    valid = np.array([[True, True, False]] * len(feats["state"]))  # the fixture's candidates
    for s in (0, 1):
        by = {name: rows for name, rows in picks[picks.seed == s].groupby("policy")}
        awr = by["digiq_awr"]
        # One row per state, its best candidate, weighted from Best-of-N's advantage: the seed's digiq critic on
        # the candidates that seed drew, clamped to [0, 1].
        adv = drawn_advantages(load_critics(paths, s, "digiq", ["general"])["general"], feats, valid, cfg.k_candidates,
                               np.random.default_rng(cfg.seed + s))  # fmt: skip
        best, best_adv = best_of_n(adv)
        assert awr.state.tolist() == list(range(len(best))) and awr.column.tolist() == best.tolist()
        a = np.clip(best_adv, 0, 1)
        np.testing.assert_allclose(awr.weight.to_numpy(), np.exp((a - a.max()) / cfg.awr_beta), rtol=1e-4)
        if "digiq_reinforce" in by:
            reinforce = by["digiq_reinforce"]
            assert reinforce.state.tolist() == np.flatnonzero(a > 0).tolist()
            # to float rounding: the stage ran pinned (digiq.kernels), this process may run the machine's own kernels
            np.testing.assert_allclose(reinforce.weight.to_numpy(), a[a > 0] / a.max(), rtol=1e-4)
        if "digiq" in by:  # Best-of-N's rows are among the rows the extractions weigh
            assert set(zip(by["digiq"].state, by["digiq"].column, strict=True)) <= set(
                zip(awr.state, awr.column, strict=True))  # fmt: skip
    extraction = metrics["extraction"]
    assert set(extraction) == {"digiq_awr", "digiq_reinforce"}
    assert (
        extraction["digiq_awr"]["rows"]
        == metrics["kept_rows"]["digiq_awr"]
        == len(picks[picks.policy == "digiq_awr"]) / 2
    )
    assert extraction["digiq_awr"]["rows_fraction"] == 1.0 and "top_percent_weight_share" in extraction["digiq_awr"]
    # Digi-Q's rows draw among the states of the trajectories their critic trained on: updates x batch draws over them
    split = load_settings(paths.root / "params.yaml").critic
    steps = TrajectoryStore(paths.offline).read().to_pandas()
    states = int((~heldout_rows(steps.traj_id.to_numpy(), split.holdout, split.seed, steps.task_set.to_numpy())).sum())
    assert 0 < states < len(feats["state"])
    assert metrics["passes"]["digiq_awr"]["general"] == round(cfg.updates * cfg.batch_size / states, 2)
    filtered = len(picks[(picks.policy == "filtered_bc") & (picks.seed == 0)])
    if filtered:  # the baselines draw among their own rows
        assert metrics["passes"]["filtered_bc"]["general"] == round(cfg.updates * cfg.batch_size / filtered, 2)


def test_the_stage_scores_each_critic_once_a_seed_and_stores_what_later_stages_would_compute_again(
    values_root, tmp_path, monkeypatch
):
    """Digi-Q and its ablation over one candidate read one critic: it is asked once per seed, and its Q and V are
    stored; so are the perfect critic's expert matrix and offline DigiRL's step features, each bit for bit what
    stage 08 and stage 09 computed for themselves. The picks are those of scoring every (state, candidate) row
    as the stage did before (the concatenated rows), but where two advantages, or the best one and the
    threshold, lie within float rounding of each other (none do here)."""
    paths = _actor_root(values_root, tmp_path / "root", {"n_candidates": [1], "perfect_critic": True})
    asked = []
    real = Critic.advantage
    monkeypatch.setattr(Critic, "advantage", lambda self, state, actions: asked.append(len(state))
                        or real(self, state, actions))  # fmt: skip
    settings = load_settings(paths.root / "params.yaml")
    actor_stage(settings, paths)  # in this process, whose kernels compute the references below
    monkeypatch.undo()
    cfg = settings.actor
    steps = TrajectoryStore(paths.offline).read().to_pandas()
    cands = read_candidates(paths).to_pandas()
    valid = np.stack(cands.valid_list.to_numpy())
    assert asked == [len(steps)] * 2  # one task set's critic, two seeds: digiq_n1 reads digiq's scores

    feats = trained_inputs(paths, ["digiq"])["digiq"]
    state, actions = torch.from_numpy(np.asarray(feats["state"])), torch.from_numpy(np.asarray(feats["candidates"]))
    picks = read_picks(paths)
    for s in (0, 1):
        stored = read_stored(paths, critic_scores_name("digiq", s), steps, ("q", "v"), "test")
        critic = Critic.load(paths.critic(s, "digiq", "general"))
        q, v, _ = critic.advantage(state, actions)
        assert np.array_equal(stored["q"], q.numpy()) and np.array_equal(stored["v"], v.numpy())
        with torch.no_grad():  # how every row was scored before: each head on the concatenated rows
            q_rows = critic.joined(critic.q(state[:, None].expand(-1, actions.shape[1], -1), actions)).numpy()
        np.testing.assert_allclose(stored["q"], q_rows, rtol=0, atol=1e-6)
        for name, k in (("digiq", cfg.k_candidates), ("digiq_n1", 1)):
            before = drawn_among(q_rows - v.numpy()[:, None], valid, k, np.random.default_rng(cfg.seed + s))
            want, _ = best_of_n_picks(cfg, before, steps)
            top = np.sort(before, 1)  # -inf: not drawn, or invalid
            close = np.isfinite(top[:, -2]) & (top[:, -1] - top[:, -2] < 1e-5)
            at_threshold = np.abs(top[:, -1] - cfg.thresholds(steps.task_set.to_numpy())) < 1e-5
            assert not (close | at_threshold).any()
            mine = picks[(picks.policy == name) & (picks.seed == s)]
            assert mine.state.tolist() == want.states.tolist() and mine.column.tolist() == want.columns.tolist()

    env, collect = settings.env, settings.collect
    right, kinds = expert_matrix(env, collect.seed, steps, cands)  # what stage 08 computed for itself
    stored = read_stored(paths, EXPERT_MATRIX, steps, ("right", "kinds"), "test")
    assert np.array_equal(stored["right"], right) and np.array_equal(stored["kinds"], kinds)

    base = AutoUIPolicy.load(paths.base_policy)
    store = TrajectoryStore(paths.offline)
    every = store.read().to_pandas()
    # What an off-to-online run of stage 09 computed for itself from its task set's offline steps.
    mine = every[every.task_set == "general"].sort_values(["traj_id", "step_id"], kind="stable").reset_index(drop=True)
    want = step_features(base, mine, load_screens(base, store, [*mine.image_path, *mine.next_image_path]))
    got = read_offline_step_features(paths, "general", "test")
    for name in ("state", "next_state", "instruction"):
        assert np.array_equal(getattr(got, name), getattr(want, name)), name


def _first_candidate(row: Row, at: PickInputs) -> tuple[Picks, dict]:
    """A new kind of row: every stored state's first valid candidate that the data did not take."""
    other = at.valid[:, 1:].any(1)
    return Picks(np.flatnonzero(other), 1 + at.valid[other, 1:].argmax(1)), {}


def test_a_new_row_kind_is_its_picks_function_and_one_registry_line(actor_root, monkeypatch):
    """Stage 07 is a loop over rows, each picked by its kind's function: a kind it does not know is named, and a
    new one registered in PICKS is picked, fit, saved and counted like the rest."""
    paths, settings = actor_root, load_settings(actor_root.root / "params.yaml")
    table = [*all_rows(settings.ablations), Row("digiq_first", "first_candidate", "ablation")]
    run = {"seeds": 1, "table": table, "env": settings.env, "collect": settings.collect}
    with pytest.raises(ValueError, match=r"no picks function for row kind\(s\) \['first_candidate'\]"):
        run_actor(settings.actor, paths, **run)
    monkeypatch.setitem(PICKS, "first_candidate", _first_candidate)  # the registry line
    metrics = run_actor(settings.actor, paths, **run)
    valid = np.stack(read_candidates(paths).to_pandas().valid_list.to_numpy())
    picks = read_picks(paths)
    mine = picks[picks.policy == "digiq_first"]
    assert mine.state.tolist() == np.flatnonzero(valid[:, 1:].any(1)).tolist() and (mine.column >= 1).all()
    assert metrics["kept_rows"]["digiq_first"] == len(mine) > 0
    AutoUIPolicy.load(paths.actor("digiq_first", 0, "general"))  # fit and saved as every row is
