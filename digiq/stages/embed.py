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

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from tqdm.auto import tqdm

from digiq import parallel
from digiq.config import EmbedConfig
from digiq.data.candidates import read_candidates
from digiq.data.features import load_features, save_features
from digiq.data.trajectories import DataError, TrajectoryStore
from digiq.env.actions import parse_action
from digiq.io import atomic_folder, require
from digiq.models.vlm import ScreenVLM
from digiq.paths import Paths
from digiq.stages.common import one_run_at_a_time, timed, write_metrics
from digiq.workers import map_jobs

__all__ = ["run_embed", "EmbedJob", "embed_job", "load_vlm"]


def _embed_features(vlm: ScreenVLM, store: TrajectoryStore, steps: list[dict], cands: list[dict], batch: int,
                    out: Path) -> float:  # fmt: skip
    """Write the four arrays for one VLM into ``out``; returns pairs embedded per second."""
    n = len(cands[0]["action_list"]) if cands else 0
    recipe = vlm.recipe
    names = sorted({s["image_path"] for s in steps} | {s["next_image_path"] for s in steps})
    # Each screenshot prepared once. The tiny recipe's are small enough to keep them all; the original's are
    # full-size screenshots (its icon goes on before scaling), so it keeps only the states being embedded.
    keep_all = recipe.name == "tiny"
    base: dict[str, np.ndarray] = {}

    def prepared(paths: list[str]) -> list[np.ndarray]:
        wanted = dict.fromkeys(paths)
        if not keep_all:
            for p in [p for p in base if p not in wanted]:
                del base[p]
        missing = [p for p in wanted if p not in base]
        for i in range(0, len(missing), 64):
            chunk = missing[i : i + 64]
            base.update(zip(chunk, recipe.base([store.load_image(p) for p in chunk]), strict=True))
        return [base[p] for p in paths]

    if keep_all:
        for i in tqdm(range(0, len(names), 64), desc="load screenshots", leave=False):
            prepared(names[i : i + 64])
    t0 = time.perf_counter()
    state_paths = [s["image_path"] for s in steps] + [s["next_image_path"] for s in steps if s["done"]]
    state_tasks = [s["task"] for s in steps] + [s["task"] for s in steps if s["done"]]
    s_rep_parts = []
    for i in tqdm(range(0, len(state_paths), batch), desc="embed states", leave=False):
        r, _ = vlm.embed([recipe.state(b) for b in prepared(state_paths[i : i + batch])],
                         [recipe.state_question(t) for t in state_tasks[i : i + batch]])  # fmt: skip
        s_rep_parts.append(r)
    s_rep = np.concatenate(s_rep_parts)
    # Candidate images are drawn batch by batch: all of them at once would take gigabytes.
    pairs = [(s, a) for s, c in zip(steps, cands, strict=True) for a in c["action_list"]]
    c_rep_parts, c_yes_parts = [], []
    for i in tqdm(range(0, len(pairs), batch), desc="embed candidates", leave=False):
        chunk = [(s, parse_action(a)) for s, a in pairs[i : i + batch]]
        shown = prepared([s["image_path"] for s, _ in chunk])
        r, y = vlm.embed([recipe.mark(b, a) for b, (_, a) in zip(shown, chunk, strict=True)],
                         [recipe.question(a, s["task"]) for s, a in chunk])  # fmt: skip
        c_rep_parts.append(r)
        c_yes_parts.append(y)
    c_rep, c_yes = np.concatenate(c_rep_parts), np.concatenate(c_yes_parts)
    pairs_per_s = (len(pairs) + len(state_paths)) / (time.perf_counter() - t0)
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
    with atomic_folder(out) as tmp:  # a stage cut short leaves the previous features whole, never a mix
        save_features(tmp, arrays, ids)
    return pairs_per_s


class EmbedJob(NamedTuple):
    """The features of one VLM (:func:`load_vlm`)."""

    paths: Paths
    vlm: str
    batch_size: int


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


def embed_job(job: EmbedJob) -> float:
    """Write one VLM's feature files; returns the pairs it embedded per second."""
    vlm = load_vlm(job.paths, job.vlm)
    vlm.model.to(parallel.device())  # a GPU when there is one
    store = TrajectoryStore(job.paths.offline)
    steps = store.read().select(["traj_id", "step_id", "task", "image_path", "next_image_path", "done"]).to_pylist()
    cands = read_candidates(job.paths).to_pylist()
    return _embed_features(vlm, store, steps, cands, job.batch_size, job.paths.features(job.vlm))


@one_run_at_a_time("embed")
def run_embed(cfg: EmbedConfig, paths: Paths, vlms: Sequence[str] = ("finetuned",), workers: int = 1) -> dict[str, Any]:
    """Features from each of ``vlms`` (:func:`load_vlm`; the first is the critic's own, the others ablations).

    On a CPU the VLMs' features are ``workers`` jobs (:mod:`digiq.workers`); on a GPU, one after the other.
    """
    require("embed", paths.vlm / "config.json", paths.candidates)
    metrics: dict[str, Any] = {}
    with timed(metrics):
        steps = TrajectoryStore(paths.offline).read().select(["traj_id", "step_id"]).to_pylist()
        cands = read_candidates(paths).select(["traj_id", "step_id"]).to_pylist()
        if steps != cands:
            raise DataError(
                f"candidates {paths.candidates} do not match the steps in {paths.offline}; rerun augment_actions"
            )
        jobs = [EmbedJob(paths, vlm, cfg.batch_size) for vlm in vlms]
        rates = map_jobs(embed_job, jobs, workers if parallel.device().type == "cpu" else 1)
        metrics["pairs_per_s"] = round(rates[0], 1)
    feats = load_features(paths)
    metrics.update({"states": int(feats["candidates"].shape[0]), "candidates_per_state": int(feats["candidates"].shape[1]),
                    "feature_dim": int(feats["state"].shape[1]), "vlms": list(vlms)})  # fmt: skip
    write_metrics(paths, "embed", metrics)
    return metrics
