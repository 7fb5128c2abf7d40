"""Self-describing checkpoints: weights (safetensors) + config + metadata in one folder.

A viewer or a later stage rebuilds any model from its folder alone (nanoGPT's
habit). Every file is written atomically, the config last, so a folder with a
``config.json`` always holds complete weights.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from safetensors.torch import load_model, save_model
from torch import nn

from digiq.io import atomic_path

__all__ = ["save_checkpoint", "read_config", "read_meta", "load_weights"]


def save_checkpoint(folder: Path | str, model: nn.Module, kind: str, config: Any, **meta: object) -> Path:
    """Write ``model``'s weights, then ``{kind: config, "meta": meta}`` as config.json."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(folder / "model.safetensors") as tmp:
        save_model(model, str(tmp))  # handles tied weights
    with atomic_path(folder / "config.json") as tmp:
        tmp.write_text(json.dumps({kind: asdict(config), "meta": meta}, indent=2))
    return folder


def read_config(folder: Path | str, kind: str) -> dict[str, Any]:
    """The ``kind`` section of a checkpoint's config.json, with a clear error when there is none."""
    path = Path(folder) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except OSError:
        raise FileNotFoundError(
            f"no {kind} checkpoint in {path.parent} (config.json missing); run its stage first"
        ) from None
    except json.JSONDecodeError as e:
        raise ValueError(f"corrupt checkpoint config {path}: {e}") from None
    if kind not in raw:
        raise ValueError(f"{path} is not a {kind} checkpoint (it holds {sorted(k for k in raw if k != 'meta')})")
    return raw[kind]


def read_meta(folder: Path | str) -> dict[str, Any]:
    """The metadata a checkpoint was saved with (stage, seed, steps, gamma...)."""
    return json.loads((Path(folder) / "config.json").read_text()).get("meta", {})


def load_weights(folder: Path | str, model: nn.Module) -> None:
    load_model(model, str(Path(folder) / "model.safetensors"))
