"""Stage 00: the base policy, SFT on noisy expert demonstrations of train tasks.

It plays AutoUI's role: a starting agent that is weak but not useless.
Demonstrations come from the scripted expert with mistakes switched on, and
only a limited number of tasks is demonstrated.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import string
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerFast

from digiq import parallel
from digiq.config import BasePolicyConfig, EnvConfig, Settings
from digiq.data.task_lists import read_tasks, tasks_digest
from digiq.data.trajectories import TrajectoryStore, store_made_whole
from digiq.env.actions import ActionType, parse_action
from digiq.env.state import Dynamics
from digiq.env.tasks import TASK_SETS
from digiq.io import clear_leftovers
from digiq.models.blip2 import Blip2ImageFeatures
from digiq.models.policy import AutoUIPolicy, PolicyConfig
from digiq.models.policy_fit import FitRow, demo_rows, fit_policy, load_screens
from digiq.models.tokenizer import default_corpus, train_tokenizer
from digiq.paths import Paths
from digiq.rollout import ExpertPolicy, rollout
from digiq.stages.common import one_run_at_a_time, save_curve_plot, timed, write_metrics

__all__ = ["run", "run_base_policy", "randomize_copied_words"]

# With compute.processes > 1, every process takes its share of the SFT's batches (digiq.parallel).
DATA_PARALLEL = True

_TYPED = re.compile(r'("typed_text": ")(.*?)(")')
_WORD = re.compile(r"[A-Za-z0-9]{2,}")


def randomize_copied_words(row: FitRow, rng: random.Random, p: float = 0.5) -> FitRow:
    """The row with words that its typed text copies from the goal renamed to fresh pseudo-words.

    AutoUI's T5 comes pretrained and copies any word of the goal into its
    typed text; a tiny T5 trained from scratch on a few dozen train entities
    (24 Web Shopping queries) memorises them instead and types garbage for the
    unseen test entities, which then no offline method can repair. Renaming
    the copied words (each with probability ``p``, consistently in the goal,
    the typed text and the previous action's typed text) shows it thousands
    of entities, so copying is what it learns. Only the goal and typed texts
    change; the action's type and points, and the screenshot, stay.
    """
    goal_at = row.prompt.rfind(" Goal: ")
    if goal_at < 0:
        raise ValueError(f"demonstration prompt without ' Goal: ': {row.prompt[:80]!r}")
    goal = row.prompt[goal_at:]
    typed = {w.lower() for text in _TYPED.findall(row.prompt[:goal_at] + row.action) for w in _WORD.findall(text[1])}
    # In sorted order: a set's order follows the process's string hashing, and each word draws from ``rng``.
    copied = [w for w in sorted(typed) if re.search(rf"\b{w}\b", goal, re.IGNORECASE) and rng.random() < p]
    if not copied:
        return row
    letters = string.ascii_lowercase + string.digits
    fresh = {w: "".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for w in copied}
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, copied)) + r")\b", re.IGNORECASE)

    def rename(text: str) -> str:
        return pattern.sub(lambda m: _same_case(fresh[m.group(0).lower()], m.group(0)), text)

    def rename_typed(text: str) -> str:
        return _TYPED.sub(lambda m: m.group(1) + rename(m.group(2)) + m.group(3), text)

    return replace(row, prompt=rename_typed(row.prompt[:goal_at]) + rename(goal), action=rename_typed(row.action))


def _same_case(word: str, like: str) -> str:
    """``word`` capitalised as ``like`` is (all caps, first letter, or lower)."""
    if like.isupper() and len(like) > 1:
        return word.upper()
    return word.capitalize() if like[:1].isupper() else word


@one_run_at_a_time("base_policy")
def run_base_policy(cfg: BasePolicyConfig, env: EnvConfig, paths: Paths, split_seed: int = 0) -> dict[str, Any]:
    """SFT on demonstrations, or (``cfg.checkpoint``) the released Auto-UI-Base, saved as the base policy.

    ``split_seed`` is the task lists' (``tasks.split_seed``): the tokenizer's
    corpus is drawn from the same train entities.
    """
    if parallel.is_main():  # under the stage's lock: what runs cut short left beside the checkpoint is theirs
        clear_leftovers(paths.base_policy)
    if cfg.checkpoint:
        return _load_released(cfg, paths)
    metrics: dict[str, Any] = {}
    with timed(metrics):
        tasks = [t for ts in TASK_SETS for t in read_tasks(paths, ts, "train", cfg.demo_tasks, "base_policy")]
        # The new tokenizer waits beside the checkpoint, where every process reads it, until the checkpoint is
        # saved whole with it (AutoUIPolicy.save): a run cut short leaves the previous checkpoint as it was.
        pid = parallel.broadcast(os.getpid())  # the main process's: one run's processes share the folder
        staged = paths.base_policy.with_name(f".{paths.base_policy.name}.tmp-tokenizer-{pid}")
        if parallel.is_main():  # the demonstrations and the tokenizer are made once; other processes read them
            made_with = {"stage": "base_policy", "base_policy": cfg.model_dump(), "env": env.model_dump(),
                         "tasks": tasks_digest(tasks)}  # fmt: skip
            with store_made_whole(paths.demos, made_with) as filling:
                rollout(ExpertPolicy(cfg.expert_noise, cfg.seed), tasks, n_envs=32, seed=cfg.seed,
                        dynamics=Dynamics.of(env), width=env.width, store=filling, desc="demonstrations",
                        screen_text=cfg.screen_text)  # fmt: skip
            # The tokenizer learns from train-split text only: test entities stay unseen.
            corpus = default_corpus(seed=cfg.seed, split_seed=split_seed) + [t.instruction for t in tasks]
            train_tokenizer(corpus, cfg.vocab_size).save_pretrained(staged)
        parallel.barrier()
        store = TrajectoryStore(paths.demos)
        tokenizer = PreTrainedTokenizerFast.from_pretrained(staged)
        torch.manual_seed(cfg.seed)  # every process starts from the same weights
        image = {"image_dim": cfg.d_model} if not cfg.blip2 else {
            "image_encoder": "blip2", "image_encoder_path": cfg.blip2,
            "image_dim": Blip2ImageFeatures.from_pretrained(cfg.blip2).dim}  # fmt: skip
        # Room for the longest screen listing the simulator draws, with the goal and the previous action.
        prompt = {"screen_text": True, "max_input_tokens": 320} if cfg.screen_text else {}
        model = AutoUIPolicy(PolicyConfig(d_model=cfg.d_model, num_layers=cfg.num_layers, d_ff=2 * cfg.d_model,
                                          **image, **prompt), tokenizer)  # fmt: skip
        rows = demo_rows(store)
        rng = random.Random(cfg.seed)
        rows = [randomize_copied_words(r, rng, cfg.copy_augment) for r in rows]
        screens = load_screens(model, store, [r.image_path for r in rows])
        curve = fit_policy(model, rows, screens, epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
                           seed=cfg.seed, desc="SFT base policy")  # fmt: skip
        if parallel.is_main():
            model.save(paths.base_policy, stage="base_policy", steps=len(curve), demo_tasks=cfg.demo_tasks)
            shutil.rmtree(staged)
    demos = (
        store.read().group_by("traj_id").aggregate([("trajectory_reward", "max")])["trajectory_reward_max"].to_pylist()
    )
    losses = [p["loss"] for p in curve]
    metrics.update(
        {
            "demo_episodes": len(demos),
            "demo_episodes_by_family": dict(sorted(Counter(t.family for t in tasks).items())),
            "demo_success_rate": round(sum(d > 0 for d in demos) / len(demos), 4),
            "demo_steps": len(rows),
            "demo_home_presses": sum(parse_action(r.action).type is ActionType.PRESS_HOME for r in rows),
            "train_loss_first": round(losses[0], 4),
            "train_loss_last": round(sum(losses[-20:]) / len(losses[-20:]), 4),
            "parameters": sum(p.numel() for p in model.parameters()),
        }
    )
    if parallel.is_main():
        save_curve_plot(paths.plots / "base_policy_loss.png", {"SFT loss": losses}, "Stage 00: base policy SFT")
        write_metrics(paths, "base_policy", metrics)
    parallel.barrier()
    return metrics


def _load_released(cfg: BasePolicyConfig, paths: Paths) -> dict[str, Any]:
    """Auto-UI-Base from its local folder, written as our checkpoint; no demonstrations are made.

    Nothing is trained, so with several processes the main one does it all.
    """
    metrics: dict[str, Any] = {}
    if parallel.is_main():
        with timed(metrics):
            model = AutoUIPolicy.from_autoui(cfg.checkpoint, image_encoder_path=cfg.blip2)
            paths.demos.mkdir(parents=True, exist_ok=True)  # the stage's output, empty: AutoUI was trained on AitW
            model.save(paths.base_policy, stage="base_policy", source=str(cfg.checkpoint))
        metrics.update({"source": str(cfg.checkpoint), "parameters": sum(p.numel() for p in model.parameters())})
        title = f"Stage 00: no SFT, {Path(cfg.checkpoint).name} as released"
        save_curve_plot(paths.plots / "base_policy_loss.png", {}, title)
        write_metrics(paths, "base_policy", metrics)
    parallel.barrier()
    return metrics


def run(settings: Settings, paths: Paths) -> dict[str, Any]:
    """Stage 00 as ``params.yaml`` sets it (:func:`digiq.stages.launch.run_stage` runs it in one process or several)."""
    return run_base_policy(settings.base_policy, settings.env,
                           paths, split_seed=settings.tasks.split_seed)  # fmt: skip
