"""Progress bars for a person watching: shown in an interactive session, never in a headless run or a worker.

Every stage's loops report progress through :func:`progress`. A stage run by
``dvc repro`` (its commands set ``TQDM_DISABLE=1``) or by the tests draws no
bar, so the executed notebooks a reader opens hold the stage's tables and
figures, not thousands of bar redraws; neither does a process that is not
the main one of a data-parallel group, nor a worker process of
:mod:`digiq.workers`, whose bars would interleave on the notebook's stderr.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterable
from typing import Any, TypeVar

from tqdm.auto import tqdm

from digiq import parallel

__all__ = ["Progress", "progress", "shown"]

Progress = tqdm  # what progress() returns: update(n), set_postfix(...), close()

T = TypeVar("T")


def shown() -> bool:
    """Whether this process draws progress bars: not with ``TQDM_DISABLE`` set, in a worker or off the main rank."""
    headless = os.environ.get("TQDM_DISABLE", "").lower() not in ("", "0", "false")
    worker = multiprocessing.parent_process() is not None
    return not headless and not worker and parallel.is_main()


def progress(iterable: Iterable[T] | None = None, **kwargs: Any) -> tqdm:
    """A ``tqdm`` bar (``leave=False``) over ``iterable``, or one to ``update`` by hand with ``total=``; a silent
    one where :func:`shown` says no."""
    return tqdm(iterable, leave=False, disable=not shown(), **kwargs)
