"""The stages' shared plumbing: learning curves as a PNG and, per step, as dvclive logs them."""

import csv

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
