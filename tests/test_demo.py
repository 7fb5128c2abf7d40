"""`make demo`: the whole pipeline at the demo preset in a scratch copy, the checkout left as it was."""

import json
import shutil
import subprocess
import sys

import pytest
import yaml
from conftest import checkout_digests

from digiq.demo import DEMO_PRESET, RESULTS, DemoError, make_workspace, workspace_environ
from digiq.paths import ROOT
from digiq.preset import read_preset


def test_the_demo_preset_names_known_knobs_of_params_yaml():
    assert list(read_preset(DEMO_PRESET)) == [ROOT / "params.yaml"]


def test_a_workspace_inside_the_checkout_or_holding_other_files_is_refused(tmp_path):
    with pytest.raises(DemoError, match="is inside the checkout"):
        make_workspace(ROOT / "demo-scratch")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(DemoError, match="holds files that no demo put there"):
        make_workspace(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    done = subprocess.run([sys.executable, "-m", "digiq.demo", "--workspace", str(tmp_path)], capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 2 and "holds files that no demo put there" in done.stderr


def test_the_workspace_is_a_copy_with_the_preset_written_in(tmp_path):
    before = checkout_digests()
    changed = make_workspace(tmp_path / "demo")
    assert "params.yaml: tasks.n_train: 700 -> 16" in changed
    params = yaml.safe_load((tmp_path / "demo" / "params.yaml").read_text())
    assert params["tasks"]["n_train"] == 16 and params["experiment"]["seeds"] == 2
    assert (tmp_path / "demo" / "digiq" / "demo.py").exists() and (tmp_path / "demo" / ".git").exists()
    assert not (tmp_path / "demo" / "dvc.lock").exists()  # a fresh run: the committed lock is the checkout's
    assert make_workspace(tmp_path / "demo") == changed  # again: the code and params anew, the preset written in
    assert checkout_digests() == before


@pytest.mark.slow  # every stage under `dvc repro`, notebooks executed
def test_the_demo_runs_every_stage_and_ends_with_its_results(demo_run):
    workspace, shown, before = demo_run
    assert "| digiq |" in shown and "| base |" in shown
    assert (workspace / RESULTS).read_text().strip() in shown
    figures = {p.name for p in (workspace / "plots").glob("*.png")}
    assert {"results.png", "ablations.png", "claims.png", "digirl_online.png", "pae.png"} <= figures
    executed = sorted(p.name for p in (workspace / "docs" / "notebooks").glob("*.ipynb"))
    assert executed == sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")
                              if not p.name.startswith("13_"))  # fmt: skip
    status = subprocess.run([sys.executable, "-m", "dvc", "status"], cwd=workspace, capture_output=True, text=True)
    assert "changed" not in status.stdout.replace("always changed", ""), status.stdout
    assert checkout_digests() == before


@pytest.mark.slow  # stage 12 rerun under `dvc exp run`, in a copy of the demo's run
def test_a_setting_is_tried_as_a_dvc_experiment_beside_the_demos_run(demo_run, tmp_path):
    before = checkout_digests()
    workspace = tmp_path / "workspace"  # a copy: the session's run stays as other tests read it
    shutil.copytree(demo_run.workspace, workspace, symlinks=True)
    git_status = subprocess.run(["git", "status", "--porcelain"], cwd=workspace, capture_output=True, text=True)
    assert git_status.stdout == "", git_status.stdout  # the run is committed: the experiments' baseline
    assert "dvc exp run -S eval.temperature=0" in demo_run.shown

    dvc, env = [sys.executable, "-m", "dvc"], workspace_environ(workspace)
    done = subprocess.run([*dvc, "exp", "run", "-S", "eval.temperature=0"], cwd=workspace, env=env,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = [line for line in done.stdout.splitlines() if line.startswith("Running stage")]
    assert ran == ["Running stage 'fingerprints':", "Running stage 'eval':"], ran  # only what reads eval

    shown = subprocess.run([*dvc, "exp", "show", "--json"], cwd=workspace, env=env, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    (baseline,) = [row for row in json.loads(shown.stdout) if row["rev"] != "workspace"]
    (experiment,) = baseline["experiments"]
    tried = experiment["revs"][0]["data"]
    for data, temperature in ((baseline["data"], 0.8), (tried, 0)):
        assert data["params"]["params.yaml"]["data"]["eval"]["temperature"] == temperature
        eval_metrics = data["metrics"]["metrics/eval.json"]["data"]
        assert 0 <= eval_metrics["digiq"]["general"]["success_rate"] <= 1
    assert checkout_digests() == before
