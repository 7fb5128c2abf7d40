"""The VLM's logits at the positions read only, against the whole vocabulary at every position, in one run.

Stage 05 (embed) reads the (No, Yes) logits at each row's answer slot, stage
04's (vlm_finetune) loss the same two, and stage 03's (vlm_pretrain) loss
the positions that predict its answers' tokens. "before" is
:class:`~digiq.models.vlm.ScreenVLM`'s methods as they were, copied here: one
forward pass with the whole vocabulary's logits at every position of a row
(about 110), the read ones sliced out afterwards. "after" is ``ScreenVLM``
now (``logits_to_keep``). Both run the same VLM on the same rows:

- embed: :meth:`ScreenVLM.embed` on ``embed.batch_size`` rows a call (stage
  05 asks each batch's distinct rows: 256 for states, about 120 of each 256
  candidates), rows per second;
- fine-tune: one optimizer step of stage 04 (loss, backward, AdamW) on
  ``vlm_finetune.batch_size`` pairs, with the weights ``params.yaml`` trains
  (``train_last_layers``), milliseconds a step;
- pretrain: one optimizer step of stage 03 (text loss, backward, AdamW) on
  ``vlm_pretrain.batch_size`` questions answered in a few words.

The VLM is the pipeline's tiny one (``VLMConfig``'s defaults, on an offline
tokenizer of the base policy's size), freshly initialised: its weights do
not change the work. The rows are the simulator's screens of train tasks of
both task sets, marked with candidate actions as stage 02 draws them (taps,
Back, Home, typed texts) and asked the stage's question, so a batch is
left-padded as stage 05's are. Before and after alternate, so a change in
the machine's load falls on both; each figure is the fastest of
``--repeats`` rounds. The figures are the process's CPU seconds: on one
torch thread (the default, a worker's on the 2-core machine) that is the
work itself, where wall seconds on a shared machine also count the time
other processes held the core; the wall seconds are printed beside them.
Outputs compared on the same weights: embed's
representations bit for bit, and its P(Yes)'s largest difference (a row's
P(Yes) is now its own two dot products with the head's answer rows, the
same bits whatever shares its batch, where the whole head's product may
round its last bit otherwise); the losses' relative difference, and the
largest gradient difference over the largest gradient.

Last line: ``answer_slot_speedup=<number>`` (embed: after's rows per CPU second over before's), after
``finetune_step_speedup`` and ``pretrain_step_speedup`` (before's CPU time a step over after's).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from torch.nn import functional as F

from digiq.config import load_settings
from digiq.env import AndroidSimEnv
from digiq.env.actions import Action, press_back, press_home, tap, type_text
from digiq.env.taskgen import generate_tasks
from digiq.env.tasks import TASK_SETS, parse_task
from digiq.models.tokenizer import default_corpus, train_tokenizer
from digiq.models.vlm import ScreenVLM, VLMConfig, trainable
from digiq.workers import threads_per_worker

SCREENS = 24  # distinct screens the rows are drawn on (the work does not depend on their pixels)


def answer_logits_before(vlm: ScreenVLM, images: list[np.ndarray], prompts: list[str]
                         ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``ScreenVLM.answer_logits`` as it was (the tiny recipe's path): the whole vocabulary at every position."""
    inputs = {k: v.to(vlm.model.device) for k, v in vlm._inputs(images, prompts).items()}
    out = vlm.model(**inputs, output_hidden_states=True)
    mask = inputs["attention_mask"][:, :, None].to(out.hidden_states[-1].dtype)
    pooled = torch.stack([(h * mask).sum(1) / mask.sum(1) for h in out.hidden_states]).mean(0)
    return out.logits[:, -1, vlm.answer_ids], torch.cat([out.hidden_states[-1][:, -1], pooled], -1)


@torch.no_grad()
def embed_before(vlm: ScreenVLM, images: list[np.ndarray], prompts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``ScreenVLM.embed`` as it was."""
    logits, rep = answer_logits_before(vlm, images, prompts)
    return rep.float().cpu().numpy(), torch.softmax(logits.float(), -1)[:, 1].cpu().numpy()


def loss_before(vlm: ScreenVLM, images: list[np.ndarray], prompts: list[str], labels: torch.Tensor) -> torch.Tensor:
    """``ScreenVLM.loss`` as it was (the tiny recipe's path): the answer slot's logits, representation and all."""
    logits, _ = answer_logits_before(vlm, images, prompts)
    return F.cross_entropy(logits, labels.to(logits.device))


def text_loss_before(vlm: ScreenVLM, images: list[np.ndarray], prompts: list[str], answers: list[str]
                     ) -> torch.Tensor:  # fmt: skip
    """``ScreenVLM.text_loss`` as it was."""
    inputs, answer, mask = vlm._with_answers(images, prompts, answers)
    start = inputs["input_ids"].shape[1] - answer.shape[1] - 1
    logits = vlm.model(**inputs).logits[:, start : start + answer.shape[1]].float()
    per_token = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), answer.reshape(-1), reduction="none")
    return (per_token * mask.reshape(-1)).sum() / mask.sum()


def candidate(task: str, rng: np.random.Generator) -> Action:
    """A candidate action as stage 02's samples run: mostly taps, some Back, Home and typed text."""
    kind = rng.choice(4, p=[0.7, 0.1, 0.1, 0.1])
    if kind == 0:
        return tap(*rng.random(2))
    if kind == 1:
        return press_back()
    if kind == 2:
        return press_home()
    words = task.split()
    start = int(rng.integers(len(words)))
    return type_text(" ".join(words[start : start + int(rng.integers(1, 5))]))


def rows(vlm: ScreenVLM, n: int, seed: int) -> tuple[list[np.ndarray], list[str], list[str]]:
    """``n`` (marked screen, stage 04/05 question, task) rows on the simulator's screens of train tasks."""
    rng = np.random.default_rng(seed)
    tasks = [parse_task(t, ts) for ts in TASK_SETS for t in generate_tasks(ts, "train", SCREENS // 2, seed=seed)]
    env = AndroidSimEnv()
    screens = [env.reset(seed=i, options={"task": t})[0]["screenshot"] for i, t in enumerate(tasks)]
    bases = vlm.recipe.base(screens)
    images, prompts, asked = [], [], []
    for _ in range(n):
        i = int(rng.integers(len(tasks)))
        action = candidate(tasks[i].instruction, rng)
        images.append(vlm.recipe.mark(bases[i], action))
        prompts.append(vlm.recipe.question(action, tasks[i].instruction))
        asked.append(tasks[i].instruction)
    return images, prompts, asked


def pretraining_question(task: str, rng: np.random.Generator) -> tuple[str, str]:
    """A question of each of stage 03's objectives (element, point, presence) with an answer of its kind."""
    words = task.split()
    label = " ".join(words[int(rng.integers(len(words))) :][:2]).strip('",.?').lower()
    return [("<image>\nWhat does tapping at the red circle land on? Answer:", label),
            (f"<image>\nWhere is {label}? Answer:", f"{rng.random():.2f} {rng.random():.2f}"),
            (f"<image>\nIs there {label} on the screen? Answer:", "Yes")][int(rng.integers(3))]  # fmt: skip


def gradients(vlm: ScreenVLM, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every trained weight's gradient of ``loss``, by name (and the gradients cleared)."""
    loss.backward()
    grads = {name: p.grad.clone() for name, p in vlm.model.named_parameters() if p.grad is not None}
    vlm.model.zero_grad(set_to_none=True)
    return grads


def compare_loss(vlm: ScreenVLM, before: Callable[[], torch.Tensor], after: Callable[[], torch.Tensor]) -> str:
    """The two losses' relative difference and their gradients' largest difference over the largest gradient."""
    vlm.model.zero_grad(set_to_none=True)  # a fit's last step leaves its gradients
    want, got = before(), after()
    want_grads, got_grads = gradients(vlm, want), gradients(vlm, got)
    scale = max(float(g.abs().max()) for g in want_grads.values())
    worst = max(float((got_grads[k] - g).abs().max()) for k, g in want_grads.items())
    return f"loss relative difference {abs(got.item() - want.item()) / abs(want.item()):.2g}, gradients {worst / scale:.2g}"


class Timing(NamedTuple):
    """The fastest of a run's timings: CPU seconds of this process, and wall seconds."""

    cpu: float
    wall: float


def alternate(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, Timing]:
    """The fastest of ``repeats`` timings of each run (CPU and wall apart), the runs alternating."""
    cpu, wall = dict.fromkeys(runs, float("inf")), dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, run in runs.items():
            c0, w0 = time.process_time(), time.perf_counter()
            run()
            cpu[name] = min(cpu[name], time.process_time() - c0)
            wall[name] = min(wall[name], time.perf_counter() - w0)
    return {name: Timing(cpu[name], wall[name]) for name in runs}


def main() -> None:
    settings = load_settings()
    embed_cfg = settings.embed
    finetune_cfg = settings.vlm_finetune
    pretrain_cfg = settings.vlm_pretrain
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=embed_cfg.batch_size, help="embed: rows per call")
    ap.add_argument("--calls", type=int, default=4, help="embed: calls per timing")
    ap.add_argument("--steps", type=int, default=5, help="fine-tune and pretrain: optimizer steps per timing")
    ap.add_argument("--repeats", type=int, default=3, help="timings of each, alternating; the fastest is kept")
    ap.add_argument("--threads", type=int, default=threads_per_worker(2),
                    help="torch threads (default: a worker's, of two)")  # fmt: skip
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = VLMConfig(image_size=pretrain_cfg.image_size, hidden=pretrain_cfg.hidden, recipe=finetune_cfg.recipe)
    vlm = ScreenVLM.tiny(train_tokenizer(default_corpus()), cfg, seed=0)
    vlm.model.eval()

    # Embed: stage 05's calls.
    calls = [rows(vlm, args.batch, seed)[:2] for seed in range(args.calls)]
    widths = [vlm._inputs(images, prompts)["input_ids"].shape[1] for images, prompts in calls]
    outputs = [(embed_before(vlm, *c), vlm.embed(*c)) for c in calls]
    same_rep = all(np.array_equal(before[0], after[0]) for before, after in outputs)
    p_yes_diff = max(float(np.abs(before[1] - after[1]).max()) for before, after in outputs)
    embed_s = alternate({"before": lambda: [embed_before(vlm, *c) for c in calls],
                         "after": lambda: [vlm.embed(*c) for c in calls]}, args.repeats)  # fmt: skip
    n_rows = args.batch * args.calls
    print(f"embed: {args.calls} calls of {args.batch} rows, {min(widths)}-{max(widths)} positions a row; "
          f"torch threads {torch.get_num_threads()}, best of {args.repeats}")  # fmt: skip
    for k, t in embed_s.items():
        print(f"embed {k}: {n_rows / t.cpu:.1f} rows per CPU second ({n_rows / t.wall:.1f} rows/s wall)")
    print(f"representations bit-identical in every call: {same_rep}; P(Yes) largest difference {p_yes_diff:.1e}")

    # Fine-tune: stage 04's steps, with the weights it trains.
    pairs = [rows(vlm, finetune_cfg.batch_size, 100 + seed) for seed in range(args.steps)]
    labels = [torch.as_tensor(np.random.default_rng(seed).integers(0, 2, finetune_cfg.batch_size))
              for seed in range(args.steps)]  # fmt: skip
    opt = torch.optim.AdamW(trainable(vlm, finetune_cfg.train_last_layers), lr=finetune_cfg.lr)
    vlm.model.train()
    first = pairs[0][:2]
    compared = compare_loss(vlm, lambda: loss_before(vlm, *first, labels[0]), lambda: vlm.loss(*first, labels[0]))
    print(f"fine-tune, on the same weights: {compared}")

    def fit(loss: Callable[[list[np.ndarray], list[str], torch.Tensor], torch.Tensor]) -> None:
        for (images, prompts, _), y in zip(pairs, labels, strict=True):
            opt.zero_grad()
            loss(images, prompts, y).backward()
            opt.step()

    fit_s = alternate({"before": lambda: fit(lambda *a: loss_before(vlm, *a)), "after": lambda: fit(vlm.loss)},
                      args.repeats)  # fmt: skip
    for k, t in fit_s.items():
        print(f"fine-tune step {k} ({finetune_cfg.batch_size} pairs, train_last_layers "
              f"{finetune_cfg.train_last_layers}): {1000 * t.cpu / args.steps:.1f} CPU ms "
              f"({1000 * t.wall / args.steps:.1f} ms wall)")  # fmt: skip

    # Pretrain: stage 03's steps (every weight trains).
    for p in vlm.model.parameters():
        p.requires_grad_(True)
    opt = torch.optim.AdamW(vlm.model.parameters(), lr=pretrain_cfg.lr)
    rng = np.random.default_rng(0)
    questions = []
    for seed in range(args.steps):
        images, _, tasks = rows(vlm, pretrain_cfg.batch_size, 200 + seed)
        asked = [pretraining_question(t, rng) for t in tasks]
        questions.append((images, [q for q, _ in asked], [a for _, a in asked]))
    compared = compare_loss(vlm, lambda: text_loss_before(vlm, *questions[0]), lambda: vlm.text_loss(*questions[0]))
    print(f"pretrain, on the same weights: {compared}")

    def pretrain(loss: Callable[[list[np.ndarray], list[str], list[str]], torch.Tensor]) -> None:
        for q in questions:
            opt.zero_grad()
            loss(*q).backward()
            opt.step()

    pre_s = alternate({"before": lambda: pretrain(lambda *q: text_loss_before(vlm, *q)),
                       "after": lambda: pretrain(vlm.text_loss)}, args.repeats)  # fmt: skip
    for k, t in pre_s.items():
        print(f"pretrain step {k} ({pretrain_cfg.batch_size} questions): {1000 * t.cpu / args.steps:.1f} CPU ms "
              f"({1000 * t.wall / args.steps:.1f} ms wall)")  # fmt: skip
    print(f"finetune_step_speedup={fit_s['before'].cpu / fit_s['after'].cpu:.2f}")
    print(f"pretrain_step_speedup={pre_s['before'].cpu / pre_s['after'].cpu:.2f}")
    print(f"answer_slot_speedup={embed_s['before'].cpu / embed_s['after'].cpu:.2f}")


if __name__ == "__main__":
    main()
