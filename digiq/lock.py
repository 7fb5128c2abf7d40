"""One live run per stage: an OS lock on the stage's lock file, which the kernel drops when its holder ends.

Killing DVC does not end the stage it started: the notebook goes on, and a
second ``dvc repro`` would run the stage again beside it, both writing the
same outputs. A run therefore holds ``fcntl.flock`` on its stage's lock file
(:meth:`digiq.paths.Paths.lock`) while it writes; a second run that finds the
lock held stops at once and names the first run's PID, which the holder
writes into the file. The kernel releases the lock when its holder's process
ends, however it ends (SIGKILL and crashes too), so no stale lock is ever left
for someone to delete by hand.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from digiq.io import StageError

__all__ = ["stage_lock"]


@contextmanager
def stage_lock(path: Path, stage: str) -> Iterator[None]:
    """Hold ``stage``'s run lock, the file ``path``, for the block.

    Raises:
        StageError: another live process holds it; the message names that process's PID.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # close-on-exec: programs this run starts do not hold it
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "not yet written"
            raise StageError(f"stage {stage}: another run of this stage is still going (PID {holder}, holding "
                             f"{path}) and writes the same outputs; wait for it to end or stop it, then run "
                             "again") from None  # fmt: skip
        os.ftruncate(fd, 0)  # the PID of a run that held it before, now ended
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock (the kernel does the same if the process dies first)
