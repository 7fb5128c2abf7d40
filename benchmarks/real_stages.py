"""Stages 04 and 05's own functions on a llava-hf folder of LLaVA-1.5-7B's size (random weights), timed on a GPU.

``real_size.py --stages`` times the models' calls; this runs the stages
around them as a user with a released checkpoint would: a llava-hf folder
is written with ``save_pretrained``, then ``run_vlm_finetune`` (bf16, last 4
layers, gradient checkpointing, one epoch) and ``run_embed`` (fine-tuned
and untuned, ``--batch`` rows per pass) run on expert rollouts of 8 train
tasks with 16 candidates per state. Each stage's wall time and peak GPU
memory are printed. ``--tiny`` builds a LLaVA of the same layout but tiny
widths and runs on the CPU: a check of this script where there is no GPU.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import yaml
from real_size import GB, llava_7b, on_gpu
from transformers import (
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
)

from digiq.config import EmbedConfig, Settings, load_params, load_settings
from digiq.data.trajectories import TrajectoryStore
from digiq.env.actions import format_action, press_back, tap
from digiq.env.taskgen import generate_tasks
from digiq.env.tasks import parse_task
from digiq.models.tokenizer import llava_style_tokenizer
from digiq.models.vlm import llava_processor
from digiq.models.vlm_recipes import LLAVA_TEMPLATE, TinyRecipe
from digiq.paths import Paths
from digiq.rollout import ExpertPolicy, rollout
from digiq.stages.embed import run_embed
from digiq.stages.vlm_finetune import run_vlm_finetune

ROOT = Path(__file__).resolve().parents[1]


def offline_root(root: Path) -> tuple[Paths, Settings]:
    """Stage 01 and 02's outputs in ``root``: noisy-expert rollouts of 8 train tasks, 16 candidates per state."""
    (root / "params.yaml").write_text(yaml.safe_dump(load_params()))  # one file: the stages read it from root
    settings = load_settings(root / "params.yaml")
    paths = Paths(root)
    tasks = [parse_task(t, "general") for t in generate_tasks("general", "train", 8, seed=3)]
    store = TrajectoryStore(paths.offline)
    rollout(ExpertPolicy(noise=0.3, seed=2), tasks, n_envs=8, seed=1, width=settings.env.width, store=store)
    steps = store.read().to_pandas()
    others = [format_action(tap(0.5, 0.5)), format_action(press_back())]
    others += [format_action(tap(0.1 * k, 0.3)) for k in range(1, 14)]
    paths.candidates.parent.mkdir(parents=True)
    pq.write_table(pa.table({"traj_id": steps.traj_id, "step_id": steps.step_id,
                             "action_list": [[a, *others] for a in steps.action],
                             "valid_list": [[True] * 16] * len(steps)}), paths.candidates)  # fmt: skip
    return paths, settings


def llava_folder(folder: Path, tiny: bool) -> None:
    """A llava-hf folder (config, weights, processor, LLaVA-style tokenizer) of LLaVA-1.5-7B's size, or tiny."""
    tasks = generate_tasks("general", "train", 100, 0)
    tok = llava_style_tokenizer([LLAVA_TEMPLATE.format(TinyRecipe(336).question(tap(0.5, 0.5), t)) + a
                                 for t in tasks for a in (" Yes", " No")], vocab_size=600)  # fmt: skip
    image = tok.convert_tokens_to_ids("<image>")
    if tiny:
        model = LlavaForConditionalGeneration(LlavaConfig(
            vision_config=CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=4, image_size=336, patch_size=14),
            text_config=LlamaConfig(vocab_size=32064, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096),
            image_token_index=image, image_seq_length=576, vision_feature_layer=-2))  # fmt: skip
    else:
        model = on_gpu(lambda: llava_7b(image))
    model.save_pretrained(folder)
    llava_processor(tok, 336, 14).save_pretrained(folder)


def peak_gb() -> float:
    return torch.cuda.max_memory_allocated() / GB if torch.cuda.is_available() else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="a tiny LLaVA of the same layout, on the CPU")
    ap.add_argument("--batch", type=int, default=16, help="stage 05's rows per forward pass (embed.batch_size)")
    args = ap.parse_args()
    if not args.tiny and not torch.cuda.is_available():
        raise SystemExit("LLaVA-1.5-7B's size needs a CUDA GPU; --tiny checks this script on the CPU")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        paths, settings = offline_root(root)
        folder = Path(tmp) / "llava-1.5-7b-hf"
        t0 = time.perf_counter()
        llava_folder(folder, args.tiny)
        print(f"llava-hf folder written in {time.perf_counter() - t0:.1f} s", flush=True)
        cfg = settings.vlm_finetune.but(
            checkpoint=str(folder),
            dtype="bfloat16",
            epochs=1,
            batch_size=8,
            train_last_layers=4,
            gradient_checkpointing=True,
        )
        for name, run in (
            ("04 vlm_finetune", lambda: run_vlm_finetune(cfg, paths)),
            ("05 embed", lambda: run_embed(EmbedConfig(batch_size=args.batch), paths, ("finetuned", "untuned"))),
        ):
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            metrics = run()
            print(f"stage {name}: {time.perf_counter() - t0:.1f} s, peak {peak_gb():.1f} GB, metrics {metrics}",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
