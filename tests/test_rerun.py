"""Two whole runs side by side (digiq.rerun): the moves and both runs' intervals, from their files."""

import json
from pathlib import Path

import pytest
import yaml

from digiq.rerun import params_differences, rerun_markdown


def _run(folder: Path, rates: dict[str, tuple[float, float]], diff: float, ci: list[float], seed: int) -> Path:
    folder.mkdir()
    ev = {row: {"general": {"success_rate": g}, "webshop": {"success_rate": w}} for row, (g, w) in rates.items()}
    comp = {ts: {"digiq-base": {"diff": diff, "ci95": ci, "n_tasks": 10, "seeds": 3}} for ts in ("general", "webshop")}
    (folder / "eval.json").write_text(json.dumps(ev))
    (folder / "comparisons.json").write_text(json.dumps(comp))
    (folder / "params.yaml").write_text(yaml.safe_dump({"base_policy": {"seed": seed, "epochs": 12}}))
    return folder


def test_moves_and_both_intervals(tmp_path):
    first = _run(tmp_path / "a", {"base": (0.20, 0.50), "digiq": (0.35, 0.55)}, 15.0, [9.0, 21.0], seed=1)
    second = _run(tmp_path / "b", {"base": (0.25, 0.47), "digiq": (0.30, 0.55), "extra": (0.1, 0.1)}, 5.0,
                  [-2.0, 12.0], seed=2)  # fmt: skip
    md = rerun_markdown(first, first / "params.yaml", second)
    assert "Runs differ in `base_policy.seed`: 1 -> 2." in md
    assert "| base | 20.0 | 25.0 | +5.0 | 50.0 | 47.0 | -3.0 |" in md
    assert "| digiq | 35.0 | 30.0 | -5.0 | 55.0 | 55.0 | +0.0 |" in md
    assert "extra" not in md  # only rows both runs evaluated
    assert (
        "Largest move of a row: General 5.0, Web Shopping 3.0 points; mean move: General 5.0, Web Shopping 1.5." in md
    )
    assert "| digiq - base | +15.0 [+9.0, +21.0] | +5.0 [-2.0, +12.0] n.s. |" in md


def test_params_differences_name_added_and_changed_keys():
    assert params_differences({"a": {"x": 1, "y": 2}}, {"a": {"x": 1, "y": 3}, "b": 4}) == [
        "`a.y`: 2 -> 3",
        "`b`: - -> 4",
    ]


def test_missing_file_is_named(tmp_path):
    first = _run(tmp_path / "a", {"base": (0.2, 0.5)}, 1.0, [0.5, 2.0], seed=1)
    (tmp_path / "b").mkdir()
    with pytest.raises(FileNotFoundError, match="b/eval.json"):
        rerun_markdown(first, first / "params.yaml", tmp_path / "b")
