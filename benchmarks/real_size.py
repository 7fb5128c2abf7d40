"""The real models at real size, built from configs (no download): parameter counts, memory, GPU throughput.

Auto-UI-Base (flan-T5-base + AutoUI's fusion of one 1408-d feature), the
BLIP-2 ViT-g vision tower that makes that feature, and LLaVA-1.5-7B (CLIP
ViT-L/14-336 + Llama-7B), each through the same classes the pipeline uses.
On any machine the models are built on the meta device (no memory) and their
parameters counted; the memory table follows from the counts (weights in
bf16 for inference; bf16 weights + fp32 master copy + AdamW moments for full
fine-tuning, 16 bytes per parameter; activations come on top). With
``--forward`` and a CUDA GPU, each model is materialised with random weights
in bf16 and timed on a batch of real-shaped inputs; the peak memory of that
forward pass is measured too.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from transformers import (
    Blip2VisionConfig,
    Blip2VisionModel,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
)

from digiq.models.policy import AutoUIPolicy, PolicyConfig
from digiq.models.tokenizer import default_corpus, train_tokenizer

GB = 1024**3


def autoui_base() -> AutoUIPolicy:
    cfg = PolicyConfig(d_model=768, d_ff=2048, d_kv=64, num_heads=12, num_layers=12, image_dim=1408, copy=False,
                       vocab_size=32128, tie_word_embeddings=False, image_encoder="blip2", max_input_tokens=512,
                       max_action_tokens=128, dropout=0.0)  # fmt: skip
    return AutoUIPolicy(cfg, train_tokenizer(default_corpus(n_tasks=50), vocab_size=400))


def blip2_vision() -> Blip2VisionModel:
    return Blip2VisionModel(Blip2VisionConfig())  # the defaults are ViT-g/14 at 224: 1408 wide, 39 layers


def llava_7b() -> LlavaForConditionalGeneration:
    vision = CLIPVisionConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                              image_size=336, patch_size=14, projection_dim=768, hidden_act="quick_gelu")  # fmt: skip
    text = LlamaConfig(vocab_size=32064, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096)  # fmt: skip
    return LlavaForConditionalGeneration(LlavaConfig(vision_config=vision, text_config=text, image_token_index=32000,
                                                     vision_feature_layer=-2, image_seq_length=576))  # fmt: skip


MODELS: dict[str, Callable[[], torch.nn.Module]] = {
    "Auto-UI-Base": autoui_base,
    "BLIP-2 ViT-g (vision)": blip2_vision,
    "LLaVA-1.5-7B": llava_7b,
}


def count(build: Callable[[], torch.nn.Module]) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in build().parameters())


def forward_pass(name: str, batch: int) -> Callable[[], object]:
    """One bf16 forward pass of ``name`` on the GPU with random weights and real-shaped inputs."""
    torch.manual_seed(0)
    model = MODELS[name]().to("cuda", torch.bfloat16).eval()
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


def timed_forward(name: str, batch: int, repeats: int = 5) -> tuple[float, float]:
    """Items per second and peak GB of a bf16 forward pass on the GPU."""
    run = forward_pass(name, batch)
    with torch.no_grad():
        run()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(repeats):
            run()
        torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / repeats
    peak = torch.cuda.max_memory_allocated() / GB
    del run
    torch.cuda.empty_cache()
    return batch / dt, peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forward", action="store_true", help="time bf16 forward passes (needs a CUDA GPU)")
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    print("| model | parameters | bf16 weights (GB) | full fine-tune, AdamW (GB) |")
    print("|---|---|---|---|")
    for name, build in MODELS.items():
        n = count(build)
        print(f"| {name} | {n / 1e6:,.0f} M | {2 * n / GB:.1f} | {16 * n / GB:.1f} |")
    if args.forward:
        if not torch.cuda.is_available():
            raise SystemExit("--forward needs a CUDA GPU")
        print(f"\n| model (bf16 forward, batch {args.batch}) | items/s | peak GB | device |\n|---|---|---|---|")
        for name in MODELS:
            rate, peak = timed_forward(name, args.batch)
            print(f"| {name} | {rate:,.1f} | {peak:.1f} | {torch.cuda.get_device_name()} |")


if __name__ == "__main__":
    main()
