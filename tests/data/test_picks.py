"""``digiq.data.picks``: the rows each policy imitates, written by stage 07 and read back by stage 08, and the
matrices stage 07 stores beside them."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from digiq.data.picks import Picks, read_picks, read_stored, stored_path, write_picks, write_stored
from digiq.data.trajectories import DataError
from digiq.io import StageError
from digiq.paths import Paths


def test_picks_come_back_per_policy_and_seed(tmp_path):
    paths = Paths(tmp_path)
    picks = {("digiq", 0): Picks(np.array([3, 7]), np.array([2, 0])), ("filtered_bc", 1): Picks.taken(np.array([1])),
             ("digirl_offline", 0): Picks.taken(np.array([], int)),
             ("digiq_reinforce", 0): Picks(np.array([3, 3, 5]), np.array([0, 2, 1]), np.array([0.25, -0.5, 0.0]))}  # fmt: skip
    write_picks(paths, picks)
    table = read_picks(paths)
    assert sorted(table.columns) == ["column", "policy", "seed", "state", "weight"]
    back = {key: Picks(rows.state.to_numpy(), rows.column.to_numpy(), rows.weight.to_numpy())
            for key, rows in table.groupby(["policy", "seed"])}  # fmt: skip
    assert set(back) == {("digiq", 0), ("filtered_bc", 1), ("digiq_reinforce", 0)}  # one that kept no row has none
    assert back[("digiq", 0)].states.tolist() == [3, 7] and back[("digiq", 0)].columns.tolist() == [2, 0]
    assert back[("filtered_bc", 1)].columns.tolist() == [0]
    assert back[("digiq", 0)].weights.tolist() == [1.0, 1.0] and back[("filtered_bc", 1)].weights.tolist() == [1.0]
    weighted = back[("digiq_reinforce", 0)]  # several candidates of one state, each with its own signed weight
    assert weighted.states.tolist() == [3, 3, 5] and weighted.columns.tolist() == [0, 2, 1]
    assert weighted.weights.tolist() == [0.25, -0.5, 0.0]


def test_a_missing_or_incomplete_picks_file_is_named(tmp_path):
    paths = Paths(tmp_path)
    with pytest.raises(StageError, match="picks.parquet"):
        read_picks(paths)
    paths.picks.parent.mkdir(parents=True)
    pq.write_table(pa.table({"seed": [0], "policy": ["digiq"]}), paths.picks)
    with pytest.raises(DataError, match=r"lacks field\(s\) \['column', 'state', 'weight'\]"):
        read_picks(paths)


def test_stored_matrices_come_back_for_the_same_steps_and_nothing_else_does(tmp_path):
    paths = Paths(tmp_path)
    steps = pd.DataFrame({"traj_id": [0, 0, 1], "step_id": [0, 1, 0]})
    q = np.arange(6, dtype=np.float32).reshape(3, 2)
    kinds = np.array(["TYPE", "DUAL_POINT", "PRESS_HOME"])
    write_stored(paths, "m", steps, {"q": q, "kinds": kinds})
    back = read_stored(paths, "m", steps, ("q", "kinds"), "diagnostics")
    assert np.array_equal(back["q"], q) and back["q"].dtype == np.float32 and back["kinds"].tolist() == kinds.tolist()
    with pytest.raises(DataError, match=r"m\.npz are not the stored steps \(3 rows for 2 steps\)"):
        read_stored(paths, "m", steps.iloc[:2], ("q",), "diagnostics")
    with pytest.raises(DataError, match="cannot read .*m\\.npz: KeyError"):
        read_stored(paths, "m", steps, ("v",), "diagnostics")
    with pytest.raises(ValueError, match="m: q has 3 rows for 2 steps"):
        write_stored(paths, "m", steps.iloc[:2], {"q": q})
    with pytest.raises(StageError, match=r"stage diagnostics: missing input .*other\.npz"):
        read_stored(paths, "other", steps, ("q",), "diagnostics")
    data = bytearray(stored_path(paths, "m").read_bytes())
    at = data.find(q.tobytes())
    data[at + 5] ^= 0x10  # one bit of Q flipped: the file's CRC no longer holds
    stored_path(paths, "m").write_bytes(bytes(data))
    with pytest.raises(DataError, match="cannot read .*m\\.npz: BadZipFile"):
        read_stored(paths, "m", steps, ("q",), "diagnostics")
