"""The critic study: named settings fit on the same data, judged on the same strata."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from digiq.algos.digiq import fit_critic
from digiq.config import CriticConfig, load_settings
from digiq.data.features import critic_inputs
from digiq.data.trajectories import TrajectoryStore
from digiq.diagnostics import critic_study
from digiq.diagnostics.critic_study import SETTINGS, main, strata, study
from digiq.models.critic import TextStart
from digiq.paths import Paths


def test_strata_split_the_held_out_states_by_outcome_by_the_taken_action_and_by_the_experts_kind():
    steps = pd.DataFrame({"trajectory_reward": [1.0, 1.0, 0.0, 0.0, 0.0]})
    right = np.array([[True, False], [False, True], [True, True], [False, False], [True, False]])
    held = np.array([True, True, True, False, False])
    expert_kinds = np.array(["TYPE", "TAP", "TYPE", "TYPE", "BACK"])
    masks = strata(steps, right, expert_kinds, held)
    assert masks["train"].tolist() == [False, False, False, True, True]
    assert masks["heldout, episode succeeded"].tolist() == [True, True, False, False, False]
    assert masks["heldout, episode failed"].tolist() == [False, False, True, False, False]
    assert masks["heldout, taken action the expert's"].tolist() == [True, False, True, False, False]
    assert masks["heldout, taken action not the expert's"].tolist() == [False, True, False, False, False]
    assert masks["heldout, the expert types"].tolist() == [True, False, True, False, False]
    assert masks["heldout, the expert does not type"].tolist() == [False, True, False, False, False]


def test_every_setting_is_judged_on_the_same_states_against_the_same_levels(values_root, tmp_path):
    paths = Paths(values_root)
    settings = load_settings(values_root / "params.yaml")
    base = CriticConfig(steps=5, hidden=16, batch_size=8)
    env, collect = settings.env, settings.collect
    out = study(paths, base, {"released": {}, "twin_min": {"twin_heads": "min"}}, 2, env, collect.seed)
    states = out["states"]
    assert states["heldout"] + states["train"] == states["heldout, episode succeeded"] + states[
        "heldout, episode failed"] + states["train"] > 0  # fmt: skip
    a, b = (out["settings"][n]["strata"] for n in ("released", "twin_min"))
    assert out["settings"]["twin_min"]["changes"] == {"twin_heads": "min"}
    for stratum, entry in a.items():
        for key, rates in entry.items():
            if key.startswith("hit_rate"):
                assert (
                    rates["uninformed"] == b[stratum][key]["uninformed"]
                )  # the level is the states', not the critic's
                assert len(rates["critic_per_seed"]) == 2 and 0.0 <= rates["critic"] <= 1.0
    assert out["settings"]["released"]["passes"]["general"] == pytest.approx(
        5 * 8 / states["train"], abs=0.01)  # fmt: skip


def test_the_command_line_writes_the_study(values_root, tmp_path, monkeypatch, capsys):
    """The trained towers and the frozen averages side by side: each setting reads the inputs its critic needs."""
    monkeypatch.setitem(SETTINGS, "released", {"steps": 3, "hidden": 16, "batch_size": 8})
    monkeypatch.setitem(SETTINGS, "frozen_text", {"steps": 3, "hidden": 16, "batch_size": 8, "text_encoder": "frozen"})
    out = tmp_path / "study.json"
    result = main(["--root", str(values_root), "--out", str(out), "--settings", "released", "frozen_text", "--seeds",
                   "1"])  # fmt: skip
    assert json.loads(out.read_text()) == result and "released" in capsys.readouterr().out
    assert set(result["settings"]) == {"released", "frozen_text"}
    assert result["settings"]["frozen_text"]["changes"]["text_encoder"] == "frozen"


def test_the_released_setting_can_read_the_stage_s_critics_and_refuses_one_fit_otherwise(values_root, tmp_path):
    """Stage 06's critic saved as the stage saves it reads as the same critic the study would fit; a checkpoint fit
    under other settings is refused, naming it."""
    root = tmp_path / "root"
    shutil.copytree(values_root, root)
    paths = Paths(root)
    settings = load_settings(root / "params.yaml")
    cfg = settings.critic.but(steps=3, hidden=16, batch_size=8)
    feats = critic_inputs(paths, text=cfg.text_features, towers=cfg.towers, targets=cfg.tap_targets,
                          typed=cfg.typed_match, entries=cfg.list_entries)  # fmt: skip
    steps = TrajectoryStore(paths.offline).read().to_pandas()
    fit = fit_critic(cfg, feats, steps, cfg.seed, encoder=TextStart.of(paths) if cfg.towers else None)
    where = paths.critic(0, "digiq", "general")
    fit["critic"].save(where, stage="critic", row="digiq", task_set="general", seed=cfg.seed, steps=cfg.steps,
                       gamma=cfg.gamma, holdout=cfg.holdout, split_seed=cfg.seed)  # fmt: skip
    args = (paths, cfg, {"released": {}}, 1, settings.env, settings.collect.seed)
    assert study(*args, from_stage=True) == study(*args)
    with pytest.raises(ValueError, match=str(where)):
        study(paths, cfg.but(steps=4), {"released": {}}, 1, settings.env, settings.collect.seed, from_stage=True)


def test_a_rerun_reads_the_critics_already_fit_instead_of_fitting_them_again(values_root, tmp_path, monkeypatch):
    monkeypatch.setitem(SETTINGS, "frozen_text", {"steps": 3, "hidden": 16, "batch_size": 8, "text_encoder": "frozen"})
    out = tmp_path / "study.json"
    first = main(["--root", str(values_root), "--out", str(out), "--settings", "frozen_text", "--seeds", "2"])
    assert len(list((tmp_path / "study.json.parts").glob("*.npy"))) == 2  # one per seed (one task set)

    def fit_again(*args, **kwargs):
        raise AssertionError("fit a critic the first run kept")

    monkeypatch.setattr(critic_study, "fit_critic", fit_again)
    assert main(["--root", str(values_root), "--out", str(out), "--settings", "frozen_text", "--seeds", "2"]) == first
    monkeypatch.setitem(SETTINGS, "frozen_text", {"steps": 4, "hidden": 16, "batch_size": 8, "text_encoder": "frozen"})
    with pytest.raises(AssertionError, match="fit a critic"):  # another setting is another critic
        main(["--root", str(values_root), "--out", str(out), "--settings", "frozen_text", "--seeds", "1"])
