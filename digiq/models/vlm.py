"""The VLM whose hidden states represent (screen, action) pairs for the critic.

Digi-Q fine-tunes LLaVA-1.5 to answer, for a screenshot with an action drawn
on it, whether the action changes the screen ("Yes"/"No"), then uses a
hidden state of the fine-tuned model as the action's representation. Here the
same ``transformers`` classes (``LlavaForConditionalGeneration`` with a
``LlavaProcessor``) run at a tiny size built from configs, with the offline
tokenizer; a real llava-hf checkpoint slots in through the same wrapper.
How a pair is shown and asked, and which hidden state represents it, is the
VLM's recipe (:mod:`digiq.models.vlm_recipes`): ``tiny`` for the CPU model,
``original`` for Digi-Q's own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F
from transformers import (
    CLIPImageProcessorPil,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from digiq.io import atomic_folder, write_error
from digiq.models.checkpoint import (
    check_part,
    load_weights,
    part_digest,
    read_tokenizer,
    read_typed_config,
    save_checkpoint,
    write_config,
)
from digiq.models.vlm_recipes import LLAVA_TEMPLATE, RECIPES, TINY_RECIPES, Recipe, TinyRecipe, recipe

__all__ = [
    "VLMConfig",
    "lr_factor",
    "ScreenVLM",
    "effect_label",
    "recipe_for",
    "saved_recipe",
    "ANSWERS",
    "llava_processor",
    "trainable",
]

ANSWERS = ("No", "Yes")
HF = "hf"  # a released VLM's checkpoint: its llava-hf folder, beside our config.json


@dataclass(frozen=True)
class VLMConfig:
    image_size: int = 96  # square input of the vision tower (LLaVA-1.5: 336)
    patch_size: int = 16
    vision_hidden: int = 64
    vision_layers: int = 2
    hidden: int = 128  # language model width (LLaVA-1.5-7B: 4096)
    layers: int = 2
    heads: int = 4
    max_text_tokens: int = 96
    # How the tiny recipe wraps a question: "{}" for the tiny VLM, LLaVA-1.5's chat turn for a released one.
    prompt_template: str = "{}"
    # The llava-hf folder the weights started from ("" = the tiny VLM built from this config).
    source: str = ""
    # How pairs are shown, asked and represented (digiq.models.vlm_recipes): tiny | tiny_no_point | original.
    recipe: str = "tiny"

    def __post_init__(self) -> None:
        if self.recipe not in RECIPES:
            raise ValueError(f"unknown VLM recipe {self.recipe!r}; one of {RECIPES}")

    @property
    def representation_size(self) -> int:
        """The tiny recipe's answer slot and pooled states side by side; the original's answer token alone."""
        return 2 * self.hidden if self.recipe in TINY_RECIPES else self.hidden


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
        self.recipe: Recipe = recipe(cfg.recipe, cfg.image_size, processor.image_processor.image_mean,
                                     cfg.prompt_template)  # fmt: skip
        if self.recipe.bos and processor.tokenizer.bos_token_id is None:
            raise ValueError(f"the {cfg.recipe} recipe starts each prompt with the tokenizer's BOS token, and this "
                             "tokenizer has none (the tiny VLM's is the policy's T5-style one); use recipe tiny, or "
                             "a llava-hf checkpoint")  # fmt: skip

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
    def from_pretrained(cls, folder: Path | str, dtype: str = "auto", recipe: str = "tiny") -> "ScreenVLM":
        """A released LLaVA-1.5 in the llava-hf layout (``llava-hf/llava-1.5-7b-hf`` as saved by ``transformers``).

        Its processor's tokenizer and image statistics are used. With the
        ``tiny`` recipe, screenshots are resized whole to the tower's square
        input (no centre crop, which would cut off a phone screen's top and
        bottom) and questions are asked in LLaVA-1.5's chat turn; with
        ``original``, as Digi-Q asked it (:mod:`digiq.models.vlm_recipes`).
        """
        folder = Path(folder)
        if not (folder / "config.json").exists():
            raise FileNotFoundError(f"no llava-hf checkpoint in {folder} (config.json missing)")
        model = LlavaForConditionalGeneration.from_pretrained(
            folder, dtype=dtype if dtype == "auto" else getattr(torch, dtype)
        )
        processor = LlavaProcessor.from_pretrained(folder)
        vision, text = model.config.vision_config, model.config.text_config
        cfg = VLMConfig(image_size=_tower_size(processor.image_processor), patch_size=vision.patch_size, vision_hidden=vision.hidden_size,
                        vision_layers=vision.num_hidden_layers, hidden=text.hidden_size, layers=text.num_hidden_layers,
                        heads=text.num_attention_heads, prompt_template=LLAVA_TEMPLATE, source=str(folder),
                        recipe=recipe)  # fmt: skip
        return cls(model.eval(), processor, cfg)

    def fresh(self) -> "ScreenVLM":
        """The same VLM before any fine-tune: the released weights, or the tiny one's initialisation (seed 0)."""
        if self.cfg.source:
            dtype = str(self.model.dtype).removeprefix("torch.")
            return ScreenVLM.from_pretrained(self.cfg.source, dtype=dtype, recipe=self.cfg.recipe)
        raw = ScreenVLM.tiny(self.processor.tokenizer, self.cfg, seed=0)
        raw.model.eval()
        return raw

    def _inputs(self, images: list[np.ndarray], prompts: list[str]) -> dict[str, torch.Tensor]:
        """What ``LlavaProcessor`` makes, for images already at the tower's size, without its slow PIL path.

        Rows are padded on the left, so the last position is every row's
        answer slot; a recipe with ``bos`` starts each row with the tokenizer's
        BOS token, after the padding, as the model saw it in training.
        """
        ip, tok = self.processor.image_processor, self.processor.tokenizer
        x = torch.as_tensor(np.stack(images)).permute(0, 3, 1, 2).float() / 255.0
        mean, std = torch.tensor(ip.image_mean)[:, None, None], torch.tensor(ip.image_std)[:, None, None]
        n = self.model.config.image_seq_length
        tok.padding_side = "left"
        image = self.processor.image_token
        texts = [self.recipe.template(p).replace(image, image * n) for p in prompts]
        if self.recipe.bos:
            ids = [[tok.bos_token_id, *row] for row in tok(texts, add_special_tokens=False).input_ids]
            enc = tok.pad({"input_ids": ids}, padding=True, return_tensors="pt")
        else:
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        pixels = ((x - mean) / std).to(self.model.dtype)
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "pixel_values": pixels}

    def answer_logits(self, images: list[np.ndarray], prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(No, Yes) logits at the answer slot, and the representation (B, ``cfg.representation_size``).

        The ``original`` recipe's representation is Digi-Q's: the last layer's
        hidden state over the positions of the answer the model gives, read
        while it generates. Each answer is one token here ("▁Yes" / "▁No";
        the end token that follows is never fed back, so it has no state),
        so that is the state at the greedy answer's position, computed in one
        more step on the prompt's cache.

        The ``tiny`` recipe's is the last layer's hidden state at the answer
        slot next to the hidden states averaged over every layer and every
        non-padding position. A fine-tune on one Yes/No question can reduce
        the answer slot of a tiny VLM to little more than that answer (most
        of all one that was never pretrained, the blind ablation's); the
        pooled states keep what the model read of the screen and the task.

        Only the answer slot's logits are read, so only they are computed
        (``logits_to_keep=1``): the whole vocabulary at every other position
        of a row would be work nobody reads. The tiny recipe reads its two
        answers' logits as each row's own dot products with the final hidden
        state (:meth:`_answer_slot`), so that a row's P(Yes) has the same
        bits whatever rows share its batch.
        """
        inputs = {k: v.to(self.model.device) for k, v in self._inputs(images, prompts).items()}
        if self.recipe.name == "original":
            out = self.model(**inputs, use_cache=True, logits_to_keep=1)
            slot = out.logits[:, -1, self.answer_ids]
            answer = torch.tensor(self.answer_ids, device=slot.device)[slot.argmax(-1)]
            mask = torch.cat([inputs["attention_mask"], torch.ones_like(answer)[:, None]], 1)
            step = self.model(
                input_ids=answer[:, None], attention_mask=mask, cache=out.cache, output_hidden_states=True
            )
            return slot, step.hidden_states[-1][:, -1]
        out = self.model(**inputs, output_hidden_states=True, logits_to_keep=1)  # the model's own call: sharded too
        mask = inputs["attention_mask"][:, :, None].to(out.hidden_states[-1].dtype)
        pooled = torch.stack([(h * mask).sum(1) / mask.sum(1) for h in out.hidden_states]).mean(0)
        return self._answer_slot(out.hidden_states[-1][:, -1]), torch.cat([out.hidden_states[-1][:, -1], pooled], -1)

    def _answer_slot(self, last: torch.Tensor) -> torch.Tensor:
        """The two answers' logits from the final hidden state at the answer slot ``last`` (B, hidden).

        Each row's two dot products are summed on their own, so a row's
        logits do not depend on which rows share its batch; the LM head's
        matrix product over a batch of one row and over many picks different
        kernels, which differ in their last bits. Called after the model's
        forward pass, when a sharded model's head holds its whole weights.
        """
        head = self.model.get_output_embeddings()
        logits = (last[:, None, :] * head.weight[self.answer_ids]).sum(-1)
        return logits if head.bias is None else logits + head.bias[self.answer_ids]

    def loss(self, images: list[np.ndarray], prompts: list[str], labels: torch.Tensor) -> torch.Tensor:
        """The fine-tune's loss for Yes/No ``labels`` (1 = Yes).

        ``tiny``: cross-entropy of the two answers at the answer slot.
        ``original``: LLaVA's training loss on the reply "Yes</s>" or "No</s>":
        next-token cross-entropy over the whole vocabulary, for the answer
        token and for the end token after it, averaged over those tokens.

        Logits are computed at the positions the loss reads only, and the
        tiny recipe's loss skips the representation, which it does not read.
        """
        inputs = {k: v.to(self.model.device) for k, v in self._inputs(images, prompts).items()}
        if isinstance(self.recipe, TinyRecipe):
            logits = self.model(**inputs, logits_to_keep=1).logits[:, -1, self.answer_ids]
            return F.cross_entropy(logits, labels.to(logits.device))
        answer = torch.tensor(self.answer_ids, device=self.model.device)[labels.to(self.model.device)]
        inputs["input_ids"] = torch.cat([inputs["input_ids"], answer[:, None]], 1)
        inputs["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones_like(answer)[:, None]], 1)
        logits = self.model(**inputs, logits_to_keep=2).logits  # predicting the answer, then the end token
        targets = torch.stack([answer, torch.full_like(answer, self.processor.tokenizer.eos_token_id)], 1)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))

    def _with_answers(self, images: list[np.ndarray], prompts: list[str], answers: list[str]
                      ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:  # fmt: skip
        """The prompts (left-padded) followed by each answer and the end token (right-padded).

        Returns the model's inputs, the answer tokens (B, L) and their mask:
        position ``P - 1 + j`` of the joined rows predicts answer token ``j``.
        """
        tok = self.processor.tokenizer
        inputs = {k: v.to(self.model.device) for k, v in self._inputs(images, prompts).items()}
        ids = [[*tok(" " + a, add_special_tokens=False).input_ids, tok.eos_token_id] for a in answers]
        width = max(map(len, ids))
        answer = torch.tensor([row + [tok.pad_token_id] * (width - len(row)) for row in ids], device=self.model.device)
        mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids], device=self.model.device)
        inputs["input_ids"] = torch.cat([inputs["input_ids"], answer], 1)
        inputs["attention_mask"] = torch.cat([inputs["attention_mask"], mask], 1)
        return inputs, answer, mask

    def text_loss(self, images: list[np.ndarray], prompts: list[str], answers: list[str]) -> torch.Tensor:
        """Next-token cross-entropy of free-text ``answers`` (and the end token after each) given the prompts.

        How a VLM learns to answer in words, as LLaVA's pretraining and
        instruction tuning train it: used by the pretraining stage.
        """
        inputs, answer, mask = self._with_answers(images, prompts, answers)
        # Logits only where an answer token is predicted: from the prompt's last position to the answer's
        # second last token (its last, the end token, predicts nothing).
        logits = self.model(**inputs, logits_to_keep=answer.shape[1] + 1).logits[:, :-1].float()
        per_token = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), answer.reshape(-1), reduction="none")
        return (per_token * mask.reshape(-1)).sum() / mask.sum()

    @torch.no_grad()
    def greedy_answers(self, images: list[np.ndarray], prompts: list[str], max_tokens: int = 12) -> list[str]:
        """The answer the model writes to each prompt, a token at a time (greedy), up to its end token."""
        tok = self.processor.tokenizer
        inputs = {k: v.to(self.model.device) for k, v in self._inputs(images, prompts).items()}
        written = torch.empty(len(prompts), 0, dtype=torch.long, device=self.model.device)
        done = torch.zeros(len(prompts), dtype=torch.bool, device=self.model.device)
        for _ in range(max_tokens):
            ids = torch.cat([inputs["input_ids"], written], 1)
            mask = torch.cat([inputs["attention_mask"], torch.ones_like(written)], 1)
            logits = self.model(input_ids=ids, attention_mask=mask, pixel_values=inputs["pixel_values"],
                                logits_to_keep=1).logits  # fmt: skip
            nxt = logits[:, -1].argmax(-1).masked_fill(done, tok.eos_token_id)
            written = torch.cat([written, nxt[:, None]], 1)
            done |= nxt == tok.eos_token_id
            if done.all():
                break
        return [tok.decode([t for t in row if t != tok.eos_token_id], skip_special_tokens=True).strip()
                for row in written.tolist()]  # fmt: skip

    @torch.no_grad()
    def embed(self, images: list[np.ndarray], prompts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Representations (B, ``cfg.representation_size``) float32 and P(Yes) (B,)."""
        logits, rep = self.answer_logits(images, prompts)
        return rep.float().cpu().numpy(), torch.softmax(logits.float(), -1)[:, 1].cpu().numpy()

    def save(self, folder: Path | str, **meta: object) -> None:
        """Our config.json beside the weights: the tiny VLM's own files, a released one's llava-hf folder ``hf/``.

        ``folder`` is replaced whole, as every checkpoint is
        (:func:`~digiq.models.checkpoint.save_checkpoint`). ``hf/``'s digest
        covers its tokenizer, processor and config, not its weights.
        """
        folder = Path(folder)
        if not self.cfg.source:
            save_checkpoint(folder, self.model, "vlm", self.cfg, tokenizer=self.processor.tokenizer, **meta)
            return
        try:
            with atomic_folder(folder) as tmp:
                self.model.save_pretrained(tmp / HF)
                self.processor.save_pretrained(tmp / HF)
                write_config(tmp, "vlm", self.cfg, meta, {HF: part_digest(tmp / HF)})
        except OSError as e:
            raise write_error(folder, e) from None

    @classmethod
    def load(cls, folder: Path | str) -> "ScreenVLM":
        """A VLM :meth:`save` wrote; one whose parts were not saved together is refused, naming the part."""
        folder = Path(folder)
        cfg = read_typed_config(folder, "vlm", VLMConfig)
        if cfg.source:
            check_part(folder, HF, f"checkpoint {folder}: its {HF}/ folder is not the one its config was saved with")
            released = cls.from_pretrained(folder / HF, dtype="auto", recipe=cfg.recipe)  # as fine-tuned
            return cls(released.model, released.processor, cfg)
        vlm = cls.tiny(read_tokenizer(folder), cfg)
        load_weights(folder, vlm.model)
        vlm.model.eval()
        return vlm


def recipe_for(name: str, checkpoint: str = "", image_size: int = VLMConfig.image_size) -> Recipe:
    """The recipe a VLM with these settings asks with, without building the VLM (to show its pairs first)."""
    if checkpoint:
        ip = LlavaProcessor.from_pretrained(checkpoint).image_processor
        return recipe(name, _tower_size(ip), ip.image_mean, LLAVA_TEMPLATE)
    return recipe(name, image_size, CLIPImageProcessorPil().image_mean, VLMConfig.prompt_template)


def saved_recipe(folder: Path | str) -> Recipe:
    """The recipe of the VLM saved in ``folder`` (by :meth:`ScreenVLM.save`), read without loading its weights."""
    cfg = read_typed_config(folder, "vlm", VLMConfig)
    return recipe_for(cfg.recipe, str(Path(folder) / HF) if cfg.source else "", cfg.image_size)


def _tower_size(ip: CLIPImageProcessorPil) -> int:
    """The square input of a released processor: its crop size, else its resize target."""
    crop = getattr(ip, "crop_size", None) or {}
    return int(crop.get("height") or ip.size.get("height") or ip.size["shortest_edge"])


def llava_processor(tokenizer: PreTrainedTokenizerBase, image_size: int, patch_size: int) -> LlavaProcessor:
    """LLaVA-1.5's processor around ``tokenizer``: square ``image_size`` input resized whole (no centre crop).

    For VLMs built here rather than loaded: the tiny one and the real-size
    benchmarks; a released checkpoint brings its own processor.
    """
    square = {"height": image_size, "width": image_size}
    images = CLIPImageProcessorPil(size=square, do_center_crop=False, crop_size=square)
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


def trainable(vlm: ScreenVLM, last_layers: int) -> list[torch.nn.Parameter]:
    """Every weight (``last_layers`` 0), or only the projector and the language model's last layers and norm.

    A full fine-tune of LLaVA-1.5-7B needs about 105 GB for weights, gradients
    and AdamW state; with the last 4 of 32 layers trained in bf16, about 18 GB
    before activations.
    """
    params = dict(vlm.model.named_parameters())
    if last_layers == 0:
        return list(params.values())
    n = vlm.model.config.text_config.num_hidden_layers
    keep = ("multi_modal_projector.", "language_model.norm.",
            *(f"language_model.layers.{i}." for i in range(max(0, n - last_layers), n)))  # fmt: skip
    chosen = []
    for name, p in params.items():
        p.requires_grad_(any(k in name for k in keep))
        if p.requires_grad:
            chosen.append(p)
    return chosen


def lr_factor(step: int, total: int, warmup: float, schedule: str) -> float:
    """The learning rate at optimizer step ``step`` of ``total``, as a fraction of ``lr``.

    Linear warm-up from 0 over the first ``warmup`` of the steps (rounded
    up), then constant or a cosine decay towards 0 at the last step: the
    ``transformers`` Trainer's schedule, which LLaVA's fine-tune scripts use
    (warm-up 0.03, cosine).
    """
    ramp = math.ceil(warmup * total)
    if step < ramp:
        return step / ramp
    if schedule == "constant":
        return 1.0
    progress = (step - ramp) / max(1, total - ramp)
    return 0.5 * (1.0 + math.cos(math.pi * progress))
