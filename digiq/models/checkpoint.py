"""Self-describing checkpoints: weights (safetensors) + config + metadata in one folder.

A viewer or a later stage rebuilds any model from its folder alone (nanoGPT's
habit). Every file is written atomically, the config last, so a folder with a
``config.json`` always holds complete weights.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Callable
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model, save_file
from torch import nn
from transformers import PreTrainedTokenizerFast

from digiq.config import fits_type, type_name  # the params file's type rule: a checkpoint's config is held to it too
from digiq.io import atomic_path

__all__ = ["save_checkpoint", "read_config", "read_typed_config", "read_tokenizer", "read_meta", "load_weights",
           "read_released_weights"]  # fmt: skip

C = TypeVar("C")


def save_checkpoint(folder: Path | str, model: nn.Module, kind: str, config: Any, **meta: object) -> Path:
    """Write ``model``'s weights, then ``{kind: config, "meta": meta}`` as config.json."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(folder / "model.safetensors") as tmp:
        save_file(_untied_state(model), str(tmp), metadata={"format": "pt"})
    with atomic_path(folder / "config.json") as tmp:
        tmp.write_text(json.dumps({kind: asdict(config), "meta": meta}, indent=2))
    return folder


def _untied_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors with each shared one (tied embeddings) once, under its first name in sorted order.

    safetensors' ``save_model`` records every dropped tied name in the file's
    metadata, which it writes in a hash map's order, drawn anew per process:
    the same weights then gave different bytes, and DVC a different hash,
    from run to run (T5's three tied embeddings). ``load_model`` ties them
    back from the model itself, so the names need not be stored.
    """
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, int, tuple[int, ...], tuple[int, ...]]] = set()
    for name, t in sorted(model.state_dict().items()):
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        if key not in seen:
            seen.add(key)
            out[name] = t.contiguous()
    return out


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
    if not isinstance(raw, dict):
        raise ValueError(f"corrupt checkpoint config {path}: a {type(raw).__name__}, not a mapping of sections")
    if kind not in raw:
        raise ValueError(f"{path} is not a {kind} checkpoint (it holds {sorted(k for k in raw if k != 'meta')})")
    if not isinstance(raw[kind], dict):
        raise ValueError(f"corrupt checkpoint config {path}: {kind} is {raw[kind]!r}, not a mapping of keys")
    return raw[kind]


def read_typed_config(folder: Path | str, kind: str, cls: type[C]) -> C:
    """The ``kind`` section of a checkpoint's config.json as the dataclass ``cls``.

    Each value is checked against its field's type as the params file's are
    (an int where a float is asked passes; a list for a tuple), so an
    unknown key, a ``null`` or a value of the wrong type is named with the
    file rather than failing later inside the model it builds.
    """
    section = read_config(folder, kind)
    path = Path(folder) / "config.json"
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(section) - {f.name for f in fields(cls)})  # type: ignore[arg-type]
    if unknown:
        raise ValueError(f"corrupt checkpoint config {path}: unknown key(s) {kind}.{unknown}")
    for key, value in section.items():
        if not fits_type(value, hints[key]):
            raise ValueError(f"corrupt checkpoint config {path}: {kind}.{key} must be {type_name(hints[key])}, "
                             f"got {value!r}")  # fmt: skip
    values = {k: tuple(v) if isinstance(v, list) and typing.get_origin(hints[k]) is tuple else v
              for k, v in section.items()}  # fmt: skip
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:  # TypeError: a key without a default missing; ValueError: cls's own checks
        raise ValueError(f"corrupt checkpoint config {path}: {e}") from None


def read_tokenizer(folder: Path | str) -> PreTrainedTokenizerFast:
    """The tokenizer saved in a checkpoint's ``tokenizer/`` folder; a missing folder is named as such.

    Given a path that is not a folder, ``from_pretrained`` takes it for a Hub
    repository id and complains about its form instead.
    """
    path = Path(folder) / "tokenizer"
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint {Path(folder)} has no tokenizer folder {path}; copy the checkpoint whole")
    return PreTrainedTokenizerFast.from_pretrained(path)


def read_meta(folder: Path | str) -> dict[str, Any]:
    """The metadata a checkpoint was saved with (stage, seed, steps, gamma...)."""
    return json.loads((Path(folder) / "config.json").read_text()).get("meta", {})


def load_weights(folder: Path | str, model: nn.Module) -> None:
    """Load a checkpoint's weights into ``model``; a missing, truncated or mismatched file is named."""
    path = Path(folder) / "model.safetensors"
    try:
        load_model(model, str(path))
    except (SafetensorError, OSError, RuntimeError) as e:  # RuntimeError: names or shapes that do not match
        raise ValueError(f"cannot load the weights {path}: {e}") from None


def read_released_weights(
    folder: Path | str, keep: Callable[[str], bool] = lambda name: True
) -> dict[str, torch.Tensor]:
    """Tensors of a checkpoint folder in Hugging Face's layout, only those whose name ``keep`` accepts.

    Reads ``model.safetensors``, ``pytorch_model.bin`` or their sharded forms
    (``*.index.json``). Safetensors are read tensor by tensor, so taking only
    the vision tower of a BLIP-2 folder never loads its 2.7B-parameter language
    model. Pickled ``.bin`` files are opened with ``weights_only=True``: a
    tensor file cannot run code.
    """
    folder = Path(folder)
    for single, index in (("model.safetensors", "model.safetensors.index.json"),
                          ("pytorch_model.bin", "pytorch_model.bin.index.json")):  # fmt: skip
        if (folder / index).exists():
            files = sorted(set(json.loads((folder / index).read_text())["weight_map"].values()))
        elif (folder / single).exists():
            files = [single]
        else:
            continue
        out: dict[str, torch.Tensor] = {}
        for name in files:
            if name.endswith(".safetensors"):
                with safe_open(str(folder / name), framework="pt") as f:
                    out.update({k: f.get_tensor(k) for k in f.keys() if keep(k)})
            else:
                state = torch.load(folder / name, map_location="cpu", weights_only=True, mmap=True)
                out.update({k: v for k, v in state.items() if keep(k)})
        return out
    raise FileNotFoundError(
        f"no weights in {folder}: expected model.safetensors or pytorch_model.bin (or a sharded index)"
    )
