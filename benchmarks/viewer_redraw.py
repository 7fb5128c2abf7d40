"""Time a step change in the Q/V viewers on the pipeline's own dataset (run after `make repro`).

Loads the data once (that is when the critic scores every step and
candidate), then moves the step slider of each viewer across many states and
reports the mean and worst redraw time; the action viewer with and without
the simulator's oracle values (which rebuild the device and roll out every
candidate). Last line: ``trajectory_step_ms=<mean> action_step_ms=<mean> action_step_oracle_ms=<mean>``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from digiq.viz.values import load_values
from digiq.viz.viewers import ActionViewer, TrajectoryViewer


def _time(viewer, trajectories: list[int], oracle: bool | None = None) -> list[float]:
    out = []
    if oracle is not None:
        viewer.with_oracle.value = oracle
    for t in trajectories:
        viewer.traj.value = t
        for step in range(1, viewer.step.max + 1):
            t0 = time.perf_counter()
            viewer.step.value = step
            out.append(1000 * (time.perf_counter() - t0))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trajectories", type=int, default=20)
    args = ap.parse_args()
    t0 = time.perf_counter()
    data = load_values()
    print(
        f"load_values: {time.perf_counter() - t0:.1f} s for {len(data.steps)} steps, {len(data.candidates)} candidates"
    )
    ids = sorted(data.steps.traj_id.unique())[: args.trajectories]
    traj = _time(TrajectoryViewer(data), ids)
    actions = ActionViewer(data, oracle=False)
    plain = _time(actions, ids, oracle=False)
    oracle = _time(actions, ids[:5], oracle=True)
    for name, ms in (("trajectory viewer", traj), ("action viewer", plain), ("action viewer + oracle", oracle)):
        print(f"{name}: {len(ms)} step changes, mean {np.mean(ms):.0f} ms, max {np.max(ms):.0f} ms")
    print(f"trajectory_step_ms={np.mean(traj):.0f} action_step_ms={np.mean(plain):.0f} "
          f"action_step_oracle_ms={np.mean(oracle):.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
