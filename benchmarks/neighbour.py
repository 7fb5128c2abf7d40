"""A stage's own-process work alone and beside a busy neighbour: two threads as they wait today, two threads that
sleep while they wait, and one thread.

The stages that train or sample one model in their own process (00
base_policy's fit, 01 collect's sampling, 03 vlm_pretrain's and 04
vlm_finetune's steps, critic_inputs' text encoder) run on
``compute.threads`` (2) torch threads. On a 2-core machine shared with
anything else (a test run, another stage, a notebook), one of the two
threads is often off its core while the other waits for it at the end of
every parallel region: an OpenMP thread that waits spins by default, so it
holds its core doing nothing while the thread it waits for queues for one.

Each work of ``benchmarks/pinned_kernels.py`` named in ``--works`` (its
inputs and models, at the committed shapes) runs in pinned processes
started three ways:

- **2 threads, spinning**: OpenMP's default wait (``OMP_WAIT_POLICY``
  unset), as a stage's own process runs them;
- **2 threads, sleeping**: ``OMP_WAIT_POLICY=PASSIVE``, a waiting thread
  sleeps;
- **1 thread**: a worker's (``compute.threads: 1``).

Each is timed alone and beside a neighbour, a one-thread process that never
stops (a Python loop), taking turns call by call; the figure is a call's
wall seconds, the median of ``--repeats``. The ways run the same code on
the same kernels: how a thread waits changes no result.

Last line: ``neighbour_stall=<number>``: over the works, the largest ratio of spinning two threads' time beside
the neighbour to their time alone.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from pinned_kernels import WORKS, Started, prepare

from digiq.kernels import pinned_environ

OWN_PROCESS = [name for name, work in WORKS.items() if work.own_process]
WAYS = {"2 threads, spinning": (2, None), "2 threads, sleeping": (2, "PASSIVE"), "1 thread": (1, "PASSIVE")}


class Process(Started):
    """A served process of ``benchmarks/pinned_kernels.py``, pinned, with ``threads`` threads and a wait policy."""

    def __init__(self, folder: Path, name: str, threads: int, wait: str | None) -> None:
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        env.update(pinned_environ(threads), TQDM_DISABLE="1")
        if wait is None:
            env.pop("OMP_WAIT_POLICY", None)
        else:
            env["OMP_WAIT_POLICY"] = wait
        self.log = folder / f"{name.replace(' ', '_').replace(',', '')}.log"
        script = Path(__file__).with_name("pinned_kernels.py")
        cmd = [sys.executable, str(script), "--serve", str(threads), "--folder", str(folder)]
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         text=True)  # fmt: skip
        self.kernels = self._reply()["kernels"]


def busy_neighbour() -> subprocess.Popen:
    """A one-thread process that keeps its core busy until killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--works", default="fit_sft,vlm_finetune", help=f"works of {', '.join(OWN_PROCESS)}")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls of each work, each way, alone and beside")
    args = ap.parse_args()
    names = [n for n in args.works.split(",") if n]
    if unknown := sorted(set(names) - set(OWN_PROCESS)):
        ap.error(f"unknown works {unknown}; the stages' own-process works: {OWN_PROCESS}")
    wall: dict[tuple[str, str, bool], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for shape in prepare(folder).items():
            print("%s: %s" % shape)
        procs = {way: Process(folder, way, *setting) for way, setting in WAYS.items()}
        try:
            for beside in (False, True):
                neighbour = busy_neighbour() if beside else None
                time.sleep(0.5 if beside else 0.0)
                try:
                    for k in range(args.repeats):
                        for i, name in enumerate(names):
                            ways = list(procs)
                            order = ways if (k + i) % 2 == 0 else ways[::-1]
                            for way in order:
                                wall.setdefault((name, way, beside), []).append(procs[way].run(name)["wall"])
                finally:
                    if neighbour is not None:
                        neighbour.kill()
                        neighbour.wait()
        finally:
            for p in procs.values():
                p.close()
    print(f"wall seconds a call, median of {args.repeats}; alone / beside a one-thread busy process (ratio)")
    print(f"{'work':<14} {'way':<22} {'alone':>8} {'beside':>8} {'ratio':>7}")
    stall = 0.0
    for name in names:
        for way in WAYS:
            alone = float(np.median(wall[(name, way, False)]))
            beside = float(np.median(wall[(name, way, True)]))
            print(f"{name:<14} {way:<22} {alone:8.3f} {beside:8.3f} {beside / alone:7.2f}")
            if way == "2 threads, spinning":
                stall = max(stall, beside / alone)
    print(f"neighbour_stall={stall:.2f}")


if __name__ == "__main__":
    main()
