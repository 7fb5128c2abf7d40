"""The policy's sampling step before and after, in one run: actions/s at eval's and augment's shapes, FLOPs per action.

"before" is ``digiq/models/policy.py`` as it was at a git revision (``--before``:
the last one whose sampler drew its noise from one stream for the whole batch
and decoded every row until the longest ended), loaded from git beside this
checkout's "after". Both load the same checkpoint and choose actions for the
same states, as a rollout does (the screenshot resampled to the encoder's
size, then sampled):

- eval's shape: one action per state, ``eval.n_envs`` states a call, at ``eval.temperature``;
- augment's shape: ``augment.n_candidates - 1`` actions per state, ``augment.batch_states`` states a call,
  at ``augment.temperature``.

The states are real: the pipeline's test tasks of both task sets (generated here), each after 0 to 4 steps of
the noisy expert, with the prompt a policy sees there. Calls alternate between
before and after, batch by batch, so a change in the machine's load falls on
both. FLOPs are counted by ``torch.utils.flop_counter`` on one call of each;
the share of the bound divides the FLOPs done per second by the rate of a
plain fp32 matrix product on the same thread.

Last line: ``policy_step_speedup=<number>`` (eval's shape: after's actions/s over before's).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from digiq.config import AugmentConfig, EvalConfig, TasksConfig
from digiq.data.trajectories import observation_text
from digiq.env import AndroidSimEnv
from digiq.env.actions import format_action
from digiq.env.expert import Expert
from digiq.env.taskgen import generate_tasks
from digiq.env.tasks import TASK_SETS, parse_task
from digiq.models.policy import AutoUIPolicy
from digiq.noise import noise_key
from digiq.paths import ROOT, Paths

BEFORE = "b65723e"  # the sampler with one noise stream per batch and every row decoded to the batch's end


def policy_module_at(revision: str) -> ModuleType:
    """``digiq/models/policy.py`` as it was at ``revision``, imported under a name of its own."""
    source = subprocess.run(["git", "show", f"{revision}:digiq/models/policy.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "policy_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("policy_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def states(n: int, seed: int = 0) -> tuple[list[str], np.ndarray]:
    """``n`` (prompt, screenshot) pairs of test tasks, each after 0-4 steps of the expert with noise 0.3."""
    cfg = TasksConfig()
    tasks = [parse_task(line, ts) for ts in TASK_SETS
             for line in generate_tasks(ts, "test", 320, cfg.seed, cfg.split_seed)]  # fmt: skip
    env, rng = AndroidSimEnv(), np.random.default_rng(seed)
    prompts, shots = [], []
    for i in range(n):
        task = tasks[int(rng.integers(len(tasks)))]
        obs, _ = env.reset(seed=i, options={"task": task})
        expert, history = Expert(0.3, i), []
        for _ in range(int(rng.integers(5))):
            action = format_action(expert.act(env.device, task))
            obs, _, done, _, _ = env.step(action)
            history.append(action)
            if done:
                break
        prompts.append(observation_text(history, task.instruction))
        shots.append(obs["screenshot"])
    return prompts, np.stack(shots)


def gemm_rate() -> float:
    """FLOP/s of a 512 x 512 fp32 matrix product on this thread: the compute bound the shares are of."""
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    for _ in range(5):
        a @ b
    t0, reps = time.perf_counter(), 50
    for _ in range(reps):
        a @ b
    return 2 * 512**3 * reps / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", type=Path, default=Paths().base_policy, help="policy checkpoint folder")
    ap.add_argument("--before", default=BEFORE, help="git revision of the policy module to compare with")
    ap.add_argument("--states", type=int, default=960, help="states per shape (eval's batches are 48 of them)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # as in a worker process on the 2-core machine

    eval_cfg, augment = EvalConfig(), AugmentConfig()
    after = AutoUIPolicy.load(args.policy)
    before = policy_module_at(args.before).AutoUIPolicy.load(args.policy)
    prompts, shots = states(args.states)
    shapes = {"eval": (eval_cfg.n_envs, 1, eval_cfg.temperature),
              "augment": (augment.batch_states, augment.n_candidates - 1, augment.temperature)}  # fmt: skip

    def choose(name: str, p: list[str], s: np.ndarray, keys: list[int], n: int, temp: float) -> list[list[str]]:
        """Actions for states (prompts ``p``, screenshots ``s``) as a rollout chooses them, by the named sampler."""
        if name == "before":  # its noise: torch's global stream
            return before.sample(p, before.screen.prepare(s), n=n, temperature=temp)
        return after.sample(p, after.screen.prepare(s), n=n, temperature=temp, noise=keys)

    rate = gemm_rate()
    print(f"states={args.states} before={args.before} one-thread fp32 GEMM {rate / 1e9:.1f} GFLOP/s")
    speedups: dict[str, float] = {}
    for shape, (batch, n, temp) in shapes.items():
        calls = [(prompts[i : i + batch], shots[i : i + batch], [noise_key(0, j) for j in range(i, min(i + batch, args.states))])
                 for i in range(0, args.states, batch)]  # fmt: skip
        torch.manual_seed(0)
        flops: dict[str, float] = {}
        for name in ("before", "after"):
            choose(name, *calls[0], n, temp)  # warm-up
            with FlopCounterMode(display=False) as counter:
                choose(name, *calls[0], n, temp)
            flops[name] = counter.get_total_flops() / (len(calls[0][0]) * n)
        took = {"before": 0.0, "after": 0.0}
        lengths: dict[str, list[int]] = {"before": [], "after": []}
        for call in calls:
            for name in ("before", "after"):
                t0 = time.perf_counter()
                out = choose(name, *call, n, temp)
                took[name] += time.perf_counter() - t0
                lengths[name] += [len(after.tokenizer(a).input_ids) for row in out for a in row]
        actions = args.states * n
        for name in ("before", "after"):
            per_s = actions / took[name]
            print(f"{shape:<8} {name:<6} {per_s:8.1f} actions/s  {flops[name] / 1e6:7.1f} MFLOP/action  "
                  f"{100 * flops[name] * per_s / rate:5.1f}% of the GEMM bound  "
                  f"{np.mean(lengths[name]):.1f} tokens/action")  # fmt: skip
        speedups[shape] = took["before"] / took["after"]
        print(f"{shape:<8} speedup {speedups[shape]:.2f}")
    print(f"policy_step_speedup={speedups['eval']:.2f}")


if __name__ == "__main__":
    main()
