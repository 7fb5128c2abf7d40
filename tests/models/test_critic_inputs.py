"""The critic's inputs: stage 05's features, then text features of the goal and the actions (Digi-Q's critic),
written once by the critic_inputs stage."""

import shutil

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import TAP, TEXT_D, H

from digiq.algos.digiq import conservative_penalty
from digiq.config import CriticConfig
from digiq.data import TrajectoryStore
from digiq.data.candidates import read_candidates
from digiq.data.features import critic_inputs, load_features, load_text_rows
from digiq.data.trajectories import DataError
from digiq.env.actions import format_action, parse_action, press_back, press_enter, tap, type_text
from digiq.env.hierarchy import Tapped, tapped_elements
from digiq.models.critic import Critic, CriticNetConfig
from digiq.models.critic_inputs import (
    action_text,
    distinct_actions,
    encode_texts,
    entry_features,
    previous_actions,
    typed_match,
)
from digiq.models.policy import AutoUIPolicy
from digiq.paths import Paths
from digiq.stages.critic import scored_candidates
from digiq.stages.critic_inputs import tapped, write_critic_inputs
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
    labels = np.array([hit.label for hit in tapped(store, steps.image_path.tolist(), lists)]).reshape(S, 3)
    assert (labels[:, 2] == "").all()  # Back is no tap
    for i in range(S):  # the fixed tap: whatever the stored screen has at TAP
        xml, size = store.load_hierarchy(steps.image_path.iat[i])
        assert [labels[i, 1]] == [hit.label for hit in tapped_elements(xml, [TAP], size)]
    assert len(set(labels[:, 1])) > 1 and "Search" in labels[:, 0]  # the expert taps search boxes
    policy = AutoUIPolicy.load(paths.base_policy)
    np.testing.assert_allclose(t["candidates"][:, :, -TEXT_D:].reshape(S * 3, -1),
                               encode_texts(policy, labels.ravel().tolist()), atol=1e-6)  # fmt: skip
    bare = shutil.copytree(values_root, tmp_path / "bare")
    for f in (bare / "data" / "offline" / "images").glob("*.hierarchy.json"):
        f.unlink()
    assert write_critic_inputs(Paths(bare))["optional_files_absent"] == ["tapped", "entries", "distinct"]
    np.testing.assert_array_equal(critic_inputs(Paths(bare), text=True, typed=True)["candidates"],
                                  critic_inputs(paths, text=True, typed=True)["candidates"])  # fmt: skip
    for option in ("targets", "entries"):
        with pytest.raises(DataError, match="collect.view_hierarchy: true"):
            critic_inputs(Paths(bare), text=True, **{option: True})
    with pytest.raises(DataError, match="collect.view_hierarchy: true"):
        scored_candidates(Paths(bare), targets=True)
    with pytest.raises(ValueError, match="tap_targets: true needs text_features"):
        CriticConfig(text_features=False, tap_targets=True, typed_match=False)
    with pytest.raises(ValueError, match="typed_match: true needs text_features"):
        CriticConfig(text_features=False, tap_targets=False, typed_match=True)


def test_typed_match_tells_the_goals_words_from_a_garbled_copy():
    goal = 'Go to ebay.com, search for "Seagate 2tb"'
    assert typed_match(goal, format_action(type_text("seagate 2TB"))) == (1.0, 1.0)  # case is ignored
    share, whole = typed_match(goal, format_action(type_text("ateseag 2tbse")))
    assert 0.5 < share < 1.0 and whole == 0.0  # most letters are there, in the wrong order
    assert typed_match(goal, format_action(type_text("xq"))) == (0.0, 0.0)
    for other in (tap(*TAP), press_back(), type_text("  ")):
        assert typed_match(goal, format_action(other)) == (0.0, 0.0)
    assert typed_match(goal, 'Action Decision: "action_type": "TYPE", "typed_text": "sea') == (0.0, 0.0)  # no parse


def test_typed_match_comes_last_among_the_candidate_features(values_root):
    paths = Paths(values_root)
    x, t = critic_inputs(paths, text=True), critic_inputs(paths, text=True, typed=True)
    S = x["state"].shape[0]
    np.testing.assert_array_equal(t["candidates"][:, :, :-2], x["candidates"])
    steps = TrajectoryStore(paths.offline).read().to_pandas()
    lists = read_candidates(paths).column("action_list").to_pylist()
    want = [[typed_match(task, a) for a in row] for task, row in zip(steps.task, lists, strict=True)]
    np.testing.assert_allclose(t["candidates"][:, :, -2:], np.array(want, np.float32).reshape(S, -1, 2))
    assert t["candidates"][:, :, -1].any()  # the expert types its goal's words somewhere
    with pytest.raises(ValueError, match="targets, typed and entries need text"):
        critic_inputs(paths, text=False, typed=True)


def test_list_entries_say_which_entry_a_tap_lands_on_last_among_the_candidate_features(values_root):
    np.testing.assert_allclose(entry_features([Tapped("Dell Xps Pro", 0), Tapped("Dell Xps Max", 2), Tapped("Go"),
                                               Tapped("")]), [[1, 1], [1, 1 / 3], [0, 0], [0, 0]])  # fmt: skip
    assert entry_features([]).shape == (0, 2)
    paths = Paths(values_root)
    x = critic_inputs(paths, text=True, targets=True, typed=True)
    e = critic_inputs(paths, text=True, targets=True, typed=True, entries=True)
    S, N = x["candidates"].shape[:2]
    np.testing.assert_array_equal(e["candidates"][:, :, :-2], x["candidates"])
    np.testing.assert_array_equal(e["state"], x["state"])
    store = TrajectoryStore(paths.offline)
    lists = read_candidates(paths).column("action_list").to_pylist()
    hits = tapped(store, store.read().column("image_path").to_pylist(), lists)
    np.testing.assert_array_equal(e["candidates"][:, :, -2:], entry_features(hits).reshape(S, N, 2))
    assert any(hit.entry >= 0 for hit in hits)  # the stored screens hold lists, and candidates tap their entries
    with pytest.raises(ValueError, match="list_entries: true needs tap_targets"):
        CriticConfig(tap_targets=False, list_entries=True)


def test_each_distinct_action_counts_once():
    back, enter = format_action(press_back()), format_action(press_enter())
    garbled = back.replace("Action Plan: [PRESS_BACK]", "Action Plan: [0.09Toggle]")
    assert garbled != back and parse_action(garbled) == parse_action(back)
    a, b = format_action(tap(0.30, 0.50)), format_action(tap(0.31, 0.52))
    broken = 'Action Decision: "action_type": "DUAL_POINT", "touch_point": "[0.09end'
    lists = [[back, garbled, enter, back, broken, broken], [a, b, back, a, format_action(type_text("x")), enter]]
    np.testing.assert_array_equal(distinct_actions(lists), [[1, 0, 1, 0, 1, 0], [1, 1, 1, 0, 1, 1]])
    # With the tapped elements known, two taps on the same one are one action, wherever inside it they land.
    targets = ["", "", "", "", "", ""] + ["Search", "Search", "", "Search", "", ""]
    np.testing.assert_array_equal(distinct_actions(lists, targets), [[1, 0, 1, 0, 1, 0], [1, 0, 1, 0, 1, 1]])


def test_the_conservative_term_scores_a_repeated_candidate_once(values_root):
    paths = Paths(values_root)
    scored = scored_candidates(paths, targets=True)
    lists = read_candidates(paths).column("action_list").to_pylist()
    valid = np.stack(read_candidates(paths).column("valid_list").to_numpy(zero_copy_only=False))
    assert (scored <= valid).all() and (scored[:, 0] == valid[:, 0]).all()
    steps = TrajectoryStore(paths.offline).read().to_pandas()
    store = TrajectoryStore(paths.offline)
    labels = np.array([hit.label for hit in tapped(store, steps.image_path.tolist(), lists)]).reshape(len(lists), -1)
    taps = np.array([[parse_action(a).is_tap for a in row] for row in lists])
    same = taps[:, 0] & taps[:, 1] & (labels[:, 0] == labels[:, 1])  # the taken action taps the fixed tap's element
    assert same.any() and (~same).any()
    np.testing.assert_array_equal(scored[:, 1], valid[:, 1] & ~same)
    np.testing.assert_array_equal(scored[:, 2], valid[:, 2])
    np.testing.assert_array_equal(scored_candidates(paths, targets=False), valid)  # a tap is only its point
    # The term over a list with a repeat, scored once, equals the term over the list without it.
    torch.manual_seed(0)
    critic = Critic(CriticNetConfig(feature_dim=4, hidden=8))
    state, cands = torch.randn(2, 4), torch.randn(2, 3, 4)
    twice = torch.cat([cands, cands[:, 1:2]], 1)
    mask = torch.tensor([[True, True, True, False]] * 2)
    torch.testing.assert_close(conservative_penalty(critic, state, twice, mask),
                               conservative_penalty(critic, state, cands, torch.ones(2, 3, dtype=torch.bool)))  # fmt: skip
    assert not torch.allclose(conservative_penalty(critic, state, twice, torch.ones(2, 4, dtype=torch.bool)),
                              conservative_penalty(critic, state, cands, torch.ones(2, 3, dtype=torch.bool)))  # fmt: skip


def test_the_viewer_scores_with_the_inputs_its_critic_was_trained_on(values_root, tmp_path):
    root = shutil.copytree(values_root, tmp_path / "root")
    x = critic_inputs(Paths(root), text=True)
    torch.manual_seed(1)
    critic = Critic(CriticNetConfig(feature_dim=x["state"].shape[1], hidden=16, action_dim=x["candidates"].shape[2],
                                    text=True))  # fmt: skip
    critic.save(Paths(root).critic(0, "digiq", "general"), stage="critic", gamma=0.9)
    data = load_values(root)
    q, v, _ = critic.advantage(torch.from_numpy(x["state"]), torch.from_numpy(x["candidates"]))
    np.testing.assert_allclose(data.steps.v.to_numpy(), v.numpy(), atol=1e-5)
    by_index = data.candidates.sort_values(["traj_id", "step_id", "index"]).q.to_numpy()
    np.testing.assert_allclose(by_index, q.numpy().ravel(), atol=1e-5)


def test_every_text_is_stored_once_with_each_step_s_and_candidate_s_rows(values_root, tmp_path):
    paths = Paths(values_root)
    texts, rows = load_text_rows(paths)
    steps = TrajectoryStore(paths.offline).read().to_pandas()
    lists = read_candidates(paths).to_pandas().action_list
    assert len(set(texts)) == len(texts)
    assert [texts[i] for i in rows["goal_row"]] == steps.task.tolist()
    assert [tuple(texts[i] for i in pair) for pair in rows["taken_rows"]] == [action_text(a) for a in steps.action]
    assert [tuple(texts[i] for i in pair) for pair in rows["before_rows"]] == [
        action_text(a) for a in previous_actions(steps)
    ]
    flat = [tuple(texts[i] for i in pair) for pair in rows["action_rows"].reshape(-1, 2)]
    assert flat == [action_text(a) for actions in lists for a in actions]
    root = tmp_path / "root"
    shutil.copytree(values_root, root)
    broken = np.array(rows["goal_row"])
    broken[0] = len(texts)
    np.save(Paths(root).critic_inputs / "goal_row.npy", broken)
    with pytest.raises(DataError, match="goal_row.npy points past the"):
        load_text_rows(Paths(root))
