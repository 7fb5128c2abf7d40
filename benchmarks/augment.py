"""Stage 02's sampling before and after, in one run: candidates per second, one thread and the stage's workers.

"before" is stage 02's loop as it was (``--before``: its revision of
``digiq/models/policy.py``, loaded from git beside this checkout's), "after"
this checkout's :func:`digiq.stages.augment_actions.sample_candidates` and
:func:`~digiq.stages.augment_actions.augment_job`. Both load the same base
policy and sample the first ``--states`` stored steps of a pipeline root
(``--root``: stages ``base_policy`` and ``collect`` run there) at the
committed shapes: ``augment.batch_states`` states a batch,
``augment.n_candidates - 1`` candidates a state at ``augment.temperature``,
invalid ones drawn again up to ``augment.max_resample`` times.

- One thread, batch by batch, the two alternating (which goes first
  alternates too): before samples each batch, then samples its invalid
  candidates' prompts and screenshots anew (the CNN and the encoder again,
  per redraw); after encodes each state once and projects cross-attention's
  keys and values once per state, not per candidate.
- The stage: before's loop in this process on torch's default threads (the
  notebook kernel's), against after's jobs of whole batches on
  ``compute.workers`` one-thread processes (worker start-up included),
  alternating ``--repeats`` times. ``--neighbour`` runs a one-thread busy
  process beside both, as a test run or another stage would.

Candidates are compared list by list: each draw is keyed by its state and
index (:mod:`digiq.noise`), so the lists are the same up to a draw that
falls within float rounding (about 1e-6) of a boundary between two tokens.

Last line: ``augment_speedup=<number>`` (the stage: before's time over after's).
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from pathlib import Path
from typing import Any

import torch
from policy_step import policy_module_at

from digiq.config import AugmentConfig, load_settings
from digiq.data.trajectories import TrajectoryStore
from digiq.env.actions import parse_action
from digiq.models.policy import AutoUIPolicy
from digiq.noise import noise_key
from digiq.paths import Paths
from digiq.stages.augment_actions import augment_job, augment_jobs, sample_candidates
from digiq.workers import map_jobs

BEFORE = "816cae9"  # cross-attention projected per candidate; every redraw encoded its state again


def before_batch(policy: Any, store: TrajectoryStore, batch: list[dict], cfg: AugmentConfig) -> tuple[list, int]:
    """One batch's candidate lists and redraws as stage 02's loop made them (its code, on before's policy)."""
    images = policy.screen.prepare(store.load_images([s["image_path"] for s in batch]))
    prompts = [s["observation"] for s in batch]
    keys = [noise_key(cfg.seed, s["traj_id"], s["step_id"]) for s in batch]
    samples = policy.sample(prompts, images, n=cfg.n_candidates - 1, temperature=cfg.temperature, noise=keys)
    resampled = 0
    for attempt in range(1, cfg.max_resample + 1):
        bad = [(i, j) for i, row in enumerate(samples) for j, a in enumerate(row) if not parse_action(a).is_valid]
        if not bad:
            break
        resampled += len(bad)
        redo = policy.sample([prompts[i] for i, _ in bad], images[[i for i, _ in bad]], n=1,
                             temperature=cfg.temperature,
                             noise=[noise_key(keys[i], j, attempt) for i, j in bad])  # fmt: skip
        for (i, j), new in zip(bad, redo, strict=True):
            samples[i][j] = new[0]
    return [[s["action"], *row] for s, row in zip(batch, samples, strict=True)], resampled


def after_batch(
    policy: AutoUIPolicy, store: TrajectoryStore, batch: list[dict], cfg: AugmentConfig
) -> tuple[list, int]:
    """The same batch through this checkout's sampler (what :func:`augment_job` runs per batch)."""
    images = policy.screen.prepare(store.load_images([s["image_path"] for s in batch]))
    keys = [noise_key(cfg.seed, s["traj_id"], s["step_id"]) for s in batch]
    samples, resampled = sample_candidates(policy, [s["observation"] for s in batch], images, keys, cfg)
    return [[s["action"], *row] for s, row in zip(batch, samples, strict=True)], resampled


def busy() -> None:
    """A neighbour: one thread of matrix products until it is stopped."""
    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    while True:
        a = torch.tanh(a @ a)


def compare(before: list[list[str]], after: list[list[str]]) -> str:
    same = sum(a == b for x, y in zip(before, after, strict=True) for a, b in zip(x, y, strict=True))
    return f"{same} of {sum(len(x) for x in before)} candidates equal"


def one_thread(old: Any, new: AutoUIPolicy, store: TrajectoryStore, steps: list[dict], cfg: AugmentConfig) -> float:
    """Batch by batch on one thread (``old``: before's policy); prints actions/s of each; returns before's time
    over after's."""
    torch.set_num_threads(1)
    took, lists = {"before": 0.0, "after": 0.0}, {"before": [], "after": []}
    drawn = {"before": 0, "after": 0}
    runs = {"before": lambda b: before_batch(old, store, b, cfg), "after": lambda b: after_batch(new, store, b, cfg)}
    batches = [steps[i : i + cfg.batch_states] for i in range(0, len(steps), cfg.batch_states)]
    for k, batch in enumerate(batches):
        for name in ("before", "after") if k % 2 == 0 else ("after", "before"):
            t0 = time.perf_counter()
            out, resampled = runs[name](batch)
            took[name] += time.perf_counter() - t0
            lists[name] += out
            drawn[name] += len(batch) * (cfg.n_candidates - 1) + resampled
    for name in took:
        print(f"one thread  {name:<6} {drawn[name] / took[name]:7.1f} actions/s  ({drawn[name]} actions drawn, "
              f"redraws included, {took[name]:.1f} s)")  # fmt: skip
    print(f"one thread  {compare(lists['before'], lists['after'])}")
    return took["before"] / took["after"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Paths().root, help="pipeline root with base_policy and collect run")
    ap.add_argument("--before", default=BEFORE, help="git revision of the policy module to compare with")
    ap.add_argument("--states", type=int, default=640, help="first stored steps sampled (10 batches of 64)")
    ap.add_argument("--repeats", type=int, default=2, help="stage runs of each, alternating")
    ap.add_argument("--neighbour", action="store_true", help="a one-thread busy process beside the stage runs")
    args = ap.parse_args()

    paths = Paths(args.root)
    settings = load_settings(paths.root / "params.yaml")
    cfg, compute = settings.augment, settings.compute
    store = TrajectoryStore(paths.offline)
    columns = ["traj_id", "step_id", "observation", "image_path", "action"]
    steps = store.read().select(columns).to_pylist()[: args.states]
    old = policy_module_at(args.before).AutoUIPolicy.load(paths.base_policy)
    new = AutoUIPolicy.load(paths.base_policy)
    print(f"states={len(steps)} before={args.before} batch_states={cfg.batch_states} "
          f"n_candidates={cfg.n_candidates} temperature={cfg.temperature} workers={compute.workers}")  # fmt: skip
    sampling = one_thread(old, new, store, steps, cfg)
    print(f"one thread  speedup {sampling:.2f}")

    threads = torch.get_num_threads()
    torch.set_num_threads(multiprocessing.cpu_count())  # the kernel's default
    neighbour = None
    if args.neighbour:
        neighbour = multiprocessing.get_context("spawn").Process(target=busy, daemon=True)
        neighbour.start()
    took: dict[str, list[float]] = {"before": [], "after": []}
    lists: dict[str, list[list[str]]] = {}
    try:
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            lists["before"] = [row for i in range(0, len(steps), cfg.batch_states)
                               for row in before_batch(old, store, steps[i : i + cfg.batch_states], cfg)[0]]  # fmt: skip
            took["before"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            jobs = augment_jobs(paths, cfg, steps, compute.workers)
            lists["after"] = [row for part in map_jobs(augment_job, jobs, compute) for row in part.lists]
            took["after"].append(time.perf_counter() - t0)
    finally:
        if neighbour is not None:
            neighbour.terminate()
        torch.set_num_threads(threads)
    how = {"before": f"in this process, {multiprocessing.cpu_count()} threads",
           "after": f"{compute.workers} one-thread workers"}  # fmt: skip
    for name, times in took.items():
        print(f"stage       {name:<6} {' '.join(f'{t:.1f}' for t in times)} s  ({how[name]})")
    print(
        f"stage       {compare(lists['before'], lists['after'])}" + ("  (beside a busy neighbour)" if neighbour else "")
    )
    print(f"augment_speedup={sum(took['before']) / sum(took['after']):.2f}")


if __name__ == "__main__":
    main()
