"""The policy: AutoUI's architecture (T5 + image features fused by gated attention).

AutoUI encodes the prompt ("Previous Actions: ... Goal: ...") with a T5
encoder, attends from every text state to projected image features with one
attention head, mixes the result in through a sigmoid gate, and decodes an
AutoUI action string with the T5 decoder. Here the same classes run at any
size: tiny by default (CPU, offline, with a small convolutional screenshot
encoder and an offline-built tokenizer), AutoUI-Base size for the real
checkpoint. Checkpoints describe themselves (config + weights + tokenizer).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_model, save_model
from torch import nn
from transformers import LogitsProcessor, LogitsProcessorList, PreTrainedTokenizerFast, T5Config, T5ForConditionalGeneration
from transformers.modeling_outputs import BaseModelOutput

from digiq.io import atomic_path

__all__ = ["PolicyConfig", "ScreenEncoder", "GatedImageFusion", "AutoUIPolicy"]


@dataclass(frozen=True)
class PolicyConfig:
    d_model: int = 128  # T5 width (AutoUI-Base: 768)
    d_ff: int = 256
    d_kv: int = 32
    num_heads: int = 4
    num_layers: int = 2  # encoder layers; the decoder has as many
    image_height: int = 114  # screenshots are resized to this before encoding
    image_width: int = 54
    image_grid: tuple[int, int] = (8, 4)  # screen regions the encoder summarises (rows, cols)
    image_dim: int = 128  # width of each region feature (AutoUI-Base: one 1408-d BLIP-2 feature)
    max_input_tokens: int = 96
    max_action_tokens: int = 48
    dropout: float = 0.1


class ScreenEncoder(nn.Module):
    """A small CNN: screenshot -> one feature per screen region (+ learned position)."""

    def __init__(self, cfg: PolicyConfig) -> None:
        super().__init__()
        c = cfg.image_dim
        self.net = nn.Sequential(
            nn.Conv2d(3, 32, 5, stride=2, padding=2), nn.GELU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.GELU(),
            nn.Conv2d(64, c, 3, stride=2, padding=1), nn.GELU(),
            nn.AdaptiveAvgPool2d(cfg.image_grid),
        )  # fmt: skip
        self.pos = nn.Parameter(torch.zeros(cfg.image_grid[0] * cfg.image_grid[1], c))
        self.size = (cfg.image_height, cfg.image_width)

    def prepare(self, images: np.ndarray | torch.Tensor) -> torch.Tensor:
        """(B, H, W, 3) uint8 screenshots of any size -> uint8 at the encoder's input size.

        Training preloads frames through this and rollouts pass live frames
        through it, so both see identically resampled pixels.
        """
        x = torch.as_tensor(np.asarray(images))
        if tuple(x.shape[1:3]) == self.size:
            return x
        x = F.interpolate(x.permute(0, 3, 1, 2).float(), size=self.size, mode="area")
        return x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()

    def forward(self, images: np.ndarray | torch.Tensor) -> torch.Tensor:
        """(B, H, W, 3) uint8 -> (B, regions, image_dim)."""
        x = self.prepare(images).to(self.pos.device).permute(0, 3, 1, 2).float() / 127.5 - 1.0
        return self.net(x).flatten(2).transpose(1, 2) + self.pos


class GatedImageFusion(nn.Module):
    """AutoUI's fusion: single-head attention from text states to image features, mixed in by a gate."""

    def __init__(self, d_model: int, image_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(image_dim, d_model)
        self.q, self.k, self.v = (nn.Linear(d_model, d_model) for _ in range(3))
        self.gate_text, self.gate_image = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def forward(self, text: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        img = self.proj(image)
        att = torch.softmax(self.q(text) @ self.k(img).transpose(1, 2) / math.sqrt(text.shape[-1]), dim=-1)
        image_att = att @ self.v(img)
        gate = torch.sigmoid(self.gate_text(text) + self.gate_image(image_att))
        return (1 - gate) * text + gate * image_att


class GumbelSampling(LogitsProcessor):
    """Sampling at ``temperature`` as greedy decoding of Gumbel-perturbed logits.

    argmax(logits / T + Gumbel noise) is an exact sample from softmax(logits / T),
    and on a CPU it is several times faster than ``torch.multinomial`` over the vocabulary,
    which dominated sampling 16 candidates per state.
    """

    def __init__(self, temperature: float) -> None:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.temperature = temperature

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        u = torch.rand_like(scores).clamp_(1e-10, 1.0)
        return scores / self.temperature - torch.log(-torch.log(u))


class AutoUIPolicy(nn.Module):
    """T5 encoder-decoder + screen features; reads prompts and screenshots, writes AutoUI action strings."""

    def __init__(self, cfg: PolicyConfig, tokenizer: PreTrainedTokenizerFast) -> None:
        super().__init__()
        self.cfg, self.tokenizer = cfg, tokenizer
        t5 = T5Config(
            vocab_size=len(tokenizer), d_model=cfg.d_model, d_ff=cfg.d_ff, d_kv=cfg.d_kv, num_heads=cfg.num_heads,
            num_layers=cfg.num_layers, num_decoder_layers=cfg.num_layers, pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.pad_token_id,
            feed_forward_proj="gated-gelu", tie_word_embeddings=True, dropout_rate=cfg.dropout,
        )  # fmt: skip
        self.t5 = T5ForConditionalGeneration(t5)
        self.screen = ScreenEncoder(cfg)
        self.fusion = GatedImageFusion(cfg.d_model, cfg.image_dim)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    # ------------------------------------------------------------ encoding

    def _prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        enc = self.tokenizer(prompts, padding=True, truncation=True, max_length=self.cfg.max_input_tokens,
                             return_tensors="pt")  # fmt: skip
        return {k: v.to(self.device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}

    def encode(self, prompts: list[str], screenshots: np.ndarray | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Fused encoder states (B, L, d) and their attention mask."""
        enc = self._prompts(prompts)
        text = self.t5.encoder(**enc).last_hidden_state
        return self.fusion(text, self.screen(screenshots)), enc["attention_mask"]

    def _labels(self, actions: list[str]) -> torch.Tensor:
        lab = self.tokenizer(actions, padding=True, truncation=True, max_length=self.cfg.max_action_tokens,
                             return_tensors="pt").input_ids.to(self.device)  # fmt: skip
        return lab.masked_fill(lab == self.tokenizer.pad_token_id, -100)

    # ------------------------------------------------------------ scoring and sampling

    def action_logprobs(self, prompts: list[str], screenshots: np.ndarray, actions: list[str]) -> torch.Tensor:
        """log pi(action | prompt, screenshot), summed over tokens, one per row."""
        states, mask = self.encode(prompts, screenshots)
        labels = self._labels(actions)
        logits = self.t5(encoder_outputs=BaseModelOutput(last_hidden_state=states), attention_mask=mask,
                         labels=labels).logits  # fmt: skip
        logp = torch.log_softmax(logits.float(), -1).gather(-1, labels.clamp(min=0)[..., None])[..., 0]
        return (logp * (labels != -100)).sum(-1)

    def loss(
        self, prompts: list[str], screenshots: np.ndarray, actions: list[str], weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Mean per-token negative log-likelihood of ``actions`` (optionally weighted per row)."""
        states, mask = self.encode(prompts, screenshots)
        labels = self._labels(actions)
        logits = self.t5(encoder_outputs=BaseModelOutput(last_hidden_state=states), attention_mask=mask,
                         labels=labels).logits  # fmt: skip
        nll = F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=-100, reduction="none")
        per_row = nll.sum(-1) / (labels != -100).sum(-1).clamp(min=1)
        return (per_row * weights).sum() / weights.sum().clamp(min=1e-8) if weights is not None else per_row.mean()

    @torch.no_grad()
    def sample(self, prompts: list[str], screenshots: np.ndarray, n: int = 1, temperature: float = 1.0,
               greedy: bool = False) -> list[list[str]]:  # fmt: skip
        """``n`` action strings per row (sampled at ``temperature``, or the greedy one)."""
        states, mask = self.encode(prompts, screenshots)
        if n > 1:  # generate() expands encoder outputs only when it samples itself; do it here
            states, mask = states.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
        out = self.t5.generate(
            encoder_outputs=BaseModelOutput(last_hidden_state=states), attention_mask=mask, do_sample=False,
            logits_processor=LogitsProcessorList([] if greedy else [GumbelSampling(temperature)]),
            max_new_tokens=self.cfg.max_action_tokens,
        )  # fmt: skip
        text = self.tokenizer.batch_decode(out, skip_special_tokens=True)
        return [text[i * n : (i + 1) * n] for i in range(len(prompts))]

    # ------------------------------------------------------------ checkpoints

    def save(self, folder: Path | str, **meta: object) -> None:
        """Weights, config, tokenizer and ``meta`` (e.g. step, stage), enough to rebuild the model anywhere."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save_pretrained(folder / "tokenizer")
        with atomic_path(folder / "model.safetensors") as tmp:
            save_model(self, str(tmp))  # handles the tied embedding / output weights
        with atomic_path(folder / "config.json") as tmp:
            tmp.write_text(json.dumps({"policy": asdict(self.cfg), "meta": meta}, indent=2))

    @classmethod
    def load(cls, folder: Path | str, device: str = "cpu") -> "AutoUIPolicy":
        folder = Path(folder)
        try:
            raw = json.loads((folder / "config.json").read_text())
        except OSError:
            raise FileNotFoundError(
                f"no policy checkpoint in {folder} (config.json missing); run its stage first"
            ) from None
        pc = raw["policy"]
        pc["image_grid"] = tuple(pc["image_grid"])
        tok = PreTrainedTokenizerFast.from_pretrained(folder / "tokenizer")
        model = cls(PolicyConfig(**pc), tok)
        load_model(model, str(folder / "model.safetensors"), device=device)
        return model.to(device).eval()
