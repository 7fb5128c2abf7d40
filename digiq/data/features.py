"""Stage 05's feature arrays: VLM representations of every state and (state, candidate) pair.

One folder per VLM (``data/features/finetuned``; ``untuned`` and ``blind`` for the VLM ablations),
row-aligned with the offline step table sorted by (traj_id, step_id):
``state.npy`` (S, H), ``next_state.npy`` (S, H), ``candidates.npy`` (S, N, H')
(H' = H for the VLMs here; released data may differ),
``p_yes.npy`` (S, N), and ``ids.npy`` (S, 2): each row's (traj_id, step_id),
so that rows which no longer match the step table (a rerun of stage 01, a
file from elsewhere) are caught on load rather than trained on.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from digiq.data.trajectories import DataError, TrajectoryStore, step_ids
from digiq.io import atomic_path, require
from digiq.paths import Paths

__all__ = ["FEATURE_FILES", "save_features", "load_features"]

FEATURE_FILES = ("state", "next_state", "candidates", "p_yes", "ids")


def save_features(folder: Path, arrays: dict[str, np.ndarray], ids: np.ndarray) -> None:
    """Write one VLM's arrays (float32) and their rows' (traj_id, step_id) into ``folder``, each file atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, arr in [*((n, np.asarray(a, np.float32)) for n, a in arrays.items()), ("ids", np.asarray(ids, np.int64))]:
        with atomic_path(folder / f"{name}.npy") as tmp:
            with open(tmp, "wb") as f:
                np.save(f, arr)


def load_features(paths: Paths, vlm: str = "finetuned") -> dict[str, np.ndarray]:
    """The stage-05 arrays of one VLM, memory-mapped, checked against each other and against the step table.

    Raises:
        DataError: naming the file that is missing, unreadable, of the wrong shape, holds a non-finite
            value, or whose rows are not the step table's.
    """
    out = {}
    folder = paths.features(vlm)
    for name in FEATURE_FILES:
        p = folder / f"{name}.npy"
        require("embed", p)
        try:
            out[name] = np.load(p, mmap_mode="r")
        except ValueError as e:
            raise DataError(f"corrupt feature file {p}: {e}") from None
    S, H = out["state"].shape[0], out["state"].shape[-1]
    # Candidates may be wider than states: Digi-Q's released data hold BLIP-2 states beside LLaVA candidates.
    n, C = out["candidates"].shape[1:] if out["candidates"].ndim == 3 else (None, None)
    want = {"state": (S, H), "next_state": (S, H), "candidates": (S, n, C), "p_yes": (S, n), "ids": (S, 2)}
    for name, shape in want.items():
        if out[name].shape != shape:
            raise DataError(f"feature file {folder / name}.npy has shape {out[name].shape}, expected {shape} "
                            f"(from state.npy's {S} rows of width {H} and candidates.npy); rerun embed")  # fmt: skip
    table = step_ids(TrajectoryStore(paths.offline).read())
    if table.shape != out["ids"].shape or not np.array_equal(table, out["ids"]):
        k = next((i for i in range(min(len(table), S)) if tuple(table[i]) != tuple(out["ids"][i])), min(len(table), S))
        raise DataError(f"the rows of {folder} are not the steps of {paths.offline}: {S} rows for {len(table)} steps, "
                        f"first differing at row {k}; rerun embed")  # fmt: skip
    for name in ("state", "next_state", "candidates"):
        for i in range(0, S, 4096):
            if not np.isfinite(out[name][i : i + 4096]).all():
                raise DataError(f"feature file {folder / name}.npy holds a non-finite value in rows {i}-{i + 4095}")
    return out
