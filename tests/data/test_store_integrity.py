"""A trajectory store's bytes and paths are checked on every read: a changed part is a named error, never other
data, and a path a store holds never reaches outside its folder."""

import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from released import released, save_released

import digiq.data.trajectories as trajectories
from digiq.data import DataError, Step, TrajectoryStore
from digiq.data.legacy import IMAGE_PREFIX, import_legacy
from digiq.data.trajectories import STEP_SCHEMA, read_table, write_parquet

TRIES = 200  # of each fault


def _steps(first: int, last: int) -> list[Step]:
    """Three steps of each trajectory ``first .. last - 1``, with text that is not all ASCII."""
    return [Step(traj_id=t, step_id=s, task=f"Search for café {t}", task_set="general", family="search",
                 observation=f"Previous Actions: {s} Goal: café {t}", next_observation=f"Previous Actions: {s + 1}",
                 image_path=f"images/{t:06d}_{s:02d}.png", next_image_path=f"images/{t:06d}_{s + 1:02d}.png",
                 action=f'Action Decision: "action_type": "type", "typed_text": "ü{t}"', valid=s % 2 == 0,
                 reward=float(s == 2), done=s == 2, mc_return=0.9 ** (2 - s), trajectory_reward=1.0)
            for t in range(first, last) for s in range(3)]  # fmt: skip


def _store(root) -> TrajectoryStore:
    store = TrajectoryStore(root)
    store.write_part(_steps(0, 6))
    store.write_part(_steps(6, 10))
    return store


@pytest.mark.parametrize("manifest", [True, False], ids=["manifest", "page-checksums-only"])
def test_no_changed_byte_of_a_part_reads_as_data(tmp_path, manifest):
    """Single-byte flips and 16-byte garbage inserts anywhere in a part: each read is a DataError or the original."""
    store = _store(tmp_path)
    if not manifest:  # as a store written before manifests: its page checksums alone
        store.manifest.unlink()
    table, ids = store.read(), store.stored_ids()
    original = {p: p.read_bytes() for p in store.parts()}
    rng = random.Random(0)
    silent, refused = [], 0
    for fault in ("flip", "insert"):
        for _ in range(TRIES):
            part = rng.choice(sorted(original))
            data = bytearray(original[part])
            at = rng.randrange(len(data))
            if fault == "flip":
                data[at] ^= rng.randrange(1, 256)
            else:
                data[at:at] = rng.randbytes(16)
            part.write_bytes(bytes(data))
            for read, same in ((store.read, table.equals), (store.stored_ids, ids.__eq__)):
                try:
                    got = read()
                except DataError as e:
                    assert part.name in str(e)
                    refused += 1
                    continue
                if not same(got):
                    silent.append(f"{fault} at byte {at} of {part.name}: {read.__name__}() read other data")
            part.write_bytes(original[part])
    assert silent == []
    assert refused > TRIES  # most faults are found (a flip in unused footer bytes may leave the data as it was)


def test_a_changed_part_is_named_with_what_failed(tmp_path):
    store = _store(tmp_path)
    part = store.parts()[1]
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 1
    part.write_bytes(bytes(data))
    for read in (store.read, store.stored_ids):
        with pytest.raises(DataError, match=rf"corrupt trajectory part {part}: its SHA-256 digest \w+ differs from the "
                                            rf"\w+ that {store.manifest} recorded"):  # fmt: skip
            read()


def test_a_part_the_manifest_does_not_list_or_a_listed_part_that_is_gone_is_named(tmp_path):
    store = _store(tmp_path)
    stray = tmp_path / "steps-00002.parquet"
    stray.write_bytes(store.parts()[0].read_bytes())  # a part copied in by hand
    with pytest.raises(DataError, match=rf"trajectory part {stray} is not in {store.manifest}"):
        store.read()
    stray.unlink()
    store.parts()[0].unlink()
    with pytest.raises(DataError, match=r"trajectory part\(s\) \['steps-00000.parquet'\] .* are gone"):
        store.stored_ids()


@pytest.mark.parametrize("text", ["{not json", '{"parts": {"../steps-00000.parquet": {"sha256": "", "rows": 1}}, '
                                                '"pending": {}}'])  # fmt: skip
def test_a_broken_manifest_is_named(tmp_path, text):
    store = _store(tmp_path)
    store.manifest.write_text(text)
    with pytest.raises(DataError, match=rf"manifest {store.manifest}"):
        store.read()


def test_text_that_is_not_utf8_is_named_by_file_and_column(tmp_path):
    """Written with checksums over the bad bytes (so only the values' check can find them), by the store and alone."""
    rows = pa.Table.from_pylist([vars(s) for s in _steps(0, 1)], schema=STEP_SCHEMA)
    bad = pa.Array.from_buffers(pa.string(), 3, [None, pa.py_buffer(np.array([0, 2, 4, 6], np.int32)),
                                                 pa.py_buffer(b"ok\xff\xfeok")])  # fmt: skip
    rows = rows.set_column(STEP_SCHEMA.get_field_index("task"), "task", bad)
    store = TrajectoryStore(tmp_path / "store")
    store.write_table(rows)
    with pytest.raises(DataError, match=rf"corrupt trajectory part {store.parts()[0]}: column 'task' does not decode"):
        store.read()
    write_parquet(rows, tmp_path / "steps.parquet")
    with pytest.raises(DataError, match=r"corrupt steps file .*steps.parquet: column 'task' does not decode"):
        read_table(tmp_path / "steps.parquet", ["task"], "steps", "collect")


def test_a_run_killed_before_the_rename_leaves_the_store_as_it_was(tmp_path, monkeypatch):
    store = _store(tmp_path)

    def killed(path):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(trajectories, "atomic_path", killed)
        with pytest.raises(KeyboardInterrupt):
            store.write_part(_steps(10, 12))
    assert list(json.loads(store.manifest.read_text())["pending"]) == ["steps-00002.parquet"]
    assert store.stored_ids() == set(range(10))  # the part never put in place is no part
    store.write_part(_steps(10, 12))  # the run again
    assert store.stored_ids() == set(range(12))
    assert json.loads(store.manifest.read_text())["pending"] == {}


def test_a_run_killed_between_the_rename_and_the_manifest_keeps_the_part(tmp_path, monkeypatch):
    store = _store(tmp_path)
    calls = []
    record = TrajectoryStore._write_manifest

    def killed_second_time(self, parts, pending):
        calls.append(pending)
        if len(calls) == 2:
            raise KeyboardInterrupt
        record(self, parts, pending)

    with monkeypatch.context() as m:
        m.setattr(TrajectoryStore, "_write_manifest", killed_second_time)
        with pytest.raises(KeyboardInterrupt):
            store.write_part(_steps(10, 12))
    assert len(store.parts()) == 3 and "steps-00002.parquet" not in json.loads(store.manifest.read_text())["parts"]
    assert store.stored_ids() == set(range(12))  # in place and as its recorded digest says: read
    store.write_part(_steps(12, 13))
    assert sorted(json.loads(store.manifest.read_text())["parts"]) == [f"steps-0000{k}.parquet" for k in range(4)]
    assert store.read().num_rows == 13 * 3


def test_a_store_without_a_manifest_is_read_as_it_is_and_gets_one_on_its_next_write(tmp_path):
    store = TrajectoryStore(tmp_path)
    for k, (first, last) in enumerate(((0, 6), (6, 10))):  # as stores were written before checksums and manifests
        pq.write_table(pa.Table.from_pylist([vars(s) for s in _steps(first, last)], schema=STEP_SCHEMA),
                       tmp_path / f"steps-{k:05d}.parquet")  # fmt: skip
    assert store.read().num_rows == 30 and store.stored_ids() == set(range(10))
    assert not store.manifest.exists()  # reading writes nothing
    store.write_part(_steps(10, 11))
    parts = json.loads(store.manifest.read_text())["parts"]
    assert {name: entry["rows"] for name, entry in parts.items()} == {
        "steps-00000.parquet": 18, "steps-00001.parquet": 12, "steps-00002.parquet": 3
    }  # fmt: skip
    assert store.stored_ids() == set(range(11))


def test_a_corrupt_part_of_a_store_without_a_manifest_is_not_recorded_as_good(tmp_path):
    store = _store(tmp_path)
    store.manifest.unlink()
    part = store.parts()[0]
    part.write_bytes(part.read_bytes()[:-100])
    with pytest.raises(DataError, match=rf"corrupt trajectory part {part}"):
        store.write_part(_steps(10, 11))
    assert not store.manifest.exists()


def test_a_path_that_leads_outside_the_store_is_refused_by_name(tmp_path):
    store = TrajectoryStore(tmp_path / "store")
    pixels = np.zeros((4, 2, 3), np.uint8)
    store.save_image("images/a.png", pixels)
    TrajectoryStore(tmp_path).save_image("outside.png", pixels)
    (store.images / "link.png").symlink_to(tmp_path / "outside.png")
    assert store.load_image("images/../images/a.png").shape == (4, 2, 3)  # ".." that stays inside is a path inside
    for rel in ("../outside.png", str(tmp_path / "outside.png"), "/abs/x.png", "images/link.png"):
        with pytest.raises(DataError, match=rf"path '{rel}' in the store {store.root} leads outside its folder"):
            store.load_image(rel)
    with pytest.raises(DataError, match="leads outside"):
        store.load_images(["images/a.png", "../outside.png"])
    with pytest.raises(DataError, match=r"path 'images/\\x00.png' in the store .* does not resolve"):
        store.load_image("images/\x00.png")
    for read in (store.has_hierarchy, store.load_hierarchy):
        with pytest.raises(DataError, match=r"path '\.\./outside.hierarchy.json' in the store .* leads outside"):
            read("../outside.png")
    with pytest.raises(DataError, match="leads outside"):
        store.save_image("../written.png", pixels)
    assert not (tmp_path / "written.png").exists()


def test_a_released_file_s_image_path_that_leads_outside_the_images_folder_is_refused(tmp_path):
    data, imgs = released(tmp_path, digiq=True)
    (tmp_path / "secret.png").write_bytes((imgs / "ep0_0.png").read_bytes())
    data[0][1]["image_path"] = f"{IMAGE_PREFIX}/../secret.png"
    with pytest.raises(DataError, match=r"trajectory 0 step 1: image '<path_to_images>/\.\./secret.png' leads outside"):
        import_legacy(save_released(tmp_path, data), tmp_path / "out", imgs, task_set="general", trust_pickle=True)
