"""The scale study: nested shares of the offline data, Digi-Q and Filtered BC fit at each actor budget, played on
the validation lists."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from digiq.data.picks import Picks
from digiq.env.taskgen import generate_tasks
from digiq.models.policy import AutoUIPolicy
from digiq.paths import Paths
from digiq.scale_study import imitated, main, nested_subset


def _steps(per_set: int) -> pd.DataFrame:
    rows = [(ts, f"{ts}-{t}") for ts in ("general", "webshop") for t in range(per_set) for _ in range(3)]
    return pd.DataFrame(rows, columns=["task_set", "traj_id"])


def test_a_smaller_share_of_the_data_is_inside_a_larger_one_in_every_task_set():
    steps = _steps(20)
    quarter, half, whole = (nested_subset(steps, f, seed=7) for f in (0.25, 0.5, 1.0))
    assert whole.all() and not (quarter & ~half).any()
    for ts in ("general", "webshop"):
        mine = steps.task_set == ts
        assert steps.traj_id[mine & quarter].nunique() == 5 and steps.traj_id[mine & half].nunique() == 10
    # Whole trajectories, never a part of one.
    assert steps.assign(k=half).groupby("traj_id").k.nunique().max() == 1
    assert (nested_subset(steps, 0.5, seed=7) == half).all() and not (nested_subset(steps, 0.5, seed=8) == half).all()
    one_each = _steps(1)
    assert one_each.traj_id[nested_subset(one_each, 0.1, seed=0)].nunique() == 2  # a trajectory per task set at least


def test_imitated_rows_are_judged_overall_and_where_the_expert_s_action_was_on_offer():
    # Four states of one task set; state 3 holds no candidate the expert would take.
    right = np.array([[True, False], [False, True], [False, True], [False, False]])
    of_set = np.array(["general"] * 4)
    seed0 = Picks(np.array([0, 1, 3]), np.array([0, 0, 1]))  # right, wrong, nothing right to pick
    seed1 = Picks(np.array([1, 2]), np.array([1, 1]))  # right, right
    out = imitated([seed0, seed1], right, of_set)["general"]
    assert out["rows"] == 2.5
    assert out["expert_share"] == pytest.approx((1 / 3 + 1) / 2, abs=1e-4)
    assert out["at_states_with_an_expert_candidate"] == pytest.approx((2 / 3 + 1) / 2, abs=1e-4)
    assert out["expert_share_there"] == pytest.approx((1 / 2 + 1) / 2, abs=1e-4)
    assert imitated([Picks(np.array([], int), np.array([], int))], right, of_set)["general"]["expert_share"] is None


@pytest.mark.parametrize("fraction", [0.0, 1.5])
def test_a_share_outside_zero_to_one_is_refused(fraction):
    with pytest.raises(ValueError, match="fraction"):
        nested_subset(_steps(2), fraction, seed=0)


@pytest.mark.slow
def test_the_study_fits_each_row_at_each_budget_and_plays_the_validation_list(values_root, tmp_path, capsys):
    root = tmp_path / "root"
    shutil.copytree(values_root, root)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["experiment"] = {**params.get("experiment", {}), "seeds": 1}
    params["critic"].update(steps=3, batch_size=8, hidden=16)
    params["actor"].update(batch_size=4)
    params["eval"] = {**params.get("eval", {}), "n_envs": 2}
    params["compute"] = {**params.get("compute", {}), "workers": 1}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    paths = Paths(root)
    paths.task_list("general", "val").parent.mkdir(parents=True, exist_ok=True)
    paths.task_list("general", "val").write_text("\n".join(generate_tasks("general", "val", 1, seed=5)) + "\n")
    out = tmp_path / "study"
    args = ["--fractions", "0.5", "1", "--updates", "1", "2", "--rows", "filtered_bc", "--critic", "twin_min"]
    result = main(["--root", str(root), "--out-dir", str(out), *args])
    assert json.loads((out / "study.json").read_text()) == json.loads(json.dumps(result))
    half, whole = result["fractions"]["0.5"], result["fractions"]["1"]
    assert result["critic"] == "twin_min"
    assert 0 < half["trajectories"]["general"] < whole["trajectories"]["general"] == 5
    imitated = whole["imitated"]["filtered_bc"]["general"]
    assert imitated["rows"] > 0 and 0 <= imitated["expert_share"] <= 1
    pick = whole["critic_heldout_pick"]["hit_rate"]
    assert 0 <= pick["critic"] <= 1 and len(pick["critic_per_seed"]) == 1 and 0 < pick["uninformed"] < 1
    for fraction in ("0.5", "1"):
        for updates in (1, 2):
            rate = result["fractions"][fraction]["budgets"][updates]["filtered_bc"]["general"]
            assert 0 <= rate["success_rate"] <= 1 and len(rate["per_seed"]) == 1
            evaluation = json.loads((out / f"{fraction}_{updates}_filtered_bc.json").read_text())
            assert evaluation["general"]["n_episodes"] == 1 and evaluation["policy"][0].endswith("filtered_bc")
    # Filtered BC at one and two steps of the same rows: different weights, both fit from the base policy.
    one, two = (AutoUIPolicy.load(out / f"1_{u}" / "seed0" / "filtered_bc" / "general") for u in (1, 2))
    base = AutoUIPolicy.load(paths.base_policy)
    w = [torch.cat([p.detach().flatten() for p in m.parameters()]) for m in (base, one, two)]
    assert not torch.equal(w[0], w[1]) and not torch.equal(w[1], w[2])
    assert "fraction 0.5" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "named"),
    [(["--fractions", "0"], "--fractions"), (["--updates", "0"], "--updates"), (["--critic", "big"], "--critic")],
)
def test_bad_arguments_are_named(values_root, tmp_path, capsys, args, named):
    with pytest.raises(SystemExit):
        main(["--root", str(values_root), "--out-dir", str(tmp_path / "x"), *args])
    assert named in capsys.readouterr().err and not (tmp_path / "x").exists()
