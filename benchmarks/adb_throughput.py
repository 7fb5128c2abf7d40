"""Steps per second through the adb path next to the in-process simulator, measured in one run.

Expert episodes on generated train tasks are recorded first; then the same
actions are replayed, on the same seeds, on an in-process
:class:`~digiq.env.AndroidSimEnv` and on an :class:`~digiq.env.adb_env.AdbEnv`
driving one phone of an in-process adb-protocol simulator through adbutils
over loopback TCP (per step: the input, ``screencap -p`` as PNG, and the
ground-truth check). Both on one core, screenshots at the model size, frame
caches warm for both (the recording fills them).

Last line: ``adb_over_sim_ratio=<number>`` (adb steps/s divided by in-process steps/s).
"""

from __future__ import annotations

import argparse
import os
import time

from digiq.env import AndroidSimEnv, Expert, generate_tasks, parse_task
from digiq.env.backends import DeviceConfig, make_env


def steps_per_s(env, episodes) -> tuple[int, float]:
    steps, t0 = 0, time.perf_counter()
    for seed, task, actions in episodes:
        env.reset(seed=seed, options={"task": task})
        for a in actions:
            env.step(a)
            steps += 1
    return steps, steps / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--width", type=int, default=216, help="model-size screenshot width")
    ap.add_argument("--noise", type=float, default=0.2)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, server threads included

    half = args.episodes // 2
    tasks = [parse_task(t, "general") for t in generate_tasks("general", "train", half, seed=7)]
    tasks += [parse_task(t, "webshop") for t in generate_tasks("webshop", "train", args.episodes - half, seed=7)]
    recorder = AndroidSimEnv(width=args.width)
    episodes = []
    for i, task in enumerate(tasks):
        recorder.reset(seed=i, options={"task": task})
        expert, actions, done = Expert(noise=args.noise, seed=i), [], False
        while not done:
            actions.append(expert.act(recorder.device, task))
            _, _, term, trunc, _ = recorder.step(actions[-1])
            done = term or trunc
        episodes.append((i, task, actions))

    steps, sim_rate = steps_per_s(AndroidSimEnv(width=args.width), episodes)
    with make_env(DeviceConfig(backend="adb-sim", adb_port=0, sim_devices=1), width=args.width) as env:
        _, adb_rate = steps_per_s(env, episodes)
    print(f"episodes={len(episodes)} steps={steps} width={args.width}")
    print(f"sim_steps_per_s={sim_rate:.0f}")
    print(f"adb_sim_steps_per_s={adb_rate:.1f}")
    print(f"adb_over_sim_ratio={adb_rate / sim_rate:.4f}")


if __name__ == "__main__":
    main()
