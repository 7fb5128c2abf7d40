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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa

from digiq.data.trajectories import read_table, write_parquet
from digiq.io import atomic_path
from digiq.paths import Paths

__all__ = ["Picks", "write_picks", "read_picks", "PICK_FIELDS"]

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
