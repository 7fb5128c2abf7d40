"""Independent jobs spread over CPU processes, or a Ray cluster: part of one VLM's features, one critic or actor fit,
one evaluation.

Stages 05-10 repeat the same work for each VLM or each (row, seed) pair,
and the jobs share nothing but their inputs on disk (and, for a job given
one to wait for, what that one wrote). The models are small, so two torch
threads in one process leave much of a second core idle, while two
one-thread processes keep both busy (``benchmarks/workers.py`` measures the
ratio). With ``compute.workers`` N > 1 a stage hands its jobs to N spawned
processes of ``cpu_count // N`` threads each; with 1 they run here, in order.
With ``compute.backend: ray`` they are tasks of a Ray cluster instead
(:func:`map_on_cluster`; joining it and its nodes' devices:
:mod:`digiq.cluster`), each asking for ``compute.job_cpus`` CPUs (its torch
threads) and ``compute.job_gpus`` GPUs, and started again when its node is
lost.

A job must be a picklable value and its function a module-level one; it
seeds itself, so its result does not depend on the process it lands in
(float sums may differ in their last bits with the thread count, as they do
between machines). Results come back in job order, one per job, whatever
was started again. A job that fails raises its error here, after the jobs
already running have finished (on a Ray cluster, they are cancelled).
"""

from __future__ import annotations

import multiprocessing
import os
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, TypeVar

import torch

from digiq.cluster import ClusterError, connect, live_nodes, own_error
from digiq.config import ComputeConfig
from digiq.kernels import pinned_children

__all__ = [
    "IN_PROCESS", "map_jobs", "job_slots", "process_cached", "forget_earlier_calls", "threads_per_worker",
    "cluster_slots", "map_on_cluster",
]  # fmt: skip

J = TypeVar("J")
R = TypeVar("R")

# What the jobs of one process share (inputs read from disk, simulated devices), by key.
_CACHE: dict[tuple[Any, ...], Any] = {}
# The key each slot holds now (process_cached's ``slot``).
_SLOTS: dict[str, tuple[Any, ...]] = {}
# The map_jobs call whose jobs this process ran last (forget_earlier_calls).
_CALL = ""
# Every job here, in order: what a stage runs with where jobs must share this process (its GPU, its devices).
IN_PROCESS = ComputeConfig(workers=1)


def threads_per_worker(workers: int) -> int:
    """Torch threads for each of ``workers`` processes: the machine's cores shared out, at least one."""
    return max(1, (os.cpu_count() or 1) // workers)


def process_cached(key: tuple[Any, ...], build: Callable[[], R], slot: str | None = None) -> R:
    """``build()`` once per process and ``key``: what every job landing in this process reads alike.

    A worker keeps it until it exits, a Ray worker until it takes a job of another :func:`map_jobs` call
    (:func:`forget_earlier_calls`); jobs run here keep it until :func:`map_jobs` returns, so a notebook's
    next run reads the files again. Values given a ``slot`` are kept one at a time: a new
    key drops the slot's previous value before it is built (a model that may not fit twice, on a GPU).
    """
    if slot is not None and _SLOTS.get(slot, key) != key:
        del _CACHE[_SLOTS.pop(slot)]
    if key not in _CACHE:
        _CACHE[key] = build()
        if slot is not None:
            _SLOTS[slot] = key
    return _CACHE[key]


def forget_earlier_calls(call: str) -> None:
    """Drop what this process cached for jobs of another :func:`map_jobs` call than ``call`` (a Ray worker outlives
    the call: the stage's next run, or the next stage, must read the files again)."""
    global _CALL
    if call != _CALL:
        _CACHE.clear()
        _SLOTS.clear()
        _CALL = call


def job_slots(compute: ComputeConfig) -> int:
    """How many jobs run at once: the local workers, or as many as the Ray cluster's CPUs (GPUs) hold."""
    if compute.backend == "ray":
        return cluster_slots(compute)
    return compute.workers


def _start_worker(threads: int) -> None:
    torch.set_num_threads(threads)


def map_jobs(fn: Callable[[J], R], jobs: Sequence[J], compute: ComputeConfig,
             after: Sequence[int | None] | None = None,
             on_done: Callable[[int, R], None] | None = None) -> list[R]:  # fmt: skip
    """``[fn(job) for job in jobs]``: on ``compute``'s Ray cluster, or over its ``workers`` processes when there is
    more than one job and worker.

    Jobs start in list order as workers come free. ``after[i]``, where
    given, is an earlier job that must have finished before job ``i`` starts
    (the second part of a run that the first leaves resumable); meanwhile
    the next job that is free to start takes its turn. ``on_done(i,
    result)``, where given, is called in this process as each job finishes,
    in the order they finish: a caller writes what is done before a later
    job can fail.

    With ``compute.pinned_kernels`` each worker starts pinned (:mod:`digiq.kernels`) with one torch thread.
    Processes are spawned, not forked: a fork copies torch's thread pools in
    whatever state they are, and a notebook kernel's too.
    """
    before = [None] * len(jobs) if after is None else list(after)
    if len(before) != len(jobs) or any(a is not None and not 0 <= a < i for i, a in enumerate(before)):
        raise ValueError(f"after must give each of the {len(jobs)} jobs an earlier job's index or None, got {after}")
    done = on_done or (lambda i, result: None)
    if compute.backend == "ray" and jobs:
        return map_on_cluster(fn, jobs, compute, before, done)
    workers = compute.workers
    if workers == 1 or len(jobs) <= 1:
        try:
            results_in_order = []
            for i, job in enumerate(jobs):  # in list order, so each job's ``after`` has finished
                results_in_order.append(fn(job))
                done(i, results_in_order[-1])
            return results_in_order
        finally:
            _CACHE.clear()
            _SLOTS.clear()
    n = min(workers, len(jobs))
    context = multiprocessing.get_context("spawn")
    results: dict[int, R] = {}
    waiting = list(range(len(jobs)))
    running: dict[Future[R], int] = {}
    threads = 1 if compute.pinned_kernels else threads_per_worker(n)  # pinned: the same on every machine
    with pinned_children(compute, threads), ProcessPoolExecutor(n, mp_context=context, initializer=_start_worker,
                                                                initargs=(threads,)) as pool:  # fmt: skip
        while waiting or running:
            ready = [i for i in waiting if before[i] is None or before[i] in results]
            for i in ready[: n - len(running)]:
                waiting.remove(i)
                running[pool.submit(fn, jobs[i])] = i
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                i = running.pop(future)
                results[i] = future.result()  # a failure leaves the pool once the others end
                done(i, results[i])
    return [results[i] for i in range(len(jobs))]


def cluster_slots(compute: ComputeConfig) -> int:
    """How many jobs of ``compute.job_cpus`` CPUs and ``compute.job_gpus`` GPUs the cluster's nodes run at once."""
    connect(compute)
    slots = 0
    for node in live_nodes():
        have = node["Resources"]
        fits = int(have.get("CPU", 0) // compute.job_cpus)
        if compute.job_gpus:
            fits = min(fits, int(have.get("GPU", 0) // compute.job_gpus))
        slots += fits
    if slots < 1:
        offered = [
            (n["NodeManagerAddress"], n["Resources"].get("CPU", 0), n["Resources"].get("GPU", 0)) for n in live_nodes()
        ]
        raise ClusterError(
            f"compute.backend ray: no node of the cluster at {compute.address!r} can run a job of "
            f"{compute.job_cpus} CPU(s) and {compute.job_gpus:g} GPU(s) (compute.job_cpus, compute.job_gpus); "
            f"nodes (address, CPUs, GPUs): {offered}"
        )
    return slots


def _run_job(fn: Callable[[J], R], job: J, threads: int, call: str) -> R:
    """One job of map_jobs call ``call`` in a Ray worker: torch on the CPUs the task asked for, what the worker
    cached for earlier calls dropped, and no progress bars (no one watches them)."""
    import torch

    os.environ["TQDM_DISABLE"] = "1"
    torch.set_num_threads(threads)
    forget_earlier_calls(call)
    return fn(job)


def map_on_cluster(fn: Callable[[J], R], jobs: Sequence[J], compute: ComputeConfig, before: Sequence[int | None],
                   on_done: Callable[[int, R], None] = lambda i, result: None) -> list[R]:  # fmt: skip
    """:func:`map_jobs` on a Ray cluster: ``fn(job)`` for each job as a Ray task, results in job order, ``on_done``
    called as each finishes.

    A job waits for ``before[i]`` (an earlier job) to finish. Ray starts a
    task lost with its node (or its worker process) again, up to
    ``compute.retries`` times; its result is kept once. A job's own error is
    raised here at once (the jobs still running are cancelled). A job on
    GPUs gets a fresh worker process: Ray's rule for GPU tasks, so that
    nothing of one job holds a GPU the next is given.

    Raises:
        ClusterError: no node can run a job, or the cluster failed a job more often than ``compute.retries`` allows.
    """
    import ray
    from ray.exceptions import RayTaskError

    cluster_slots(compute)  # a job no node can hold would wait for ever: say so now
    task = ray.remote(num_cpus=compute.job_cpus, num_gpus=compute.job_gpus, max_calls=1 if compute.job_gpus else 0,
                      max_retries=compute.retries, retry_exceptions=False)(_run_job)  # fmt: skip
    call = uuid.uuid4().hex
    results: dict[int, R] = {}
    waiting = list(range(len(jobs)))
    running: dict[Any, int] = {}
    try:
        while waiting or running:
            for i in [i for i in waiting if before[i] is None or before[i] in results]:
                waiting.remove(i)
                running[task.remote(fn, jobs[i], compute.job_cpus, call)] = i
            finished, _ = ray.wait(list(running), num_returns=1)
            for ref in finished:
                i = running.pop(ref)
                try:
                    results[i] = ray.get(ref)
                    on_done(i, results[i])
                except RayTaskError as e:
                    raise own_error(e) from e
                except ray.exceptions.RayError as e:
                    raise ClusterError(
                        f"job {i + 1} of {len(jobs)} ({fn.__name__}) failed in the cluster, not in its own code, "
                        f"after {compute.retries} retries (compute.retries): {type(e).__name__}: {e}"
                    ) from None
    finally:
        for ref in running:
            ray.cancel(ref)
    return [results[i] for i in range(len(jobs))]
