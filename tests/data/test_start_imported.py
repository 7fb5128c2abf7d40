"""Starting the pipeline from imported data at stage 02, 04 or 06: files placed, then a real `dvc repro`."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from released import released, save_released

from digiq.config import load_settings
from digiq.data import DataError, TrajectoryStore
from digiq.data.candidates import read_candidates
from digiq.data.features import load_features
from digiq.data.legacy import import_legacy
from digiq.data.start import place_imported, upstream_stages
from digiq.paths import ROOT, Paths

pytestmark = pytest.mark.slow  # stages 06-10 under DVC on imported data

OFF = {
    "diagnostics": {"oracle_states": 0},
    "ablations": {"untuned_vlm": False, "blind_vlm": False, "perfect_critic": False},
    "critic": {"tap_targets": False, "list_entries": False},
}


def _imported(tmp_path, name: str, task_set: str, digiq: bool = True, reverse: bool = False):
    """One released file, imported; ``reverse`` stores its trajectories out of id order, as a file may."""
    (tmp_path / name).mkdir()
    data, imgs = released(tmp_path / name, digiq=digiq)
    if reverse:
        data = data[::-1]
    out = tmp_path / f"imported_{name}"
    import_legacy(save_released(tmp_path / name, data), out, imgs, task_set=task_set, trust_pickle=True)
    return out, [step for traj in data for step in traj]


def test_two_released_files_become_the_inputs_of_the_critic(tmp_path):
    general, g_steps = _imported(tmp_path, "g", "general")
    webshop, w_steps = _imported(tmp_path, "w", "webshop", reverse=True)
    paths = Paths(tmp_path / "root")
    placed = place_imported([general, webshop], paths, "critic", load_settings(params=OFF))
    assert placed["steps"] == 18 and placed["features"] == str(paths.features())
    steps = TrajectoryStore(paths.offline).read().to_pandas()
    # Distinct trajectory ids (both files use 10..12), each folder's screenshots readable from the merged store.
    assert sorted(set(steps.traj_id)) == [10, 11, 12, 23, 24, 25]
    assert list(steps.task_set) == ["general"] * 9 + ["webshop"] * 9
    for row in steps.itertuples():
        assert TrajectoryStore(paths.offline).load_image(row.image_path).shape == (24, 12, 3)
    cands = read_candidates(paths).to_pandas()
    assert list(zip(cands.traj_id, cands.step_id)) == list(zip(steps.traj_id, steps.step_id))
    # Feature rows follow the sorted step table, although the second file listed its trajectories in reverse.
    by_key = {(s["traj_id"] + shift, s["step_id"]): s for shift, part in ((0, g_steps), (13, w_steps)) for s in part}
    feats = load_features(paths)
    for i, row in enumerate(steps.itertuples()):
        step = by_key[(row.traj_id, row.step_id)]
        assert row.action == step["action"]
        np.testing.assert_allclose(feats["state"][i], step["image_features"].numpy())
        np.testing.assert_allclose(feats["next_state"][i], step["next_image_features"].numpy())
        np.testing.assert_allclose(feats["candidates"][i], step["q_rep_out_list"].numpy())
    assert feats["state"].shape == (18, 1408) and feats["candidates"].shape == (18, 3, 8)
    assert np.isnan(feats["p_yes"]).all()  # the released files keep no P(Yes)


def test_what_imported_data_cannot_give_is_refused_by_name(tmp_path):
    digirl, _ = _imported(tmp_path, "r", "general", digiq=False)
    paths = Paths(tmp_path / "root")
    with pytest.raises(DataError, match="lacks candidates.parquet, which starting at vlm_finetune needs"):
        place_imported([digirl], paths, "vlm_finetune", load_settings(params=OFF))
    with pytest.raises(DataError, match="diagnostics.oracle_states must be 0"):
        place_imported(
            [digirl], paths, "augment_actions", load_settings(params={**OFF, "diagnostics": {"oracle_states": 200}})
        )
    with pytest.raises(DataError, match="critic.tap_targets must be false"):
        place_imported(
            [digirl], paths, "augment_actions", load_settings(params={**OFF, "critic": {"tap_targets": True}})
        )
    with pytest.raises(DataError, match="variants.digiq_hierarchy.tap_targets must be false"):
        place_imported(
            [digirl],
            paths,
            "augment_actions",
            load_settings(params={**OFF, "variants": {"digiq_hierarchy": {"tap_targets": True}}}),
        )
    with pytest.raises(DataError, match="ablations.untuned_vlm must be false"):
        place_imported(
            [digirl],
            paths,
            "critic",
            load_settings(params={**OFF, "ablations": {**OFF["ablations"], "untuned_vlm": True}}),
        )
    with pytest.raises(DataError, match="ablations.perfect_critic must be false"):
        place_imported(
            [digirl],
            paths,
            "augment_actions",
            load_settings(params={**OFF, "ablations": {**OFF["ablations"], "perfect_critic": True}}),
        )
    with pytest.raises(DataError, match="not 'embed'"):
        place_imported([digirl], paths, "embed", load_settings(params=OFF))
    assert not paths.offline.exists()  # nothing written by a refused call
    # The fine-tune starts from stage 03's VLM, which no import holds; the critic on imported features does not.
    # dvc repro --downstream runs nothing above the start: the embed stage after augment_actions needs the VLM's
    # fine-tune, which reads the (imported) steps but is no stage after augment_actions.
    # PAE's stages are no stage after any of these, yet evaluation reads their rows: they run first, PAE's learned
    # evaluator on the pretrained VLM and the (imported) steps.
    # (Each list in two pieces: a literal list of six or more stages reads as a second copy of the pipeline.)
    before_collect = ["fingerprints", "tasks", "base_policy", "vlm_pretrain"]
    assert upstream_stages("augment_actions")[:4] == before_collect
    assert upstream_stages("augment_actions")[4:] == ["vlm_finetune", "propose", "pae"]
    # The critic's text features read the (imported) steps and candidates and the base policy, never a VLM.
    for stage in ("vlm_finetune", "critic"):
        assert upstream_stages(stage)[:4] == before_collect
        assert upstream_stages(stage)[4:] == ["critic_inputs", "propose", "pae"]
    with pytest.raises(DataError, match="cannot start at 'embed'"):
        upstream_stages("embed")
    placed = place_imported(
        [digirl], paths, "augment_actions", load_settings(params=OFF)
    )  # a DigiRL file starts at stage 02
    assert placed["steps"] == 9 and "candidates" not in placed


def test_a_broken_feature_file_leaves_the_previous_outputs_whole(tmp_path):
    general, _ = _imported(tmp_path, "g", "general")
    paths = Paths(tmp_path / "root")
    place_imported([general], paths, "critic", load_settings(params=OFF))
    before = sorted(p.name for p in paths.offline.rglob("*"))
    np.save(general / "q_rep_out_list.npy", np.zeros((5, 3, 8), np.float32))  # rows no longer match the steps
    with pytest.raises(DataError, match="q_rep_out_list.npy has 5 rows for 9 steps"):
        place_imported([general], paths, "critic", load_settings(params=OFF))
    assert sorted(p.name for p in paths.offline.rglob("*")) == before


TINY = {
    "tasks": {"n_train": 16, "n_test": 4},
    "base_policy": {"demo_tasks": 8, "epochs": 1, "d_model": 64},
    "vlm_pretrain": {"steps": 4, "batch_size": 4, "eval_questions": 4, "hidden": 64},
    "critic": {"steps": 4, "hidden": 32, "tap_targets": False, "list_entries": False, "typed_match": True},
    "actor": {
        "updates": 3,
        "k_candidates": 3,
        "threshold_general": -1.0,
        "threshold_webshop": -1.0,
    },  # fmt: skip
    "diagnostics": {"oracle_states": 0},
    "digirl": {"online": []},
    "pae": {"rows": []},
    "eval": {"n_tasks": 4, "n_envs": 4},
    "experiment": {"seeds": 1},
    "ablations": {"untuned_vlm": False, "blind_vlm": False, "n_candidates": [1], "perfect_critic": False},
}


def test_dvc_runs_the_pipeline_from_the_critic_on_imported_data(tmp_path):
    """`start-at critic`, then the stages above it alone and `dvc repro --downstream critic`, in a copy of the repo."""
    repo = tmp_path / "repo"
    for folder in ("digiq", "notebooks", "params"):
        shutil.copytree(
            ROOT / folder, repo / folder, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints")
        )
    (repo / ".dvc").mkdir()
    for rel in ("dvc.yaml", ".dvcignore", ".dvc/config"):
        shutil.copy2(ROOT / rel, repo / rel)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for group, values in TINY.items():
        params[group].update(values)
    params["variants"] = {"digiq_cql": {"conservative": 0.3}}  # a variant needs nothing the released files lack
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    general, _ = _imported(tmp_path, "g", "general")
    bin_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TQDM_DISABLE": "1"}

    def run(*cmd: str) -> str:
        done = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{cmd}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
        return done.stdout

    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "copy"],
                   cwd=repo, check=True)  # as a clone has: dvclive logs curves against a commit  # fmt: skip
    placed = json.loads(run(sys.executable, "-m", "digiq.data", "start-at", "critic", str(general)))
    # Each stage alone (--single-item): the critic's text inputs read the imported steps, which no stage here wrote.
    assert placed["next"] == [
        "dvc repro --single-item fingerprints tasks base_policy vlm_pretrain critic_inputs propose pae",
        "dvc repro --downstream critic",
    ]
    for command in placed["next"]:
        run(sys.executable, "-m", *command.split())
    metrics = repo / "metrics"
    assert not (metrics / "collect.json").exists() and not (metrics / "embed.json").exists()  # skipped
    critic = json.loads((metrics / "critic.json").read_text())
    assert critic["wall_time_s"] >= 0
    critics = repo / "data" / "models" / "critic" / "seed0" / "digiq"
    assert [p.name for p in critics.iterdir()] == ["general"]  # one critic per task set the imported data hold
    net = json.loads((critics / "general" / "config.json").read_text())
    # The released shapes, then the text features the base policy's encoder adds (goal and previous action to
    # the state, type and typed text to each candidate), and the typed text's two match numbers (typed_match).
    d = json.loads((repo / "data" / "models" / "base_policy" / "config.json").read_text())["policy"]["d_model"]
    assert net["critic"]["feature_dim"] == 1408 + 3 * d and net["critic"]["action_dim"] == 8 + 2 * d + 2
    assert net["critic"]["text"]
    actor = json.loads((metrics / "actor.json").read_text())
    assert actor["states"] == 9
    report = json.loads((metrics / "eval.json").read_text())
    assert set(report) == {"base", "digiq", "filtered_bc", "digirl_offline", "digiq_cql"}
    assert all(set(by_set) == {"general"} for by_set in report.values())  # the task sets the policies were fit on
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    assert {"critic_inputs", "critic", "actor", "eval", "base_policy"} <= set(lock)
    assert not {"collect", "embed"} & set(lock)
    assert pq.read_table(repo / "data" / "candidates" / "candidates.parquet").num_rows == 9
