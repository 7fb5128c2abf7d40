"""The rows each policy of the actor stage imitates: per seed, a stored state, the column of the candidate it copies
and the row's weight.

Column 0 is the action the data took there (the augment_actions stage
stores it first), so Filtered BC's and offline DigiRL's rows all have
column 0 and Best-of-N's have the candidate its critic chose. Every row
weighs 1 in the fit except those of the extraction ablation (AWR's and
REINFORCE's weights, every drawn candidate of a state; a negative weight
pushes the candidate down). The actor stage writes the table beside the
actors it fits; the diagnostics stage judges every method's rows alike
from it.

Beside the picks, in ``scores/``, the actor stage keeps what it computed
over every stored state and later stages read rather than compute again
(:func:`write_stored`, :func:`read_stored`): each critic's Q and V of every
candidate per seed (the diagnostics judge the same matrices Best-of-N
picked from), the simulator expert's verdict on every candidate (the
perfect critic's; the diagnostics' too) and the frozen base policy's step
features offline DigiRL's value functions read (off-to-online DigiRL's
too). Each file holds its rows' (traj_id, step_id), checked on every read.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa

from digiq.data.trajectories import DataError, read_table, write_parquet
from digiq.io import atomic_path, require
from digiq.paths import Paths

__all__ = ["Picks", "write_picks", "read_picks", "PICK_FIELDS", "STORED", "EXPERT_MATRIX", "DIGIRL_STEP_FEATURES",
           "stored_path", "critic_scores_name", "write_stored", "read_stored"]  # fmt: skip

STORED = "scores"  # the folder of stage 07's stored matrices, beside the picks
# The stored names of the expert's matrix (right, kinds) and of offline DigiRL's step features (state, next_state,
# instruction); each critic's are critic_scores_name's (q, v).
EXPERT_MATRIX = "expert_matrix"
DIGIRL_STEP_FEATURES = "digirl_step_features"

PICK_FIELDS = ("seed", "policy", "state", "column", "weight")


class Picks(NamedTuple):
    """One policy's rows for one seed: stored states (rows of the step table sorted by trajectory and step), columns
    and the rows' weights in the fit (``None``: every row weighs 1)."""

    states: np.ndarray
    columns: np.ndarray
    weights: np.ndarray | None = None

    @classmethod
    def taken(cls, states: np.ndarray) -> Picks:
        """The data's own action at ``states``."""
        return cls(states, np.zeros(len(states), int))

    def row_weights(self) -> np.ndarray:
        """Each row's weight, 1 where none is given."""
        return np.ones(len(self.states)) if self.weights is None else np.asarray(self.weights, np.float64)


def write_picks(paths: Paths, picks: Mapping[tuple[str, int], Picks]) -> None:
    """Write every ``(policy, seed)``'s picks to :attr:`Paths.picks`, atomically."""
    keys = sorted(picks)
    table = pa.table({
        "seed": np.concatenate([np.full(len(picks[k].states), k[1]) for k in keys]).astype(np.int64),
        "policy": [k[0] for k in keys for _ in range(len(picks[k].states))],
        "state": np.concatenate([np.asarray(picks[k].states, np.int64) for k in keys]),
        "column": np.concatenate([np.asarray(picks[k].columns, np.int64) for k in keys]),
        "weight": np.concatenate([picks[k].row_weights() for k in keys]),
    })  # fmt: skip
    with atomic_path(paths.picks) as tmp:
        write_parquet(table, tmp)


def read_picks(paths: Paths) -> pd.DataFrame:
    """The table as written; a missing, corrupt or incomplete file is named."""
    table = read_table(paths.picks, PICK_FIELDS, "picks", "actor")
    return table.to_pandas()


def stored_path(paths: Paths, name: str) -> Path:
    """Where stage 07 keeps the matrices called ``name`` (:func:`write_stored`)."""
    return paths.actors / STORED / f"{name}.npz"


def critic_scores_name(row: str, seed: int) -> str:
    """The stored name of Q and V by ``row``'s critics of seed index ``seed``."""
    return f"critic_{row}_seed{seed}"


def _step_ids(steps: pd.DataFrame) -> np.ndarray:
    return steps[["traj_id", "step_id"]].to_numpy(np.int64)


def write_stored(paths: Paths, name: str, steps: pd.DataFrame, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``arrays``, one row per step of ``steps``, with the steps' (traj_id, step_id), as ``name``, atomically."""
    for key, a in arrays.items():
        if len(a) != len(steps):
            raise ValueError(f"{name}: {key} has {len(a)} rows for {len(steps)} steps")
    with atomic_path(stored_path(paths, name)) as tmp, open(tmp, "wb") as f:
        np.savez(f, ids=_step_ids(steps), **arrays)


def read_stored(paths: Paths, name: str, steps: pd.DataFrame, fields: tuple[str, ...],
                stage: str) -> dict[str, np.ndarray]:  # fmt: skip
    """The arrays ``fields`` stored as ``name``, checked to be one row per step of ``steps``, in their order.

    Raises:
        StageError: the file is missing (naming ``stage``, the stage that reads it).
        DataError: it does not read, lacks a field, or its rows are not the steps of ``steps``.
    """
    path = stored_path(paths, name)
    require(stage, path)
    try:
        with np.load(path, allow_pickle=False) as stored:
            out = {key: stored[key] for key in ("ids", *fields)}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:  # BadZipFile: a CRC that fails too
        raise DataError(f"cannot read {path}: {type(e).__name__}: {e}; rerun the actor stage") from None
    ids = out.pop("ids")
    if not np.array_equal(ids, _step_ids(steps)):
        raise DataError(f"the rows of {path} are not the stored steps ({len(ids)} rows for {len(steps)} steps); "
                        "rerun the actor stage")  # fmt: skip
    for key, a in out.items():
        if len(a) != len(steps):
            raise DataError(f"{path}: {key} has {len(a)} rows for {len(steps)} steps; rerun the actor stage")
    return out
