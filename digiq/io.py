"""Files: atomic writing (an interrupted run never leaves a half-written file or folder behind), missing inputs
and failed writes named, text files read line by line, and file text made safe to print."""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_path", "atomic_folder", "swap_in", "interrupted_swap", "interrupted_swap_note", "clear_leftovers",
           "atomic_write_text", "fill_block", "write_error", "check_writable", "text_lines", "printable", "StageError",
           "require"]  # fmt: skip

PRINTED_CHARS = 200  # the most of one file's line a message shows; the rest is counted, not printed


def write_error(path: Path, e: OSError) -> OSError:
    """``e`` as an error naming ``path``, the file being written, and saying so when the disk is full.

    An error of a write often names no file, or the hidden temporary file the
    write went through; its errno is kept.
    """
    why = e.strerror or str(e)  # strerror: without the temporary file's name
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        why += " (the disk is full)"
    return OSError(e.errno, f"cannot write {path}: {why}")


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds.

    An error of the block's writes or of the rename is raised once, naming
    ``path`` (:func:`write_error`).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)  # atomic on POSIX and Windows within one file system
    except OSError as e:
        raise write_error(path, e) from None  # a failed close re-raises the write's error: shown once
    finally:
        tmp.unlink(missing_ok=True)


def check_writable(path: Path) -> None:
    """Raise an OSError naming ``path`` unless a file can be written there: before a long run, not after it.

    Makes the parent folder and writes, syncs and removes a temporary file
    in it, so a read-only folder or a full disk shows now.
    """
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, f"cannot write {path}: it is a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.check-") as f:
            f.write(b"\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise write_error(path, e) from None


def text_lines(path: Path) -> Iterator[tuple[int, str, str | None]]:
    """Each line of a text file with its number (from 1), decoded alone: ``(n, text, None)``.

    A line that is not UTF-8 comes as ``(n, text with the odd bytes as \\xNN,
    why)``, so one odd byte costs its line, not the file.
    """
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            raw = raw.rstrip(b"\r\n")
            try:
                yield n, raw.decode("utf-8"), None
            except UnicodeDecodeError as e:
                why = f"not UTF-8 (byte {raw[e.start]:#04x} at offset {e.start})"
                yield n, raw.decode("utf-8", "backslashreplace"), why


def printable(text: str, limit: int = PRINTED_CHARS) -> str:
    """``text`` fit for a terminal or log: control characters (escape sequences) written as escapes, at most
    ``limit`` characters of it shown."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return shown if len(text) <= limit else f"{shown}... ({len(text)} characters)"


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole; a failure names ``path`` (:func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def fill_block(path: Path, markers: tuple[str, str], body: str) -> None:
    """Replace the block between ``markers`` in ``path`` with ``body`` (a generated part of a hand-written page)."""
    start, end = markers
    text = path.read_text(encoding="utf-8")
    if start not in text or end not in text:
        raise ValueError(f"{path} has no {start} ... {end} block to fill")
    block = f"{start}\n{body}\n{end}"
    atomic_write_text(path, re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S))


@contextmanager
def atomic_folder(path: Path) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path``; swap it in for ``path`` only if the block succeeds.

    The folder it replaces is removed only once the new one is in place
    (:func:`swap_in`), so an interrupted run leaves either the old folder or
    the new one, whole.
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
    """Put the finished folder ``new`` in place of ``path``; the old one is removed only once the new one is in.

    On Linux the two trade places in one step (:func:`_exchange`), so a kill
    leaves ``path`` old or new, never absent. Where the file system cannot
    (another system, some network file systems), the old folder is moved
    aside to ``.<name>.old-<PID>`` first: a kill between the two renames
    leaves no ``path``, and the old folder whole there, which
    :func:`interrupted_swap` finds and :func:`clear_leftovers` puts back.
    """
    if not path.exists():
        os.replace(new, path)
        return
    if _exchange(new, path):
        shutil.rmtree(new, ignore_errors=True)  # now the old folder
        return
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    os.replace(path, old)
    os.replace(new, path)
    shutil.rmtree(old, ignore_errors=True)


_RENAME_EXCHANGE = 2  # renameat2's flag (linux/fs.h)
_AT_FDCWD = -100  # paths relative to the working directory (linux/fcntl.h)
# glibc >= 2.28 has it; None on other systems and C libraries.
_RENAMEAT2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None) if sys.platform == "linux" else None
if _RENAMEAT2 is not None:
    _RENAMEAT2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]


def _exchange(a: Path, b: Path) -> bool:
    """Swap the entries ``a`` and ``b`` atomically (Linux's ``renameat2`` with ``RENAME_EXCHANGE``).

    False where the system, its C library or the file system cannot; any
    other failure is raised, naming both.
    """
    if _RENAMEAT2 is None:
        return False
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, f"cannot put {a} in place of {b}: {os.strerror(err)}")


def interrupted_swap(path: Path) -> Path | None:
    """Where the previous ``path`` lies whole when a :func:`swap_in` was cut between its two renames, else None."""
    if path.exists():
        return None
    left = sorted(path.parent.glob(f".{path.name}.old-*"), key=lambda p: p.stat().st_mtime_ns)
    return left[-1] if left else None


def clear_leftovers(path: Path) -> None:
    """Put back the ``path`` a cut swap left aside, and remove the temporary folders and files dead runs left beside it.

    Only for a writer that knows no other run writes ``path`` now: a stage
    holding its lock (:mod:`digiq.lock`).
    """
    old = interrupted_swap(path)
    if old is not None:
        os.replace(old, path)
    for left in [*path.parent.glob(f".{path.name}.tmp-*"), *path.parent.glob(f".{path.name}.old-*")]:
        if left.is_dir() and not left.is_symlink():
            shutil.rmtree(left, ignore_errors=True)
        else:
            left.unlink(missing_ok=True)


def interrupted_swap_note(path: Path) -> str:
    """For the message naming a missing ``path``: where the previous one lies, when a cut swap of it or of a folder
    above it is why it is missing; else ''."""
    for p in (path, *path.parents):
        if p.parent.exists():
            old = interrupted_swap(p)
            return (f"; a run replacing {p} was cut short, and the previous {p.name} lies whole at {old} "
                    f"(rename it back, or rerun the stage)") if old else ""  # fmt: skip
    return ""


class StageError(RuntimeError):
    """A stage cannot run: names the stage and what is missing or wrong."""


def require(stage: str, *paths: Path) -> None:
    """Stop with a message naming the stage and the missing upstream output."""
    for p in paths:
        if not p.exists():
            raise StageError(
                f"stage {stage}: missing input {p}; run the upstream stage first (dvc repro){interrupted_swap_note(p)}"
            )
