"""The typed-text check: perturbed queries, their Q beside the right one's, the report against the tie level."""

import shutil

import numpy as np
import pytest
import torch
from conftest import H

from digiq.algos.digiq import build_critic
from digiq.config import CriticConfig, load_settings
from digiq.data import TrajectoryStore
from digiq.data.candidates import read_candidates
from digiq.data.features import critic_inputs, load_text_rows
from digiq.diagnostics.ground_truth import expert_matrix
from digiq.diagnostics.typed_text import (
    PERTURBATIONS,
    perturbations,
    typed_text_report,
    typed_versions_q,
    typing_states,
    versions_of,
)
from digiq.env.actions import format_action, parse_action, press_back, type_text
from digiq.models.critic import Critic, CriticNetConfig, TextStart, critic_scores
from digiq.models.policy import AutoUIPolicy
from digiq.paths import Paths
from digiq.stages.diagnostics import typed_text_check
from digiq.tables import typed_text_table


def test_each_perturbation_differs_from_the_query_and_a_one_word_query_gets_fewer():
    rng = np.random.default_rng(0)
    made = perturbations("seagate 2tb hard drive", ["seagate 2tb hard drive", "Apple Watch"], rng)
    assert set(made) == set(PERTURBATIONS) and "seagate 2tb hard drive" not in made.values()
    assert sorted(made["drop_word"].split()) != sorted("seagate 2tb hard drive".split())
    assert sorted(made["swap_words"].split()) == sorted("seagate 2tb hard drive".split())
    assert sorted(made["misspell"]) == sorted("seagate 2tb hard drive")  # the same letters, one pair swapped
    assert made["other_task"] == "Apple Watch"
    assert set(perturbations("aa", ["AA "], rng)) == {"misspell"}  # a doubled letter; the other query is the same
    rows, available = versions_of(["lamp", "desk lamp"], rng)
    assert rows[0][0] == "lamp" and available.tolist() == [[False, False, True, True], [True, True, True, True]]


def test_the_report_is_half_a_point_per_win_over_the_tie_level_with_an_interval():
    episodes = np.arange(40) // 2
    available = np.ones((40, len(PERTURBATIONS)), bool)
    available[:, 0] = False  # no dropped words anywhere: that kind is left out
    knows = [np.c_[np.ones(40), np.zeros((40, 4))] for _ in range(3)]
    blind = [np.zeros((40, 5)) for _ in range(3)]
    good, ties = typed_text_report(knows, available, episodes), typed_text_report(blind, available, episodes)
    assert good["all"]["diff"] == 50.0 and good["all"]["ci95"][0] == 50.0 and good["all"]["win_share"] == 1.0
    assert ties["all"]["diff"] == 0.0 and ties["all"]["tie_share"] == 1.0 and ties["all"]["ci95"] == [0.0, 0.0]
    assert "drop_word" not in good and good["all"]["units"] == 40 * 3


@pytest.mark.parametrize("encoder", ["trained", "frozen"])
def test_the_right_query_scores_as_the_critic_scores_its_candidate(values_root, encoder):
    """Version 0 is the right query itself: its Q is the critic's Q of that candidate, through the towers or the
    frozen averages; a version with other words scores otherwise."""
    paths = Paths(values_root)
    steps = TrajectoryStore(paths.offline).read().to_pandas()
    typed = np.flatnonzero([parse_action(a).text != "" and "TYPE" in a for a in steps.action])
    assert len(typed) >= 2
    texts = load_text_rows(paths)[0]
    policy = AutoUIPolicy.load(paths.base_policy)
    cfg = CriticConfig(hidden=16, text_encoder=encoder)
    inputs = critic_inputs(paths, text=True, towers=cfg.towers)
    torch.manual_seed(0)
    critic = build_critic(cfg, inputs, TextStart(policy, texts)).eval()
    queries = [parse_action(steps.action.iat[i]).text for i in typed]
    q = typed_versions_q(critic, inputs, typed, np.zeros(len(typed), int), [[t, t + " xyz"] for t in queries], texts,
                         policy)  # fmt: skip
    scored = critic_scores({"general": critic}, inputs, np.array(["general"] * len(steps)))["q"][typed, 0]
    np.testing.assert_allclose(q[:, 0], scored, rtol=1e-4, atol=1e-5)
    assert not np.allclose(q[:, 1], q[:, 0])


def test_typing_states_are_where_the_expert_types_and_a_candidate_does_it_and_frozen_extras_are_refused():
    lists = [[format_action(type_text("a b")), format_action(press_back())],
             [format_action(press_back()), format_action(type_text("c d"))],
             [format_action(press_back()), format_action(type_text("e"))]]  # fmt: skip
    right = np.array([[True, False], [False, True], [False, False]])
    states, columns = typing_states(right, np.array(["TYPE", "TYPE", "TYPE"]), lists, np.arange(3))
    assert states.tolist() == [0, 1] and columns.tolist() == [0, 1]
    critic = Critic(CriticNetConfig(feature_dim=H, hidden=4, text=True, typed=True))
    with pytest.raises(ValueError, match="on the action's text alone"):
        typed_versions_q(critic, {"state": np.zeros((1, H), np.float32)}, np.array([0]), np.array([0]), [["a"]], [],
                         None)  # fmt: skip


def test_stage_08_checks_every_critic_row_that_reads_the_action_s_text_alone(values_root, tmp_path):
    """The stage's check on a small root: a critic with towers and one on frozen averages are both checked, at the
    states where the expert types and some candidate types what it would; a critic without text is not."""
    shutil.copytree(values_root, tmp_path / "root")
    paths = Paths(tmp_path / "root")
    settings = load_settings(paths.root / "params.yaml")
    steps = TrajectoryStore(paths.offline).read().to_pandas()
    cands = read_candidates(paths).to_pandas()
    right, kinds = expert_matrix(settings.env, settings.collect.seed, steps, cands)
    start = TextStart.of(paths)
    for row, encoder in (("digiq", "trained"), ("digiq_frozen_text", "frozen")):
        cfg = CriticConfig(hidden=16, text_encoder=encoder)
        torch.manual_seed(0)
        critic = build_critic(cfg, critic_inputs(paths, text=True, towers=cfg.towers), start)
        critic.save(paths.critic(0, row, "general"), stage="critic")
    Critic(CriticNetConfig(feature_dim=H, hidden=4)).save(paths.critic(0, "digiq_untuned", "general"), stage="critic")
    lists = cands.action_list.tolist()
    out = typed_text_check(paths, ["digiq", "digiq_frozen_text", "digiq_untuned"], 1, 0, right, kinds, lists,
                           np.arange(len(steps)), steps.traj_id.to_numpy(), steps.task_set.to_numpy())  # fmt: skip
    assert out["states"] == len(typing_states(right, kinds, lists, np.arange(len(steps)))[0]) > 0
    assert {out["digiq"]["text_encoder"], out["digiq_frozen_text"]["text_encoder"]} == {"trained", "frozen"}
    for row in ("digiq", "digiq_frozen_text"):
        assert set(out[row]) >= {"all", "general"} and len(out[row]["all"]["all"]["ci95"]) == 2
    assert "digiq_untuned" not in out  # its critic reads no text


def test_the_table_gives_each_critic_s_check_and_the_pick_where_the_expert_types():
    r = {"diff": 12.3, "ci95": [-1.0, 20.1], "units": 10, "clusters": 3, "seeds": 3, "win_share": 0.6,
         "tie_share": 0.1}  # fmt: skip
    typed = {"states": 40, "states_by_task_set": {"webshop": 40},
             "digiq": {"text_encoder": "trained", "all": {"all": r}, "webshop": {"all": r, "misspell": r}}}  # fmt: skip
    lines = typed_text_table(typed, {"digiq": {"webshop": {"all": r, "typing": r, "other": r}}})
    assert (
        "| digiq | trained | Web Shopping | misspell | +12.3 [-1.0, +20.1], no detectable difference | 60.0 | 10.0 |"
        in lines
    )
    assert "| digiq | where the expert types | Web Shopping | +12.3 [-1.0, +20.1], no detectable difference |" in lines
    assert typed_text_table({"states": 0}, {})[0].startswith("Typed-text check off")
