"""Where an evaluation episode's time goes: the policy's sampling, its parts, and the simulator, in one run.

One stage-10 job (a checkpoint on the first ``--tasks`` test tasks of each
task set, at eval's temperature and batch size) runs in one one-thread
process, as in a worker on the 2-core machine, under ``cProfile``. The
shares are of the job's wall time; the indented parts are inside choosing
actions (resampling is done once there, then found done inside the encoder).

Last line: ``policy_share=<number>`` (the fraction of the time spent choosing actions).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from pathlib import Path

import torch

from digiq.config import EnvConfig, EvalConfig
from digiq.data.task_lists import read_tasks
from digiq.env.tasks import TASK_SETS
from digiq.evaluate import EvalJob, evaluate_job
from digiq.paths import Paths

# (label, file suffix, function name) of what is timed, cumulative time of each.
PARTS = [
    ("choosing actions (ModelPolicy.act)", "digiq/models/agents.py", "act"),
    ("  screen resampling to the encoder's size (ScreenEncoder.prepare)", "digiq/models/policy.py", "prepare"),
    ("  encoder: prompt and screen (AutoUIPolicy.encode)", "digiq/models/policy.py", "encode"),
    ("  decoder, one token at a time (StepDecoder.step)", "digiq/models/policy.py", "step"),
    ("  next-token probabilities (AutoUIPolicy._next_token_probs)", "digiq/models/policy.py", "_next_token_probs"),
    ("simulator: step and render (PhoneEnv.step)", "digiq/env/gym_env.py", "step"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--policy", type=Path, default=Paths().actor("digiq", 0, "general"), help="policy checkpoint folder"
    )
    ap.add_argument("--tasks", type=int, default=128, help="first test tasks of each task set")
    args = ap.parse_args()
    torch.set_num_threads(1)

    tasks = {ts: read_tasks(Paths(), ts, "test", args.tasks, "benchmark") for ts in TASK_SETS}
    job = EvalJob(args.policy, "benchmark", 0, tasks, EvalConfig(), EnvConfig(), screen_text=False)
    profile = cProfile.Profile()
    began = time.perf_counter()
    profile.enable()
    results = evaluate_job(job)
    profile.disable()
    wall = time.perf_counter() - began

    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]  # {(file, line, name): (cc, nc, tt, ct, callers)}
    episodes = [r for listed in results.values() for r in listed]
    print(f"episodes={len(episodes)} steps={sum(r.steps for r in episodes)} wall_s={wall:.2f} (profiled)")
    shares = {}
    for label, suffix, name in PARTS:
        cumulative = sum(v[3] for (file, _, func), v in stats.items() if file.endswith(suffix) and func == name)
        shares[label] = cumulative / wall
        print(f"{label:<66} {cumulative:7.2f} s  {100 * shares[label]:5.1f}%")
    print(f"policy_share={shares[PARTS[0][0]]:.2f}")


if __name__ == "__main__":
    main()
