"""The critic's inputs beside the VLM's: text features of the goal and the actions, and what each tap lands on.

Digi-Q's critic reads, beside the VLM's representations of stage 05, the
goal, the previous action's type and typed text and each candidate's type
and typed text, each through a language model (:mod:`digiq.models.critic_inputs`;
here the base policy's frozen T5 encoder). This stage computes them once for
every stored step and candidate and writes them to ``data/critic_inputs/``;
the critics (stage 06), the actors (07), the diagnostics (08) and the Q/V
viewer read them (:func:`digiq.data.features.critic_inputs`) instead of each
building them again. It reads no VLM, so a run that starts at the critic on
imported features still has them.

Written per step (S) and candidate (N), float32, row-aligned with the step
table sorted by (traj_id, step_id), with ``ids.npy`` to check it:
``goal`` (S, d), ``before`` (S, 2d: the previous action's type and typed
text), ``taken`` (S, 2d: the action taken, s' 's previous action),
``actions`` (S, N, 2d), ``typed`` (S, N, 2: :func:`~digiq.models.critic_inputs.typed_match`);
where the view hierarchies were stored (``collect.view_hierarchy``), also
``tapped`` (S, N, d: the label of the element a tap lands on),
``entries`` (S, N, 2: :func:`~digiq.models.critic_inputs.entry_features`)
and ``distinct`` (S, N, bool: :func:`~digiq.models.critic_inputs.distinct_actions`
with taps told apart by their element). For a critic that encodes the texts
itself (:mod:`digiq.models.critic_text`): ``texts.json``, every distinct
text once, and the rows of each step's and candidate's texts in it
(:func:`text_rows`).

    python -m digiq.stages.critic_inputs [--root .]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from digiq import parallel
from digiq.config import Settings, load_settings
from digiq.data.candidates import read_candidates
from digiq.data.features import TEXT_OPTIONAL, TEXTS, save_features
from digiq.data.trajectories import DataError, TrajectoryStore, step_ids
from digiq.env.actions import parse_action
from digiq.env.hierarchy import Tapped, tapped_elements
from digiq.io import atomic_write_text, require
from digiq.models.critic_inputs import (
    action_features,
    action_text,
    distinct_actions,
    encode_texts,
    entry_features,
    previous_actions,
    typed_match,
)
from digiq.models.policy import AutoUIPolicy
from digiq.paths import Paths
from digiq.stages.common import one_run_at_a_time, timed, write_metrics, written_whole

__all__ = ["run", "write_critic_inputs", "tapped", "text_rows", "main"]


def tapped(store: TrajectoryStore, images: Sequence[str], action_lists: Sequence[Sequence[str]]) -> list[Tapped]:
    """Per state (screenshot ``images[i]``) and candidate, flat: what a tap lands on; ``Tapped("")`` for other actions.

    Read from the view hierarchy stored beside each screenshot
    (``collect.view_hierarchy``), one parse per screen. Digi-Q's critic gets
    this from LLaVA, which reads the screen; the tiny VLM here cannot read a
    label at 96 pixels, so without it a tap is only a point to the critic.
    """
    out = []
    for image, texts in zip(images, action_lists, strict=True):
        actions = [parse_action(text) for text in texts]
        taps = [i for i, action in enumerate(actions) if action.is_valid and action.is_tap]
        row = [Tapped("")] * len(actions)
        if taps:
            xml, size = store.load_hierarchy(image)
            for i, hit in zip(taps, tapped_elements(xml, [actions[i].touch for i in taps], size), strict=True):
                row[i] = hit
        out.extend(row)
    return out


def text_rows(goals: Sequence[str], before: Sequence[str], taken: Sequence[str], lists: Sequence[Sequence[str]]
              ) -> tuple[list[str], dict[str, np.ndarray]]:  # fmt: skip
    """Every distinct text a critic that encodes texts reads, once, and each step's and candidate's rows in them
    (:data:`~digiq.data.features.TEXT_ROWS`): the goals, and each action's type and typed text as the release parses
    them (:func:`~digiq.models.critic_inputs.action_text`) for the previous action, the one taken and every
    candidate."""
    at: dict[str, int] = {}

    def row(text: str) -> int:
        return at.setdefault(text, len(at))

    def pair(action: str) -> tuple[int, int]:
        kind, typed = action_text(action)
        return row(kind), row(typed)

    S, N = len(goals), len(lists[0]) if lists else 0
    out = {"goal_row": np.array([row(g) for g in goals], np.int64),
           "before_rows": np.array([pair(a) for a in before], np.int64).reshape(S, 2),
           "taken_rows": np.array([pair(a) for a in taken], np.int64).reshape(S, 2),
           "action_rows": np.array([pair(a) for actions in lists for a in actions], np.int64).reshape(S, N, 2)}  # fmt: skip
    return list(at), out


@one_run_at_a_time("critic_inputs")
def write_critic_inputs(paths: Paths) -> dict[str, Any]:
    """Compute every stored step's and candidate's text features with the base policy and write them whole."""
    require("critic_inputs", paths.base_policy / "config.json")
    metrics: dict[str, Any] = {}
    # Inside the block, paths.critic_inputs is a temporary folder, swapped in whole at its end.
    with written_whole(paths, "critic_inputs") as paths, timed(metrics):
        store = TrajectoryStore(paths.offline)
        table = store.read()
        steps = table.select(["traj_id", "step_id", "task", "action", "image_path"]).to_pandas()
        lists = read_candidates(paths).column("action_list").to_pylist()
        if len(lists) != len(steps):
            raise DataError(f"{paths.candidates} lists {len(lists)} states but {paths.offline} has {len(steps)} "
                            "steps; rerun augment_actions")  # fmt: skip
        S, N = len(steps), len(lists[0]) if lists else 0
        policy = AutoUIPolicy.load(paths.base_policy, device=str(parallel.device()))
        flat = [a for row in lists for a in row]
        arrays = {
            "goal": encode_texts(policy, steps.task.tolist()),
            "before": action_features(policy, previous_actions(steps)),
            "taken": action_features(policy, steps.action.tolist()),
            "actions": action_features(policy, flat).reshape(S, N, -1),
            "typed": np.array(
                [typed_match(task, a) for task, row in zip(steps.task, lists, strict=True) for a in row], np.float32
            ).reshape(S, N, 2),  # fmt: skip
        }
        hierarchies = S > 0 and store.has_hierarchy(steps.image_path.iat[0])
        if hierarchies:
            hits = tapped(store, steps.image_path.tolist(), lists)
            arrays["tapped"] = encode_texts(policy, [hit.label for hit in hits]).reshape(S, N, -1)
            arrays["entries"] = entry_features(hits).reshape(S, N, 2)
            arrays["distinct"] = distinct_actions(lists, [hit.label for hit in hits])
        texts, rows = text_rows(steps.task.tolist(), previous_actions(steps), steps.action.tolist(), lists)
        arrays.update(rows)
        save_features(paths.critic_inputs, arrays, step_ids(table))
        atomic_write_text(paths.critic_inputs / TEXTS, json.dumps(texts, ensure_ascii=False))
        metrics.update({"states": S, "candidates": N, "text_dim": int(arrays["goal"].shape[1]),
                        "hierarchies": hierarchies, "files": sorted(arrays), "texts": len(texts)})  # fmt: skip
    metrics["optional_files_absent"] = [name for name in TEXT_OPTIONAL if name not in metrics["files"]]
    write_metrics(paths, "critic_inputs", metrics)
    return metrics


def run(settings: Settings, paths: Paths) -> dict[str, Any]:
    """The stage as ``params.yaml`` sets it: it reads no knob."""
    return write_critic_inputs(paths)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m digiq.stages.critic_inputs", description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=".", help="pipeline root: params.yaml and data/ (default: where DVC runs it)")
    args = ap.parse_args(argv)
    paths = Paths(Path(args.root))
    run(load_settings(paths.root / "params.yaml"), paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
