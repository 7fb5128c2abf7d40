"""Files: atomic writing (an interrupted run never leaves a half-written file behind) and missing inputs named."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_path", "atomic_folder", "atomic_write_text", "StageError", "require"]


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)  # atomic on POSIX and Windows within one file system
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


@contextmanager
def atomic_folder(path: Path) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path``; swap it in for ``path`` only if the block succeeds.

    The folder it replaces is removed only once the new one is in place, so
    an interrupted run leaves either the old folder or the new one, whole.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        swap_in(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def swap_in(new: Path, path: Path) -> None:
    """Put the finished folder ``new`` in place of ``path``; the old one is removed only once the new one is in."""
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    if path.exists():
        os.replace(path, old)
    os.replace(new, path)
    shutil.rmtree(old, ignore_errors=True)


class StageError(RuntimeError):
    """A stage cannot run: names the stage and what is missing or wrong."""


def require(stage: str, *paths: Path) -> None:
    """Stop with a message naming the stage and the missing upstream output."""
    for p in paths:
        if not p.exists():
            raise StageError(f"stage {stage}: missing input {p}; run the upstream stage first (dvc repro)")
