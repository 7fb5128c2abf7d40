"""What stages 08 and 09 computed again from stage 07's inputs, against reading what stage 07 stored, in one run.

- The expert's matrix (which candidates of every stored state do what the simulator's expert would): stage 07
  computes it for the perfect critic's row, and stage 08 computed it again
  (:func:`digiq.diagnostics.ground_truth.expert_matrix`, every collected episode replayed); now stage 08 reads
  stage 07's (:func:`digiq.data.picks.read_stored`).
- Offline DigiRL's step features (the frozen base policy's encoder over every stored step and its next state):
  stage 07 computes them for offline DigiRL, and each of stage 09's six off-to-online runs (3 seeds x 2 task
  sets) computed its task set's again: screenshots loaded, then encoded (the code it ran, copied here as the
  baseline); now each reads stage 07's (:func:`digiq.algos.digirl.read_offline_step_features`), which
  stage 07 computes per task set from the same rows as the runs did
  (:func:`digiq.stages.actor.step_features_job`).

Both are compared bit for bit with what they replace. Times: each way ``--repeats`` times, alternating, medians;
the stages' figures count one expert matrix (stage 08) and three runs per task set (stage 09).

Data: noisy-expert rollouts of ``--tasks`` train tasks per task set (default 40: about 600 steps, against the
committed run's 28,790) as the offline data, 16 candidates a state (the action taken, then 15 drawn from the
actions the expert, Back, Home and taps at random points make), and a base policy of the committed size,
freshly initialised (the work does not depend on its weights).

Last line: ``reuse_speedup=<number>``: the stages' time on this work, before over after.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from digiq.algos.digirl import StepFeatures, read_offline_step_features, step_features, write_offline_step_features
from digiq.config import EnvConfig
from digiq.data.picks import EXPERT_MATRIX, read_stored, write_stored
from digiq.data.trajectories import TrajectoryStore
from digiq.diagnostics.ground_truth import expert_matrix
from digiq.env.actions import format_action, press_back, press_home, tap
from digiq.env.taskgen import generate_tasks
from digiq.env.tasks import TASK_SETS, parse_task
from digiq.models.policy import AutoUIPolicy, PolicyConfig
from digiq.models.policy_fit import load_screens
from digiq.models.tokenizer import default_corpus, train_tokenizer
from digiq.paths import Paths
from digiq.rollout import ExpertPolicy, rollout
from digiq.stages.actor import StepFeaturesJob, step_features_job

N_CANDIDATES = 16
COLLECT_SEED = 0
RUNS_PER_TASK_SET = 3  # stage 09's off-to-online runs: one per seed


def offline_features_before(paths: Paths, task_set: str) -> StepFeatures:
    """What an off-to-online run computed for its task set's offline steps before (its buffer's ``add``)."""
    base = AutoUIPolicy.load(paths.base_policy)
    store = TrajectoryStore(paths.offline)
    t = store.read().to_pandas()
    t = t[t.task_set == task_set]
    t = t.sort_values(["traj_id", "step_id"], kind="stable").reset_index(drop=True)
    loaded = load_screens(base, store, [*t.image_path, *t.next_image_path])
    return step_features(base, t, loaded)


def build(root: Path, tasks: int, env: EnvConfig) -> tuple[Paths, pd.DataFrame, pd.DataFrame]:
    """Offline data, candidates and a base policy under ``root``: the step table and the candidates."""
    paths = Paths(root)
    store = TrajectoryStore(paths.offline)
    episodes = [parse_task(t, ts) for ts in TASK_SETS for t in generate_tasks(ts, "train", tasks, seed=5)]
    rollout(ExpertPolicy(noise=0.3, seed=1), episodes, n_envs=8, seed=COLLECT_SEED, width=env.width, store=store)
    steps = store.read().to_pandas()
    rng = np.random.default_rng(0)
    taps = [tap(*rng.uniform(0.05, 0.95, 2)) for _ in range(6)]
    pool = [format_action(a) for a in (press_back(), press_home(), *taps)]
    lists = [[a, *rng.choice([a, *pool], N_CANDIDATES - 1).tolist()] for a in steps.action]
    cands = pd.DataFrame({"traj_id": steps.traj_id, "step_id": steps.step_id, "action_list": lists})
    torch.manual_seed(0)
    AutoUIPolicy(PolicyConfig(), train_tokenizer(default_corpus(n_tasks=50))).save(paths.base_policy)
    return paths, steps, cands


def alternate(ways: dict[str, Callable[[], object]], repeats: int) -> tuple[dict[str, float], dict[str, object]]:
    """Each way called ``repeats`` times, alternating: its median seconds and its last result."""
    times: dict[str, list[float]] = {name: [] for name in ways}
    out: dict[str, object] = {}
    for _ in range(repeats):
        for name, fn in ways.items():
            began = time.perf_counter()
            out[name] = fn()
            times[name].append(time.perf_counter() - began)
    return {name: float(np.median(t)) for name, t in times.items()}, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=40, help="train tasks per task set rolled out as the offline data")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each way")
    args = ap.parse_args()
    torch.set_num_threads(1)  # a worker's: stage 09's runs are jobs
    env = EnvConfig()
    with tempfile.TemporaryDirectory() as tmp:
        paths, steps, cands = build(Path(tmp), args.tasks, env)
        print(f"{len(steps):,} stored steps, {N_CANDIDATES} candidates a state")
        # What stage 07 stores (its own work, the same before and after).
        right, kinds = expert_matrix(env, COLLECT_SEED, steps, cands)
        write_stored(paths, EXPERT_MATRIX, steps, {"right": right, "kinds": kinds})
        write_offline_step_features(paths, steps, {ts: step_features_job(StepFeaturesJob(paths, ts))
                                                   for ts in TASK_SETS})  # fmt: skip

        seconds, out = alternate({
            "before": lambda: expert_matrix(env, COLLECT_SEED, steps, cands),
            "after": lambda: tuple(read_stored(paths, EXPERT_MATRIX, steps, ("right", "kinds"), "diagnostics").values()),
        }, args.repeats)  # fmt: skip
        same = all(np.array_equal(a, b) for a, b in zip(out["before"], out["after"], strict=True))
        e_before, e_after = seconds["before"], seconds["after"]
        print(f"expert matrix: computed again {e_before:.3f} s, read {e_after:.4f} s; "
              f"{'the same bits' if same else 'DIFFERENT'}")  # fmt: skip

        f_before = f_after = 0.0
        for ts in TASK_SETS:
            seconds, out = alternate({
                "before": lambda ts=ts: offline_features_before(paths, ts),
                "after": lambda ts=ts: read_offline_step_features(paths, ts, "digirl_online"),
            }, args.repeats)  # fmt: skip
            want, got = out["before"], out["after"]
            same = all(np.array_equal(getattr(got, k), getattr(want, k)) for k in ("state", "next_state",
                                                                                   "instruction"))  # fmt: skip
            print(f"{ts} offline step features ({len(want.state):,} steps): computed again {seconds['before']:.3f} s, "
                  f"read {seconds['after']:.4f} s; {'the same bits' if same else 'DIFFERENT'}")  # fmt: skip
            f_before += RUNS_PER_TASK_SET * seconds["before"]
            f_after += RUNS_PER_TASK_SET * seconds["after"]
    print(f"stage 08 (one expert matrix) and stage 09 (six runs' offline features): before {e_before + f_before:.2f} s, "
          f"after {e_after + f_after:.3f} s")  # fmt: skip
    print(f"reuse_speedup={(e_before + f_before) / (e_after + f_after):.1f}")


if __name__ == "__main__":
    main()
