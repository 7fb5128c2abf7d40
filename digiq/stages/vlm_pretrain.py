"""Stage 03: pretrain the tiny VLM to read screens, before the representation fine-tune.

Digi-Q's VLM is LLaVA-1.5, which has read images and text before Digi-Q
fine-tunes it; the tiny VLM built here starts from random weights, and a
vision tower that was never trained gives the critic features that hold
little of the screen. This stage is the CPU-sized stand-in for LLaVA's
pretraining: free-text questions about screens of the train tasks, answered
from each screen's view hierarchy (:mod:`digiq.models.vlm_pretrain`), and
accuracy per question on screens of the validation tasks that the training
screens do not contain.

A released LLaVA (``vlm_finetune.checkpoint``) is pretrained already: the
stage then records that and trains nothing. With no objectives or no steps
the saved VLM is the random initialisation: the fine-tune then starts blind,
as it did before this stage existed.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from digiq import parallel
from digiq.config import EnvConfig, Settings, VLMFinetuneConfig, VLMPretrainConfig
from digiq.data.screen_corpus import LabelledScreen, labelled_screens, screen_images
from digiq.data.task_lists import read_tasks
from digiq.data.trajectories import TrajectoryStore
from digiq.env.state import Dynamics
from digiq.env.tasks import TASK_SETS, Task
from digiq.io import StageError, atomic_write_text, require
from digiq.models.checkpoint import read_tokenizer
from digiq.models.vlm import ScreenVLM, VLMConfig, lr_factor
from digiq.models.vlm_pretrain import Question, ask, correct
from digiq.paths import Paths
from digiq.progress import progress
from digiq.rollout import ExpertPolicy, rollout
from digiq.stages.common import one_run_at_a_time, save_curve_plot, timed, write_metrics

__all__ = ["run", "run_vlm_pretrain", "record_screens", "questions", "accuracy"]


def record_screens(folder: Path, tasks: Sequence[Task], *, noise: float, seed: int, dynamics: Dynamics,
                   width: int) -> TrajectoryStore:  # fmt: skip
    """The noisy expert's episode on each task, stored with every screen's view hierarchy.

    A run cut short resumes with the tasks not yet stored (:func:`digiq.rollout.rollout`).
    """
    store = TrajectoryStore(folder)
    rollout(ExpertPolicy(noise, seed), tasks, n_envs=32, seed=seed, dynamics=dynamics, width=width, store=store,
            desc=f"screens of {folder.name}", hierarchies=True)  # fmt: skip
    return store


def questions(objectives: Sequence[str], screens: Sequence[LabelledScreen], bases: Sequence[np.ndarray],
              vlm: ScreenVLM, n: int, rng: random.Random) -> list[Question]:  # fmt: skip
    """``n`` questions, each of an objective and about a screen drawn at random."""
    labels = sorted({e.label for s in screens for e in s.elements})
    out = []
    for _ in range(n):
        i = rng.randrange(len(screens))
        out.append(ask(rng.choice(list(objectives)), screens[i], bases[i], vlm.recipe, rng, labels))
    return out


@torch.no_grad()
def accuracy(vlm: ScreenVLM, asked: Sequence[Question], batch: int = 64) -> float:
    """The share of ``asked`` the VLM's greedy answers get right."""
    vlm.model.eval()
    right = 0
    for i in range(0, len(asked), batch):
        b = asked[i : i + batch]
        answers = vlm.greedy_answers([q.image for q in b], [q.prompt for q in b])
        right += sum(correct(q, a) for q, a in zip(b, answers, strict=True))
    return right / max(1, len(asked))


def _most_common_rate(asked: Sequence[Question]) -> float:
    """How often the most common expected answer would be right: what answering without looking gets."""
    common = Counter(q.answer for q in asked).most_common(1)[0][0]
    return sum(correct(q, common) for q in asked) / len(asked)


@one_run_at_a_time("vlm_pretrain")
def run_vlm_pretrain(cfg: VLMPretrainConfig, finetune: VLMFinetuneConfig, env: EnvConfig, paths: Paths,
                     tasks_per_set: int | None = None) -> dict[str, Any]:  # fmt: skip
    """Pretrain the tiny VLM (on the policy's offline tokenizer) and save it to :attr:`Paths.vlm_pretrained`.

    Screens come from the noisy expert's episodes on the first
    ``tasks_per_set`` train tasks of each task set (all with ``None``) and on
    as many validation tasks.
    """
    metrics: dict[str, Any] = {}
    if finetune.checkpoint:
        paths.vlm_pretrained.mkdir(parents=True, exist_ok=True)
        atomic_write_text(paths.vlm_pretrained / "released.json", json.dumps({"checkpoint": finetune.checkpoint}))
        write_metrics(paths, "vlm_pretrain", {"released": finetune.checkpoint})
        return {"released": finetune.checkpoint}
    require("vlm_pretrain", paths.base_policy / "tokenizer")
    with timed(metrics):
        # From the initialisation ScreenVLM.fresh() rebuilds, which the blind ablation fine-tunes instead.
        vlm = ScreenVLM.tiny(read_tokenizer(paths.base_policy),
                             VLMConfig(image_size=cfg.image_size, hidden=cfg.hidden, recipe=finetune.recipe),
                             seed=0)  # fmt: skip
        vlm.model.to(parallel.device())  # a GPU when there is one
        stores = {}
        with timed(metrics, "screens_time_s"):
            for split in ("train", "val"):
                tasks = [t for ts in TASK_SETS for t in read_tasks(paths, ts, split, tasks_per_set, "vlm_pretrain")]
                stores[split] = record_screens(paths.screens / split, tasks, noise=cfg.expert_noise, seed=cfg.seed,
                                               dynamics=Dynamics.of(env), width=env.width)  # fmt: skip
            train = labelled_screens(stores["train"])
            held = labelled_screens(stores["val"], exclude=train)
            if not train:
                raise StageError("stage vlm_pretrain: no train screen shows a labelled element; the view hierarchies "
                                 f"under {paths.screens / 'train'} list nothing to ask about")  # fmt: skip
            bases = vlm.recipe.base(screen_images(stores["train"], train))
            held_bases = vlm.recipe.base(screen_images(stores["val"], held)) if held else []
        rng = random.Random(cfg.seed)
        # Held-out accuracy needs validation screens unlike every training screen; a tiny run may have none.
        evals = (
            {o: questions([o], held, held_bases, vlm, cfg.eval_questions, rng) for o in cfg.objectives} if held else {}
        )
        before = {o: round(accuracy(vlm, q), 4) for o, q in evals.items()}
        curve = _train(vlm, cfg, train, bases, rng) if cfg.objectives else []
        after = {o: round(accuracy(vlm, q), 4) for o, q in evals.items()}
        vlm.save(paths.vlm_pretrained, stage="vlm_pretrain", steps=len(curve), objectives=list(cfg.objectives))
    metrics.update({
        "screens_train": len(train),
        "screens_heldout": len(held),
        "steps": len(curve),
        "accuracy_heldout_before": before,
        "accuracy_heldout": after,
        "most_common_answer_heldout": {o: round(_most_common_rate(q), 4) for o, q in evals.items()},
        "train_loss_last": round(float(np.mean(curve[-50:])), 4) if curve else None,
    })  # fmt: skip
    save_curve_plot(paths.plots / "vlm_pretrain_loss.png", {"answer loss": curve}, "Stage 03: VLM pretraining")
    write_metrics(paths, "vlm_pretrain", metrics)
    return metrics


def _train(vlm: ScreenVLM, cfg: VLMPretrainConfig, screens: list[LabelledScreen], bases: list[np.ndarray],
           rng: random.Random) -> list[float]:  # fmt: skip
    """``cfg.steps`` AdamW steps on fresh questions, every weight trained; the loss curve."""
    torch.manual_seed(cfg.seed)
    opt = torch.optim.AdamW(vlm.model.parameters(), lr=cfg.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg.steps, cfg.warmup, "cosine"))
    vlm.model.train()
    curve = []
    for _ in progress(range(cfg.steps), desc="pretrain VLM"):
        batch = questions(cfg.objectives, screens, bases, vlm, cfg.batch_size, rng)
        loss = vlm.text_loss([q.image for q in batch], [q.prompt for q in batch], [q.answer for q in batch])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vlm.model.parameters(), 1.0)
        opt.step()
        schedule.step()
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"vlm_pretrain: the loss is {loss.item()} at step {len(curve)}; lower lr")
        curve.append(loss.item())
    vlm.model.eval()
    return curve


def run(settings: Settings, paths: Paths) -> dict[str, Any]:
    """Stage 03 as ``params.yaml`` sets it."""
    return run_vlm_pretrain(settings.vlm_pretrain,
                            settings.vlm_finetune,
                            settings.env, paths)  # fmt: skip
