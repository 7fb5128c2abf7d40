"""What the critic's trained text towers cost a TD step, against the frozen text features it reads today.

Released Digi-Q's critic trains its three text encoders with its heads. Per TD step of ``--batch`` transitions
the towers (:mod:`digiq.models.critic_text`, copies of the base policy's T5 encoder at the committed shape:
d_model 128, 2 layers) encode, each distinct text once: for Q(s, a) and V(s), the goal and the previous action's
type and typed text, and the taken action's type and typed text, with gradients; for the targets, without
gradients, the target towers' encodings of s' (the goal and the taken action) and of (s, a). The heads are the
paper's critic's (256 wide) on the committed inputs' widths either way. Texts are task instructions of both
task sets and actions as the base writes them (taps, typing a goal's words, presses), 32 goals a batch as
episodes share them.

One thread (a worker's), ``--repeats`` steps each way, alternating; the figure is the median step.

Last line: ``tower_step_ratio=<number>``: a step with trained towers over a step on frozen features.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
from torch import nn

from digiq.env.actions import format_action, press_back, press_enter, tap, type_text
from digiq.env.taskgen import generate_tasks
from digiq.models.critic import Critic, CriticNetConfig
from digiq.models.critic_inputs import action_text
from digiq.models.critic_text import TextTable, TextTowers
from digiq.models.policy import AutoUIPolicy, PolicyConfig
from digiq.models.tokenizer import default_corpus, train_tokenizer

VLM_DIM, HIDDEN = 256, 256


def texts_of_a_batch(batch: int, rng: random.Random) -> dict[str, list[str]]:
    """A batch's goals (32 episodes' worth), and its previous and taken actions' types and typed texts."""
    goals = generate_tasks("general", "train", 16, seed=1) + generate_tasks("webshop", "train", 16, seed=1)
    goal = [rng.choice(goals) for _ in range(batch)]

    def action(g: str) -> str:
        kind = rng.random()
        if kind < 0.4:
            return format_action(tap(rng.random(), rng.random()))
        if kind < 0.7:
            words = g.split()
            return format_action(type_text(" ".join(rng.sample(words, min(len(words), rng.randint(1, 3))))))
        return format_action(rng.choice([press_back(), press_enter()]))

    def parts(actions: list[str]) -> tuple[list[str], list[str]]:
        pairs = [action_text(a) for a in actions]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    before_type, before_text = parts([action(g) for g in goal])
    taken_type, taken_text = parts([action(g) for g in goal])
    return {"goal": goal, "before_type": before_type, "before_text": before_text, "taken_type": taken_type,
            "taken_text": taken_text}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    tok = train_tokenizer(default_corpus(n_tasks=300), vocab_size=1024)
    policy = AutoUIPolicy(PolicyConfig(d_model=128, d_ff=256, d_kv=32, num_heads=4, num_layers=2), tok)
    d = policy.cfg.d_model
    towers, target_towers = TextTowers(policy.t5.encoder, d), TextTowers(policy.t5.encoder, d)
    target_towers.requires_grad_(False)
    critic = Critic(CriticNetConfig(feature_dim=VLM_DIM + 3 * d, hidden=HIDDEN, action_dim=VLM_DIM + 2 * d))
    target = critic.target()
    opt = torch.optim.Adam([*critic.parameters(), *towers.parameters()], lr=1e-5)
    rng = random.Random(0)
    batches = [texts_of_a_batch(args.batch, rng) for _ in range(args.repeats)]
    table = TextTable.of([t for b in batches for texts in b.values() for t in texts], tok, policy.cfg.max_input_tokens)
    vlm_s, vlm_next, vlm_a = (torch.randn(args.batch, VLM_DIM) for _ in range(3))
    frozen = {k: torch.randn(args.batch, d) for k in batches[0]}

    def inputs(texts: dict[str, torch.Tensor], enc: nn.Module | None) -> tuple[torch.Tensor, ...]:
        def of(tower: str, key: str) -> torch.Tensor:
            return enc(tower, table, texts[key]) if enc is not None else frozen[key]

        state = torch.cat([vlm_s, of("goal", "goal"), of("action_type", "before_type"),
                           of("typed_text", "before_text")], 1)  # fmt: skip
        action = torch.cat([vlm_a, of("action_type", "taken_type"), of("typed_text", "taken_text")], 1)
        after = torch.cat([vlm_next, of("goal", "goal"), of("action_type", "taken_type"),
                           of("typed_text", "taken_text")], 1)  # fmt: skip
        return state, action, after

    def step(b: dict[str, list[str]], trained: bool) -> float:
        rows = {k: table.rows(v) for k, v in b.items()}
        start = time.perf_counter()
        with torch.no_grad():
            state_t, action_t, after = inputs(rows, target_towers if trained else None)
            y_q = sum(target.v(after)) / 2
            y_v = sum(target.q(state_t, action_t)) / 2
        state, action, _ = inputs(rows, towers if trained else None)
        loss = sum((q - y_q).pow(2).mean() for q in critic.q(state, action)) + sum(
            (v - y_v).pow(2).mean() for v in critic.v(state)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        return time.perf_counter() - start

    times: dict[bool, list[float]] = {False: [], True: []}
    for b in batches:
        for trained in (False, True):
            times[trained].append(step(b, trained))
    frozen_s, trained_s = statistics.median(times[False]), statistics.median(times[True])
    distinct = statistics.mean(len({t for texts in b.values() for t in texts}) for b in batches)
    print(f"distinct texts a batch: {distinct:.0f} of {5 * args.batch}")
    print(f"step on frozen features: {1000 * frozen_s:.1f} ms; with trained towers: {1000 * trained_s:.1f} ms")
    print(f"tower_step_ratio={trained_s / frozen_s:.1f}")


if __name__ == "__main__":
    main()
