"""The actor study: Digi-Q's actor refit from stage 07's picks under the loss as released and the one before, and
from changed rows, played on the validation lists; what Digi-Q's rows are."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import yaml

from digiq import actor_study
from digiq.actor_study import beyond_clamp, main, on_kept, row_report, typing_taken
from digiq.config import load_params
from digiq.data import TrajectoryStore
from digiq.data.picks import Picks
from digiq.env.actions import format_action, press_back, tap, type_text
from digiq.env.taskgen import generate_tasks
from digiq.models.policy import AutoUIPolicy
from digiq.paths import Paths
from digiq.stages.actor import run as actor_stage
from digiq.stages.launch import run_stage

TYPE_A, TYPE_B = format_action(type_text("gopro hero")), format_action(type_text("gopxo hero"))
TAP, BACK = format_action(tap(0.5, 0.5)), format_action(press_back())


def test_untaken_typing_rows_become_the_data_s_action_and_others_stay():
    lists = [[TAP, TYPE_B], [TYPE_A, TYPE_B], [BACK, TAP]]
    picks = Picks(np.array([0, 1, 2]), np.array([1, 1, 1]), np.array([1.0, 2.0, 3.0]))
    changed = typing_taken(picks, lists)
    assert changed.columns.tolist() == [0, 0, 1] and changed.weights.tolist() == [1.0, 2.0, 3.0]
    assert typing_taken(Picks(np.array([1]), np.array([0])), lists).columns.tolist() == [0]  # the data's own typing
    kept = on_kept(picks, np.array([2, 0]))
    assert kept.states.tolist() == [0, 2] and kept.columns.tolist() == [1, 1]


def test_the_row_report_crosses_picked_and_expert_kinds_and_reads_the_typed_goal():
    steps = pd.DataFrame({"task_set": ["webshop"] * 3, "task": ["Search for gopro hero on ebay"] * 3})
    cands = pd.DataFrame({"action_list": [[TYPE_A, TYPE_B], [TAP, TYPE_B], [TAP, BACK]]})
    right = np.array([[True, False], [False, False], [True, False]])
    kinds = np.array(["TYPE", "TYPE", "DUAL_POINT"])
    seeds = [Picks(np.array([0, 1, 2]), np.array([1, 1, 1])), Picks(np.array([0]), np.array([0]))]
    out = row_report(seeds, steps, cands, right, kinds)["webshop"]
    assert out["rows_per_seed"] == 2.0 and out["typing_rows_per_seed"] == 1.5
    assert out["kinds"] == {"DUAL_POINT": {"PRESS_BACK": 0.25}, "TYPE": {"TYPE": 0.75}}
    typing = out["typing"]
    # 9 of "gopxo hero"'s 10 characters are in the goal; the data's action types the goal's words at states 0, taps at 1
    assert typing["goal_share_picked"] == round((0.9 + 0.9 + 1.0) / 3, 4)
    assert typing["goal_share_data"] == round((1.0 + 0.0 + 1.0) / 3, 4)
    assert typing["expert_share_picked"] == round(1 / 3, 4) and typing["expert_share_data"] == round(2 / 3, 4)
    assert "rows_with_a_token_below_clamp" not in out  # no base policy given


@pytest.mark.slow
def test_the_study_refits_digiq_per_setting_and_compares_each_with_the_released_loss(values_root, tmp_path,
                                                                                      monkeypatch):  # fmt: skip
    root = tmp_path / "root"
    shutil.copytree(values_root, root)
    torch.manual_seed(1)
    params = load_params(root / "params.yaml")
    # Every state kept: Digi-Q's untrained critic here would keep few.
    params["actor"].update({"updates": 2, "batch_size": 4, "k_candidates": 2, "threshold_general": -10.0})
    params["ablations"] = {"untuned_vlm": False, "blind_vlm": False, "n_candidates": [], "perfect_critic": True,
                           "extraction": []}  # fmt: skip
    params["experiment"] = {"seeds": 1}
    params["variants"] = {}
    params["eval"] = {**params.get("eval", {}), "n_envs": 2}
    (root / "params.yaml").write_text(yaml.safe_dump(dict(params)))
    (root / "params").mkdir(exist_ok=True)
    (root / "params" / "compute.yaml").write_text(yaml.safe_dump({"compute": {"processes": 1, "workers": 1}}))
    paths = Paths(root)
    run_stage(actor_stage, paths, paths.root / "params.yaml")
    paths.task_list("general", "val").parent.mkdir(parents=True, exist_ok=True)
    paths.task_list("general", "val").write_text("\n".join(generate_tasks("general", "val", 2, seed=5)) + "\n")
    out = tmp_path / "study"
    result = main(["--root", str(root), "--out-dir", str(out), "--settings", "no_clamp", "perfect_on_kept",
                   "--updates", "1"])  # fmt: skip
    assert json.loads((out / "study.json").read_text()) == json.loads(json.dumps(result))
    assert list(result["settings"]) == ["released", "no_clamp", "perfect_on_kept"]
    for name in ("released", "no_clamp", "perfect_on_kept"):
        assert (out / f"{name}_1" / "seed0" / "digiq" / "general" / "config.json").exists()
        assert 0 <= result["settings"][name]["1"]["general"]["success_rate"] <= 1
    compared = result["against_released"]["no_clamp"]["1"]["general"]
    assert compared["n_tasks"] == 2 and compared["seeds"] == 1 and len(compared["ci95"]) == 2
    rows = result["rows"]["general"]
    assert rows["rows_per_seed"] > 0 and 0 <= rows["rows_with_a_token_below_clamp"] <= 1

    # Called again on the same folder, the study reads the evaluations it wrote instead of fitting again.
    def fit_again(*args, **kwargs):
        raise AssertionError("fit again what the folder's evaluations hold")

    monkeypatch.setattr(actor_study, "map_jobs", fit_again)
    again = main(["--root", str(root), "--out-dir", str(out), "--settings", "no_clamp", "perfect_on_kept",
                  "--updates", "1"])  # fmt: skip
    assert json.loads(json.dumps(again)) == json.loads(json.dumps(result))
    monkeypatch.undo()

    # The actor's settings refit Filtered BC's picks too; the row settings are Digi-Q's only.
    fbc = main(["--root", str(root), "--out-dir", str(tmp_path / "fbc"), "--row", "filtered_bc", "--settings",
                "no_clamp", "--updates", "1"])  # fmt: skip
    assert (tmp_path / "fbc" / "no_clamp_1" / "seed0" / "filtered_bc" / "general" / "config.json").exists()
    assert set(fbc["against_released"]) == {"no_clamp"} and "rows" not in fbc  # the row report is Digi-Q's
    with pytest.raises(SystemExit):
        main(["--root", str(root), "--out-dir", str(tmp_path / "x"), "--row", "filtered_bc", "--settings",
              "typing_taken"])  # fmt: skip


def test_rows_beyond_the_clamp_are_those_whose_lowest_or_highest_token_probability_lies_past_it(values_root):
    """Against each row's own token probabilities, one row at a time: its lowest below 0.001, its highest above
    0.99."""
    paths = Paths(values_root)
    base = AutoUIPolicy.load(paths.base_policy)
    store = TrajectoryStore(paths.offline)
    steps = store.read().to_pandas().head(8)
    images = base.screen.prepare(store.load_images(steps.image_path.tolist()))
    prompts, actions = steps.observation.tolist(), steps.action.tolist()
    below, above = beyond_clamp(base, prompts, images, actions)
    pad = base.tokenizer.pad_token_id
    with torch.no_grad():
        for i in range(len(steps)):
            enc = base.encode(prompts[i : i + 1], images[i : i + 1])
            labels = base._labels(actions[i : i + 1])
            written = F.pad(base.t5._shift_right(labels.masked_fill(labels == -100, pad)), (1, 0), value=pad)
            probs = base._target_logprobs(enc, written, labels.clamp(min=0))[labels != -100].exp()
            assert below[i] == bool(probs.min() < 0.001) and above[i] == bool(probs.max() > 0.99)
