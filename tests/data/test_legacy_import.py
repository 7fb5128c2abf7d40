"""The importer of released Digi-Q / DigiRL ``.pt`` files, on files built here with the released schema."""

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
from released import released, save_released

from digiq.data import DataError, TrajectoryStore, mc_returns
from digiq.data.candidates import SPLIT
from digiq.data.legacy import IMAGE_PREFIX, import_legacy


def test_digiq_file_round_trips(tmp_path):
    data, imgs = released(tmp_path, digiq=True)
    summary = import_legacy(
        save_released(tmp_path, data), tmp_path / "out", imgs, task_set="general", trust_pickle=True
    )
    assert summary == {"trajectories": 3, "steps": 9, "format": "digiq", "candidates": 3,
                       "arrays": ["image_features", "next_image_features", "q_rep_out_list"]}  # fmt: skip
    store = TrajectoryStore(tmp_path / "out")
    table = store.read().to_pandas()
    flat = [step for traj in data for step in traj]
    assert list(table.traj_id) == [s["traj_id"] for s in flat] and list(table.step_id) == [s["step_id"] for s in flat]
    for key in ("observation", "next_observation", "task", "action", "reward", "done", "mc_return"):
        assert list(table[key]) == [s[key] for s in flat], key
    assert list(dict.fromkeys(table.family)) == ["search", "open_app", "unsupported"]
    for row, step in zip(table.itertuples(), flat, strict=True):  # screenshots copied byte for byte
        src = imgs / step["image_path"].removeprefix(IMAGE_PREFIX + "/")
        nxt = imgs / step["next_image_path"].removeprefix(IMAGE_PREFIX + "/")
        assert (tmp_path / "out" / row.image_path).read_bytes() == src.read_bytes()
        assert (tmp_path / "out" / row.next_image_path).read_bytes() == nxt.read_bytes()
    cands = pq.read_table(tmp_path / "out" / "candidates.parquet").to_pandas()
    assert [list(c) for c in cands.action_list] == [s["action_list"].split(SPLIT) for s in flat]
    assert all(list(v) == [True, True, False] for v in cands.valid_list)
    feats = np.load(tmp_path / "out" / "image_features.npy")
    assert feats.shape == (9, 1408) and np.allclose(feats, np.stack([s["image_features"] for s in flat]))
    assert np.load(tmp_path / "out" / "q_rep_out_list.npy").shape == (9, 3, 8)


def test_digirl_file_gets_next_images_and_returns_from_its_steps(tmp_path):
    data, imgs = released(tmp_path, digiq=False, mc=False)
    summary = import_legacy(save_released(tmp_path, data), tmp_path / "out", imgs, task_set="general", trust_pickle=True,
                            gamma=0.9)  # fmt: skip
    assert summary["format"] == "digirl" and summary["candidates"] == 0
    table = TrajectoryStore(tmp_path / "out").read().to_pandas()
    for row in table.itertuples():  # DigiRL's image_path is the screen after the action: shifted back by one
        assert (tmp_path / "out" / row.image_path).read_bytes() == (
            imgs / f"ep{row.traj_id}_{row.step_id}.png"
        ).read_bytes()
        nxt = imgs / f"ep{row.traj_id}_{row.step_id + 1}.png"
        assert (tmp_path / "out" / row.next_image_path).read_bytes() == nxt.read_bytes()
    first = table[table.traj_id == 0]
    assert list(first.next_image_path[:-1]) == list(first.image_path[1:])  # one copy of each screen
    assert len(list((tmp_path / "out" / "images").iterdir())) == 4 + 3 + 5  # each episode's screens
    assert np.allclose(first.mc_return, mc_returns([0.0, 0.0, 1.0], 0.9))
    assert not (tmp_path / "out" / "candidates.parquet").exists()


def test_digirl_file_needs_each_episodes_first_screen(tmp_path):
    data, imgs = released(tmp_path, digiq=False)
    (imgs / "ep1_0.png").unlink()
    with pytest.raises(DataError, match=r"trajectory 1 step 0 \(the episode's first screen\): image .*ep1_0.png"):
        import_legacy(save_released(tmp_path, data), tmp_path / "out", imgs, task_set="general", trust_pickle=True)
    data[1][0]["image_path"] = f"{IMAGE_PREFIX}/ep1_2.png"
    with pytest.raises(DataError, match=r"trajectory 1 step 0: a DigiRL image_path ends in _1"):
        import_legacy(save_released(tmp_path, data), tmp_path / "out", imgs, task_set="general", trust_pickle=True)


def test_refuses_to_unpickle_without_trust(tmp_path):
    data, imgs = released(tmp_path, digiq=True)
    with pytest.raises(DataError, match="--trust-pickle"):
        import_legacy(save_released(tmp_path, data), tmp_path / "out", imgs, task_set="general")


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda d: d[1][0].pop("reward"), r"trajectory 1 step 0: missing key 'reward'"),
        (lambda d: d[2][1].update(observation=7), r"trajectory 2 step 1: key 'observation' should be a string"),
        (lambda d: d[0][2].update(image_path=f"{IMAGE_PREFIX}/gone.png"), r"trajectory 0 step 2: image .*gone.png"),
        (lambda d: d[0][0].update(action_list="x" + SPLIT + "y"), r"trajectory 0 step 0: action_list\[0\] should be"),
        (lambda d: d[1].__setitem__(1, "not a dict"), r"trajectory 1 step 1 .* should be a dict"),
        (lambda d: d[2][0].pop("q_rep_out_list"), r"q_rep_out_list is on 8 of 9 steps"),
    ],
)
def test_broken_files_are_rejected_naming_key_and_step(tmp_path, breakage, message):
    data, imgs = released(tmp_path, digiq=True)
    breakage(data)
    with pytest.raises(DataError, match=message):
        import_legacy(save_released(tmp_path, data), tmp_path / "out", imgs, task_set="general", trust_pickle=True)
    assert not list((tmp_path / "out").glob("steps-*.parquet"))  # nothing half-written to trust


def test_command_line(tmp_path):
    data, imgs = released(tmp_path, digiq=True)
    src = save_released(tmp_path, data)
    cmd = [sys.executable, "-m", "digiq.data", "import-legacy", str(src), str(tmp_path / "out"), "--images", str(imgs),
           "--task-set", "general"]  # fmt: skip
    refused = subprocess.run(cmd, capture_output=True, text=True)
    assert refused.returncode == 2 and "--trust-pickle" in refused.stderr
    done = subprocess.run([*cmd, "--trust-pickle"], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)["steps"] == 9
    again = subprocess.run([*cmd, "--trust-pickle"], capture_output=True, text=True)
    assert again.returncode == 2 and "already holds a dataset" in again.stderr
