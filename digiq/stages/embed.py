"""Stage 05: VLM representations of every state and every (state, candidate) pair.

Outputs (``data/features/finetuned``; ``data/features/untuned`` for the
ablation without the representation fine-tune and ``data/features/blind``
for the one without pretraining), row-aligned with the offline step table sorted by
(traj_id, step_id):
``state.npy`` (S, H), ``next_state.npy`` (S, H), ``candidates.npy`` (S, N, H),
``p_yes.npy`` (S, N), ``ids.npy`` (S, 2), memory-mappable (:mod:`digiq.data.features`). Digi-Q names: ``image_features`` /
``next_image_features`` (state) and ``q_rep_out_list`` (candidates).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

import numpy as np

from digiq import parallel
from digiq.config import ComputeConfig, EmbedConfig, Settings
from digiq.data.candidates import read_candidates
from digiq.data.features import load_features, save_features
from digiq.data.trajectories import DataError, TrajectoryStore
from digiq.env.actions import Action, parse_action
from digiq.io import atomic_folder, require
from digiq.models.vlm import ScreenVLM
from digiq.paths import Paths
from digiq.progress import progress
from digiq.rows import VLM_OF_ROW, vlm_rows
from digiq.stages.common import one_run_at_a_time, timed, write_metrics
from digiq.workers import IN_PROCESS, job_slots, map_jobs, process_cached

__all__ = [
    "run",
    "run_embed",
    "EmbedJob",
    "EmbedPart",
    "embed_job",
    "embed_rows",
    "load_vlm",
    "state_rows",
    "pair_rows",
]

# What the VLM is shown for a row: its screenshot, its task and the candidate's parsed action (None: the
# state alone). Two rows with one key get the same image and prompt, so the same representation.
Key = tuple[str, str, Action | None]
# Each VLM's rows are split into about this many jobs per worker, so that the last jobs are short and no
# core waits long for the other at the end of the stage.
JOBS_PER_WORKER = 4


def state_rows(steps: list[dict]) -> list[Key]:
    """The states embedded: every step's screen, then the final screen of each finished trajectory."""
    return ([(s["image_path"], s["task"], None) for s in steps]
            + [(s["next_image_path"], s["task"], None) for s in steps if s["done"]])  # fmt: skip


def pair_rows(steps: list[dict], cands: list[dict], start: int = 0, stop: int | None = None) -> list[Key]:
    """The (state, candidate) pairs ``start:stop`` of the flat list, state by state, candidates in order."""
    n = len(cands[0]["action_list"]) if cands else 0
    stop = len(steps) * n if stop is None else stop
    return [(steps[i // n]["image_path"], steps[i // n]["task"], parse_action(cands[i // n]["action_list"][i % n]))
            for i in range(start, stop)]  # fmt: skip


def embed_rows(vlm: ScreenVLM, store: TrajectoryStore, rows: Sequence[Key], batch: int, desc: str = "embed"
               ) -> tuple[np.ndarray, np.ndarray, int]:  # fmt: skip
    """Representations and P(Yes) of ``rows``, ``batch`` rows per forward pass; and how many rows were distinct.

    Each batch embeds its distinct keys once and copies them to their
    duplicates (16 candidates of a state hold about 7 distinct actions). The
    batches themselves stay as they are, ``batch`` rows counted from the
    first: a prompt is left-padded to its batch's longest and its positions
    counted from there, so the same pair in a batch of another width differs
    in its last bits (about 1e-6), while fewer rows of the same width give
    the same bits on a CPU (``tests/stages/test_embed.py``, ``benchmarks/embed.py``).
    """
    recipe = vlm.recipe
    reps, yes, distinct = [], [], 0
    for i in progress(range(0, len(rows), batch), desc=desc):
        chunk = rows[i : i + batch]
        unique = list(dict.fromkeys(chunk))
        names = list(dict.fromkeys(path for path, _, _ in unique))
        # The candidate images are drawn batch by batch: all of them at once would take gigabytes.
        shown = dict(zip(names, recipe.base([store.load_image(p) for p in names]), strict=True))
        images = [recipe.state(shown[p]) if a is None else recipe.mark(shown[p], a) for p, _, a in unique]
        prompts = [recipe.state_question(t) if a is None else recipe.question(a, t) for _, t, a in unique]
        r, y = vlm.embed(images, prompts)
        where = {key: j for j, key in enumerate(unique)}
        take = [where[key] for key in chunk]
        reps.append(r[take])
        yes.append(y[take])
        distinct += len(unique)
    return np.concatenate(reps), np.concatenate(yes), distinct


class EmbedJob(NamedTuple):
    """Rows ``start:stop`` of one VLM's (:func:`load_vlm`) states or (state, candidate) pairs.

    ``start`` is a multiple of ``batch_size``: a job's batches are the ones the whole list is cut into.
    """

    paths: Paths
    vlm: str
    batch_size: int
    part: Literal["states", "candidates"]
    start: int
    stop: int


class EmbedPart(NamedTuple):
    """What one :class:`EmbedJob` embedded: its rows' representations and P(Yes), distinct rows, seconds taken."""

    rep: np.ndarray
    p_yes: np.ndarray
    distinct: int
    seconds: float


def load_vlm(paths: Paths, name: str) -> ScreenVLM:
    """The VLM whose features are ``data/features/<name>``.

    ``finetuned``: the representation fine-tune's; ``untuned``: the same VLM
    before it (the pretrained tiny VLM, or the released LLaVA as published);
    ``blind``: the fine-tune of a tiny VLM that was never pretrained.
    """
    if name == "finetuned":
        return ScreenVLM.load(paths.vlm)
    if name == "blind":
        return ScreenVLM.load(paths.vlm_blind)
    if name == "untuned":
        if (paths.vlm_pretrained / "config.json").exists():
            return ScreenVLM.load(paths.vlm_pretrained)
        # A released LLaVA is not pretrained here: it is read again from its own folder.
        return ScreenVLM.load(paths.vlm).fresh()
    raise ValueError(f"unknown VLM {name!r}: finetuned, untuned or blind")


def _steps(paths: Paths) -> tuple[list[dict], list[dict]]:
    steps = TrajectoryStore(paths.offline).read().select(["traj_id", "step_id", "task", "image_path",
                                                          "next_image_path", "done"]).to_pylist()  # fmt: skip
    return steps, read_candidates(paths).select(["action_list"]).to_pylist()


def embed_job(job: EmbedJob) -> EmbedPart:
    """Embed one job's rows; the process keeps the inputs it read and its last VLM for its next job."""
    if job.start % job.batch_size:
        raise ValueError(f"embed job starts at row {job.start}, not a multiple of its batch size {job.batch_size}")
    steps, cands = process_cached(("embed inputs", job.paths), lambda: _steps(job.paths))

    def build() -> ScreenVLM:
        vlm = load_vlm(job.paths, job.vlm)
        vlm.model.to(parallel.device())  # a GPU when there is one
        return vlm

    vlm = process_cached(("embed vlm", job.paths, job.vlm), build, slot="embed vlm")
    t0 = time.perf_counter()
    if job.part == "states":
        rows = state_rows(steps)[job.start : job.stop]
    else:
        rows = pair_rows(steps, cands, job.start, job.stop)
    store = TrajectoryStore(job.paths.offline)
    rep, p_yes, distinct = embed_rows(vlm, store, rows, job.batch_size, f"embed {job.vlm} {job.part} {job.start}")
    return EmbedPart(rep, p_yes, distinct, time.perf_counter() - t0)


def _jobs(paths: Paths, vlms: Sequence[str], batch: int, n_states: int, n_pairs: int, workers: int) -> list[EmbedJob]:
    """Each VLM's states and pairs in runs of whole batches, about :data:`JOBS_PER_WORKER` jobs per worker each."""
    batches = math.ceil(n_states / batch) + math.ceil(n_pairs / batch)
    size = batch * max(1, math.ceil(batches / (JOBS_PER_WORKER * workers)))
    return [EmbedJob(paths, vlm, batch, part, a, min(a + size, rows)) for vlm in vlms
            for part, rows in (("states", n_states), ("candidates", n_pairs)) for a in range(0, rows, size)]  # fmt: skip


def _save(paths: Paths, name: str, steps: list[dict], parts: list[tuple[EmbedJob, EmbedPart]], n: int) -> None:
    """Write one VLM's arrays from its jobs' parts, in row order."""
    s_rep = np.concatenate([p.rep for j, p in parts if j.part == "states"])
    c_rep = np.concatenate([p.rep for j, p in parts if j.part == "candidates"])
    c_yes = np.concatenate([p.p_yes for j, p in parts if j.part == "candidates"])
    S, H = len(steps), s_rep.shape[1]
    state = s_rep[:S]
    # s' of a step is the next step's state; the final screen of a trajectory was embedded at the end.
    next_state = np.empty_like(state)
    final = iter(s_rep[S:])
    for i, s in enumerate(steps):
        next_state[i] = next(final) if s["done"] else state[i + 1]
    arrays = {"state": state, "next_state": next_state, "candidates": c_rep.reshape(S, n, H),
              "p_yes": c_yes.reshape(S, n)}  # fmt: skip
    ids = np.array([(s["traj_id"], s["step_id"]) for s in steps], np.int64).reshape(S, 2)
    # A stage cut short leaves the previous features whole, never a mix.
    with atomic_folder(paths.features(name)) as tmp:
        save_features(tmp, arrays, ids)


@one_run_at_a_time("embed")
def run_embed(cfg: EmbedConfig, paths: Paths, vlms: Sequence[str] = ("finetuned",),
              compute: ComputeConfig = IN_PROCESS) -> dict[str, Any]:  # fmt: skip
    """Features from each of ``vlms`` (:func:`load_vlm`; the first is the critic's own, the others ablations).

    Each VLM's rows are cut into jobs of whole batches (:func:`embed_job`),
    merged here in order. On a CPU the jobs are shared by ``compute.workers``
    processes (:mod:`digiq.workers`), on a GPU they run one after the other;
    on a Ray cluster they are its tasks, each on ``compute.job_gpus`` GPUs.
    """
    require("embed", paths.vlm / "config.json", paths.candidates)
    metrics: dict[str, Any] = {}
    with timed(metrics):
        steps = TrajectoryStore(paths.offline).read().select(["traj_id", "step_id", "done"]).to_pylist()
        cands = read_candidates(paths).select(["traj_id", "step_id", "action_list"]).to_pylist()
        if [(s["traj_id"], s["step_id"]) for s in steps] != [(c["traj_id"], c["step_id"]) for c in cands]:
            raise DataError(
                f"candidates {paths.candidates} do not match the steps in {paths.offline}; rerun augment_actions"
            )
        n = len(cands[0]["action_list"]) if cands else 0
        if any(len(c["action_list"]) != n for c in cands):
            raise DataError(f"candidates {paths.candidates} hold lists of different lengths; every state needs "
                            f"{n}, as the first has: rerun augment_actions")  # fmt: skip
        if compute.backend == "local" and parallel.device().type != "cpu":
            compute = IN_PROCESS
        n_states = len(steps) + sum(s["done"] for s in steps)
        jobs = _jobs(paths, vlms, cfg.batch_size, n_states, len(steps) * n, job_slots(compute))
        parts = list(zip(jobs, map_jobs(embed_job, jobs, compute), strict=True))
        for name in vlms:
            _save(paths, name, steps, [(j, p) for j, p in parts if j.vlm == name], n)
        first = [p for j, p in parts if j.vlm == vlms[0]]
        # Per second of one worker: every row counts, a duplicate copied as well as a pair embedded.
        metrics["pairs_per_s"] = round(sum(len(p.rep) for p in first) / sum(p.seconds for p in first), 1)
        metrics["distinct_pairs"] = sum(p.distinct for j, p in parts if j.vlm == vlms[0] and j.part == "candidates")
    feats = load_features(paths)
    metrics.update({"states": int(feats["candidates"].shape[0]), "candidates_per_state": int(feats["candidates"].shape[1]),
                    "feature_dim": int(feats["state"].shape[1]), "vlms": list(vlms)})  # fmt: skip
    write_metrics(paths, "embed", metrics)
    return metrics


def run(settings: Settings, paths: Paths) -> dict[str, Any]:
    """Stage 05 as ``params.yaml`` sets it: the features of the VLMs the rows' critics read, the paper's first."""
    vlms = [VLM_OF_ROW[row] for row in vlm_rows(settings.ablations)]
    return run_embed(settings.embed, paths, vlms,
                     compute=settings.compute)  # fmt: skip
