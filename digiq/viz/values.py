"""Q and V values of the pipeline's data, ready to look at.

:func:`load_values` reads what the pipeline wrote (the offline steps, the
candidates, the stage-05 features and one seed's self-describing critic
checkpoint) and scores every step and every candidate once: V(s), Q(s, a),
the advantage Q - V, the VLM's P(Yes), and which candidate Best-of-N keeps.
The viewers (:mod:`digiq.viz.viewers`) only index into these tables, so a
redraw costs a screenshot load and a drawing, not a forward pass; one
state's candidates also come as a static figure
(:meth:`ValueData.candidates_figure`), which the critic's notebook shows
without the widgets.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from PIL import Image

from digiq.config import (
    ActorConfig,
    DiagnosticsConfig,
    EnvConfig,
    load_settings,
)
from digiq.data.candidates import read_candidates
from digiq.data.features import load_features
from digiq.data.trajectories import TrajectoryStore, data_task_sets
from digiq.diagnostics.ground_truth import stored_state_values
from digiq.env.state import Dynamics
from digiq.env.tasks import parse_task
from digiq.io import require
from digiq.models.checkpoint import read_meta
from digiq.models.critic import Critic, inputs_for, load_critics, per_task_set
from digiq.paths import ROOT, Paths
from digiq.rollout import episode_seed
from digiq.viz.draw import draw_candidates, short_action

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["ValueData", "load_values"]


@dataclass
class ValueData:
    """Every step with its values, and every step's candidates with theirs.

    ``steps``: one row per stored step (Digi-Q's fields plus ``v``, ``q``,
    ``advantage``). ``candidates``: one row per (step, candidate) with
    ``traj_id``, ``step_id``, ``index`` (0 = the action taken), ``action``,
    ``valid``, ``q``, ``advantage``, ``p_yes`` and ``chosen`` (Best-of-N's
    pick among the valid ones; ``kept`` when it clears the threshold).
    """

    steps: pd.DataFrame
    candidates: pd.DataFrame
    store: TrajectoryStore
    env: EnvConfig
    actor: ActorConfig  # Best-of-N's thresholds
    diagnostics: DiagnosticsConfig  # the true values' rollouts
    collect_seed: int
    gamma: float

    def trajectory(self, traj_id: int) -> pd.DataFrame:
        rows = self.steps[self.steps.traj_id == traj_id]
        if rows.empty:
            raise KeyError(f"no trajectory {traj_id} in {self.store.root}")
        return rows

    def step_candidates(self, traj_id: int, step_id: int) -> pd.DataFrame:
        """The candidates of one state, best Q first."""
        rows = self.candidates[(self.candidates.traj_id == traj_id) & (self.candidates.step_id == step_id)]
        if rows.empty:
            raise KeyError(f"no step ({traj_id}, {step_id}) in {self.store.root}")
        return rows.sort_values("q", ascending=False)

    def oracle(self, traj_id: int, step_id: int) -> np.ndarray:
        """True values of the step's candidates (in candidate-index order), from the simulator."""
        step = self.trajectory(traj_id)
        row = step[step.step_id == step_id].iloc[0]
        cands = self.candidates[(self.candidates.traj_id == traj_id) & (self.candidates.step_id == step_id)]
        return stored_state_values(parse_task(row.task, row.task_set), episode_seed(self.collect_seed, traj_id),
                                   step.action[step.step_id < step_id].tolist(),
                                   cands.sort_values("index").action.tolist(), dynamics=Dynamics.of(self.env),
                                   width=self.env.width, rollouts=self.diagnostics.oracle_rollouts,
                                   noise=self.diagnostics.oracle_noise, gamma=self.gamma, branch_seed=traj_id)  # fmt: skip

    def candidates_table(self, traj_id: int, step_id: int, oracle: bool = True) -> pd.DataFrame:
        """One state's candidates, best Q first, as the action viewer lists them; ``oracle``: with true values."""
        cands = self.step_candidates(traj_id, step_id)
        table = pd.DataFrame({
            "#": cands["index"].to_numpy(),
            "action": [short_action(a) for a in cands.action],
            "valid": cands.valid.to_numpy(),
            "Q": cands.q.to_numpy(),
            "Q-V": cands.advantage.to_numpy(),
            # NaN: features imported from a released file, which keeps no P(Yes).
            "VLM: changes screen?": np.where(cands.p_yes.isna(), "?", np.where(cands.p_yes > 0.5, "Yes", "No")),
            "P(Yes)": cands.p_yes.to_numpy(),
            "Best-of-N": np.where(cands.kept, "chosen, kept", np.where(cands.chosen, "chosen, below threshold", "")),
        })  # fmt: skip
        if oracle:
            table["oracle value"] = self.oracle(traj_id, step_id)[cands["index"].to_numpy()]
        return table

    def candidates_image(self, traj_id: int, step_id: int) -> Image.Image:
        """The state's screenshot with its touch candidates drawn and numbered (#0: the action taken)."""
        cands = self.step_candidates(traj_id, step_id)
        row = self.trajectory(traj_id).iloc[step_id]
        return draw_candidates(self.store.load_image(row.image_path), cands.action.tolist(), cands["index"].tolist())

    def candidates_figure(self, traj_id: int, step_id: int, table: pd.DataFrame) -> Figure:
        """The state's drawn candidates beside ``table`` (its :meth:`candidates_table`), as a matplotlib figure."""
        import matplotlib.pyplot as plt

        fig, (ax_img, ax_tab) = plt.subplots(1, 2, figsize=(11, 4.5), gridspec_kw={"width_ratios": [1, 3]})
        ax_img.imshow(self.candidates_image(traj_id, step_id))
        ax_img.axis("off")
        shown = table.drop(columns=["P(Yes)"]).round(3).astype(str)
        tab = ax_tab.table(cellText=shown.to_numpy(), colLabels=list(shown.columns), loc="center", cellLoc="left")
        tab.auto_set_font_size(False)
        tab.set_fontsize(6.5)
        tab.auto_set_column_width(list(range(len(shown.columns))))
        ax_tab.axis("off")
        task = self.trajectory(traj_id).task.iloc[0]
        fig.suptitle(f"{task} (step {step_id}); candidates sorted by Q", fontsize=9)
        fig.tight_layout()
        return fig


def load_values(root: Path | str | None = None, seed: int = 0, row: str = "digiq") -> ValueData:
    """Score the pipeline's data with seed ``seed``'s critic of ``row`` (stage 06: ``digiq``, a variant...) in one call."""
    paths = Paths(Path(root) if root else ROOT)
    require("viewer", paths.critics / f"seed{seed}" / row, paths.offline, paths.candidates)
    settings = load_settings(paths.root / "params.yaml")
    actor = settings.actor
    store = TrajectoryStore(paths.offline)
    steps = store.read().to_pandas()
    cands = read_candidates(paths).to_pandas()
    task_sets = steps.task_set.to_numpy()
    critics = load_critics(paths, seed, row, data_task_sets(task_sets))  # each task set's own
    first = next(iter(critics.values()))
    meta = read_meta(paths.critic(seed, row, next(iter(critics))))  # every task set's critic reads the same inputs
    vlm = str(meta.get("vlm", "finetuned"))  # whose features
    feats = inputs_for(paths, vlm, first.cfg)

    def q_and_v(critic: Critic, rows: np.ndarray) -> np.ndarray:
        """(rows, N + 1): Q of each candidate, then V."""
        x = critic.read(feats, rows, ("state", "candidates"))
        q, v, _ = critic.advantage(x["state"], x["candidates"])
        return np.concatenate([q.cpu().numpy(), v.cpu().numpy()[:, None]], 1)

    values = per_task_set(task_sets, critics, q_and_v)
    q, v = values[:, :-1], values[:, -1]
    adv = q - v[:, None]
    valid = np.stack(cands.valid_list.to_numpy())
    chosen = np.where(valid, adv, -np.inf).argmax(1)
    threshold = actor.thresholds(task_sets)
    S, N = valid.shape
    steps = steps.assign(v=v, q=q[:, 0], advantage=adv[:, 0])
    table = pd.DataFrame({
        "traj_id": np.repeat(steps.traj_id.to_numpy(), N),
        "step_id": np.repeat(steps.step_id.to_numpy(), N),
        "index": np.tile(np.arange(N), S),
        "action": np.concatenate(cands.action_list.to_numpy()),
        "valid": valid.ravel(),
        "q": q.ravel(),
        "advantage": adv.ravel(),
        "p_yes": np.asarray(load_features(paths, vlm)["p_yes"]).ravel(),
        "chosen": (np.arange(N)[None, :] == chosen[:, None]).ravel(),
        "kept": ((np.arange(N)[None, :] == chosen[:, None]) & (adv > threshold[:, None])).ravel(),
    })  # fmt: skip
    gamma = float(meta["gamma"])  # the discount the critic was trained with
    return ValueData(steps, table, store, settings.env, actor,
                     settings.diagnostics,
                     settings.collect.seed, gamma)  # fmt: skip
