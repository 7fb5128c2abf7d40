"""Look at Q and V: a trajectory viewer and an action viewer, as ipywidgets or static figures.

Digi-Q's release offers two browser apps for this; here they
live in JupyterLab next to the data. Open them with one call each::

    from digiq.viz.values import load_values
    from digiq.viz.viewers import TrajectoryViewer, ActionViewer
    data = load_values()            # the pipeline's outputs, seed 0's critic
    TrajectoryViewer(data)   # every step: screenshot + action, V, Q, Q - V, reward
    ActionViewer(data)       # one state's N candidates sorted by Q, Best-of-N's pick, oracle values

A viewer displays as its widget together with a picture of its first view
(``figure()`` as a PNG in the same output): JupyterLab shows the widget, and
where no widget frontend runs (an executed notebook on the web, nbviewer)
the picture stands in. Both keep what they show as plain attributes
(``image``: the drawn PIL image, ``table``: the DataFrame), so tests and
scripts can drive the controls and check the pictures.
"""

from __future__ import annotations

import base64
import io
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import ipywidgets as W
import pandas as pd
from PIL import Image

from digiq.env.actions import parse_action
from digiq.viz.draw import draw_action, figure_png, short_action
from digiq.viz.values import ValueData

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["TrajectoryViewer", "ActionViewer"]


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _table_html(table: pd.DataFrame, highlight: int | None = None) -> str:
    styled = table.style.format(precision=3).hide(axis="index")
    if highlight is not None:
        styled = styled.apply(lambda row: ["background: #ffe9a8" if row.name == highlight else "" for _ in row], axis=1)
    return styled.to_html()


class _Viewer(ABC):
    """What both viewers display: their widget, with a static picture of the view beside it in one output."""

    widget: W.Widget

    @abstractmethod
    def figure(self) -> Figure:
        """The current view as a static matplotlib figure."""

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["image/png"] = base64.b64encode(figure_png(self.figure())).decode("ascii")
        return bundle


class TrajectoryViewer(_Viewer):
    """Pick a trajectory (by index, or filtered by family, outcome and task text) and a step."""

    def __init__(self, data: ValueData) -> None:
        self.data = data
        traj = data.steps.groupby("traj_id").agg(task=("task", "first"), family=("family", "first"),
                                                 reward=("trajectory_reward", "first"))  # fmt: skip
        self.trajectories = traj
        self.family = W.Dropdown(options=["all", *sorted(traj.family.unique())], description="family")
        self.outcome = W.Dropdown(options=["all", "success", "failure"], description="outcome")
        self.text = W.Text(placeholder="words of the task", description="task")
        self.traj = W.Dropdown(description="trajectory", layout=W.Layout(width="60%"))
        self.step = W.IntSlider(min=0, max=0, description="step")
        self.picture = W.Image(format="png")
        self.values = W.HTML()
        self.image: Image.Image | None = None
        self.table = pd.DataFrame()
        for w in (self.family, self.outcome, self.text):
            w.observe(lambda _: self._filter(), names="value")
        self.traj.observe(lambda _: self._pick(), names="value")
        self.step.observe(lambda _: self._draw(), names="value")
        self.widget = W.VBox([W.HBox([self.family, self.outcome, self.text]), W.HBox([self.traj, self.step]),
                              W.HBox([self.picture, self.values])])  # fmt: skip
        self._filter()

    def _filter(self) -> None:
        t = self.trajectories
        if self.family.value != "all":
            t = t[t.family == self.family.value]
        if self.outcome.value != "all":
            t = t[(t.reward > 0) == (self.outcome.value == "success")]
        words = self.text.value.lower().split()
        if words:
            t = t[t.task.str.lower().apply(lambda s: all(w in s for w in words))]
        before = self.traj.value
        self.traj.options = [(f"{i}: {row.task} ({'success' if row.reward > 0 else 'failure'})", i)
                             for i, row in t.iterrows()]  # fmt: skip
        if self.traj.options and self.traj.value is None:
            self.traj.value = self.traj.options[0][1]  # new options leave no selection: take the first
        if self.traj.value == before or self.traj.value is None:
            self._pick()  # no change event fired, but the view must follow the filter

    def _pick(self) -> None:
        if self.traj.value is None:
            self.image, self.table = None, pd.DataFrame()
            self.picture.value, self.values.value = b"", "<i>no trajectory matches</i>"
            return
        steps = self.data.trajectory(self.traj.value)
        self.table = pd.DataFrame({"step": steps.step_id.to_numpy(), "action": [short_action(a) for a in steps.action],
                                   "V(s)": steps.v.to_numpy(), "Q(s,a)": steps.q.to_numpy(),
                                   "Q-V": steps.advantage.to_numpy(), "reward": steps.reward.to_numpy()})  # fmt: skip
        self.step.max = len(steps) - 1
        self.step.value = 0
        self._draw()

    def _draw(self) -> None:
        if self.traj.value is None:
            return
        row = self.data.trajectory(self.traj.value).iloc[self.step.value]
        self.image = draw_action(self.data.store.load_image(row.image_path), parse_action(row.action))
        self.picture.value = _png(self.image)
        self.values.value = f"<b>{row.task}</b><br>" + _table_html(self.table, highlight=self.step.value)

    def figure(self) -> Figure:
        """Every step of the current trajectory as a static matplotlib figure, values in the titles."""
        import matplotlib.pyplot as plt

        steps = self.data.trajectory(self.traj.value)
        fig, axes = plt.subplots(1, len(steps), figsize=(1.6 * len(steps) + 1, 4), squeeze=False)
        for ax, row in zip(axes[0], steps.itertuples(), strict=True):
            ax.imshow(draw_action(self.data.store.load_image(row.image_path), parse_action(row.action)))
            ax.set_title(f"{row.step_id}: V={row.v:.2f}\nQ={row.q:.2f} A={row.advantage:+.2f}\nr={row.reward:g}",
                         fontsize=7)  # fmt: skip
            ax.axis("off")
        fig.suptitle(steps.task.iloc[0], fontsize=9)
        fig.tight_layout()
        return fig


class ActionViewer(_Viewer):
    """Pick a trajectory and a step; its N candidates drawn and listed, best Q first."""

    def __init__(self, data: ValueData, oracle: bool = True) -> None:
        self.data = data
        ids = sorted(data.steps.traj_id.unique())
        tasks = data.steps.groupby("traj_id").task.first()
        self.traj = W.Dropdown(options=[(f"{i}: {tasks[i]}", i) for i in ids], description="trajectory",
                               layout=W.Layout(width="60%"))  # fmt: skip
        self.step = W.IntSlider(min=0, max=0, description="step")
        self.with_oracle = W.Checkbox(value=oracle, description="oracle values (simulator)")
        self.picture = W.Image(format="png")
        self.values = W.HTML()
        self.image: Image.Image | None = None
        self.table = pd.DataFrame()
        self.traj.observe(lambda _: self._pick(), names="value")
        for w in (self.step, self.with_oracle):
            w.observe(lambda _: self._draw(), names="value")
        self.widget = W.VBox([W.HBox([self.traj, self.step, self.with_oracle]), W.HBox([self.picture, self.values])])
        self._pick()

    def _pick(self) -> None:
        self.step.max = len(self.data.trajectory(self.traj.value)) - 1
        self.step.value = 0
        self._draw()

    def _draw(self) -> None:
        traj, step = self.traj.value, self.step.value
        self.table = self.data.candidates_table(traj, step, oracle=self.with_oracle.value)
        self.image = self.data.candidates_image(traj, step)
        self.picture.value = _png(self.image)
        task = self.data.trajectory(traj).task.iloc[0]
        self.values.value = f"<b>{task}</b> (step {step}; #0 = the action taken)<br>" + _table_html(self.table)

    def figure(self) -> Figure:
        """The current state's candidates and their table as a static matplotlib figure."""
        return self.data.candidates_figure(self.traj.value, self.step.value, self.table)
