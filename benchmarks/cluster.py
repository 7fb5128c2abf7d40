"""An evaluation on a local Ray cluster of 1, 2 and 3 one-core nodes, against the local backend, in one run.

Two ways an evaluation uses a cluster (docs/cluster.md), each measured in
episodes per second:

* **jobs**: stage 12's evaluation jobs (one per seed and task set, each with
  its own simulated phones and its own copy of the policy) as Ray tasks of
  one CPU, against the same jobs in this process one after the other;
* **devices**: one rollout with the policy here and ``--devices`` phones
  spread over the nodes' device hosts, against the same rollout on phones in
  this process. The difference per episode, on one node, is the backend's
  scheduling overhead (a call to each host per step, the screenshots sent
  back).

Each measurement starts its own cluster: a head that runs nothing and 1, 2
or 3 worker nodes of one CPU, sharing ``--devices`` phones evenly (a
multiple of 6). Each node's worker processes are started (imports) before
it is timed. Every episode is checked against the
local backend's: same outcome and length.

Run from a repository that ran ``make repro`` (its base policy), or give
``--policy``. The machine's cores bound the figures: on two cores a third
one-core node competes with the other two and with this process.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from digiq.cluster import DEVICES
from digiq.config import ComputeConfig, DeviceConfig, JudgeConfig, load_settings
from digiq.env.taskgen import generate_tasks
from digiq.env.tasks import TASK_SETS, parse_task
from digiq.evaluate import EvalJob, load_agent, run_jobs
from digiq.paths import Paths
from digiq.rollout import EpisodeResult, device_pool, rollout
from digiq.workers import IN_PROCESS, map_jobs


def _warm(_: int) -> str:
    """Start a worker with digiq's evaluation imported; the node it runs on."""
    import digiq.evaluate  # noqa: F401

    return ray.get_runtime_context().get_node_id()


def outcomes(results: list[dict[str, list[EpisodeResult]]]) -> list[tuple[bool, int]]:
    return [(r.success, r.steps) for result in results for ts in sorted(result) for r in result[ts]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", type=Path, default=Paths().base_policy, help="policy checkpoint folder")
    ap.add_argument("--tasks", type=int, default=24, help="validation tasks of each task set per job")
    ap.add_argument("--seeds", type=int, default=3, help="seeds: jobs are seeds x task sets")
    ap.add_argument("--devices", type=int, default=6, help="phones of the devices rollout, shared by the nodes")
    args = ap.parse_args()
    if args.devices < 6 or args.devices % 6:
        ap.error(f"--devices must be a positive multiple of 6 (1, 2 and 3 nodes share them evenly), got {args.devices}")
    # This script's _warm is a job the cluster's workers cannot import: it goes by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    logging.getLogger("ray").setLevel(logging.WARNING)

    cfg, env = (settings := load_settings()).eval, settings.env
    tasks = {ts: [parse_task(t, ts) for t in generate_tasks(ts, "val", args.tasks)] for ts in TASK_SETS}
    jobs = [EvalJob(args.policy, f"seed {s}", s, {ts: listed}, cfg, env, False)
            for s in range(args.seeds) for ts, listed in tasks.items()]  # fmt: skip
    episodes = sum(len(listed) for job in jobs for listed in job.tasks.values())
    listed = [t for ts in TASK_SETS for t in tasks[ts]]
    agent = load_agent(args.policy, cfg)

    def devices_rollout(compute: ComputeConfig | None) -> tuple[float, list[tuple[bool, int]]]:
        with device_pool(DeviceConfig(), env, JudgeConfig(), args.devices, compute) as make:
            t0 = time.perf_counter()
            ran = rollout(agent, listed, n_envs=args.devices, seed=cfg.seed, width=env.width, env_factory=make)
            return time.perf_counter() - t0, [(r.success, r.steps) for r in ran]

    t0 = time.perf_counter()
    here = outcomes(run_jobs(jobs, DeviceConfig(), JudgeConfig(), IN_PROCESS))
    jobs_local = time.perf_counter() - t0
    devices_local, rolled_here = devices_rollout(None)
    print(f"local backend: {len(jobs)} jobs, {episodes} episodes in {jobs_local:.1f} s "
          f"({episodes / jobs_local:.2f} episodes/s); one rollout of {len(listed)} episodes on {args.devices} phones "
          f"here in {devices_local:.1f} s ({len(listed) / devices_local:.2f} episodes/s)")  # fmt: skip

    rates: dict[int, tuple[float, float]] = {}
    for nodes in (1, 2, 3):
        share = args.devices // nodes  # the same phones in all, spread over the nodes
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
        try:
            for _ in range(nodes):
                cluster.add_node(num_cpus=1, resources={DEVICES: share})
            cluster.wait_for_nodes()
            compute = ComputeConfig(backend="ray", address=cluster.address)
            warmed = set(map_jobs(_warm, list(range(4 * nodes)), compute))
            t0 = time.perf_counter()
            there = outcomes(run_jobs(jobs, DeviceConfig(), JudgeConfig(), compute))
            jobs_s = time.perf_counter() - t0
            devices_s, rolled = devices_rollout(compute)
        finally:
            ray.shutdown()
            cluster.shutdown()
        same = (there == here) + (rolled == rolled_here)
        rates[nodes] = (episodes / jobs_s, len(listed) / devices_s)
        print(f"{nodes} node(s) of 1 CPU ({len(warmed)} warmed), {share} phones each: jobs {jobs_s:.1f} s "
              f"({rates[nodes][0]:.2f} episodes/s), devices rollout {devices_s:.1f} s "
              f"({rates[nodes][1]:.2f} episodes/s); {same}/2 runs equal to the local backend's")  # fmt: skip
        if nodes == 1:
            overhead = (devices_s - devices_local) / len(listed)
            print(f"scheduling overhead on one node: {1000 * overhead:.0f} ms per episode "
                  f"({devices_s / devices_local:.2f}x the local rollout's time)")  # fmt: skip
    for nodes in (2, 3):
        print(f"jobs_speedup_{nodes}_nodes={rates[nodes][0] / rates[1][0]:.2f} "
              f"devices_speedup_{nodes}_nodes={rates[nodes][1] / rates[1][1]:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
