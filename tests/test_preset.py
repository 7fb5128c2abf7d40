"""Presets written into the params files: values, comments, refusals."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from digiq.config import ConfigError, load_params, load_settings
from digiq.preset import apply_preset, read_preset

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "params" / "presets" / "real.yaml"


@pytest.fixture
def params(tmp_path) -> Path:
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    shutil.copytree(ROOT / "params", tmp_path / "params")
    return tmp_path / "params.yaml"


def _lines(root: Path) -> dict[str, list[str]]:
    return {
        f.name: f.read_text().splitlines() for f in [root / "params.yaml", *sorted((root / "params").glob("*.yaml"))]
    }


def test_real_preset_sets_each_value_and_leaves_every_other_line(params):
    before = _lines(params.parent)
    assert len(apply_preset(REAL, params)) == 13
    merged = load_params(params)
    for file, groups in read_preset(REAL, params).items():
        for group, keys in groups.items():
            for key, value in keys.items():
                assert merged[group][key] == value and merged.source[group, key] == file, (group, key)
    cfg = load_settings(params, merged).vlm_finetune
    assert (cfg.recipe, cfg.lr, cfg.epochs, cfg.autocast, cfg.train_last_layers) == ("original", 2e-5, 0.01, True, 0)
    after = _lines(params.parent)
    preset_keys = {key for groups in read_preset(REAL, params).values() for keys in groups.values() for key in keys}
    for name, lines in before.items():
        kept = [line for line in lines if not any(line.startswith(f"  {key}:") for key in preset_keys)]
        assert set(kept) - {"embed: {}"} <= set(after[name]), name  # comments, nulls and the rest untouched
    assert "  n_tasks: null" in "\n".join(after["params.yaml"])
    assert any(
        line.startswith("  recipe: original") and "# how a pair is shown" in line for line in after["params.yaml"]
    )
    assert apply_preset(REAL, params) == []  # applied twice: nothing left to change


@pytest.mark.parametrize(
    ("preset", "message"),
    [
        ("params/other.yaml:\n  embed:\n    batch_size: 4\n", r"'params/other.yaml' is not a params file here"),
        ("params.yaml:\n  vlm:\n    lr: 1.0\n", r"'vlm' is not a group of knobs"),
        ("params.yaml:\n  vlm_finetune:\n    learning_rate: 1.0\n", r"vlm_finetune.learning_rate is no knob"),
        (
            "params.yaml:\n  vlm_finetune:\n    dtype: bfloat16\n",
            r"vlm_finetune.dtype is set in params/released_models.yaml",
        ),
        ("params.yaml:\n  vlm_finetune:\n    recipe: llava\n", r"recipe must be tiny, tiny_no_point or original"),
    ],
)
def test_a_bad_preset_changes_nothing_and_says_what_is_wrong(params, tmp_path, preset, message):
    (tmp_path / "bad.yaml").write_text(preset)
    before = _lines(params.parent)
    with pytest.raises(ValueError, match=message):
        apply_preset(tmp_path / "bad.yaml", params)
    assert _lines(params.parent) == before


def test_command_line(params, tmp_path):
    cmd = [sys.executable, "-m", "digiq.preset", str(REAL), "--params", str(params)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert "params.yaml: vlm_finetune.recipe: (default) -> original" in done.stdout
    (tmp_path / "bad.yaml").write_text("params.yaml:\n  vlm:\n    lr: 1.0\n")
    refused = subprocess.run([*cmd[:3], str(tmp_path / "bad.yaml"), *cmd[4:]], capture_output=True, text=True)
    assert refused.returncode == 2 and "preset not applied" in refused.stderr
    assert issubclass(ConfigError, ValueError)
