"""Independent jobs spread over CPU processes: part of one VLM's features, one critic or actor fit, one evaluation.

Stages 05-09 repeat the same work for each VLM or each (row, seed) pair,
and the jobs share nothing but their inputs on disk (and, for a job given
one to wait for, what that one wrote). The models are small, so two torch
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
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, TypeVar

import torch

__all__ = ["map_jobs", "process_cached", "threads_per_worker"]

J = TypeVar("J")
R = TypeVar("R")

# What the jobs of one process share (inputs read from disk, simulated devices), by key.
_CACHE: dict[tuple[Any, ...], Any] = {}
# The key each slot holds now (process_cached's ``slot``).
_SLOTS: dict[str, tuple[Any, ...]] = {}


def threads_per_worker(workers: int) -> int:
    """Torch threads for each of ``workers`` processes: the machine's cores shared out, at least one."""
    return max(1, (os.cpu_count() or 1) // workers)


def process_cached(key: tuple[Any, ...], build: Callable[[], R], slot: str | None = None) -> R:
    """``build()`` once per process and ``key``: what every job landing in this process reads alike.

    A worker keeps it until it exits; jobs run here keep it until :func:`map_jobs` returns, so a
    notebook's next run reads the files again. Values given a ``slot`` are kept one at a time: a new
    key drops the slot's previous value before it is built (a model that may not fit twice, on a GPU).
    """
    if slot is not None and _SLOTS.get(slot, key) != key:
        del _CACHE[_SLOTS.pop(slot)]
    if key not in _CACHE:
        _CACHE[key] = build()
        if slot is not None:
            _SLOTS[slot] = key
    return _CACHE[key]


def _start_worker(threads: int) -> None:
    torch.set_num_threads(threads)


def map_jobs(fn: Callable[[J], R], jobs: Sequence[J], workers: int, after: Sequence[int | None] | None = None
             ) -> list[R]:  # fmt: skip
    """``[fn(job) for job in jobs]``, over ``workers`` processes when there is more than one job and worker.

    Jobs start in list order as workers come free. ``after[i]``, where
    given, is an earlier job that must have finished before job ``i`` starts
    (the second part of a run that the first leaves resumable); meanwhile
    the next job that is free to start takes its turn.

    Processes are spawned, not forked: a fork copies torch's thread pools in
    whatever state they are, and a notebook kernel's too.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    before = [None] * len(jobs) if after is None else list(after)
    if len(before) != len(jobs) or any(a is not None and not 0 <= a < i for i, a in enumerate(before)):
        raise ValueError(f"after must give each of the {len(jobs)} jobs an earlier job's index or None, got {after}")
    if workers == 1 or len(jobs) <= 1:
        try:
            return [fn(job) for job in jobs]  # in list order, so each job's ``after`` has finished
        finally:
            _CACHE.clear()
            _SLOTS.clear()
    n = min(workers, len(jobs))
    context = multiprocessing.get_context("spawn")
    results: dict[int, R] = {}
    waiting = list(range(len(jobs)))
    running: dict[Future[R], int] = {}
    with ProcessPoolExecutor(n, mp_context=context, initializer=_start_worker,
                             initargs=(threads_per_worker(n),)) as pool:  # fmt: skip
        while waiting or running:
            ready = [i for i in waiting if before[i] is None or before[i] in results]
            for i in ready[: n - len(running)]:
                waiting.remove(i)
                running[pool.submit(fn, jobs[i])] = i
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                results[running.pop(future)] = future.result()  # a failure leaves the pool once the others end
    return [results[i] for i in range(len(jobs))]
