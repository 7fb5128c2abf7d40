"""Self-describing checkpoints: weights (safetensors) + config + metadata in one folder.

A viewer or a later stage rebuilds any model from its folder alone (nanoGPT's
habit). The folder is written whole in a temporary sibling and swapped in
(:func:`digiq.io.atomic_folder`), so a save cut short leaves the previous
checkpoint whole, never its tokenizer beside new weights. ``config.json``
records the SHA-256 of the weights and of the tokenizer's files
(:data:`DIGESTS`); a load recomputes them and refuses, by name, a folder
whose parts come from different saves (a tokenizer or weights copied in
from another checkpoint). A checkpoint saved before digests were kept has
none and is loaded unchecked: the outputs DVC tracks from earlier runs
stay loadable.
"""

from __future__ import annotations

import hashlib
import json
import typing
from collections.abc import Callable
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, TypeVar

import torch
from pydantic import TypeAdapter, ValidationError
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model, save_file
from torch import nn
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from digiq.config import type_name
from digiq.io import atomic_folder, interrupted_swap_note, write_error

__all__ = ["save_checkpoint", "write_config", "part_digest", "checkpoint_digest", "check_part", "read_config",
           "read_typed_config", "read_tokenizer", "read_meta", "load_weights", "read_released_weights", "DIGESTS", "WEIGHTS"]  # fmt: skip

C = TypeVar("C")

DIGESTS = "digests"  # config.json's key: {part of the folder: its SHA-256 at save (part_digest)}
WEIGHTS = "model.safetensors"
TOKENIZER = "tokenizer"
# Left out of a folder's digest: a released model's weights are gigabytes, which hashing at every load would
# read once more; they are swapped in whole with the rest.
_WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth")


def save_checkpoint(folder: Path | str, model: nn.Module, kind: str, config: Any, *,
                    tokenizer: PreTrainedTokenizerBase | None = None, **meta: object) -> Path:  # fmt: skip
    """Write ``model``'s weights, ``tokenizer`` (if any) into ``tokenizer/`` and ``{kind: config, "meta": meta}``
    with their digests as config.json, all into a temporary folder swapped in for ``folder`` whole.

    Whatever ``folder`` held before is replaced.
    """
    folder = Path(folder)
    try:
        with atomic_folder(folder) as tmp:
            digests = {}
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp / TOKENIZER)
                digests[TOKENIZER] = part_digest(tmp / TOKENIZER)
            save_file(_untied_state(model), str(tmp / WEIGHTS), metadata={"format": "pt"})
            digests[WEIGHTS] = part_digest(tmp / WEIGHTS)
            write_config(tmp, kind, config, meta, digests)
    except OSError as e:
        raise write_error(folder, e) from None
    return folder


def write_config(folder: Path, kind: str, config: Any, meta: dict[str, object], digests: dict[str, str]) -> None:
    """``{kind: config, "meta": meta, "digests": digests}`` as config.json of ``folder``, a checkpoint being built
    in a temporary folder (:func:`digiq.io.atomic_folder`): swapped in whole, it needs no atomic write of its own."""
    text = json.dumps({kind: asdict(config), "meta": meta, DIGESTS: digests}, indent=2)
    (folder / "config.json").write_text(text, encoding="utf-8")


def part_digest(path: Path) -> str:
    """SHA-256 of a file, or of a folder's files (their relative names and digests, in sorted order) but weights."""
    h = hashlib.sha256()
    if path.is_file():
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        return h.hexdigest()
    for file in sorted(p for p in path.rglob("*") if p.is_file() and not p.name.endswith(_WEIGHT_FILES)):
        h.update(f"{file.relative_to(path).as_posix()}\0{part_digest(file)}\n".encode())
    return h.hexdigest()


def checkpoint_digest(folder: Path | str) -> str:
    """One SHA-256 for a whole checkpoint: its config.json, which records its parts' digests, and its weights too
    when it records none (a checkpoint saved before digests were kept). What a store made by it records."""
    folder = Path(folder)
    parts = [folder / "config.json"] + ([] if _digests(folder) else [folder / WEIGHTS])
    return hashlib.sha256("".join(part_digest(p) for p in parts if p.exists()).encode()).hexdigest()


def check_part(folder: Path | str, part: str, what: str) -> None:
    """Refuse ``folder/part`` unless its digest is the one config.json recorded at save (none recorded: accepted).

    Raises:
        ValueError: ``what`` (the part, named), both digests and what to do.
    """
    folder = Path(folder)
    want = _digests(folder).get(part)
    if want is None:
        return
    got = part_digest(folder / part)
    if got != want:
        raise ValueError(f"{what}: {folder / 'config.json'} records SHA-256 {want[:16]}..., {folder / part} has "
                         f"{got[:16]}...; copy the checkpoint whole, or rerun the stage that saved it")  # fmt: skip


def _digests(folder: Path) -> dict[str, str]:
    """The digests config.json recorded at save; none for a checkpoint saved before they were kept."""
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}  # read_config names a missing or corrupt config.json
    digests = raw.get(DIGESTS, {}) if isinstance(raw, dict) else {}
    if not isinstance(digests, dict) or not all(isinstance(v, str) for v in digests.values()):
        raise ValueError(f"corrupt checkpoint config {folder / 'config.json'}: {DIGESTS} is {digests!r}, not a "
                         "mapping of parts to SHA-256 digests")  # fmt: skip
    return digests


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
        raise FileNotFoundError(f"no {kind} checkpoint in {path.parent} (config.json missing); run its stage first"
                                f"{interrupted_swap_note(path)}") from None  # fmt: skip
    except json.JSONDecodeError as e:
        raise ValueError(f"corrupt checkpoint config {path}: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"corrupt checkpoint config {path}: a {type(raw).__name__}, not a mapping of sections")
    if kind not in raw:
        raise ValueError(f"{path} is not a {kind} checkpoint (it holds {sorted(set(raw) - {'meta', DIGESTS})})")
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
    values = {k: tuple(v) if isinstance(v, list) and typing.get_origin(hints[k]) is tuple else v
              for k, v in section.items()}  # fmt: skip
    for key, value in values.items():
        try:
            TypeAdapter(hints[key]).validate_python(value, strict=True)
        except ValidationError:
            raise ValueError(f"corrupt checkpoint config {path}: {kind}.{key} must be {type_name(hints[key])}, "
                             f"got {section[key]!r}") from None  # fmt: skip
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:  # TypeError: a key without a default missing; ValueError: cls's own checks
        raise ValueError(f"corrupt checkpoint config {path}: {e}") from None


def read_tokenizer(folder: Path | str) -> PreTrainedTokenizerFast:
    """The tokenizer saved in a checkpoint's ``tokenizer/`` folder; a missing folder is named as such, and so is one
    that is not the tokenizer the checkpoint's weights were saved with (:func:`check_part`).

    Given a path that is not a folder, ``from_pretrained`` takes it for a Hub
    repository id and complains about its form instead.
    """
    path = Path(folder) / TOKENIZER
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint {Path(folder)} has no tokenizer folder {path}; copy the checkpoint whole")
    check_part(folder, TOKENIZER, f"checkpoint {folder}: its tokenizer is not the one its weights were saved with")
    return PreTrainedTokenizerFast.from_pretrained(path)


def read_meta(folder: Path | str) -> dict[str, Any]:
    """The metadata a checkpoint was saved with (stage, seed, steps, gamma...)."""
    return json.loads((Path(folder) / "config.json").read_text()).get("meta", {})


def load_weights(folder: Path | str, model: nn.Module) -> None:
    """Load a checkpoint's weights into ``model``; a missing, truncated or mismatched file is named, and so is one
    that is not the file the checkpoint's config was saved with (:func:`check_part`)."""
    path = Path(folder) / WEIGHTS
    if path.is_file():
        check_part(folder, WEIGHTS, f"cannot load the weights {path}: they are not the ones saved with its config")
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
