"""Stage 08's evaluations in one process against the same jobs shared by worker processes, measured in one run.

A policy checkpoint (default: the pipeline's base policy) is evaluated on
the first ``--tasks`` test tasks of each task set for ``--jobs`` seeds,
first all in this process with torch's default threads, then through
:func:`digiq.workers.map_jobs` with ``--workers`` processes of
``cpu_count // workers`` threads each. Worker start-up (spawn, imports,
building the simulated devices) is inside the second figure.

Last line: ``workers_speedup=<number>`` (time in one process divided by time with workers).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from digiq.config import ComputeConfig, DeviceConfig, JudgeConfig, load_settings
from digiq.data.task_lists import read_tasks
from digiq.env.tasks import TASK_SETS
from digiq.evaluate import EvalJob, evaluate_job
from digiq.paths import Paths
from digiq.rollout import device_pool
from digiq.workers import map_jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", type=Path, default=Paths().base_policy, help="policy checkpoint folder")
    ap.add_argument("--tasks", type=int, default=48, help="first test tasks of each task set")
    ap.add_argument("--jobs", type=int, default=4, help="seeds, one job each")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    cfg, env = (settings := load_settings()).eval, settings.env
    tasks = {ts: read_tasks(Paths(), ts, "test", args.tasks, "benchmark") for ts in TASK_SETS}
    jobs = [EvalJob(args.policy, f"seed {s}", s, tasks, cfg, env, False) for s in range(args.jobs)]

    t0 = time.perf_counter()
    with device_pool(DeviceConfig(), env, JudgeConfig(), min(cfg.n_envs, args.tasks)) as pool:
        here = [evaluate_job(job, pool) for job in jobs]
    one = time.perf_counter() - t0
    t0 = time.perf_counter()
    there = map_jobs(evaluate_job, jobs, ComputeConfig(workers=args.workers))
    shared = time.perf_counter() - t0

    episodes = args.jobs * sum(map(len, tasks.values()))
    same = sum(a.success == b.success for x, y in zip(here, there) for ts in x for a, b in zip(x[ts], y[ts]))
    print(f"{episodes} episodes: one process {one:.1f} s, {args.workers} workers {shared:.1f} s; "
          f"{same}/{episodes} episodes with the same outcome")  # fmt: skip
    print(f"workers_speedup={one / shared:.2f}")


if __name__ == "__main__":
    main()
