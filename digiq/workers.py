"""Independent jobs spread over CPU processes: one VLM's features, one critic or actor fit, one evaluation.

Stages 05-09 repeat the same work for each VLM or each (row, seed) pair,
and the jobs share nothing but their inputs on disk. The models are small, so two torch
threads in one process leave much of a second core idle, while two
one-thread processes keep both busy (``benchmarks/workers.py`` measures the
ratio). With ``compute.workers`` N > 1 a stage hands its jobs to N spawned
processes of ``cpu_count // N`` threads each; with 1 they run here, in order.

A job must be a picklable value and its function a module-level one; it
seeds itself, so its result does not depend on the process it lands in
(float sums may differ in their last bits with the thread count, as they do
between machines). Results come back in job order. A job that fails raises
its error here, after the jobs already running have finished.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

import torch

__all__ = ["map_jobs", "process_cached", "threads_per_worker"]

J = TypeVar("J")
R = TypeVar("R")

# What the jobs of one process share (inputs read from disk, simulated devices), by key.
_CACHE: dict[tuple[Any, ...], Any] = {}


def threads_per_worker(workers: int) -> int:
    """Torch threads for each of ``workers`` processes: the machine's cores shared out, at least one."""
    return max(1, (os.cpu_count() or 1) // workers)


def process_cached(key: tuple[Any, ...], build: Callable[[], R]) -> R:
    """``build()`` once per process and ``key``: what every job landing in this process reads alike.

    A worker keeps it until it exits; jobs run here keep it until :func:`map_jobs` returns, so a
    notebook's next run reads the files again.
    """
    if key not in _CACHE:
        _CACHE[key] = build()
    return _CACHE[key]


def _start_worker(threads: int) -> None:
    torch.set_num_threads(threads)


def map_jobs(fn: Callable[[J], R], jobs: Sequence[J], workers: int) -> list[R]:
    """``[fn(job) for job in jobs]``, over ``workers`` processes when there is more than one job and worker.

    Processes are spawned, not forked: a fork copies torch's thread pools in
    whatever state they are, and a notebook kernel's too.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if workers == 1 or len(jobs) <= 1:
        try:
            return [fn(job) for job in jobs]
        finally:
            _CACHE.clear()
    n = min(workers, len(jobs))
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(n, mp_context=context, initializer=_start_worker,
                             initargs=(threads_per_worker(n),)) as pool:  # fmt: skip
        return list(pool.map(fn, jobs))
