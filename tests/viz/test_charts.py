"""The figures a reader reads: every row its own colour, legends clear of the data."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from digiq.stages.common import online_curves_figure, seed_curve  # noqa: E402
from digiq.viz.charts import results_chart
from digiq.viz.colours import ROW_COLOURS, row_colours  # noqa: E402

ROWS = ["base", "digiq", "filtered_bc", "digirl_offline", "digiq_hierarchy", "digirl_online", "digirl_off2on",
        "filtered_bc_online", "pae", "pae_oracle", "pae_human"]  # the committed run's eleven rows  # fmt: skip


def _rate(r: float) -> dict:
    return {"success_rate": r, "success_rate_std": 0.02, "per_seed": [r, r], "n_episodes": 96}


def test_every_row_gets_its_own_colour_and_too_many_rows_are_refused():
    colours = row_colours(ROWS)
    assert list(colours) == ROWS and len(set(colours.values())) == len(ROWS)
    assert row_colours(["a", "b", "a"]) == {"a": ROW_COLOURS[0], "b": ROW_COLOURS[1]}
    with pytest.raises(ValueError, match="21 rows to tell apart, and 20 colours"):
        row_colours([f"row{i}" for i in range(21)])


def test_the_results_chart_tells_eleven_rows_apart_and_keeps_its_legend_off_the_bars():
    results = {row: {"general": _rate(0.1 + 0.05 * i), "webshop": _rate(0.5)} for i, row in enumerate(ROWS)}
    fig = results_chart(results, "test")
    ax = fig.axes[0]
    by_row: dict[str, set[str]] = {}
    for container in ax.containers:
        if hasattr(container, "patches"):
            by_row.setdefault(container.get_label(), set()).update(to_hex(p.get_facecolor()) for p in container.patches)
    assert set(by_row) == set(ROWS) and all(len(c) == 1 for c in by_row.values())
    assert len({c for cs in by_row.values() for c in cs}) == len(ROWS)
    fig.canvas.draw()
    legend, axes = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.x0 >= axes.x1  # beside the axes: no bar under it
    plt.close(fig)


def test_the_online_figure_draws_every_row_in_its_own_colour():
    rounds = [{"success": 0.1 * k, "env_steps": 32, "wall_time_s": 5.0} for k in range(3)]
    rows = {row: {"per_seed": [rounds, rounds[:2]]} for row in ROWS}  # the second seed has two rounds
    fig = online_curves_figure(rows, {"offline data": 0.2})
    lines = [line for line in fig.axes[0].get_lines() if line.get_label() in ROWS]
    assert [line.get_label() for line in lines] == ROWS
    assert len({to_hex(line.get_color()) for line in lines}) == len(ROWS)
    assert all(len(line.get_xdata()) == 2 for line in lines)  # the rounds every seed has
    plt.close(fig)


def test_a_seed_curve_reads_the_rounds_every_seed_has():
    a = [{"success": 0.0, "env_steps": 10}, {"success": 0.5, "env_steps": 10}, {"success": 1.0, "env_steps": 10}]
    b = [{"success": 0.5, "env_steps": 20}, {"success": 0.5, "env_steps": 20}]
    x, mean, low, high = seed_curve([a, b], "success")
    assert x.tolist() == [15.0, 30.0] and mean.tolist() == [0.25, 0.5]
    assert low.tolist() == [0.0, 0.5] and high.tolist() == [0.5, 0.5]
    assert seed_curve([a, []], "success") is None


def test_the_claims_forest_plot_shows_each_claim_s_lead_interval_and_verdict():
    from digiq.tables import Claim, judge_claim
    from digiq.viz.charts import claims_chart

    claims = [Claim("A beats B", "a-b", ">", "both"), Claim("C is behind D", "c-d", "<", "at least one")]
    comparisons = {"general": {"a-b": {"diff": 5.0, "ci95": [1.0, 9.0]}, "c-d": {"diff": -4.0, "ci95": [-7.0, -1.0]}},
                   "webshop": {"a-b": {"diff": -3.0, "ci95": [-6.0, -0.5]}}}  # c-d not measured on Web Shopping  # fmt: skip
    fig = claims_chart(comparisons, claims)
    ax = fig.axes[0]
    points = sorted((round(float(line.get_ydata()[0]), 2), float(line.get_xdata()[0])) for line in ax.get_lines()
                    if line.get_marker() == "o")  # fmt: skip
    assert points == [(-0.15, 5.0), (0.15, -3.0), (0.85, 4.0)]  # c-d's lead is D's: the sign follows the claim
    verdicts = [t.get_text() for t in ax.texts]
    assert verdicts == [judge_claim(c, comparisons)[1] for c in claims] == ["not reproduced", "not measured"]
    plt.close(fig)
