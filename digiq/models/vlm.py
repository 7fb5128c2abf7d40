"""The VLM whose hidden states represent (screen, action) pairs for the critic.

Digi-Q fine-tunes LLaVA-1.5 to answer, for a screenshot with an action drawn
on it, whether the action changes the screen ("Yes"/"No"), then uses a
hidden state of the fine-tuned model as the action's representation. Here the
same ``transformers`` classes (``LlavaForConditionalGeneration`` with a
``LlavaProcessor``) run at a tiny size built from configs, with the offline
tokenizer; a real llava-hf checkpoint slots in through the same wrapper.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F
from transformers import (
    CLIPImageProcessor,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from digiq.env.actions import Action, ActionType
from digiq.io import atomic_path
from digiq.models.checkpoint import load_weights, read_config, save_checkpoint

__all__ = [
    "VLMConfig",
    "ScreenVLM",
    "question",
    "state_question",
    "draw_marker",
    "effect_label",
    "ANSWERS",
    "REPRESENTATION_PARTS",
    "LLAVA_TEMPLATE",
    "llava_processor",
]

ANSWERS = ("No", "Yes")
# The equal parts of a representation (ScreenVLM.answer_logits), in order; the oracle reports on each.
REPRESENTATION_PARTS = ("answer_slot", "pooled")
_RED = np.array([230, 30, 60], np.uint8)


@dataclass(frozen=True)
class VLMConfig:
    image_size: int = 96  # square input of the vision tower (LLaVA-1.5: 336)
    patch_size: int = 16
    vision_hidden: int = 64
    vision_layers: int = 2
    hidden: int = 128  # language model width = representation size (LLaVA-1.5-7B: 4096)
    layers: int = 2
    heads: int = 4
    max_text_tokens: int = 96
    # How a question is wrapped for the model: "{}" for the tiny VLM, LLaVA-1.5's chat turn for a released one.
    prompt_template: str = "{}"
    # The llava-hf folder the weights started from ("" = the tiny VLM built from this config).
    source: str = ""


# LLaVA-1.5's conversation format (llava-hf model cards): the answer slot is the position after "ASSISTANT:".
LLAVA_TEMPLATE = "USER: {} ASSISTANT:"


def question(action: Action, task: str) -> str:
    """The Yes/No question Digi-Q asks about an action, worded per action type."""
    if action.type is ActionType.DUAL_POINT:
        what = "tapping at the red circle" if action.is_tap else "swiping along the red line"
    elif action.type is ActionType.TYPE:
        what = f'typing "{action.text}"'
    elif action.type is ActionType.INVALID:
        what = "an invalid action"
    else:
        what = {ActionType.PRESS_BACK: "pressing Back", ActionType.PRESS_HOME: "pressing Home",
                ActionType.PRESS_ENTER: "pressing Enter"}.get(action.type, "declaring the task done")  # fmt: skip
    return f"<image>\nTask: {task}\nDoes {what} change the screen? Answer:"


def state_question(task: str) -> str:
    """The prompt whose representation stands for the state alone (for V(s))."""
    return f"<image>\nTask: {task}\nWhat is on the screen? Answer:"


def draw_marker(image: np.ndarray, action: Action) -> np.ndarray:
    """``image`` (any size) with the action marked in red: a ring for a tap, a line for a swipe.

    Drawn at the VLM's input resolution with numpy, which is what keeps
    embedding N candidates per state cheap.
    """
    out = image.copy()
    h, w = out.shape[:2]
    if action.type is not ActionType.DUAL_POINT:
        out[-max(2, h // 24) :, :] = _RED  # a bar: "something other than a touch"
        return out
    yy, xx = np.mgrid[0:h, 0:w]
    (ty, tx), (ly, lx) = action.touch, action.lift
    r = max(2.0, w / 16)
    if action.is_tap:
        d = np.hypot(yy - ty * (h - 1), xx - tx * (w - 1))
        out[(d > r - 1.5) & (d < r + 0.5)] = _RED
    else:
        for s in np.linspace(0, 1, 2 * max(h, w)):
            out[round((ty + s * (ly - ty)) * (h - 1)), round((tx + s * (lx - tx)) * (w - 1))] = _RED
        out[np.hypot(yy - ly * (h - 1), xx - lx * (w - 1)) < r / 2] = _RED
    return out


def effect_label(before: np.ndarray, after: np.ndarray, threshold: float = 30.0) -> bool:
    """Digi-Q's label: "Yes" when the mean squared pixel change at 1/4 scale exceeds ``threshold``."""

    def quarter(x: np.ndarray) -> np.ndarray:
        t = torch.as_tensor(x).permute(2, 0, 1)[None].float()
        return F.interpolate(t, scale_factor=0.25, mode="area")[0].numpy()

    return float(((quarter(before) - quarter(after)) ** 2).mean()) > threshold


class ScreenVLM:
    """A LLaVA model plus its processor: Yes/No loss, answers, and representations."""

    def __init__(self, model: LlavaForConditionalGeneration, processor: LlavaProcessor, cfg: VLMConfig) -> None:
        self.model, self.processor, self.cfg = model, processor, cfg
        self.answer_ids = _answer_ids(processor.tokenizer)

    @classmethod
    def tiny(cls, tokenizer: PreTrainedTokenizerFast, cfg: VLMConfig | None = None, seed: int = 0) -> "ScreenVLM":
        """A freshly initialised tiny LLaVA (CLIP vision tower + Llama) built from configs, no download."""
        cfg = cfg or VLMConfig()
        torch.manual_seed(seed)
        n_patches = (cfg.image_size // cfg.patch_size) ** 2
        vision = CLIPVisionConfig(hidden_size=cfg.vision_hidden, intermediate_size=2 * cfg.vision_hidden,
                                  num_hidden_layers=cfg.vision_layers, num_attention_heads=4,
                                  image_size=cfg.image_size, patch_size=cfg.patch_size)  # fmt: skip
        text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=cfg.hidden, intermediate_size=2 * cfg.hidden,
                           num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.heads,
                           max_position_embeddings=n_patches + cfg.max_text_tokens + 8,
                           pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)  # fmt: skip
        llava = LlavaConfig(vision_config=vision, text_config=text,
                            image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
                            vision_feature_select_strategy="default", vision_feature_layer=-1,
                            image_seq_length=n_patches)  # fmt: skip
        return cls(
            LlavaForConditionalGeneration(llava), llava_processor(tokenizer, cfg.image_size, cfg.patch_size), cfg
        )

    @classmethod
    def from_pretrained(cls, folder: Path | str, dtype: str = "auto") -> "ScreenVLM":
        """A released LLaVA-1.5 in the llava-hf layout (``llava-hf/llava-1.5-7b-hf`` as saved by ``transformers``).

        Its processor's tokenizer and image statistics are used; screenshots
        are resized whole to the tower's square input (no centre crop, which
        would cut off a phone screen's top and bottom) and questions are asked
        in LLaVA-1.5's chat turn.
        """
        folder = Path(folder)
        if not (folder / "config.json").exists():
            raise FileNotFoundError(f"no llava-hf checkpoint in {folder} (config.json missing)")
        model = LlavaForConditionalGeneration.from_pretrained(
            folder, dtype=dtype if dtype == "auto" else getattr(torch, dtype)
        )
        processor = LlavaProcessor.from_pretrained(folder)
        ip, vision, text = processor.image_processor, model.config.vision_config, model.config.text_config
        crop = getattr(ip, "crop_size", None) or {}
        size = crop.get("height") or ip.size.get("height") or ip.size["shortest_edge"]
        cfg = VLMConfig(image_size=int(size), patch_size=vision.patch_size, vision_hidden=vision.hidden_size,
                        vision_layers=vision.num_hidden_layers, hidden=text.hidden_size, layers=text.num_hidden_layers,
                        heads=text.num_attention_heads, prompt_template=LLAVA_TEMPLATE, source=str(folder))  # fmt: skip
        return cls(model.eval(), processor, cfg)

    def fresh(self) -> "ScreenVLM":
        """The same VLM before any fine-tune: the released weights, or the tiny one's initialisation (seed 0)."""
        if self.cfg.source:
            return ScreenVLM.from_pretrained(self.cfg.source, dtype=str(self.model.dtype).removeprefix("torch."))
        raw = ScreenVLM.tiny(self.processor.tokenizer, self.cfg, seed=0)
        raw.model.eval()
        return raw

    def small_image(self, screenshot: np.ndarray) -> np.ndarray:
        """The screenshot at the vision tower's square input size (uint8)."""
        return self.small_images([screenshot])[0]

    def small_images(self, screenshots: list[np.ndarray], chunk: int = 64) -> list[np.ndarray]:
        """Many screenshots resized in chunks, each result its own small array.

        Resizing one at a time leaves the allocator fragmented by the
        full-size float temporaries (about 0.75 MB kept per image: gigabytes
        for a dataset); chunked, the temporaries are few and large.
        """
        s, out = self.cfg.image_size, []
        for i in range(0, len(screenshots), chunk):
            t = torch.as_tensor(np.stack(screenshots[i : i + chunk])).permute(0, 3, 1, 2).float()
            small = F.interpolate(t, size=(s, s), mode="area").round().clamp(0, 255).byte().permute(0, 2, 3, 1).numpy()
            out += [np.array(x) for x in small]  # copies: no view keeps the chunk alive
        return out

    def _inputs(self, images: list[np.ndarray], prompts: list[str]) -> dict[str, torch.Tensor]:
        """What ``LlavaProcessor`` makes, for images already at the tower's size, without its slow PIL path."""
        ip, tok = self.processor.image_processor, self.processor.tokenizer
        x = torch.as_tensor(np.stack(images)).permute(0, 3, 1, 2).float() / 255.0
        mean, std = torch.tensor(ip.image_mean)[:, None, None], torch.tensor(ip.image_std)[:, None, None]
        n = self.model.config.image_seq_length
        tok.padding_side = "left"  # so the last position is every row's answer slot
        image = self.processor.image_token
        texts = [self.cfg.prompt_template.replace("{}", p, 1).replace(image, image * n) for p in prompts]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        pixels = ((x - mean) / std).to(self.model.dtype)
        return {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask, "pixel_values": pixels}

    def answer_logits(self, images: list[np.ndarray], prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(No, Yes) logits at the answer slot, and the representation (B, 2 * hidden).

        The representation is the last layer's hidden state at the answer slot
        (what the Yes/No fine-tune shapes, Digi-Q's representation) next to the
        hidden states averaged over every layer and every non-padding position.
        The tiny VLM has no pretraining, so a fine-tune on one Yes/No question
        reduces its answer slot to little more than that answer: a TD critic on
        it alone tracked held-out returns with correlation 0.05 (0.48 on the
        untuned model's). The pooled states keep what the model read of the
        screen and the task (a ridge fit of returns from state features: 0.47
        with them, 0.29 without). A pretrained LLaVA keeps that in its answer
        slot; there the pooled half is redundant but harmless.
        """
        inputs = {k: v.to(self.model.device) for k, v in self._inputs(images, prompts).items()}
        out = self.model(**inputs, output_hidden_states=True)
        mask = inputs["attention_mask"][:, :, None].to(out.hidden_states[-1].dtype)
        pooled = torch.stack([(h * mask).sum(1) / mask.sum(1) for h in out.hidden_states]).mean(0)
        return out.logits[:, -1, self.answer_ids], torch.cat([out.hidden_states[-1][:, -1], pooled], -1)

    def loss(self, images: list[np.ndarray], prompts: list[str], labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of the Yes/No answer (labels: 1 = Yes)."""
        logits, _ = self.answer_logits(images, prompts)
        return F.cross_entropy(logits, labels.to(logits.device))

    @torch.no_grad()
    def embed(self, images: list[np.ndarray], prompts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Representations (B, 2 * hidden) float32 and P(Yes) (B,)."""
        logits, rep = self.answer_logits(images, prompts)
        return rep.float().cpu().numpy(), torch.softmax(logits.float(), -1)[:, 1].cpu().numpy()

    def save(self, folder: Path | str, **meta: object) -> None:
        """Our config.json beside the weights: the tiny VLM's own files, a released one's llava-hf folder ``hf/``."""
        folder = Path(folder)
        if not self.cfg.source:
            self.processor.tokenizer.save_pretrained(folder / "tokenizer")
            save_checkpoint(folder, self.model, "vlm", self.cfg, **meta)
            return
        self.model.save_pretrained(folder / "hf")
        self.processor.save_pretrained(folder / "hf")
        with atomic_path(folder / "config.json") as tmp:  # last: a folder without it is no checkpoint
            tmp.write_text(json.dumps({"vlm": asdict(self.cfg), "meta": meta}, indent=2))

    @classmethod
    def load(cls, folder: Path | str) -> "ScreenVLM":
        folder = Path(folder)
        cfg = VLMConfig(**read_config(folder, "vlm"))
        if cfg.source:
            released = cls.from_pretrained(folder / "hf", dtype="auto")  # as fine-tuned
            return cls(released.model, released.processor, cfg)
        vlm = cls.tiny(PreTrainedTokenizerFast.from_pretrained(folder / "tokenizer"), cfg)
        load_weights(folder, vlm.model)
        vlm.model.eval()
        return vlm


def llava_processor(tokenizer: PreTrainedTokenizerBase, image_size: int, patch_size: int) -> LlavaProcessor:
    """LLaVA-1.5's processor around ``tokenizer``: square ``image_size`` input resized whole (no centre crop).

    For VLMs built here rather than loaded: the tiny one and the real-size
    benchmarks; a released checkpoint brings its own processor.
    """
    square = {"height": image_size, "width": image_size}
    images = CLIPImageProcessor(size=square, do_center_crop=False, crop_size=square)
    return LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=patch_size,
                          vision_feature_select_strategy="default", image_token="<image>",
                          num_additional_image_tokens=1)  # fmt: skip


def _answer_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The one token each answer is after "Answer:": " Yes" in the offline BPE, "▁Yes" in LLaVA's SentencePiece."""
    prefix = tokenizer("Answer:", add_special_tokens=False).input_ids
    ids = []
    for answer in ANSWERS:
        full = tokenizer(f"Answer: {answer}", add_special_tokens=False).input_ids
        if full[: len(prefix)] != prefix or len(full) != len(prefix) + 1:
            raise ValueError(f"the tokenizer must make {answer!r} one token after 'Answer:'; it gives {full}")
        ids.append(full[-1])
    if len(set(ids)) != len(ANSWERS) or tokenizer.unk_token_id in ids:
        raise ValueError(f"the tokenizer needs distinct known tokens for the answers {ANSWERS}, got ids {ids}")
    return ids
