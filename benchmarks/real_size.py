"""The real models at real size, built from configs (no download): parameter counts, memory, GPU throughput.

Auto-UI-Base (flan-T5-base + AutoUI's fusion of one 1408-d feature), the
BLIP-2 ViT-g vision tower that makes that feature, and LLaVA-1.5-7B (CLIP
ViT-L/14-336 + Llama-7B), each through the same classes the pipeline uses.
On any machine the models are built on the meta device (no memory) and their
parameters counted; the memory table follows from the counts (weights in
bf16 for inference; bf16 weights + fp32 master copy + AdamW moments for full
fine-tuning, 16 bytes per parameter, and 1/N of that per process when stage
03 shards them over N processes; activations come on top). With
``--forward`` and a CUDA GPU, each model is materialised with random weights
in bf16 and timed on a batch of real-shaped inputs; the peak memory of that
forward pass is measured too. With ``--stages`` and a CUDA GPU, the pipeline's
own code runs at real size: stage 05's ``ScreenVLM.embed`` and stage 04's
fine-tune step (last 4 layers, and LoRA rank 16; each with and without
gradient checkpointing) on LLaVA-1.5-7B, both again with the real preset's
recipe (``original``), and the Auto-UI-Base sampling loop
of stages 01, 02 and 08; each is timed with its peak memory.
``real_stages.py`` runs the stage functions around them.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

import numpy as np
import torch
from transformers import (
    Blip2VisionConfig,
    Blip2VisionModel,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
)

from digiq.env.actions import tap
from digiq.env.taskgen import generate_tasks
from digiq.models.policy import AutoUIPolicy, PolicyConfig
from digiq.models.tokenizer import default_corpus, llava_style_tokenizer, train_tokenizer
from digiq.models.vlm import ScreenVLM, VLMConfig, llava_processor
from digiq.models.vlm_recipes import LLAVA_TEMPLATE, TinyRecipe
from digiq.stages.vlm_finetune import add_lora, checkpoint_layers, trainable

M = TypeVar("M", bound=torch.nn.Module)

GB = 1024**3


def autoui_base() -> AutoUIPolicy:
    cfg = PolicyConfig(d_model=768, d_ff=2048, d_kv=64, num_heads=12, num_layers=12, image_dim=1408, copy=False,
                       vocab_size=32128, tie_word_embeddings=False, image_encoder="blip2", max_input_tokens=512,
                       max_action_tokens=128, dropout=0.0)  # fmt: skip
    return AutoUIPolicy(cfg, train_tokenizer(default_corpus(n_tasks=50), vocab_size=400))


def blip2_vision() -> Blip2VisionModel:
    return Blip2VisionModel(Blip2VisionConfig())  # the defaults are ViT-g/14 at 224: 1408 wide, 39 layers


def llava_7b(image_token_index: int = 32000) -> LlavaForConditionalGeneration:
    vision = CLIPVisionConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                              image_size=336, patch_size=14, projection_dim=768, hidden_act="quick_gelu")  # fmt: skip
    text = LlamaConfig(vocab_size=32064, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096)  # fmt: skip
    cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_index=image_token_index,
                      vision_feature_layer=-2, image_seq_length=576)  # fmt: skip
    return LlavaForConditionalGeneration(cfg)


MODELS: dict[str, Callable[[], torch.nn.Module]] = {
    "Auto-UI-Base": autoui_base,
    "BLIP-2 ViT-g (vision)": blip2_vision,
    "LLaVA-1.5-7B": llava_7b,
}


def count(build: Callable[[], torch.nn.Module]) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in build().parameters())


def on_gpu(build: Callable[[], M]) -> M:
    """``build()`` with random weights made straight on the GPU in bf16: no 28 GB fp32 copy on the CPU first."""
    torch.manual_seed(0)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            return build().eval()
    finally:
        torch.set_default_dtype(before)


def forward_pass(name: str, batch: int) -> Callable[[], object]:
    """One bf16 forward pass of ``name`` on the GPU with random weights and real-shaped inputs."""
    model = on_gpu(MODELS[name])
    if name == "Auto-UI-Base":
        prompts = ["Previous Actions: Goal: Search for a vegetarian restaurant near me on Google Maps"] * batch
        feats = torch.randn(batch, 1408)
        labels = ['Action Decision: "action_type": "DUAL_POINT", "touch_point": "[0.52, 0.31]"'] * batch
        return lambda: model.action_logprobs(prompts, feats, labels)
    if name.startswith("BLIP-2"):
        x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
        return lambda: model(pixel_values=x)
    ids = torch.full((batch, 576 + 64), 1, device="cuda")
    ids[:, 1 : 1 + 576] = 32000  # LLaVA-1.5's 576 image tokens, then the prompt
    x = torch.randn(batch, 3, 336, 336, device="cuda", dtype=torch.bfloat16)
    return lambda: model(input_ids=ids, pixel_values=x, attention_mask=torch.ones_like(ids))


def timed(run: Callable[[], object], repeats: int = 5) -> tuple[float, float]:
    """Seconds per call of ``run`` (after one warm-up call) and the peak GB allocated on the GPU while timing."""
    run()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(repeats):
        run()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeats, torch.cuda.max_memory_allocated() / GB


def timed_forward(name: str, batch: int, repeats: int = 5) -> tuple[float, float]:
    """Items per second and peak GB of a bf16 forward pass on the GPU."""
    run = forward_pass(name, batch)
    with torch.no_grad():
        dt, peak = timed(run, repeats)
    del run
    torch.cuda.empty_cache()
    return batch / dt, peak


def screen_vlm_7b() -> ScreenVLM:
    """Stage 04/04's ``ScreenVLM`` around a random LLaVA-1.5-7B, with an offline LLaVA-style tokenizer and processor."""
    tasks = generate_tasks("general", "train", 300, 0) + generate_tasks("webshop", "train", 150, 0)
    corpus = [
        LLAVA_TEMPLATE.format(TinyRecipe(336).question(tap(0.5, 0.5), t)) + a for t in tasks for a in (" Yes", " No")
    ]
    tok = llava_style_tokenizer(corpus, vocab_size=4000)
    model = on_gpu(lambda: llava_7b(tok.convert_tokens_to_ids("<image>")))
    cfg = VLMConfig(image_size=336, patch_size=14, vision_hidden=1024, vision_layers=24, hidden=4096, layers=32,
                    heads=32, prompt_template=LLAVA_TEMPLATE)  # fmt: skip
    return ScreenVLM(model, llava_processor(tok, 336, 14), cfg)


def _train_step(vlm: ScreenVLM, params: list[torch.nn.Parameter], images: list[np.ndarray], prompts: list[str],
                labels: torch.Tensor) -> Callable[[], None]:  # fmt: skip
    """One stage-04 step: Yes/No loss, backward, AdamW."""
    opt = torch.optim.AdamW(params, lr=1e-5)
    vlm.model.train()

    def step() -> None:
        opt.zero_grad()
        vlm.loss(images, prompts, labels).backward()
        opt.step()

    return step


def _llava_rows(images: list[np.ndarray], prompts: list[str], train_batch: int) -> list[tuple[str, str, float, float]]:
    """Stage 05's embedding, then stage 04's step (last 4 layers, LoRA; with and without checkpointing) on LLaVA-7B.

    A step that runs out of GPU memory is reported as such (rate NaN, peak infinite) and the next one goes on.
    """
    vlm = screen_vlm_7b()
    with torch.no_grad():
        dt, peak = timed(lambda: vlm.embed(images, prompts), 3)
    rows = [("05 embed", f"LLaVA-1.5-7B `ScreenVLM.embed`, tiny recipe, batch {len(images)}", len(images) / dt, peak)]
    rows += _original_rows(vlm, len(images), train_batch)
    images, prompts = images[:train_batch], prompts[:train_batch]
    labels = torch.tensor([i % 2 for i in range(train_batch)])
    for what in ("last 4 layers", "LoRA rank 16"):
        params = trainable(vlm, 4) if what == "last 4 layers" else add_lora(vlm, 16, 32.0)
        for recompute in (True, False):
            if recompute:
                checkpoint_layers(vlm)
            else:
                vlm.model.activation_checkpointing_disable()
            label = f"LLaVA-1.5-7B, {what}{', checkpointing' if recompute else ''}, AdamW step, batch {train_batch}"
            try:
                dt, peak = timed(_train_step(vlm, params, images, prompts, labels), 3)
                rows.append(("04 fine-tune", label, train_batch / dt, peak))
            except torch.OutOfMemoryError:
                rows.append(("04 fine-tune", label, float("nan"), float("inf")))
            for p in vlm.model.parameters():
                p.grad = None
            torch.cuda.empty_cache()
    return rows


def _original_rows(vlm: ScreenVLM, batch: int, train_batch: int) -> list[tuple[str, str, float, float]]:
    """The real preset's recipe on the same weights: embedding (prompt, then the answer token on its cache) and
    a step of LLaVA's next-token loss (last 4 layers, checkpointing), on 1080 x 2280 screens with a tap's icon."""
    original = ScreenVLM(vlm.model, vlm.processor, replace(vlm.cfg, recipe="original"))
    screens = [np.random.default_rng(i).integers(0, 256, (2280, 1080, 3), np.uint8) for i in range(batch)]
    actions = [tap(0.2 + 0.6 * i / batch, 0.5) for i in range(batch)]
    images = [original.recipe.mark(s, a) for s, a in zip(screens, actions, strict=True)]
    prompts = [original.recipe.question(a, "") for a in actions]
    with torch.no_grad():
        dt, peak = timed(lambda: original.embed(images, prompts), 3)
    rows = [("05 embed", f"LLaVA-1.5-7B `ScreenVLM.embed`, original recipe, batch {batch}", batch / dt, peak)]
    labels = torch.tensor([i % 2 for i in range(train_batch)])
    params = trainable(original, 4)
    checkpoint_layers(original)
    label = f"LLaVA-1.5-7B, original recipe's loss, last 4 layers, checkpointing, AdamW step, batch {train_batch}"
    try:
        dt, peak = timed(_train_step(original, params, images[:train_batch], prompts[:train_batch], labels), 3)
        rows.append(("04 fine-tune", label, train_batch / dt, peak))
    except torch.OutOfMemoryError:
        rows.append(("04 fine-tune", label, float("nan"), float("inf")))
    original.model.activation_checkpointing_disable()
    for p in original.model.parameters():
        p.grad = None
    torch.cuda.empty_cache()
    return rows


def _autoui_rows(goals: list[str]) -> list[tuple[str, str, float, float]]:
    """The Auto-UI-Base sampling loop at stage 01/07's one action per state and stage 02's 16 candidates."""
    batch = len(goals)
    policy = on_gpu(autoui_base)
    feats = torch.randn(batch, 1408)
    steps = policy.cfg.max_action_tokens  # random weights never write the end token: every sample runs this long
    rows = []
    with torch.no_grad():
        for n, stage in ((1, "01 collect, 09 eval"), (16, "02 augment")):
            dt, peak = timed(lambda n=n: policy.sample(goals, feats, n=n, noise=list(range(len(goals)))), 3)
            rows.append((stage, f"Auto-UI-Base sampling, {batch} states x {n}, tokens", batch * n * steps / dt, peak))
    return rows


def stage_timings(batch: int, train_batch: int) -> list[tuple[str, str, float, float]]:
    """(stage, what, items per second, peak GB) for the pipeline's own GPU work at real size."""
    rng = np.random.default_rng(0)
    tasks = generate_tasks("general", "test", batch, 1)
    images = [rng.integers(0, 256, (336, 336, 3), np.uint8) for _ in range(batch)]
    rows = _llava_rows(images, [TinyRecipe(336).question(tap(0.3, 0.6), t) for t in tasks], train_batch)
    torch.cuda.empty_cache()
    return rows + _autoui_rows([f"Previous Actions: Goal: {t}" for t in tasks])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forward", action="store_true", help="time bf16 forward passes (needs a CUDA GPU)")
    ap.add_argument("--stages", action="store_true", help="time the pipeline's GPU stages at real size (needs CUDA)")
    ap.add_argument("--batch", type=int, default=16, help="items per forward pass")
    ap.add_argument("--train-batch", type=int, default=8, help="pairs per stage-04 step (--stages)")
    args = ap.parse_args()
    print(
        "| model | parameters | bf16 weights (GB) | full fine-tune, AdamW (GB) | per process, sharded over 2 / 4 / 8 |"
    )
    print("|---|---|---|---|---|")
    for name, build in MODELS.items():
        n = count(build)
        shards = " / ".join(f"{16 * n / GB / k:.1f}" for k in (2, 4, 8))  # vlm_finetune.shard: 1/N of all 16 bytes
        print(f"| {name} | {n / 1e6:,.0f} M | {2 * n / GB:.1f} | {16 * n / GB:.1f} | {shards} |")
    if (args.forward or args.stages) and not torch.cuda.is_available():
        raise SystemExit("--forward and --stages need a CUDA GPU")
    if args.forward:
        print(f"\n| model (bf16 forward, batch {args.batch}) | items/s | peak GB | device |\n|---|---|---|---|")
        for name in MODELS:
            rate, peak = timed_forward(name, args.batch)
            print(f"| {name} | {rate:,.1f} | {peak:.1f} | {torch.cuda.get_device_name()} |")
    if args.stages:
        print("\n| stage | what (bf16) | items/s | peak GB | device |\n|---|---|---|---|---|")
        for stage, what, rate, peak in stage_timings(args.batch, args.train_batch):
            shown = ("out of memory", "-") if np.isinf(peak) else (f"{rate:,.1f}", f"{peak:.1f}")
            print(f"| {stage} | {what} | {shown[0]} | {shown[1]} | {torch.cuda.get_device_name()} |")


if __name__ == "__main__":
    main()
