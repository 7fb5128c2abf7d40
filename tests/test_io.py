import shutil

import numpy as np
import pytest

from digiq.data import DataError
from digiq.data.features import load_features
from digiq.io import StageError, atomic_path, atomic_write_text
from digiq.models.critic import Critic
from digiq.paths import Paths


def test_atomic_write_replaces_whole_file(tmp_path):
    p = tmp_path / "sub" / "a.txt"
    atomic_write_text(p, "one")
    atomic_write_text(p, "two")
    assert p.read_text() == "two" and [x.name for x in p.parent.iterdir()] == ["a.txt"]


def test_interrupted_write_leaves_old_file_and_no_temp(tmp_path):
    p = tmp_path / "a.txt"
    p.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(p) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed")
    assert p.read_text() == "old" and [x.name for x in tmp_path.iterdir()] == ["a.txt"]


def _features_root(values_root, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(values_root, root)
    return Paths(root)


@pytest.mark.parametrize(
    ("break_it", "message"),
    [
        (
            lambda f: np.save(f / "ids.npy", np.load(f / "ids.npy")[::-1]),
            r"are not the steps of .* first differing at row 0",
        ),
        (lambda f: np.save(f / "next_state.npy", np.load(f / "next_state.npy")[:, :-1]), r"next_state.npy has shape"),
        (lambda f: np.save(f / "p_yes.npy", np.load(f / "p_yes.npy")[:, :2]), r"p_yes.npy has shape"),
        (
            lambda f: np.save(
                f / "candidates.npy", np.where(np.arange(3)[None, :, None] == 1, np.nan, np.load(f / "candidates.npy"))
            ),
            r"candidates.npy holds a non-finite",
        ),
        (lambda f: (f / "ids.npy").unlink(), r"missing input .*ids.npy"),
    ],
)
def test_feature_files_that_do_not_fit_the_steps_or_each_other_are_named(values_root, tmp_path, break_it, message):
    paths = _features_root(values_root, tmp_path)
    assert load_features(paths)["candidates"].shape[1] == 3  # whole, they load
    break_it(paths.features())
    with pytest.raises((DataError, StageError), match=message):
        load_features(paths)


def test_a_truncated_checkpoint_is_named(values_root, tmp_path):
    paths = _features_root(values_root, tmp_path)
    weights = paths.critic(0) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match=rf"cannot load the weights {weights}"):
        Critic.load(paths.critic(0))
