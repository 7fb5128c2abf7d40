"""Stage 04: fine-tune the pretrained VLM on "does this action change the screen?".

Labels come for free from the data: Digi-Q calls an action effective when
the screenshot changes enough (mean squared pixel difference at 1/4 scale
above a threshold). The question is asked with the action drawn on the
screenshot, so the VLM's hidden state learns where actions land and whether
they do anything; stage 05 uses that hidden state as the action's features.
"""

from __future__ import annotations

import contextlib
import math
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.tensor import DTensor

from digiq import parallel
from digiq.config import Settings, VLMFinetuneConfig
from digiq.data.trajectories import TrajectoryStore, split_trajectories
from digiq.env.actions import parse_action
from digiq.io import require
from digiq.models.vlm import ScreenVLM, effect_label, lr_factor, trainable
from digiq.paths import Paths
from digiq.progress import progress
from digiq.stages.common import one_run_at_a_time, save_curve_plot, timed, write_metrics, written_whole

__all__ = ["run", "run_vlm_finetune", "labelled_pairs", "add_lora", "merge_lora"]

# With compute.processes > 1, every process takes its share of the fine-tune's batches (digiq.parallel).
DATA_PARALLEL = True

# The language model's linear layers (Llama names); the vision tower's q/k/v/out projections stay frozen.
LORA_TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)$"


def labelled_pairs(store: TrajectoryStore, vlm: ScreenVLM, threshold: float) -> list[dict[str, Any]]:
    """One (marked image, question, Yes/No label) per stored transition."""
    rows = store.read().select(["traj_id", "task", "image_path", "next_image_path", "action"]).to_pylist()
    out = []
    for i in progress(range(0, len(rows), 64), desc="label transitions"):
        batch = rows[i : i + 64]
        # The label compares a screen with the next one pixel by pixel: a pair of two sizes is named.
        pairs = [store.load_images([r["image_path"], r["next_image_path"]]) for r in batch]
        bases = vlm.recipe.base([before for before, _ in pairs])
        for r, (before, after), base in zip(batch, pairs, bases, strict=True):
            action = parse_action(r["action"])
            label = int(effect_label(before, after, threshold))
            out.append({"traj_id": r["traj_id"], "image": vlm.recipe.mark(base, action),
                        "prompt": vlm.recipe.question(action, r["task"]), "label": label})  # fmt: skip
    return out


def _loss(vlm: ScreenVLM, pairs: list[dict[str, Any]]) -> torch.Tensor:
    return vlm.loss(
        [p["image"] for p in pairs], [p["prompt"] for p in pairs], torch.tensor([p["label"] for p in pairs])
    )


@torch.no_grad()
def _accuracy(vlm: ScreenVLM, pairs: list[dict[str, Any]], batch: int = 128) -> float:
    vlm.model.eval()
    hits = 0
    for i in range(0, len(pairs), batch):
        b = pairs[i : i + batch]
        logits, _ = vlm.answer_logits([p["image"] for p in b], [p["prompt"] for p in b])
        hits += int((logits.argmax(-1).cpu() == torch.tensor([p["label"] for p in b])).sum())
    return hits / max(1, len(pairs))


def blocks(vlm: ScreenVLM) -> list[torch.nn.Module]:
    """The layers sharded each on its own (gathered whole one at a time): every transformer layer, LM and vision."""
    return [m for name, m in vlm.model.named_modules() if re.fullmatch(r".*\.layers\.\d+", name)]


def add_lora(vlm: ScreenVLM, rank: int, alpha: float) -> list[torch.nn.Parameter]:
    """Wrap ``vlm.model`` with rank-``rank`` LoRA adapters (peft); returns what trains: adapters and projector.

    As in LLaVA's own LoRA recipe, the projector from image features to the
    language model trains whole (it is small and task-specific). For
    LLaVA-1.5-7B at rank 16 that is 40 M adapter and 21 M projector weights
    beside 7 B frozen ones in bf16: about 14 GB before activations.
    ``merge_lora`` folds the adapters back, so the saved checkpoint is a
    plain llava-hf folder.
    """
    from peft import LoraConfig, get_peft_model

    vlm.model = get_peft_model(vlm.model, LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0,
                                                     target_modules=LORA_TARGETS))  # fmt: skip
    chosen = []
    for name, p in vlm.model.named_parameters():
        if "multi_modal_projector" in name:
            p.requires_grad_(True)
        if p.requires_grad:
            chosen.append(p)
    return chosen


def checkpoint_layers(vlm: ScreenVLM) -> None:
    """Keep only each layer's input in the forward pass and recompute the rest in backward.

    The projector trains in every mode, so the gradient runs back through all
    32 language-model layers and their activations are kept whatever trains:
    with LLaVA-1.5-7B that is most of a step's memory, more than one 80 GB
    GPU holds for a LoRA step (docs/real-models.md, "Memory and size of the
    real models"). The gradients are the same up to float rounding.
    """
    vlm.model.activation_checkpointing_enable({"use_reentrant": False})


def merge_lora(vlm: ScreenVLM) -> None:
    """Fold the LoRA adapters into the weights they adapt and drop peft's wrapper."""
    vlm.model = vlm.model.merge_and_unload()


@one_run_at_a_time("vlm_finetune")
def run_vlm_finetune(cfg: VLMFinetuneConfig, paths: Paths, blind: bool = False) -> dict[str, Any]:
    """Fine-tune the pretrained tiny VLM or, with ``cfg.checkpoint``, a released LLaVA; written to :attr:`Paths.vlm`.

    With ``blind`` the same fine-tune also runs on the VLM before any
    pretraining (its random initialisation), written to :attr:`Paths.vlm_blind`:
    the ablation that shows what pretraining gives. The folder is written
    whole: a run cut short leaves the previous one's VLMs.
    """
    require("vlm_finetune", paths.offline, *(() if cfg.checkpoint else (paths.vlm_pretrained / "config.json",)))
    if blind and cfg.checkpoint:
        raise ValueError("ablations.blind_vlm needs the tiny VLM: a released LLaVA has no blind counterpart here")
    metrics: dict[str, Any] = {}
    with written_whole(paths, "vlm") as paths, timed(metrics):
        if cfg.checkpoint:
            vlm = ScreenVLM.from_pretrained(cfg.checkpoint, cfg.dtype, recipe=cfg.recipe)
        else:
            vlm = ScreenVLM.load(paths.vlm_pretrained)
        metrics_of, curves = {}, {}
        metrics_of["finetuned"], curves["Yes/No loss"] = _finetune(cfg, vlm, paths, paths.vlm)
        if blind:
            metrics_of["blind"], curves["Yes/No loss, not pretrained"] = _finetune(
                cfg, vlm.fresh(), paths, paths.vlm_blind
            )
    metrics.update(metrics_of.pop("finetuned"))
    metrics.update(metrics_of)  # the blind VLM's, under "blind"
    if parallel.is_main():
        save_curve_plot(paths.plots / "vlm_finetune_loss.png", curves, "Stage 04: VLM fine-tune")
        write_metrics(paths, "vlm_finetune", metrics)
    parallel.barrier()
    return metrics


def _finetune(cfg: VLMFinetuneConfig, vlm: ScreenVLM, paths: Paths, out: Path) -> tuple[dict[str, Any], list[float]]:
    """Fine-tune ``vlm`` on the stored transitions' Yes/No labels, save it to ``out``; its metrics and loss curve."""
    metrics: dict[str, Any] = {}
    pairs = labelled_pairs(TrajectoryStore(paths.offline), vlm, cfg.threshold)
    held = split_trajectories([p["traj_id"] for p in pairs], cfg.holdout, cfg.seed)
    train = [p for p in pairs if p["traj_id"] not in held]
    test = [p for p in pairs if p["traj_id"] in held]
    acc_before = _accuracy(vlm, test)
    rng = random.Random(cfg.seed)
    vlm.model.to(parallel.device())
    if cfg.gradient_checkpointing:
        checkpoint_layers(vlm)
    if cfg.shard:
        parallel.shard_model(vlm.model, blocks(vlm))
    if cfg.lora_rank:
        torch.manual_seed(cfg.seed)  # the adapters' initialisation: the same run gives the same weights
        params = add_lora(vlm, cfg.lora_rank, cfg.lora_alpha)
    else:
        params = trainable(vlm, cfg.train_last_layers)
    metrics["trained_weights"] = sum(p.numel() for p in params)
    # What this process keeps of them (a sharded weight's local part): all, or about 1/N when sharded.
    metrics["trained_weights_per_process"] = sum(
        (p.to_local() if isinstance(p, DTensor) else p).numel() for p in params
    )
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    total = math.ceil(cfg.epochs * math.ceil(len(train) / cfg.batch_size))
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(step, total, cfg.warmup, cfg.schedule))
    compute = (torch.autocast(parallel.device().type, dtype=torch.bfloat16) if cfg.autocast
               else contextlib.nullcontext())  # fmt: skip
    curve: list[float] = []
    bar = progress(total=total, desc="fine-tune VLM")
    while len(curve) < total:  # whole epochs, then the fraction of one that is left
        vlm.model.train()
        rng.shuffle(train)
        for i in range(0, len(train), cfg.batch_size):
            if len(curve) == total:
                break
            opt.zero_grad()
            with compute:
                loss = parallel.backward_share(train[i : i + cfg.batch_size], lambda b: {"loss": _loss(vlm, b)},
                                               params, sharded=cfg.shard)["loss"]  # fmt: skip
            opt.step()
            schedule.step()
            curve.append(loss)
            bar.update()
    bar.close()
    if cfg.lora_rank:
        merge_lora(vlm)
    vlm.model.eval()
    acc_after = _accuracy(vlm, test)
    if cfg.shard:  # the shards gathered into a plain copy of the model, on the main process
        weights = parallel.full_weights(vlm.model)
        if parallel.is_main():
            vlm = vlm.fresh()
            vlm.model.load_state_dict(weights)
    if parallel.is_main():
        if cfg.autocast:  # what was computed in: the 16-bit weights a mixed-precision run publishes
            vlm.model.to(torch.bfloat16)
        vlm.save(out, stage="vlm_finetune", steps=len(curve))
    yes = np.mean([p["label"] for p in test]) if test else 0.0
    metrics.update(
        {
            "pairs_train": len(train),
            "pairs_heldout": len(test),
            "yes_rate_heldout": round(float(yes), 4),
            "majority_rate_heldout": round(float(max(yes, 1 - yes)), 4),
            "accuracy_heldout_before": round(acc_before, 4),
            "accuracy_heldout": round(acc_after, 4),
            "train_loss_last": round(float(np.mean(curve[-20:])), 4) if curve else None,
        }
    )
    return metrics, curve


def run(settings: Settings, paths: Paths) -> dict[str, Any]:
    """Stage 04 as ``params.yaml`` sets it (:func:`digiq.stages.launch.run_stage` runs it in one process or several)."""
    return run_vlm_finetune(settings.vlm_finetune, paths,
                            blind=settings.ablations.blind_vlm)  # fmt: skip
