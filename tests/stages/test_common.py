"""The stages' shared plumbing: learning curves as a PNG and, per step, as dvclive logs them."""

import csv
import subprocess

import pytest

from digiq.data.task_lists import read_tasks
from digiq.io import StageError
from digiq.paths import Paths
from digiq.stages.common import save_curve_plot


def _read(tsv):
    with open(tsv, newline="") as f:
        return [(int(r["step"]), float(r[tsv.stem])) for r in csv.DictReader(f, delimiter="\t")]


def test_curves_are_logged_per_step_beside_their_png_and_replace_an_earlier_run(tmp_path):
    png = tmp_path / "critic_td_loss.png"
    save_curve_plot(png, {"q loss (digiq)": [1.0, 0.5, 0.25], "v loss (digiq)": [2.0, 1.0], "old": [3.0]}, "TD")
    save_curve_plot(png, {"q loss (digiq)": [1.0, 0.5, 0.25], "v loss (digiq)": [2.0, 1.0]}, "TD")
    metrics = tmp_path / "critic_td_loss" / "plots" / "metrics"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in metrics.iterdir()) == ["q_loss_digiq.tsv", "v_loss_digiq.tsv"]  # "old" is gone
    assert _read(metrics / "q_loss_digiq.tsv") == [(0, 1.0), (1, 0.5), (2, 0.25)]
    assert _read(metrics / "v_loss_digiq.tsv") == [(0, 2.0), (1, 1.0)]
    assert not (tmp_path / "critic_td_loss" / "metrics.json").exists()


def test_many_curves_are_drawn_as_small_multiples_one_a_panel(tmp_path):
    from PIL import Image

    few, many = tmp_path / "few.png", tmp_path / "many.png"
    save_curve_plot(few, {f"fit {i}": [1.0, 0.5] for i in range(4)}, "fits")
    save_curve_plot(many, {f"fit {i}": [1.0, 0.5] for i in range(9)}, "fits")
    width, height = Image.open(few).size
    wide, tall = Image.open(many).size
    assert (width, height) == (600, 350) and (wide, tall) == (1200, 660)  # 4 panels a row, 3 rows


def test_curves_in_a_repository_without_a_commit_name_the_fix(tmp_path, monkeypatch):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    monkeypatch.chdir(tmp_path)  # dvclive finds the repository from the working directory
    with pytest.raises(StageError, match="cannot log curves to .*loss: .*commit once"):
        save_curve_plot(tmp_path / "loss.png", {"loss": [1.0, 0.5]}, "fit")


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (b"What is " + b"very " * 300 + b"far?", "an instruction of 1512 characters, longer than the 1000"),
        (b"What time is it in Caf\xe9?", r"not UTF-8 \(byte 0xe9 at offset 22\)"),
    ],
)
def test_a_stage_task_list_with_an_odd_line_names_the_file_and_line(tmp_path, bad, why):
    paths = Paths(tmp_path)
    path = paths.task_list("general", "test")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"What time is it in Copenhagen?\n\n" + bad + b"\n")
    with pytest.raises(StageError, match=rf"stage eval: {path}:3: {why}"):
        read_tasks(paths, "general", "test", stage="eval")
