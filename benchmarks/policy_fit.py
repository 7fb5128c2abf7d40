"""The policy fit's step before and after, in one run: milliseconds per optimizer step at the actor's batch.

"before" is :func:`whole_batch_loss`, ``AutoUIPolicy.loss`` as it was,
copied here: the whole batch padded to its longest prompt and action, the
copy head's mixture over the whole vocabulary at every position, the
targets' log-probabilities read off it. "after" is this checkout's
``AutoUIPolicy.loss``: the rows in groups of like prompt length
(``--groups``, each timed), each group padded to its own longest, and the
mixture's probability of the target token only.

A step is what :func:`digiq.models.policy_fit.fit_policy` runs: the loss,
its backward pass, the gradient's norm clipped, an AdamW update, the model
in training mode (dropout on) on one thread, as in a fit's worker process.
The rows are real states: the pipeline's test tasks of both task sets,
each after 0 to 4 steps of the noisy expert (``benchmarks/policy_step.py``'s),
with the prompt a policy sees there and the expert's next action as the
target; a step's ``--batch`` rows are drawn uniformly with replacement, as
the actor's are. The policy is ``--policy`` (a checkpoint) or, by default,
an untrained one of the base policy's committed architecture and
vocabulary: the work of a step depends on the shapes, not on the weights.
Each variant steps a copy of the same policy through the same batches, the
variants alternating step by step.

Outputs: with dropout off (evaluation mode), on the first batch, the loss
and every gradient of each variant against before's: the largest relative
difference of the loss, and the largest difference of a gradient over the
largest gradient entry.

Last line: ``policy_fit_speedup=<number>`` (before's ms per step over after's at the default group).
"""

from __future__ import annotations

import argparse
import copy
import random
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers.modeling_outputs import BaseModelOutput

from digiq.config import BasePolicyConfig, TasksConfig
from digiq.data.trajectories import observation_text
from digiq.env import AndroidSimEnv
from digiq.env.actions import format_action
from digiq.env.expert import Expert
from digiq.env.taskgen import generate_tasks
from digiq.env.tasks import TASK_SETS, parse_task
from digiq.models.policy import AutoUIPolicy, PolicyConfig
from digiq.models.tokenizer import default_corpus, train_tokenizer

Loss = Callable[[AutoUIPolicy, list[str], torch.Tensor, list[str]], torch.Tensor]


def whole_batch_loss(model: AutoUIPolicy, prompts: list[str], images: torch.Tensor, actions: list[str]) -> torch.Tensor:
    """``AutoUIPolicy.loss`` (unweighted) as it was: one forward pass of the whole batch over the whole vocabulary."""
    enc = model.encode(prompts, images)
    labels = model._labels(actions)
    pad = model.tokenizer.pad_token_id
    written = F.pad(model.t5._shift_right(labels.masked_fill(labels == -100, pad)), (1, 0), value=pad)
    out = model.t5(encoder_outputs=BaseModelOutput(last_hidden_state=enc["states"]), attention_mask=enc["mask"],
                   decoder_input_ids=written[:, 1:], output_hidden_states=model.copy is not None)  # fmt: skip
    if model.copy is None:
        logp = torch.log_softmax(out.logits.float(), -1)
    else:
        probs = model._next_token_probs(enc, out.logits, out.decoder_hidden_states[-1], written)
        logp = torch.log(probs.clamp_min(1e-12))
    logp = logp.gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    keep = labels != -100
    return (-(logp * keep).sum(-1) / keep.sum(-1).clamp(min=1)).mean()


def expert_rows(n: int, seed: int = 0) -> tuple[list[str], np.ndarray, list[str]]:
    """``n`` (prompt, screenshot, action) rows: a test task after 0-4 steps of the expert with noise 0.3, and the
    expert's next action there."""
    cfg = TasksConfig()
    tasks = [parse_task(line, ts) for ts in TASK_SETS
             for line in generate_tasks(ts, "test", 320, cfg.seed, cfg.split_seed)]  # fmt: skip
    env, rng = AndroidSimEnv(), np.random.default_rng(seed)
    prompts, shots, actions = [], [], []
    while len(prompts) < n:
        task = tasks[int(rng.integers(len(tasks)))]
        obs, _ = env.reset(seed=len(prompts), options={"task": task})
        expert, history, done = Expert(0.3, len(prompts)), [], False
        for _ in range(int(rng.integers(5))):
            action = format_action(expert.act(env.device, task))
            obs, _, done, _, _ = env.step(action)
            history.append(action)
            if done:
                break
        if not done:
            prompts.append(observation_text(history, task.instruction))
            shots.append(obs["screenshot"])
            actions.append(format_action(expert.act(env.device, task)))
    return prompts, np.stack(shots), actions


def grouped_loss(group: int) -> Loss:
    return lambda model, prompts, images, actions: model.loss(prompts, images, actions, group=group)


def gradients(model: AutoUIPolicy, loss: Loss, batch: tuple[list[str], torch.Tensor, list[str]]) -> tuple[float, list]:
    model.zero_grad()
    value = loss(model, *batch)
    value.backward()
    return float(value.detach()), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", type=Path, default=None, help="policy checkpoint (default: an untrained base policy)")
    ap.add_argument("--states", type=int, default=960, help="states the batches are drawn from")
    ap.add_argument("--batch", type=int, default=128, help="rows per step (actor.batch_size)")
    ap.add_argument("--steps", type=int, default=12, help="optimizer steps per variant")
    ap.add_argument("--groups", default="32,16,64", help="group sizes of after, the first the default")
    args = ap.parse_args()
    torch.set_num_threads(1)  # as in a fit's worker process on the 2-core machine

    if args.policy is None:
        cfg = BasePolicyConfig()
        torch.manual_seed(0)
        tokenizer = train_tokenizer(default_corpus(seed=cfg.seed), cfg.vocab_size)
        base = AutoUIPolicy(PolicyConfig(d_model=cfg.d_model, num_layers=cfg.num_layers, d_ff=2 * cfg.d_model,
                                         image_dim=cfg.d_model), tokenizer)  # fmt: skip
    else:
        base = AutoUIPolicy.load(args.policy)
    prompts, shots, actions = expert_rows(args.states)
    shots = base.screen.prepare(shots)
    rng = random.Random(0)
    batches = []
    for _ in range(args.steps):
        drawn = [rng.randrange(args.states) for _ in range(args.batch)]
        batches.append(([prompts[i] for i in drawn], shots[drawn], [actions[i] for i in drawn]))
    tokens = [(len(base.tokenizer(p).input_ids), len(base.tokenizer(a).input_ids)) for p, a in zip(prompts, actions)]
    print(f"rows={args.batch} states={args.states} prompt tokens {np.mean([t[0] for t in tokens]):.1f} "
          f"(longest {max(t[0] for t in tokens)}), action tokens {np.mean([t[1] for t in tokens]):.1f} "
          f"(longest {max(t[1] for t in tokens)})")  # fmt: skip
    groups = [int(g) for g in args.groups.split(",")]
    variants: dict[str, Loss] = {"before": whole_batch_loss, **{f"after/{g}": grouped_loss(g) for g in groups}}

    base.eval()  # dropout off: the variants' losses and gradients compared
    want_loss, want_grads = gradients(base, whole_batch_loss, batches[0])
    for name, loss in variants.items():
        got_loss, got_grads = gradients(base, loss, batches[0])
        top = max(float(w.abs().max()) for w in want_grads)
        worst = max(float((g - w).abs().max()) for g, w in zip(got_grads, want_grads, strict=True))
        print(f"{name:<9} dropout off: loss {got_loss:.7f} (before {want_loss:.7f}, relative difference "
              f"{abs(got_loss - want_loss) / want_loss:.1e}), gradients differ by {worst / top:.1e} of the largest")  # fmt: skip

    models = {name: copy.deepcopy(base).train() for name in variants}
    optims = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in models.items()}
    took = dict.fromkeys(variants, 0.0)
    for k, batch in enumerate(batches):
        order = list(variants) if k % 2 == 0 else list(reversed(variants))
        for name in order:
            model, opt = models[name], optims[name]
            t0 = time.perf_counter()
            opt.zero_grad()
            variants[name](model, *batch).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            took[name] += time.perf_counter() - t0
    for name in variants:
        print(f"{name:<9} {1000 * took[name] / args.steps:7.1f} ms/step  ({args.batch} rows, dropout on, 1 thread)")
    print(f"policy_fit_speedup={took['before'] / took[f'after/{groups[0]}']:.2f}")


if __name__ == "__main__":
    main()
