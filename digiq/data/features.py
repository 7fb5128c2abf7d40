"""Stage 04's feature arrays: VLM representations of every state and (state, candidate) pair.

One folder per VLM (``data/features/finetuned``, ``data/features/untuned``),
row-aligned with the offline step table sorted by (traj_id, step_id):
``state.npy`` (S, H), ``next_state.npy`` (S, H), ``candidates.npy`` (S, N, H)
and ``p_yes.npy`` (S, N).
"""

from __future__ import annotations

import numpy as np

from digiq.data.trajectories import DataError
from digiq.io import require
from digiq.paths import Paths

__all__ = ["FEATURE_FILES", "load_features"]

FEATURE_FILES = ("state", "next_state", "candidates", "p_yes")


def load_features(paths: Paths, vlm: str = "finetuned") -> dict[str, np.ndarray]:
    """The stage-04 arrays of one VLM, memory-mapped; a missing or mismatched file is named."""
    out = {}
    folder = paths.features(vlm)
    for name in FEATURE_FILES:
        p = folder / f"{name}.npy"
        require("embed", p)
        try:
            out[name] = np.load(p, mmap_mode="r")
        except ValueError as e:
            raise DataError(f"corrupt feature file {p}: {e}") from None
    S = out["state"].shape[0]
    for name, arr in out.items():
        if arr.shape[0] != S:
            raise DataError(f"feature file {folder / name}.npy has {arr.shape[0]} rows, state.npy has {S}")
    return out
