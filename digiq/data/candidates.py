"""The candidate-action table (stage 02's output): N actions per stored state, index 0 the action taken.

Written by stage 02 and by the importer of released Digi-Q files, read by
the stages after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from digiq.data.trajectories import read_table, write_parquet
from digiq.env.actions import parse_action
from digiq.io import atomic_path
from digiq.paths import Paths

__all__ = ["CANDIDATE_FIELDS", "SPLIT", "write_candidates", "read_candidates"]

CANDIDATE_FIELDS = ("traj_id", "step_id", "action_list", "valid_list")
SPLIT = "<split>"  # Digi-Q's separator when a state's candidates are joined into one string


def write_candidates(path: Path, traj_ids: Sequence[int], step_ids: Sequence[int],
                     action_lists: Sequence[Sequence[str]]) -> list[list[bool]]:  # fmt: skip
    """Write the table atomically, each candidate marked valid when it parses as an action; returns those marks."""
    valid = [[parse_action(a).is_valid for a in row] for row in action_lists]
    table = pa.table({
        "traj_id": list(traj_ids),
        "step_id": list(step_ids),
        "action_list": [list(a) for a in action_lists],
        "valid_list": valid,
    })  # fmt: skip
    with atomic_path(path) as tmp:
        write_parquet(table, tmp)
    return valid


def read_candidates(paths: Paths) -> pa.Table:
    """Stage 02's table, sorted by trajectory and step; a missing, corrupt or incomplete file is named."""
    table = read_table(paths.candidates, CANDIDATE_FIELDS, "candidates", "augment_actions")
    return table.sort_by([("traj_id", "ascending"), ("step_id", "ascending")])
