"""The critic's inputs: stage 04's features, then text features of the goal and the actions (Digi-Q's critic)."""

import shutil

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import TAP, TEXT_D, H

from digiq.config import CriticConfig
from digiq.data import TrajectoryStore
from digiq.data.trajectories import DataError
from digiq.env.actions import format_action, press_back, tap, type_text
from digiq.env.hierarchy import element_at
from digiq.models.critic import Critic, CriticNetConfig
from digiq.models.policy import AutoUIPolicy
from digiq.paths import Paths
from digiq.train.critic_inputs import action_text, critic_inputs, encode_texts, previous_actions, tap_targets
from digiq.train.embed import load_features
from digiq.viz.values import load_values


def test_action_text_is_type_and_typed_text_and_garbage_stays_whole():
    assert action_text(format_action(type_text("gopro hero"))) == ("TYPE", "gopro hero")
    assert action_text(format_action(tap(0.2, 0.4))) == ("DUAL_POINT", "")
    assert action_text(format_action(press_back())) == ("PRESS_BACK", "")
    broken = 'Action Decision: "action_type": "DUAL_POINT", "touch_point": "[0.09end'
    assert action_text(broken) == (broken, broken)  # not an empty action: the critic sees it is garbage


def test_the_previous_action_stays_inside_its_trajectory():
    steps = pd.DataFrame({"traj_id": [0, 0, 0, 1, 1], "action": ["a0", "a1", "a2", "b0", "b1"]})
    assert previous_actions(steps) == ["", "a0", "a1", "", "b0"]


def test_each_text_is_encoded_as_alone_and_in_input_order(values_root):
    policy = AutoUIPolicy.load(Paths(values_root).base_policy)
    texts = ["Search for gopro hero", "TYPE", "", "Search for gopro hero", "gopro"]
    out = encode_texts(policy, texts, batch=2)
    assert out.shape == (5, TEXT_D) and np.array_equal(out[0], out[3])
    for text, row in zip(texts, out, strict=True):  # padding beside longer texts changes nothing
        np.testing.assert_allclose(row, policy.text_features([text])[0].numpy(), atol=1e-5)
    assert not np.allclose(out[0], out[4]) and not np.allclose(out[1], out[2])


def test_critic_inputs_append_goal_previous_action_and_candidate_text(values_root):
    paths = Paths(values_root)
    plain, feats = critic_inputs(paths, text=False), load_features(paths)
    assert all(np.array_equal(plain[k], feats[k]) for k in ("state", "next_state", "candidates"))
    x = critic_inputs(paths, text=True)
    S = feats["state"].shape[0]
    assert x["state"].shape == x["next_state"].shape == (S, H + 3 * TEXT_D)
    assert x["candidates"].shape == (S, 3, H + 2 * TEXT_D)
    np.testing.assert_array_equal(x["state"][:, :H], feats["state"])  # the VLM's features come first, unchanged
    np.testing.assert_array_equal(x["candidates"][:, :, :H], feats["candidates"])
    steps = TrajectoryStore(paths.offline).read().to_pandas()
    policy = AutoUIPolicy.load(paths.base_policy)
    goal = slice(H, H + TEXT_D)
    np.testing.assert_allclose(x["state"][:, goal], encode_texts(policy, steps.task.tolist()), atol=1e-6)
    # s' of a step reads the step's own action as the previous one: the next step's state, same goal.
    same = np.flatnonzero(steps.traj_id.to_numpy()[1:] == steps.traj_id.to_numpy()[:-1])
    np.testing.assert_allclose(x["next_state"][same, H:], x["state"][same + 1, H:], atol=1e-5)
    first = steps.step_id.to_numpy() == 0
    empty = encode_texts(policy, [""])[0]
    assert np.allclose(x["state"][first, H + TEXT_D :], np.tile(empty, 2), atol=1e-6)
    # Candidate 0 is the action taken (the same text as s' reads); candidate 1 is the same tap everywhere.
    np.testing.assert_allclose(x["candidates"][:, 0, H:], x["next_state"][:, H + TEXT_D :], atol=1e-5)
    tap_text = np.concatenate(encode_texts(policy, list(action_text(format_action(tap(*TAP))))))
    np.testing.assert_allclose(x["candidates"][:, 1, H:], np.tile(tap_text, (S, 1)), atol=1e-6)


def test_tap_targets_add_the_label_each_tap_lands_on(values_root, tmp_path):
    paths = Paths(values_root)
    x, t = critic_inputs(paths, text=True), critic_inputs(paths, text=True, targets=True)
    S = x["state"].shape[0]
    assert t["candidates"].shape == (S, 3, H + 3 * TEXT_D)
    np.testing.assert_array_equal(t["candidates"][:, :, : H + 2 * TEXT_D], x["candidates"])
    np.testing.assert_array_equal(t["state"], x["state"])
    store = TrajectoryStore(paths.offline)
    steps = store.read().to_pandas()
    lists = [[a, format_action(tap(*TAP)), format_action(press_back())] for a in steps.action]
    labels = np.array(tap_targets(store, steps.image_path.tolist(), lists)).reshape(S, 3)
    assert (labels[:, 2] == "").all()  # Back is no tap
    for i in range(S):  # the fixed tap: whatever the stored screen has at TAP
        xml, size = store.load_hierarchy(steps.image_path.iat[i])
        assert labels[i, 1] == element_at(xml, TAP, size)
    assert len(set(labels[:, 1])) > 1 and "Search" in labels[:, 0]  # the expert taps search boxes
    policy = AutoUIPolicy.load(paths.base_policy)
    np.testing.assert_allclose(t["candidates"][:, :, -TEXT_D:].reshape(S * 3, -1),
                               encode_texts(policy, labels.ravel().tolist()), atol=1e-6)  # fmt: skip
    bare = shutil.copytree(values_root, tmp_path / "bare")
    for f in (bare / "data" / "offline" / "images").glob("*.hierarchy.json"):
        f.unlink()
    with pytest.raises(DataError, match="collect.view_hierarchy: true"):
        critic_inputs(Paths(bare), text=True, targets=True)
    with pytest.raises(ValueError, match="needs text_features"):
        CriticConfig(text_features=False, tap_targets=True)


def test_the_viewer_scores_with_the_inputs_its_critic_was_trained_on(values_root, tmp_path):
    root = shutil.copytree(values_root, tmp_path / "root")
    x = critic_inputs(Paths(root), text=True)
    torch.manual_seed(1)
    critic = Critic(CriticNetConfig(feature_dim=x["state"].shape[1], hidden=16, action_dim=x["candidates"].shape[2],
                                    text=True))  # fmt: skip
    critic.save(Paths(root).critic(0), stage="critic", gamma=0.9)
    data = load_values(root)
    q, v, _ = critic.advantage(torch.from_numpy(x["state"]), torch.from_numpy(x["candidates"]))
    np.testing.assert_allclose(data.steps.v.to_numpy(), v.numpy(), atol=1e-5)
    by_index = data.candidates.sort_values(["traj_id", "step_id", "index"]).q.to_numpy()
    np.testing.assert_allclose(by_index, q.numpy().ravel(), atol=1e-5)
