"""What the critic's trained text towers cost, against frozen text features: a TD step, and scoring every candidate.

Released Digi-Q's critic trains its three text encoders with its heads; this repository's critic does the same
(``critic.text_encoder: trained``, :mod:`digiq.models.critic_text`), or reads frozen averages computed once
(``frozen``). Both critics are built as stage 06 builds them (:func:`digiq.algos.digiq.build_critic`), the towers
copied from a base policy of the committed shape (T5, d_model 128, 2 layers), on ``--states`` synthetic stored
steps of 16 candidates: task instructions of both task sets, 8 steps an episode, actions as the base writes them
(taps, typing a goal's words, presses). VLM features are random at the committed width.

- **TD step**: one update of stage 06 on ``--batch`` transitions (:func:`~digiq.algos.digiq.td_losses`, backward,
  Adam, the target's soft update); each tower encodes each distinct text of the batch once.
- **scoring**: Q and V of every candidate of every state, as stage 07 scores them
  (:func:`~digiq.models.critic.critic_scores`); with towers every distinct text is encoded once.

One thread (a worker's), ``--repeats`` of each, alternating; the figures are medians.

Last line: ``tower_step_ratio=<number>``: a TD step with towers over one on frozen features.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np
import pandas as pd
import torch

from digiq.algos.digiq import build_critic, td_losses, transition_tensors
from digiq.config import CriticConfig
from digiq.env.actions import format_action, press_back, press_enter, tap, type_text
from digiq.env.taskgen import generate_tasks
from digiq.models.critic import TextStart, critic_scores
from digiq.models.policy import AutoUIPolicy, PolicyConfig
from digiq.models.tokenizer import default_corpus, train_tokenizer
from digiq.stages.critic_inputs import text_rows

VLM_DIM, N, STEPS_PER_EPISODE = 256, 16, 8


def synthetic_steps(states: int, rng: random.Random) -> tuple[list[str], list[str], list[str], list[list[str]]]:
    """Goals, previous actions, taken actions and candidate lists of ``states`` stored steps."""
    tasks = generate_tasks("general", "train", 200, seed=1) + generate_tasks("webshop", "train", 200, seed=1)

    def action(goal: str) -> str:
        kind = rng.random()
        if kind < 0.4:
            return format_action(tap(rng.random(), rng.random()))
        if kind < 0.7:
            words = goal.split()
            return format_action(type_text(" ".join(rng.sample(words, min(len(words), rng.randint(1, 3))))))
        return format_action(rng.choice([press_back(), press_enter()]))

    goals = [tasks[i // STEPS_PER_EPISODE % len(tasks)] for i in range(states)]
    lists = [[action(g) for _ in range(N)] for g in goals]
    taken = [row[0] for row in lists]
    before = ["" if i % STEPS_PER_EPISODE == 0 else taken[i - 1] for i in range(states)]
    return goals, before, taken, lists


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--states", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    tok = train_tokenizer(default_corpus(n_tasks=300), vocab_size=1024)
    policy = AutoUIPolicy(PolicyConfig(d_model=128, d_ff=256, d_kv=32, num_heads=4, num_layers=2), tok).eval()
    goals, before, taken, lists = synthetic_steps(args.states, random.Random(0))
    texts, rows = text_rows(goals, before, taken, lists)
    d = policy.cfg.d_model
    vlm = {"state": np.random.default_rng(0).normal(size=(args.states, VLM_DIM)).astype(np.float32),
           "next_state": np.random.default_rng(1).normal(size=(args.states, VLM_DIM)).astype(np.float32),
           "candidates": np.random.default_rng(2).normal(size=(args.states, N, VLM_DIM)).astype(np.float32)}  # fmt: skip
    frozen_text = np.random.default_rng(3).normal(size=(args.states, N + 1, 3 * d)).astype(np.float32)
    inputs = {
        "frozen": {"state": np.concatenate([vlm["state"], frozen_text[:, 0]], 1),
                   "next_state": np.concatenate([vlm["next_state"], frozen_text[:, 0]], 1),
                   "candidates": np.concatenate([vlm["candidates"], frozen_text[:, 1:, : 2 * d]], 2)},
        "trained": {**vlm, **rows},
    }  # fmt: skip
    steps = pd.DataFrame({"reward": np.zeros(args.states), "done": np.zeros(args.states),
                          "mc_return": np.zeros(args.states)})  # fmt: skip
    start = TextStart(policy, texts)
    critics, targets, opts, data = {}, {}, {}, {}
    for way, feats in inputs.items():
        critics[way] = build_critic(CriticConfig(text_encoder=way), feats, start)
        targets[way] = critics[way].target()
        opts[way] = torch.optim.Adam(critics[way].parameters(), lr=1e-5)
        data[way] = transition_tensors(feats, steps)
    of_set = np.array(["general"] * args.states)
    draw = np.random.default_rng(4)

    def td_step(way: str) -> float:
        batch = draw.integers(0, args.states, args.batch)
        began = time.perf_counter()
        q_loss, v_loss = td_losses(critics[way], targets[way], {k: t[batch] for k, t in data[way].items()}, 0.95)
        opts[way].zero_grad()
        (q_loss + v_loss).backward()
        opts[way].step()
        targets[way].soft_update(critics[way], 0.1)
        return time.perf_counter() - began

    def scoring(way: str) -> float:
        critic = critics[way].eval()
        began = time.perf_counter()
        critic_scores({"general": critic}, inputs[way], of_set)
        took = time.perf_counter() - began
        critic.train()
        return took

    times: dict[str, list[float]] = {f"{what} {way}": [] for what in ("td_step", "scoring") for way in inputs}
    for r in range(args.repeats):
        for way in inputs:
            times[f"td_step {way}"].append(td_step(way))
            if r < max(1, args.repeats // 5):
                times[f"scoring {way}"].append(scoring(way))
    median = {key: statistics.median(t) for key, t in times.items()}
    distinct = len(texts)
    print(f"{args.states} states x {N} candidates, {distinct} distinct texts; TD batch {args.batch}, one thread")
    for what in ("td_step", "scoring"):
        frozen, trained = median[f"{what} frozen"], median[f"{what} trained"]
        print(f"{what:<8} frozen {1000 * frozen:9.1f} ms   towers {1000 * trained:9.1f} ms   "
              f"({trained / frozen:.1f}x)")  # fmt: skip
    print(f"tower_step_ratio={median['td_step trained'] / median['td_step frozen']:.1f}")


if __name__ == "__main__":
    main()
