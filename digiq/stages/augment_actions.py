"""Stage 02: N candidate actions per state, sampled from the base policy.

Index 0 is always the action actually taken; the others are sampled at a
raised temperature. A candidate that does not parse as a valid action is
drawn again (a bounded number of times) and kept, marked invalid, if it
still fails: the critic should learn that invalid actions are worthless.

The states are sampled in batches of ``augment.batch_states``, runs of whole
batches shared by one-thread worker processes (:mod:`digiq.workers`). A
candidate's draws come from its own noise (the seed, its state's trajectory
and step, its index, the redraw), and every batch holds the states it holds
in one process, so the table is the same on any number of workers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from digiq.config import AugmentConfig, ComputeConfig, Settings
from digiq.data.candidates import write_candidates
from digiq.data.trajectories import TrajectoryStore
from digiq.env.actions import parse_action
from digiq.io import require
from digiq.models.policy import AutoUIPolicy
from digiq.noise import noise_key
from digiq.paths import Paths
from digiq.progress import progress
from digiq.stages.common import one_run_at_a_time, timed, write_metrics
from digiq.workers import IN_PROCESS, job_slots, map_jobs, process_cached

__all__ = ["run", "run_augment", "AugmentJob", "AugmentPart", "augment_job", "augment_jobs", "sample_candidates"]

# The states are split into about this many jobs per worker, so that the last jobs are short and no core waits
# long for the other at the end of the stage.
JOBS_PER_WORKER = 4


@dataclass(frozen=True)
class AugmentJob:
    """Whole sampling batches of stored steps (``traj_id``, ``step_id``, ``observation``, ``image_path``,
    ``action``), sampled from the base policy in ``paths``."""

    paths: Paths
    cfg: AugmentConfig
    steps: list[dict[str, Any]]


@dataclass(frozen=True)
class AugmentPart:
    """A job's candidate lists, one per step in its order, and how many candidates were drawn again."""

    lists: list[list[str]]
    resampled: int


def sample_candidates(model: AutoUIPolicy, prompts: list[str], images: torch.Tensor, keys: list[int],
                      cfg: AugmentConfig) -> tuple[list[list[str]], int]:  # fmt: skip
    """``cfg.n_candidates - 1`` sampled actions per state, invalid ones drawn again, and the number drawn again.

    ``images`` are the states' screenshots at the encoder's size, ``keys``
    their noise keys. Each state is encoded once: its redraws decode from
    the states of the first draws (:meth:`AutoUIPolicy.sample_encoded`).
    """
    enc = model.encode_by_length(prompts, images)
    samples = model.sample_encoded(enc, n=cfg.n_candidates - 1, temperature=cfg.temperature, noise=keys)
    resampled = 0
    for attempt in range(1, cfg.max_resample + 1):  # redraw invalid candidates, all at once
        bad = [(i, j) for i, row in enumerate(samples) for j, a in enumerate(row) if not parse_action(a).is_valid]
        if not bad:
            break
        resampled += len(bad)
        redo = model.sample_encoded(enc, temperature=cfg.temperature, rows=[i for i, _ in bad],
                                    noise=[noise_key(keys[i], j, attempt) for i, j in bad])  # fmt: skip
        for (i, j), new in zip(bad, redo, strict=True):
            samples[i][j] = new[0]
    return samples, resampled


def augment_job(job: AugmentJob) -> AugmentPart:
    """One job's candidates: its steps in batches of ``cfg.batch_states``, the action taken first in each list."""
    model = process_cached(("augment policy", job.paths.base_policy), lambda: AutoUIPolicy.load(job.paths.base_policy))
    store = TrajectoryStore(job.paths.offline)
    lists, resampled = [], 0
    size = job.cfg.batch_states
    for start in progress(range(0, len(job.steps), size), desc="candidates"):
        batch = job.steps[start : start + size]
        images = model.screen.prepare(store.load_images([s["image_path"] for s in batch]))
        # A state's candidates draw from its own noise (the seed, its trajectory and step): the same
        # whatever batch the state falls in.
        keys = [noise_key(job.cfg.seed, s["traj_id"], s["step_id"]) for s in batch]
        samples, redrawn = sample_candidates(model, [s["observation"] for s in batch], images, keys, job.cfg)
        lists += [[s["action"], *row] for s, row in zip(batch, samples, strict=True)]
        resampled += redrawn
    return AugmentPart(lists, resampled)


def augment_jobs(paths: Paths, cfg: AugmentConfig, steps: list[dict[str, Any]], workers: int) -> list[AugmentJob]:
    """The steps in runs of whole batches, about :data:`JOBS_PER_WORKER` jobs per worker."""
    batches = math.ceil(len(steps) / cfg.batch_states)
    size = cfg.batch_states * max(1, math.ceil(batches / (JOBS_PER_WORKER * workers)))
    return [AugmentJob(paths, cfg, steps[a : a + size]) for a in range(0, len(steps), size)]


@one_run_at_a_time("augment_actions")
def run_augment(cfg: AugmentConfig, paths: Paths, compute: ComputeConfig = IN_PROCESS) -> dict[str, Any]:
    """The candidate table (:func:`~digiq.data.candidates.write_candidates`), sampled by ``compute``'s workers."""
    require("augment_actions", paths.base_policy / "config.json")
    metrics: dict[str, Any] = {}
    with timed(metrics):
        store = TrajectoryStore(paths.offline)
        steps = store.read().select(["traj_id", "step_id", "observation", "image_path", "action"]).to_pylist()
        parts = map_jobs(augment_job, augment_jobs(paths, cfg, steps, job_slots(compute)), compute)
        lists = [row for part in parts for row in part.lists]
        resampled = sum(part.resampled for part in parts)
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


def run(settings: Settings, paths: Paths) -> dict[str, Any]:
    """Stage 02 as ``params.yaml`` sets it, on ``compute``'s workers."""
    return run_augment(settings.augment, paths,
                       compute=settings.compute)  # fmt: skip
