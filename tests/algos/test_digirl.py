"""digiq.algos.digirl: DigiRL's advantage, filters, curriculum and success classifiers, checked by hand."""

import numpy as np
import pandas as pd
import pytest
import torch

from digiq.algos.digirl import (
    DigiRLValues,
    SuccessClassifier,
    curriculum,
    digirl_steps,
    fit_success_classifier,
    instruction_features,
    keep_steps,
    state_features,
    step_advantages,
    step_features,
    trajectory_advantages,
)
from digiq.models.policy import AutoUIPolicy, PolicyConfig
from digiq.models.tokenizer import default_corpus, train_tokenizer


def test_advantage_of_a_success_mixes_the_outcome_with_value_differences():
    # w_h = 0.5 ** (2 - h): 0.25, 0.5, 1; A_h = w_h + (1 - w_h) (r_h + V(s_{h+1}) - V(s_h)), worked by hand.
    adv = step_advantages([0, 0, 1], v=[0.2, 0.5, 0.8], v_next=[0.5, 0.8, 0.9], lam=0.5)
    assert adv == pytest.approx([0.25 + 0.75 * 0.3, 0.5 + 0.5 * 0.3, 1.0])


def test_advantage_of_a_failure_is_the_value_difference_alone():
    adv = step_advantages([0, 0, 0], v=[0.4, 0.3, 0.1], v_next=[0.3, 0.1, 0.05], lam=0.5)
    assert adv == pytest.approx([-0.1, -0.2, -0.05])
    # lam = 0: the outcome counts only at the step that earned it; lam = 1: at every step of a success.
    assert step_advantages([0, 1], [0.5, 0.5], [0.5, 0.5], lam=0.0) == pytest.approx([0.0, 1.0])
    assert step_advantages([0, 1], [0.9, 0.5], [0.1, 0.5], lam=1.0) == pytest.approx([1.0, 1.0])


def test_advantage_refuses_what_is_not_an_outcome_reward():
    with pytest.raises(ValueError, match="outcome reward of 0 or 1"):
        step_advantages([1, 1], [0, 0], [0, 0], lam=0.5)
    with pytest.raises(ValueError, match="lam must lie in"):
        step_advantages([0, 1], [0, 0], [0, 0], lam=1.5)
    with pytest.raises(ValueError, match="as many rewards"):
        step_advantages([0, 1], [0], [0, 0], lam=0.5)


def test_a_step_table_gets_each_episode_s_own_advantages():
    ids = np.array([3, 3, 3, 7, 7])
    r = np.array([0, 0, 1, 0, 0.0])
    v, v_next = np.array([0.2, 0.5, 0.8, 0.4, 0.3]), np.array([0.5, 0.8, 0.9, 0.3, 0.1])
    adv = trajectory_advantages(ids, r, v, v_next, lam=0.5)
    assert adv[:3] == pytest.approx(step_advantages(r[:3], v[:3], v_next[:3], 0.5))
    assert adv[3:] == pytest.approx([-0.1, -0.2])
    with pytest.raises(ValueError, match="sorted by trajectory"):
        trajectory_advantages(ids[::-1], r, v, v_next, lam=0.5)


def test_the_step_filter_keeps_advantages_above_one_over_the_horizon():
    adv = np.array([0.11, 0.09, 0.06, 0.04])
    assert keep_steps(adv, np.array([10, 10, 20, 20])).tolist() == [True, False, True, False]


def test_curriculum_replays_the_most_surprising_episodes_first():
    outcomes = np.array([1, 1, 0, 1, 0])
    v_inst = np.array([0.9, 0.2, 0.1, 0.5, 0.9])  # r - V: 0.1, 0.8, -0.1, 0.5, -0.9
    assert curriculum(outcomes, v_inst, top=0.4).tolist() == [1, 3]
    assert curriculum(outcomes, v_inst, top=1.0).tolist() == [1, 3, 0, 2, 4]
    assert curriculum(np.array([1, 1, 0]), np.array([0.5, 0.5, 0.5]), top=0.1).tolist() == [0, 1]  # a tie at the cut
    with pytest.raises(ValueError, match="replayed share"):
        curriculum(outcomes, v_inst, top=0.0)


def test_success_classifier_learns_and_reads_its_most_pessimistic_head():
    gen = np.random.default_rng(0)
    x = gen.normal(size=(400, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.float32)
    net = SuccessClassifier(6, hidden=32, heads=2)
    curve = fit_success_classifier(net, x, y, updates=300, batch=64, lr=3e-3, seed=0)
    assert np.mean(curve[-20:]) < 0.5 * np.mean(curve[:20])
    v = net.value(x)
    assert v.shape == (400,) and ((v > 0.5) == (y > 0)).mean() > 0.8  # chance: 0.5
    with torch.no_grad():
        heads = torch.sigmoid(net.logits(torch.from_numpy(x))).numpy()
    assert v == pytest.approx(heads.min(1), abs=1e-6)
    with pytest.raises(ValueError, match="400 feature rows for 3"):
        fit_success_classifier(net, x, y[:3], updates=1, batch=8, lr=1e-3, seed=0)


def test_value_features_come_from_the_policy_s_encoder_batch_by_batch():
    policy = AutoUIPolicy(PolicyConfig(d_model=16, d_ff=32, d_kv=8, num_heads=2, num_layers=1, image_dim=16),
                          train_tokenizer(default_corpus(n_tasks=20))).eval()  # fmt: skip
    prompts = ["Previous Actions: Goal: open the clock app", "Previous Actions: PRESS_HOME Goal: search for news"] * 2
    shots = np.random.default_rng(0).integers(0, 256, (4, 228, 108, 3), np.uint8)
    whole = state_features(policy, prompts, shots)
    assert whole.shape == (4, 16) and whole.dtype == np.float32
    assert state_features(policy, prompts, shots, batch=1) == pytest.approx(whole, abs=1e-5)  # padding changes nothing
    assert not np.allclose(whole[0], state_features(policy, prompts[:1], shots[1:2])[0])  # the screen counts
    goals = instruction_features(policy, ["open the clock app", "search for news"])
    assert goals.shape == (2, 16) and not np.allclose(goals[0], goals[1])


def test_digirl_keeps_good_steps_of_the_replayed_episodes_only():
    # Episodes 0 (success, surprising: V_inst 0.1), 1 (success, expected: V_inst 0.9), 2 (failure).
    episode = np.array([0, 0, 1, 1, 2, 2])
    rewards = np.array([0, 1, 0, 1, 0, 0.0])
    v, v_next = np.array([0.2, 0.6, 0.5, 0.7, 0.3, 0.8]), np.array([0.6, 0.9, 0.7, 0.9, 0.8, 0.2])
    v_inst = np.array([0.1, 0.1, 0.9, 0.9, 0.5, 0.5])
    horizons = np.full(6, 10)
    kept, adv = digirl_steps(episode, rewards, horizons, v, v_next, v_inst, lam=0.5, top=1 / 3)
    assert kept.tolist() == [0, 1]  # only episode 0 is replayed, and both its steps clear 1/H
    assert adv[4] == pytest.approx(0.5)  # a failure's step that raised the value clears 1/H ...
    kept, _ = digirl_steps(episode, rewards, horizons, v, v_next, v_inst, lam=0.5, top=1.0)
    assert kept.tolist() == [0, 1, 2, 3, 4]  # ... and is kept once its episode is replayed; step 5 lowered it


def test_digirl_values_fit_save_and_load(tmp_path):
    gen = np.random.default_rng(1)
    x, y = gen.normal(size=(64, 5)).astype(np.float32), gen.integers(0, 2, 64).astype(np.float32)
    values = DigiRLValues(5, hidden=16, seed=0)
    curves = values.fit(x[:8], y[:8], x, x + 0.1, y, updates=3, batch=16, lr=1e-3, seed=0)
    assert len(curves["instruction"]) == len(curves["step"]) == 3
    values.save(tmp_path)
    other = DigiRLValues(5, hidden=16, seed=9)
    assert not np.allclose(other.step.value(x), values.step.value(x))
    other.load_state(tmp_path)
    assert other.step.value(x) == pytest.approx(values.step.value(x))
    assert other.instruction.value(x) == pytest.approx(values.instruction.value(x))


def test_step_features_encode_each_distinct_state_and_instruction_once_and_match_column_by_column(monkeypatch):
    policy = AutoUIPolicy(PolicyConfig(d_model=16, d_ff=32, d_kv=8, num_heads=2, num_layers=1, image_dim=16),
                          train_tokenizer(default_corpus(n_tasks=20))).eval()  # fmt: skip
    rng = np.random.default_rng(1)
    screens = {f"s{i}.png": policy.screen.prepare(rng.integers(0, 256, (1, 228, 108, 3), np.uint8))[0]
               for i in range(4)}  # fmt: skip
    # One episode of three steps: each step's s' is the next step's s.
    prompts = ["Goal: open the clock app", "Previous Actions: PRESS_HOME Goal: open the clock app",
               "Previous Actions: PRESS_HOME TAP Goal: open the clock app", "done"]  # fmt: skip
    steps = pd.DataFrame({"observation": prompts[:3], "image_path": ["s0.png", "s1.png", "s2.png"],
                          "next_observation": prompts[1:], "next_image_path": ["s1.png", "s2.png", "s3.png"],
                          "task": ["open the clock app"] * 3})  # fmt: skip
    encoded: list[int] = []
    original = state_features

    def counting(policy, prompts, shots, batch=64):
        encoded.append(len(prompts))
        return original(policy, prompts, shots, batch)

    monkeypatch.setattr("digiq.algos.digirl.state_features", counting)
    feats = step_features(policy, steps, screens)
    assert encoded == [4]  # four distinct states, not six
    shots = {c: torch.stack([screens[p] for p in steps[c]]) for c in ("image_path", "next_image_path")}
    assert feats.state == pytest.approx(original(policy, prompts[:3], shots["image_path"]), abs=1e-5)
    assert feats.next_state == pytest.approx(original(policy, prompts[1:], shots["next_image_path"]), abs=1e-5)
    assert feats.instruction == pytest.approx(np.repeat(instruction_features(policy, ["open the clock app"]), 3, 0),
                                              abs=1e-5)  # fmt: skip
