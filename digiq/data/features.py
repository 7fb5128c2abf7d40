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
    """The stage-05 arrays of one VLM, memory-mapped, checked against the step table and against each other.

    Raises:
        DataError: naming the file that is missing, unreadable, not float32 (``ids``: not integer), of
            the wrong shape, holds a non-finite value, or whose rows are not the step table's. Rows are
            counted against the step table, so a file cut short is the one named, not its intact neighbour.
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
    table = step_ids(TrajectoryStore(paths.offline).read())
    if out["ids"].shape != table.shape or not np.array_equal(table, out["ids"]):
        S = len(out["ids"])
        k = next((i for i in range(min(len(table), S)) if tuple(table[i]) != tuple(out["ids"][i])), min(len(table), S))
        raise DataError(f"the rows of {folder} are not the steps of {paths.offline}: {S} rows for {len(table)} steps, "
                        f"first differing at row {k}; rerun embed")  # fmt: skip
    ndim = {"state": 2, "next_state": 2, "candidates": 3, "p_yes": 2}
    for name, n in ndim.items():
        arr = out[name]
        if arr.ndim != n or len(arr) != len(table):
            raise DataError(f"feature file {folder / name}.npy has shape {arr.shape}, expected {n} dimensions and "
                            f"{len(table)} rows (ids.npy's, one per step); rerun embed")  # fmt: skip
        if arr.dtype != np.float32:  # what embed writes; the critic's float32 layers take nothing else
            raise DataError(f"feature file {folder / name}.npy holds {arr.dtype}, not float32; rerun embed")
    # Candidates may be wider than states: Digi-Q's released data hold BLIP-2 states beside LLaVA candidates.
    for name, other, axis in (("next_state", "state", 1), ("p_yes", "candidates", 1)):
        if out[name].shape[axis] != out[other].shape[axis]:
            raise DataError(f"feature file {folder / name}.npy has shape {out[name].shape}, but {other}.npy has "
                            f"{out[other].shape}: their axis {axis} must agree; rerun embed")  # fmt: skip
    for name in ("state", "next_state", "candidates"):
        for i in range(0, len(table), 4096):
            if not np.isfinite(out[name][i : i + 4096]).all():
                raise DataError(f"feature file {folder / name}.npy holds a non-finite value in rows {i}-{i + 4095}")
    return out
