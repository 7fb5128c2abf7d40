"""Every critic's Q and V of every stored state's candidates: as stages 07 and 08 scored them, against once per
(critic, seed) with the first layer split and each state's distinct candidates once, in one run.

Before, stage 07 asked a seed's critic again for every Best-of-N row that reads it (Digi-Q and its ablations
over 1 and 4 candidates share Digi-Q's critic), and stage 08 asked every critic of every seed once more: 30
scorings for 12 distinct matrices (4 critics x 3 seeds). Each ran every (state, candidate) row, the state's
features concatenated to the candidate's, through both Q heads: ``Critic.advantage`` as it was, copied here
unchanged as the baseline. Now stage 07 computes each (critic, seed)'s matrices once and stores them, stage 08
reads them, and :meth:`digiq.models.critic.Critic.advantage` reads the heads as
:func:`digiq.models.critic.pair_mlp` does (the LayerNorm's statistics and the first layer split between the
state's columns and the candidate's, the state's share once per state, each distinct candidate once).

One scoring is one seed's critics over every stored state, each task set's states by its own critic, as the
stages score them. Both run on one thread (a worker's), alternating, ``--repeats`` times; the ratio is of
their medians. The outputs are compared: the largest difference of Q and V, and Best-of-N's pick (the best
valid candidate of all 16, each state) by both, where two advantages are not within 1e-5 of each other.

Data: synthetic features at the committed run's shapes (``--states``, default its 28,790 stored steps, 45% of
them General's; 16 candidates a state; the paper's critic inputs: 640 state features, the fine-tuned VLM's 256
and the text features of the goal and the previous action, and 512 candidate features, the VLM's 256 and the
action's type and typed text; Q heads 256 wide). A state's candidates are the action taken and 15 draws from
16 actions with weights 1 / rank^0.95: about 8.4 distinct, as stage 02 measures on the pipeline's data. The
critic is freshly initialised (the work does not depend on the weights).

Last line: ``scoring_speedup=<number>``: the stages' scoring time before over after (30 scorings the old way
against 12 the new).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from digiq.models.critic import Critic, CriticNetConfig

N_CANDIDATES = 16
STATE_DIM, CANDIDATE_DIM, HIDDEN = 640, 512, 256
SCORINGS_BEFORE, SCORINGS_AFTER = 30, 12  # 18 in stage 07 and 12 in stage 08; 12 in stage 07 alone


@torch.no_grad()
def advantage_before(critic: Critic, state: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``Critic.advantage`` as it was: every (state, candidate) row concatenated, through both Q heads."""
    s = state[:, None].expand(-1, actions.shape[1], -1)
    q = critic.joined(critic.q(s, actions))
    v = critic.joined(critic.v(state))
    return q, v, q - v[:, None]


def synthetic(states: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """States (S, 640), candidates (S, 16, 512) with repeats as the base samples them, and each state's task set."""
    rng = np.random.default_rng(seed)
    state = rng.standard_normal((states, STATE_DIM), np.float32) * 0.7 + rng.normal(0.2, 1.0, STATE_DIM)
    actions = rng.standard_normal((states, N_CANDIDATES, CANDIDATE_DIM), np.float32)
    actions += rng.normal(0.1, 1.0, CANDIDATE_DIM).astype(np.float32)
    weights = 1 / np.arange(1, N_CANDIDATES + 1) ** 0.95
    picks = rng.choice(N_CANDIDATES, size=(states, N_CANDIDATES), p=weights / weights.sum())
    candidates = np.take_along_axis(actions, picks[..., None], 1)
    task_set = np.where(rng.uniform(size=states) < 0.45, "general", "webshop")
    return torch.from_numpy(state.astype(np.float32)), torch.from_numpy(candidates), task_set


def scoring(advantage, critics: dict[str, Critic], state: torch.Tensor, candidates: torch.Tensor,
            task_set: np.ndarray) -> tuple[float, torch.Tensor, torch.Tensor]:  # fmt: skip
    """Seconds, Q and V of one scoring: each task set's states by its own critic."""
    q = torch.empty(candidates.shape[:2])
    v = torch.empty(len(state))
    began = time.perf_counter()
    for ts, critic in critics.items():
        rows = torch.from_numpy(np.flatnonzero(task_set == ts))
        q[rows], v[rows], _ = advantage(critic, state[rows], candidates[rows])
    return time.perf_counter() - began, q, v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--states", type=int, default=28_790, help="stored states (the committed run's: 28,790)")
    ap.add_argument("--repeats", type=int, default=3, help="scorings of each way, alternating")
    args = ap.parse_args()
    torch.set_num_threads(1)
    state, candidates, task_set = synthetic(args.states, seed=0)
    distinct = np.mean([len(np.unique(row, axis=0)) for row in candidates[:2000].numpy()])
    print(f"{args.states:,} states x {N_CANDIDATES} candidates, {distinct:.1f} distinct a state (first 2,000)")
    torch.manual_seed(0)
    net = CriticNetConfig(feature_dim=STATE_DIM, action_dim=CANDIDATE_DIM, hidden=HIDDEN)
    critics = {ts: Critic(net).eval() for ts in ("general", "webshop")}
    times: dict[str, list[float]] = {"before": [], "after": []}
    out = {}
    for _ in range(args.repeats):
        for name, advantage in (("before", advantage_before), ("after", Critic.advantage)):
            seconds, q, v = scoring(advantage, critics, state, candidates, task_set)
            times[name].append(seconds)
            out[name] = (q, v)
            print(f"{name}: {seconds:.2f} s a scoring", flush=True)
    (q0, v0), (q1, v1) = out["before"], out["after"]
    best0, best1 = (q0 - v0[:, None]).argmax(1), (q1 - v1[:, None]).argmax(1)
    top = torch.sort(q0 - v0[:, None], 1).values
    tied = (top[:, -1] - top[:, -2] < 1e-5) & (top[:, -1] > top[:, -2])  # a near tie of two different values
    differ = best0 != best1
    print(f"Q: largest difference {float((q0 - q1).abs().max()):.2e} (largest |Q| {float(q0.abs().max()):.3f}); "
          f"V: {'the same bits' if torch.equal(v0, v1) else f'largest difference {float((v0 - v1).abs().max()):.2e}'}")  # fmt: skip
    print(f"Best-of-N over all 16: {int(differ.sum())} of {len(differ):,} picks differ "
          f"({int((differ & ~tied).sum())} outside near ties; {int(tied.sum())} states with a near tie)")  # fmt: skip
    before, after = float(np.median(times["before"])), float(np.median(times["after"]))
    print(f"one scoring: before {before:.2f} s, after {after:.2f} s (median of {args.repeats}), "
          f"ratio {before / after:.2f}")  # fmt: skip
    stage_before, stage_after = SCORINGS_BEFORE * before, SCORINGS_AFTER * after
    print(f"stages 07 + 08: {SCORINGS_BEFORE} scorings {stage_before:.0f} s against {SCORINGS_AFTER} "
          f"{stage_after:.0f} s")  # fmt: skip
    print(f"scoring_speedup={stage_before / stage_after:.2f}")


if __name__ == "__main__":
    main()
