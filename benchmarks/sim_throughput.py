"""Steps per second of one simulated device on one core, rendering every step.

Expert episodes on generated train tasks (with the expert's noise, so the
screens are as varied as in collection) are recorded first at another
screenshot size; then the actions are replayed on a fresh device at the
model size and only the replay is timed: device step + screenshot, starting
with empty frame and text caches, as a new collection run would.

Last line: ``sim_steps_per_s=<number>``.
"""

from __future__ import annotations

import argparse
import os
import time

from digiq.env import AndroidSimEnv, Expert, generate_tasks, parse_task


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=1000, help="a collection-sized run")
    ap.add_argument("--width", type=int, default=216, help="model-size screenshot width")
    ap.add_argument("--noise", type=float, default=0.2)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core

    half = args.episodes // 2
    tasks = [parse_task(t, "general") for t in generate_tasks("general", "train", half, seed=7)]
    tasks += [parse_task(t, "webshop") for t in generate_tasks("webshop", "train", args.episodes - half, seed=7)]

    recorder = AndroidSimEnv(width=args.width // 2 + 7)  # a different size: shares no cached frame or glyph
    episodes = []
    for i, task in enumerate(tasks):
        recorder.reset(seed=i, options={"task": task})
        expert, actions, done = Expert(noise=args.noise, seed=i), [], False
        while not done:
            a = expert.act(recorder.device, task)
            actions.append(a)
            _, _, term, trunc, _ = recorder.step(a)
            done = term or trunc
        episodes.append((i, task, actions))

    env = AndroidSimEnv(width=args.width)
    steps = 0
    t0 = time.perf_counter()
    for i, task, actions in episodes:
        env.reset(seed=i, options={"task": task})
        for a in actions:
            obs, *_ = env.step(a)
            steps += 1
    dt = time.perf_counter() - t0
    h, w, _ = obs["screenshot"].shape
    print(f"episodes={len(episodes)} steps={steps} screenshot={w}x{h} seconds={dt:.3f}")
    print(f"sim_steps_per_s={steps / dt:.0f}")


if __name__ == "__main__":
    main()
