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

Three ways to run the towers are timed (:data:`WAYS`), and the frozen features beside them.

Last line: ``tower_step_ratio=<number>``: a step with one shared tower called once a step over a step on frozen
features.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

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


# The towers each way: three, each text kind's call on its own; three, each tower called once a step on the
# distinct texts of all its inputs (TextTowers.encode); one tower shared by the three kinds, called once a step.
WAYS = ("three, a call per input", "three, a call per tower", "one shared, a call a step")
KEYS = {"goal": "goal", "before_type": "action_type", "before_text": "typed_text", "taken_type": "action_type",
        "taken_text": "typed_text"}  # fmt: skip


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
    rng = random.Random(0)
    batches = [texts_of_a_batch(args.batch, rng) for _ in range(args.repeats)]
    table = TextTable.of([t for b in batches for texts in b.values() for t in texts], tok, policy.cfg.max_input_tokens)
    vlm_s, vlm_next, vlm_a = (torch.randn(args.batch, VLM_DIM) for _ in range(3))
    frozen = {k: torch.randn(args.batch, d) for k in KEYS}
    ways: dict[str, tuple[TextTowers | None, TextTowers | None]] = {"frozen": (None, None)}
    for way in WAYS:
        towers = TextTowers(policy.t5.encoder, d, shared=way.startswith("one"))
        target_towers = TextTowers(policy.t5.encoder, d, shared=way.startswith("one")).requires_grad_(False)
        ways[way] = (towers, target_towers)
    critics = {way: Critic(CriticNetConfig(feature_dim=VLM_DIM + 3 * d, hidden=HIDDEN, action_dim=VLM_DIM + 2 * d))
               for way in ways}  # fmt: skip
    opts = {way: torch.optim.Adam([*critics[way].parameters(), *(ways[way][0].parameters() if ways[way][0] else [])],
                                  lr=1e-5) for way in ways}  # fmt: skip

    def inputs(rows: dict[str, torch.Tensor], way: str, enc: TextTowers | None) -> tuple[torch.Tensor, ...]:
        if enc is None:
            pooled = frozen
        elif way.endswith("per input"):
            pooled = {key: enc(KEYS[key], table, rows[key]) for key in KEYS}
        else:
            pooled = enc.encode(table, {key: (KEYS[key], rows[key]) for key in KEYS})
        state = torch.cat([vlm_s, pooled["goal"], pooled["before_type"], pooled["before_text"]], 1)
        action = torch.cat([vlm_a, pooled["taken_type"], pooled["taken_text"]], 1)
        after = torch.cat([vlm_next, pooled["goal"], pooled["taken_type"], pooled["taken_text"]], 1)
        return state, action, after

    def step(b: dict[str, list[str]], way: str) -> float:
        rows = {k: table.rows(v) for k, v in b.items()}
        towers, target_towers = ways[way]
        critic, opt = critics[way], opts[way]
        start = time.perf_counter()
        with torch.no_grad():
            state_t, action_t, after = inputs(rows, way, target_towers)
            y_q = sum(critic.v(after)) / 2
            y_v = sum(critic.q(state_t, action_t)) / 2
        state, action, _ = inputs(rows, way, towers)
        loss = sum((q - y_q).pow(2).mean() for q in critic.q(state, action)) + sum(
            (v - y_v).pow(2).mean() for v in critic.v(state)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        return time.perf_counter() - start

    times: dict[str, list[float]] = {way: [] for way in ways}
    for b in batches:
        for way in ways:
            times[way].append(step(b, way))
    median = {way: statistics.median(t) for way, t in times.items()}
    distinct = statistics.mean(len({t for texts in b.values() for t in texts}) for b in batches)
    print(f"distinct texts a batch: {distinct:.0f} of {5 * args.batch}")
    for way, t in median.items():
        print(f"{way:<28} {1000 * t:7.1f} ms a step  ({t / median['frozen']:.1f}x frozen)")
    print(f"tower_step_ratio={median[WAYS[-1]] / median['frozen']:.1f}")


if __name__ == "__main__":
    main()
