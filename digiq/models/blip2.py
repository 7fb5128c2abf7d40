"""BLIP-2 image features: the image input of Auto-UI-Base and of the released DigiRL / Digi-Q data.

AutoUI never sees pixels. A frozen BLIP-2 vision tower (ViT-g, from
``Salesforce/blip2-opt-2.7b``) turns each screenshot into its pooled output,
one 1408-d vector, and the policy attends to that (the AutoUI paper; the released
``image_features`` keys hold exactly these). This module loads only that
tower from a local BLIP-2 folder, reproduces its image processor's
resize-and-normalise in torch, and returns the pooled features.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import Blip2VisionConfig, Blip2VisionModel

from digiq.models.checkpoint import read_released_weights

__all__ = ["Blip2ImageFeatures"]

# BlipImageProcessor's defaults (OpenAI CLIP statistics, 224 x 224), used when a folder has no preprocessor_config.json.
_MEAN, _STD, _SIZE = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711), 224


class Blip2ImageFeatures:
    """A frozen BLIP-2 vision tower: (B, H, W, 3) uint8 screenshots -> (B, hidden) pooled features."""

    def __init__(self, vision: Blip2VisionModel, size: tuple[int, int], mean: tuple[float, ...],
                 std: tuple[float, ...]) -> None:  # fmt: skip
        self.vision = vision.eval().requires_grad_(False)
        self.size = size
        self.mean = torch.tensor(mean, dtype=torch.float32)[:, None, None]
        self.std = torch.tensor(std, dtype=torch.float32)[:, None, None]

    @property
    def dim(self) -> int:
        """Width of one feature (1408 for BLIP-2's ViT-g)."""
        return self.vision.config.hidden_size

    @classmethod
    def from_pretrained(cls, folder: Path | str, device: str = "cpu",
                        dtype: torch.dtype = torch.float32) -> "Blip2ImageFeatures":  # fmt: skip
        """The vision tower of a local BLIP-2 folder (a full ``Blip2Model`` or a vision-only one).

        Only the ``vision_model.*`` tensors are read from a full checkpoint.
        """
        folder = Path(folder)
        try:
            raw = json.loads((folder / "config.json").read_text())
        except OSError:
            raise FileNotFoundError(f"no BLIP-2 checkpoint in {folder} (config.json missing)") from None
        full = raw.get("model_type") in ("blip-2", "blip_2") or "vision_config" in raw
        vision_cfg = Blip2VisionConfig(**(raw["vision_config"] if full else raw))
        weights = read_released_weights(folder, (lambda k: k.startswith("vision_model.")) if full else (lambda k: True))
        if full:
            weights = {k.removeprefix("vision_model."): v for k, v in weights.items()}
        vision = Blip2VisionModel(vision_cfg)
        missing, unexpected = vision.load_state_dict(weights, strict=False)
        if missing or unexpected:
            raise ValueError(
                f"{folder} is not a BLIP-2 vision tower: missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        size, mean, std = (_SIZE, _SIZE), _MEAN, _STD
        if (folder / "preprocessor_config.json").exists():
            proc = json.loads((folder / "preprocessor_config.json").read_text())
            s = proc.get("size", {})
            size = (s["height"], s["width"]) if "height" in s else (s.get("shortest_edge", _SIZE),) * 2
            mean, std = tuple(proc.get("image_mean", mean)), tuple(proc.get("image_std", std))
        return cls(vision.to(device=device, dtype=dtype), size, mean, std)

    def pixel_values(self, images: np.ndarray | torch.Tensor) -> torch.Tensor:
        """What ``BlipImageProcessor`` makes of uint8 screenshots: bicubic resize, scale to [0, 1], normalise."""
        x = torch.as_tensor(np.asarray(images))
        if x.ndim != 4 or x.shape[-1] != 3 or x.dtype != torch.uint8:
            raise ValueError(f"expected (B, H, W, 3) uint8 screenshots, got {tuple(x.shape)} {x.dtype}")
        x = F.interpolate(x.permute(0, 3, 1, 2).float(), size=self.size, mode="bicubic", antialias=True,
                          align_corners=False)  # fmt: skip
        return ((x.clamp(0, 255).round() / 255.0) - self.mean) / self.std

    @torch.no_grad()
    def __call__(self, images: np.ndarray | torch.Tensor, batch_size: int = 32) -> torch.Tensor:
        """(B, dim) float32 features on the CPU, ``batch_size`` screenshots per forward pass."""
        p = next(self.vision.parameters())
        out = [
            self.vision(pixel_values=self.pixel_values(images[i : i + batch_size]).to(p.device, p.dtype)).pooler_output
            for i in range(0, len(images), batch_size)
        ]
        return torch.cat(out).float().cpu()
