"""Stage 02: N candidate actions per state, sampled from the base policy.

Index 0 is always the action actually taken; the others are sampled at a
raised temperature. A candidate that does not parse as a valid action is
drawn again (a bounded number of times) and kept, marked invalid, if it
still fails: the critic should learn that invalid actions are worthless.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from digiq.config import AugmentConfig, load_section
from digiq.data.candidates import write_candidates
from digiq.data.trajectories import TrajectoryStore
from digiq.env.actions import parse_action
from digiq.io import require
from digiq.models.policy import AutoUIPolicy
from digiq.noise import noise_key
from digiq.paths import Paths
from digiq.progress import progress
from digiq.stages.common import one_run_at_a_time, timed, write_metrics

__all__ = ["run", "run_augment"]


@one_run_at_a_time("augment_actions")
def run_augment(cfg: AugmentConfig, paths: Paths) -> dict[str, Any]:
    require("augment_actions", paths.base_policy / "config.json")
    metrics: dict[str, Any] = {}
    with timed(metrics):
        model = AutoUIPolicy.load(paths.base_policy)
        store = TrajectoryStore(paths.offline)
        steps = store.read().select(["traj_id", "step_id", "observation", "image_path", "action"]).to_pylist()
        lists, resampled = [], 0
        for start in progress(range(0, len(steps), cfg.batch_states), desc="candidates"):
            batch = steps[start : start + cfg.batch_states]
            images = model.screen.prepare(store.load_images([s["image_path"] for s in batch]))
            prompts = [s["observation"] for s in batch]
            # A state's candidates draw from its own noise (the seed, its trajectory and step): the same
            # whatever batch the state falls in.
            keys = [noise_key(cfg.seed, s["traj_id"], s["step_id"]) for s in batch]
            samples = model.sample(prompts, images, n=cfg.n_candidates - 1, temperature=cfg.temperature, noise=keys)
            for attempt in range(1, cfg.max_resample + 1):  # redraw invalid candidates, all at once
                bad = [
                    (i, j) for i, row in enumerate(samples) for j, a in enumerate(row) if not parse_action(a).is_valid
                ]
                if not bad:
                    break
                resampled += len(bad)
                redo = model.sample([prompts[i] for i, _ in bad], images[[i for i, _ in bad]], n=1,
                                    temperature=cfg.temperature,
                                    noise=[noise_key(keys[i], j, attempt) for i, j in bad])  # fmt: skip
                for (i, j), new in zip(bad, redo, strict=True):
                    samples[i][j] = new[0]
            lists += [[s["action"], *row] for s, row in zip(batch, samples, strict=True)]
        marks = write_candidates(paths.candidates, [s["traj_id"] for s in steps], [s["step_id"] for s in steps], lists)
    valid = np.array([v for row in marks for v in row[1:]])
    distinct = np.mean([len(set(row)) for row in lists])
    metrics.update(
        {
            "states": len(steps),
            "n_candidates": cfg.n_candidates,
            "sampled_valid_rate": round(float(valid.mean()), 4) if valid.size else 0.0,
            "resampled": resampled,
            "mean_distinct_candidates": round(float(distinct), 2),
        }
    )
    write_metrics(paths, "augment_actions", metrics)
    return metrics


def run(params: dict[str, Any], paths: Paths) -> dict[str, Any]:
    """Stage 02 as ``params.yaml`` sets it."""
    return run_augment(load_section(AugmentConfig, "augment", params), paths)
