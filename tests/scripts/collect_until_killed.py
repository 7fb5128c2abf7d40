"""Collect 160 tasks on 32 simulated devices in parts of 64 into OUT_DIR; tests/test_rollout.py kills it part-way.

The noisy expert's episodes differ in length, so they finish out of task order and a part holds the first 64
to finish, not ids 0-63. A pause per step gives the test time to kill between parts."""

import sys
import time
from pathlib import Path

from digiq.data import TrajectoryStore
from digiq.env import parse_task
from digiq.env.taskgen import generate_tasks
from digiq.rollout import ExpertPolicy, rollout

TASKS = [parse_task(t) for t in generate_tasks("general", "train", 80, seed=4)] + [
    parse_task(t, "webshop") for t in generate_tasks("webshop", "train", 80, seed=4)
]


class Slow(ExpertPolicy):
    def act(self, batch):
        time.sleep(float(sys.argv[2]))
        return super().act(batch)


if __name__ == "__main__":
    rollout(Slow(noise=0.4, seed=1), TASKS, n_envs=32, width=108, store=TrajectoryStore(Path(sys.argv[1])),
            part_size=64, seed=3)  # fmt: skip
