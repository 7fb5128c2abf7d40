import errno
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from digiq.data import DataError, Step, TrajectoryStore
from digiq.data.features import load_features
from digiq.io import StageError, atomic_path, atomic_write_text, check_writable, printable, text_lines
from digiq.models.critic import Critic
from digiq.models.policy import AutoUIPolicy
from digiq.models.policy_fit import load_screens
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
        # A file cut short is named itself, not its intact neighbour next_state.npy measured against it.
        (lambda f: np.save(f / "state.npy", np.load(f / "state.npy")[:-1]), r"\bstate.npy has shape \(\d+, 8\)"),
        (lambda f: np.save(f / "state.npy", np.load(f / "state.npy").astype(np.float64)), r"state.npy holds float64"),
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
    weights = paths.critic(0, "digiq", "general") / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match=rf"cannot load the weights {weights}"):
        Critic.load(paths.critic(0, "digiq", "general"))


def _to_dev_full(path: Path) -> None:
    """Make ``path``'s next atomic write go to /dev/full, a real device whose every write fails with ENOSPC.

    The write goes through the hidden temporary file :func:`atomic_path`
    names with this process's id; a link there sends it to the device.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_name(f".{path.name}.tmp-{os.getpid()}").symlink_to("/dev/full")


def test_a_write_to_a_full_disk_names_the_file_once(tmp_path):
    out = tmp_path / "sub" / "report.json"
    _to_dev_full(out)
    with pytest.raises(OSError, match=rf"cannot write {out}: No space left on device \(the disk is full\)") as e:
        atomic_write_text(out, "x" * 100_000)
    assert e.value.errno == errno.ENOSPC and ".tmp-" not in str(e.value)
    assert e.value.__suppress_context__ and e.value.__cause__ is None  # one error shown, not a chain of two
    assert not out.exists() and list(out.parent.iterdir()) == []


def test_a_file_that_cannot_be_written_is_named_before_the_run(tmp_path):
    (tmp_path / "file").write_text("")
    for bad in (tmp_path / "file" / "out.json", tmp_path):  # a parent that is a file; a folder in the file's place
        with pytest.raises(OSError, match=rf"cannot write {bad}"):
            check_writable(bad)
    check_writable(tmp_path / "new" / "out.json")
    assert list((tmp_path / "new").iterdir()) == []  # the probe is gone


def test_a_full_disk_under_the_trajectory_store_names_the_store_path(tmp_path):
    store = TrajectoryStore(tmp_path / "offline")
    image = store.image_name(0, 0)
    _to_dev_full(store.root / image)
    pixels = np.random.default_rng(0).integers(0, 255, (400, 200, 3), dtype=np.uint8)  # more than PNG buffers
    with pytest.raises(OSError, match=rf"cannot write {store.root / image}: .*\(the disk is full\)"):
        store.save_image(image, pixels)
    store.save_image(image, pixels)  # the link is gone with the failed write: the disk has room again
    part = store.root / "steps-00000.parquet"
    _to_dev_full(part)
    step = Step(0, 0, "t", "general", "search", "o", "o", image, image, "a", True, 0.0, True, 0.0, 0.0)
    with pytest.raises(OSError, match=rf"cannot write {part}: .*\(the disk is full\)"):
        store.write_part([step] * 20_000)


def test_a_task_file_line_by_line_and_printed_safely(tmp_path):
    path = tmp_path / "tasks.txt"
    path.write_bytes(b"one\r\ncaf\xc3\xa9 \xff two\n\nred \x1b[31m text\n")
    assert list(text_lines(path)) == [(1, "one", None), (2, "café \\xff two", "not UTF-8 (byte 0xff at offset 6)"),
                                      (3, "", None), (4, "red \x1b[31m text", None)]  # fmt: skip
    assert printable("red \x1b[31m text\a") == "red \\x1b[31m text\\x07"
    assert printable("ab" * 200, limit=5) == "ababa... (400 characters)"


def test_a_screenshot_of_another_size_is_named_where_screenshots_are_stacked(values_root, tmp_path):
    paths = _features_root(values_root, tmp_path)
    store = TrajectoryStore(paths.offline)
    names = sorted(store.read().column("image_path").to_pylist())[:3]
    odd = store.root / names[1]
    Image.fromarray(np.zeros((40, 30, 3), np.uint8)).save(odd)
    policy = AutoUIPolicy.load(paths.base_policy)
    with pytest.raises(DataError, match=rf"screenshot {odd} is 30x40 pixels, but .* and 1 other\(s\) read with it"):
        load_screens(policy, store, names)


def _break_config(folder: Path, change: Callable[[dict], None]) -> Path:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.update(policy=None), r"policy is None, not a mapping of keys"),
        (lambda c: c["policy"].update(image_grid=None), r"policy.image_grid must be tuple, got None"),
        (lambda c: c["policy"].update(d_model="16"), r"policy.d_model must be int, got '16'"),
        (lambda c: c["policy"].update(heads=2), r"unknown key\(s\) policy.\['heads'\]"),
    ],
)
def test_a_checkpoint_config_of_the_wrong_type_names_the_file_and_key(values_root, tmp_path, change, message):
    folder = shutil.copytree(Paths(values_root).base_policy, tmp_path / "policy")
    path = _break_config(folder, change)
    with pytest.raises(ValueError, match=rf"corrupt checkpoint config {path}: {message}"):
        AutoUIPolicy.load(folder)


def test_a_checkpoint_without_its_tokenizer_names_the_missing_folder(values_root, tmp_path):
    folder = shutil.copytree(Paths(values_root).base_policy, tmp_path / "policy")
    shutil.rmtree(folder / "tokenizer")
    with pytest.raises(FileNotFoundError, match=rf"has no tokenizer folder {folder / 'tokenizer'}"):
        AutoUIPolicy.load(folder)
