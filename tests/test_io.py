import pytest

from digiq.io import atomic_path, atomic_write_text


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
