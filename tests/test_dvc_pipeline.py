"""dvc.yaml and params.yaml agree with the notebooks and the typed configs."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from digiq import config
from digiq.env.taskgen import generate_tasks
from digiq.paths import ROOT

DVC = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
PARAMS = config.load_params()
METHOD = yaml.safe_load((ROOT / "params.yaml").read_text())  # the method's knobs alone


EXPLORATION = {"13_explore_values.ipynb"}  # notebooks for people, run after the pipeline; not stages


def test_every_notebook_is_one_stage_that_depends_on_it():
    notebooks = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb") if p.name not in EXPLORATION)
    staged = sorted(
        n
        for s in DVC.values()
        for n in [s["cmd"].split("papermill notebooks/")[-1].split()[0]]
        if "papermill" in s["cmd"]
    )
    assert staged == notebooks
    for stage in DVC.values():
        if "papermill" in stage["cmd"]:
            assert stage["cmd"].split("papermill ")[1].split()[0] in stage["deps"]
            assert any(str(m).startswith("metrics/") for item in stage["metrics"] for m in item)


def test_params_match_the_typed_configs_and_their_defaults():
    assert set(PARAMS) == set(config.SECTIONS) | {"variants"}  # variants: named critics, each the critic group changed
    settings = config.load_settings(params=PARAMS)
    assert set(settings.variants) == {"digiq_hierarchy", "digiq_frozen_text"}
    assert settings.variants["digiq_frozen_text"].text_encoder == "frozen" and settings.critic.towers
    for name, cls in config.SECTIONS.items():
        for key, f in cls.model_fields.items():
            # A value set in a params file is its field's default too, so a knob left out changes nothing.
            assert getattr(getattr(settings, name), key) == config.knob_default(f), (
                f"{name}.{key} differs from the config default"
            )


def test_params_yaml_holds_the_methods_knobs_and_params_the_machines():
    knobs = [k for group, keys in METHOD.items() for k in keys if group != "variants"]
    knobs += [k for changes in METHOD["variants"].values() for k in changes]
    # A page a person reads whole: the methods' knobs that decide a run (Digi-Q's, DigiRL's and PAE's switches);
    # the rest keep their config defaults, each explained by its help.
    assert len(knobs) <= 54, f"params.yaml has {len(knobs)} knobs"
    assert not {"env", "devices", "judge", "compute"} & set(METHOD)  # in params/, beside it
    assert {p.name for p in config.params_files()[1:]} == {"compute.yaml", "devices.yaml", "released_models.yaml"}


def _commented_keys(path):
    """(group, key, comment) of every key line of a params file; a variant's keys are the critic group's."""
    group = None
    for line in path.read_text().splitlines():
        top = re.match(r"^(\w+):", line)
        if top:
            group = "critic" if top.group(1) == "variants" else top.group(1)
            continue
        key = re.match(r"^ +(\w+): *(.*?)(?: +# (.*))?$", line)
        if key and key.group(2):  # a variant's own name line holds no value
            yield group, key.group(1), key.group(3)


def test_each_knob_is_explained_once_by_its_config_help():
    for path in config.params_files():
        seen = list(_commented_keys(path))
        assert seen, path
        for group, key, comment in seen:
            fields = {key: f.description for key, f in config.SECTIONS[group].model_fields.items()}
            assert comment == fields[key], f"{path.name}: {group}.{key}: the comment is not the config's help"


def test_stage_params_are_declared():
    for stage in DVC.values():
        for item in stage.get("params", []):
            if isinstance(item, str):
                assert item in METHOD, item  # whole groups, so any knob added to a group is tracked
            else:
                ((file, groups),) = item.items()
                declared = yaml.safe_load((ROOT / file).read_text())
                for dotted in groups:  # a group, or one knob of it as group.key
                    group, _, key = dotted.partition(".")
                    assert group in declared and (not key or key in declared[group]), (file, dotted)


def test_no_stage_command_pastes_a_params_value_into_the_shell():
    """DVC pastes ${group.key} into a command before any type check: a params value would run as shell code.

    Stages read their knobs through the typed configs instead (digiq.config.load_settings).
    """
    text = (ROOT / "dvc.yaml").read_text()
    assert "${" not in text, [line.strip() for line in text.splitlines() if "${" in line]


@pytest.mark.slow  # a real `dvc repro`
def test_a_params_value_is_never_run_by_the_shell(tmp_path):
    """`dvc repro tasks` with a command in place of a number: the stage stops, naming the key, and runs nothing;
    with numbers, it writes the lists the generator gives."""
    repo = tmp_path / "repo"
    for folder in ("digiq", "notebooks", "params"):  # fingerprints, run first, reads every notebook
        shutil.copytree(ROOT / folder, repo / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (repo / ".dvc").mkdir()
    for rel in ("dvc.yaml", ".dvcignore", ".dvc/config"):
        shutil.copy2(ROOT / rel, repo / rel)
    marker = tmp_path / "ran"
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["tasks"].update({"n_train": f"$(touch {marker})16", "n_val": 2, "n_test": 3, "n_test_webshop": 4})
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}  # dvc's `python`

    def repro() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dvc", "repro", "tasks"], cwd=repo, env=env, capture_output=True,
                              text=True, timeout=300)  # fmt: skip

    done = repro()
    assert done.returncode != 0 and not marker.exists(), done.stdout + done.stderr
    assert "params.yaml: tasks.n_train must be int, got '$(touch" in done.stderr, done.stderr
    params["tasks"]["n_train"] = 5
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    done = repro()
    assert done.returncode == 0, done.stdout + done.stderr
    seeds = params["tasks"]["seed"], params["tasks"]["split_seed"]
    for ts in ("general", "webshop"):
        for split, n in (("train", 5), ("val", 2), ("test", 3 if ts == "general" else 4)):
            listed = (repo / "data" / "tasks" / f"{ts}_{split}.txt").read_text()
            assert listed == "\n".join(generate_tasks(ts, split, n, *seeds)) + "\n"
    assert json.loads((repo / "metrics" / "tasks.json").read_text())["expert_success"] == 2 * (5 + 2) + 3 + 4


def test_the_digiq_row_is_the_papers_critic_and_the_variants_go_beyond_it():
    """The digiq row is plain TD on VLM and text features; anything more is a named variant."""
    settings = config.load_settings(params=PARAMS)
    paper = settings.critic
    assert paper.conservative == 0 and paper.text_features and (paper.gamma, paper.tau) == (0.95, 0.1)
    assert not (paper.tap_targets or paper.typed_match or paper.list_entries)
    variants = settings.variants
    assert variants["digiq_hierarchy"].conservative > 0 and variants["digiq_hierarchy"].list_entries
