"""Stage 08's expert rankers: as the stage fit them, against pair by pair split and each fit a one-thread job, in
one run.

Stage 08 fits, for each VLM's critic inputs, an MLP shaped like a Q head and a linear scorer to the expert's
choices, each cross-fitted over two halves of the episodes: 12 fits (3 VLMs x 2 rankers x 2 halves). Before,
each ran in the notebook's kernel, one after the other, every (state, candidate) row concatenated through the
net: ``expert_probe`` as it was, copied here unchanged as the baseline. Now each fit is a job
(:func:`digiq.diagnostics.probes.expert_probe_half`, the stage's ``ranker_job``) on one-thread worker processes,
and reads the pairs as :func:`digiq.models.critic.pair_mlp` does: the state's share of the LayerNorm and the
first layer once per state, each state's distinct candidates only.

Two measurements:

- one training step of the MLP ranker at the committed shapes (64 states of 16 candidates, 640 state and 512
  candidate features, 256 wide), both on one thread, alternating blocks of steps; the ratio of the medians;
- the stage's part on a subsample: ``--states`` states (default 1,000 of the committed 28,790) of three
  VLMs' synthetic features, the 12 fits the old way in this process on two threads (the notebook kernel's)
  against the 12 jobs over two one-thread workers (``compute.workers: 2``), start-up included.

Outputs: the rankers' scores before and after, their largest difference beside the baseline's own between one
thread and two (training amplifies float rounding alike: that is the yardstick), and how often each one's top
valid candidate is a right one (the stage's ``expert_pick`` hit rate).

Data: synthetic, as in ``benchmarks/scoring.py`` (about 8.4 distinct candidates a state); a candidate is right
when its features lie far along a direction of its own state's, so the rankers have something to learn; 95% of
candidates valid; episodes of 12 states.

Last line: ``rankers_speedup=<number>``: the stage's part, before over after.
"""

from __future__ import annotations

import argparse
import time
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from digiq.config import ComputeConfig
from digiq.diagnostics.probes import expert_probe_half
from digiq.models.critic import mlp, pair_mlp, same_candidates
from digiq.workers import map_jobs

N_CANDIDATES = 16
STATE_DIM, CANDIDATE_DIM, HIDDEN = 640, 512, 256
VLMS = 3
RANKERS = (("mlp", 256), ("linear", None))


def expert_probe_before(state: np.ndarray, candidates: np.ndarray, right: np.ndarray, valid: np.ndarray,
                        episodes: np.ndarray, *, seed: int, hidden: int | None = 256, epochs: int = 40) -> np.ndarray:  # fmt: skip
    """``digiq.diagnostics.probes.expert_probe`` as it was: both halves in turn, every pair row concatenated."""
    ok = torch.as_tensor(np.asarray(valid, bool))
    hit = torch.as_tensor(np.asarray(right, bool)) & ok
    informative = (hit.any(1) & (ok & ~hit).any(1)).numpy()
    s, c = torch.as_tensor(np.asarray(state)), torch.as_tensor(np.asarray(candidates))
    rng = np.random.default_rng(seed)
    ids = np.unique(episodes)
    half = np.isin(episodes, rng.permutation(ids)[: len(ids) // 2])
    scores = np.zeros(ok.shape, np.float32)

    def logits(net: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
        x = torch.cat([s[idx][:, None].expand(-1, c.shape[1], -1), c[idx]], -1)
        return net(x)[..., 0].masked_fill(~ok[idx], -1e9)

    with torch.random.fork_rng():
        for fit in (half, ~half):
            torch.manual_seed(seed)
            d_in = s.shape[1] + c.shape[2]
            net = mlp(d_in, hidden) if hidden else nn.Sequential(nn.LayerNorm(d_in), nn.Linear(d_in, 1))
            opt = torch.optim.AdamW(net.parameters(), lr=3e-4 if hidden else 1e-2, weight_decay=1e-2)
            train = np.flatnonzero(fit & informative)
            for _ in range(epochs if len(train) else 0):
                for batch in np.array_split(rng.permutation(train), max(1, len(train) // 64)):
                    idx = torch.as_tensor(batch)
                    target = hit[idx].float() / hit[idx].sum(1, keepdim=True)
                    loss = -(target * torch.log_softmax(logits(net, idx), 1)).sum(1).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            with torch.no_grad():
                held = torch.as_tensor(np.flatnonzero(~fit))
                scores[~fit] = logits(net, held).numpy()
    return scores


def synthetic(states: int, seed: int) -> dict[str, np.ndarray]:
    """One VLM's critic inputs and the expert's verdicts: state, candidates, right, valid, episodes."""
    rng = np.random.default_rng(seed)
    state = (rng.standard_normal((states, STATE_DIM), np.float32) + rng.normal(0.2, 1.0, STATE_DIM)).astype(np.float32)
    actions = rng.standard_normal((states, N_CANDIDATES, CANDIDATE_DIM), np.float32)
    weights = 1 / np.arange(1, N_CANDIDATES + 1) ** 0.95
    picks = rng.choice(N_CANDIDATES, size=(states, N_CANDIDATES), p=weights / weights.sum())
    candidates = np.take_along_axis(actions, picks[..., None], 1)
    direction = state[:, :CANDIDATE_DIM] / np.linalg.norm(state[:, :CANDIDATE_DIM], axis=1, keepdims=True)
    along = np.einsum("snd,sd->sn", candidates, direction)
    right = along >= np.sort(along, 1)[:, [-3]]  # each state's farthest two or three candidates (repeats alike)
    return {"state": state, "candidates": candidates, "right": right,
            "valid": rng.uniform(size=(states, N_CANDIDATES)) < 0.95,
            "episodes": np.arange(states) // 12}  # fmt: skip


class HalfFit(NamedTuple):
    """One of the 12 fits: a VLM's synthetic inputs (by seed), a ranker, a half."""

    states: int
    vlm: int
    hidden: int | None
    half: int


def half_fit(job: HalfFit) -> tuple[np.ndarray, np.ndarray]:
    """The stage's ranker job on synthetic inputs: the rows one fit scores and their scores."""
    d = synthetic(job.states, seed=job.vlm)
    return expert_probe_half(d["state"], d["candidates"], d["right"], d["valid"], d["episodes"], half=job.half,
                             seed=0, hidden=job.hidden)  # fmt: skip


def hit_rate(scores: np.ndarray, right: np.ndarray, valid: np.ndarray) -> float:
    """How often the top valid candidate is right, over states with right and wrong valid candidates."""
    hit = right & valid
    informative = hit.any(1) & (valid & ~hit).any(1)
    pick = np.where(valid, scores, -np.inf).argmax(1)
    return float(hit[np.arange(len(hit)), pick][informative].mean())


def step_times(blocks: int, steps: int) -> dict[str, float]:
    """Median milliseconds of one MLP ranker step, the concatenated rows' way and pair_mlp's, on one thread."""
    d = synthetic(64, seed=9)
    s, c = torch.from_numpy(d["state"]), torch.from_numpy(d["candidates"])
    ok, hit = torch.from_numpy(d["valid"]), torch.from_numpy(d["right"] & d["valid"])
    target = hit.float() / hit.sum(1, keepdim=True).clamp(min=1)
    same = same_candidates(c)
    torch.manual_seed(0)
    net = mlp(STATE_DIM + CANDIDATE_DIM, HIDDEN)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-4, weight_decay=1e-2)
    ways = {
        "before": lambda: net(torch.cat([s[:, None].expand(-1, N_CANDIDATES, -1), c], -1))[..., 0],
        "after": lambda: pair_mlp(net, s, c, same),
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(blocks):
        for name, logits in ways.items():
            began = time.perf_counter()
            for _ in range(steps):
                loss = -(target * torch.log_softmax(logits().masked_fill(~ok, -1e9), 1)).sum(1).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            times[name].append((time.perf_counter() - began) / steps * 1000)
    return {name: float(np.median(t)) for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--states", type=int, default=1000, help="states of each VLM's synthetic data in the stage part")
    ap.add_argument("--blocks", type=int, default=5, help="alternating blocks of steps in the step timing")
    args = ap.parse_args()

    torch.set_num_threads(1)
    step = step_times(args.blocks, steps=10)
    print(f"MLP ranker step, 64 states x 16 candidates, one thread: before {step['before']:.1f} ms, "
          f"after {step['after']:.1f} ms, ratio {step['before'] / step['after']:.2f}")  # fmt: skip

    data = [synthetic(args.states, seed=vlm) for vlm in range(VLMS)]
    torch.set_num_threads(2)  # the notebook kernel's threads
    began = time.perf_counter()
    before = {(vlm, name): expert_probe_before(d["state"], d["candidates"], d["right"], d["valid"], d["episodes"],
                                               seed=0, hidden=hidden)
              for vlm, d in enumerate(data) for name, hidden in RANKERS}  # fmt: skip
    before_s = time.perf_counter() - began
    print(f"the 12 fits before: {before_s:.1f} s (in this process, 2 threads)", flush=True)

    jobs = [HalfFit(args.states, vlm, hidden, half) for vlm in range(VLMS) for _, hidden in RANKERS for half in (0, 1)]
    began = time.perf_counter()
    fitted = map_jobs(half_fit, jobs, ComputeConfig(workers=2))
    after_s = time.perf_counter() - began
    print(f"the 12 fits after: {after_s:.1f} s (12 jobs, 2 one-thread workers)", flush=True)
    after: dict[tuple[int, str], np.ndarray] = {}
    names = dict((hidden, name) for name, hidden in RANKERS)
    for job, (rows, scores) in zip(jobs, fitted, strict=True):
        after.setdefault((job.vlm, names[job.hidden]), np.zeros((args.states, N_CANDIDATES), np.float32))[rows] = scores

    torch.set_num_threads(1)
    for vlm, name in before:
        d = data[vlm]
        valid = d["valid"]
        gap = float(np.abs(before[vlm, name] - after[vlm, name])[valid].max())
        line = (f"VLM {vlm} {name}: hit rate before {hit_rate(before[vlm, name], d['right'], valid):.4f}, after "
                f"{hit_rate(after[vlm, name], d['right'], valid):.4f}; largest score difference {gap:.2e} "
                f"(largest |score| {float(np.abs(before[vlm, name][valid]).max()):.2f})")  # fmt: skip
        if vlm == 0:  # the yardstick: the baseline itself on one thread instead of two
            one = expert_probe_before(d["state"], d["candidates"], d["right"], d["valid"], d["episodes"], seed=0,
                                      hidden=dict(RANKERS)[name])  # fmt: skip
            line += f"; the baseline on 1 thread against 2: {float(np.abs(one - before[vlm, name])[valid].max()):.2e}"
        print(line, flush=True)
    print(f"the stage's part: before {before_s:.1f} s, after {after_s:.1f} s")
    print(f"rankers_speedup={before_s / after_s:.2f}")


if __name__ == "__main__":
    main()
