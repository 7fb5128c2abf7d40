"""`make demo`: the whole pipeline at the demo preset in a scratch copy, the checkout left as it was."""

import json
import shutil
import subprocess
import sys

import pytest
import yaml
from conftest import checkout_digests

from digiq.demo import DEMO_PRESET, RESULTS, DemoError, environment, make_workspace, output_digests, workspace_environ
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


# What the demo's run made before the last change meant to move no result (python -m digiq.demo --record): a change
# that moves one records it anew, in the commit that says why.
RECORDED = ROOT / "tests" / "demo_outputs.json"


@pytest.mark.slow  # every stage under `dvc repro` (the session's demo run)
def test_the_demo_s_outputs_are_the_recorded_ones_bit_for_bit(demo_run):
    """Every data folder, metrics file and learning-curve log of the demo, without wall times, as recorded: a
    refactor leaves each bit where it was. Bits are promised for the same libraries (the kernels are pinned)."""
    recorded = json.loads(RECORDED.read_text())
    if (mine := environment()) != recorded["environment"]:
        other = {k: (v, mine.get(k)) for k, v in recorded["environment"].items() if mine.get(k) != v}
        pytest.skip(f"{RECORDED.name} was recorded with other libraries (recorded, here): {other}")
    digests = output_digests(demo_run.workspace)
    moved = sorted(k for k in {**digests, **recorded["digests"]} if digests.get(k) != recorded["digests"].get(k))
    assert moved == [], f"these outputs differ from {RECORDED.name}'s: {moved}"


def test_the_digests_leave_out_wall_times_and_see_any_other_change(tmp_path):
    """The digests a run is held to move with a result's bits, and not with its wall times."""
    (tmp_path / "metrics").mkdir()
    (tmp_path / "data" / "offline").mkdir(parents=True)
    (tmp_path / "metrics" / "actor.json").write_text('{"kept_rows": {"digiq": 3}, "wall_time_s": 1.5}')
    (tmp_path / "data" / "offline" / "part-0.parquet").write_bytes(b"rows")
    first = output_digests(tmp_path)
    assert set(first) == {"metrics/actor.json", "data/offline"}
    (tmp_path / "metrics" / "actor.json").write_text('{"kept_rows": {"digiq": 3}, "wall_time_s": 9.0}')
    assert output_digests(tmp_path) == first
    (tmp_path / "data" / "offline" / "part-0.parquet").write_bytes(b"rowz")
    assert output_digests(tmp_path)["data/offline"] != first["data/offline"]
    (tmp_path / "metrics" / "actor.json").write_text('{"kept_rows": {"digiq": 4}, "wall_time_s": 9.0}')
    assert output_digests(tmp_path)["metrics/actor.json"] != first["metrics/actor.json"]


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
