"""Import the released Digi-Q and DigiRL ``.pt`` files into this repository's dataset format.

A released file is a ``torch.save``d list of trajectories, each a list of
step dicts (docs/real-models.md). DigiRL steps carry the transition and BLIP-2
image features, with as ``image_path`` the screen after the step's action
(the screen before it is the previous step's); Digi-Q steps add ``traj_id``/``step_id``, the next image,
the candidate actions (``action_list``, ``<split>``-joined, index 0 = taken)
and the VLM representations (``q_rep_out_list``). Images are referenced by
paths starting with ``<path_to_images>``, replaced here by a local folder.

The output folder is a :class:`~digiq.data.trajectories.TrajectoryStore`
(screenshots copied under ``images/``), plus, when the file has them:

- ``candidates.parquet``: the stage-02 contract (``traj_id``, ``step_id``,
  ``action_list``, ``valid_list``), so the pipeline can start at stage 04;
- ``image_features.npy`` / ``next_image_features.npy`` (S, 1408): the BLIP-2
  features AutoUI reads, in step-table order;
- ``q_rep_out_list.npy`` (S, N, D): Digi-Q's candidate representations.

Unpickling runs whatever code the file names, so loading needs an explicit
``trust_pickle=True`` (``--trust-pickle`` on the command line).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from digiq.data.candidates import SPLIT, write_candidates
from digiq.data.trajectories import DataError, Step, TrajectoryStore, mc_returns
from digiq.env.actions import parse_action
from digiq.env.tasks import UnsupportedInstruction, parse_task
from digiq.io import atomic_path

__all__ = ["IMAGE_PREFIX", "load_legacy", "import_legacy"]

IMAGE_PREFIX = "<path_to_images>"
_TEXT = ("observation", "next_observation", "image_path", "task", "action")
_ARRAYS = ("image_features", "next_image_features", "q_rep_out_list")  # kept when on every step
_DIGIQ = ("next_image_path", "action_list")  # the keys that mark a Digi-Q (not DigiRL) file


def load_legacy(path: Path | str, *, trust_pickle: bool = False) -> list[list[dict[str, Any]]]:
    """The trajectories of a released ``.pt`` file, after checking its outer structure."""
    path = Path(path)
    if not trust_pickle:
        raise DataError(f"{path} is a Python pickle (torch.save of dicts): loading it runs any code the file "
                        "names. Pass --trust-pickle (trust_pickle=True) only for a file from a source you "
                        "trust, such as the Digi-Q or DigiRL release.")  # fmt: skip
    if not path.is_file():
        raise DataError(f"no such file: {path}")
    try:
        data = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # a pickle can fail in any way; name the file and the cause
        raise DataError(f"cannot unpickle {path}: {type(e).__name__}: {e}") from None
    if not isinstance(data, list) or not data:
        raise DataError(f"{path} should hold a non-empty list of trajectories, got {type(data).__name__}")
    for t, traj in enumerate(data):
        if not isinstance(traj, list) or not traj:
            raise DataError(f"trajectory {t} of {path} should be a non-empty list of step dicts, "
                            f"got {type(traj).__name__}")  # fmt: skip
        for s, step in enumerate(traj):
            if not isinstance(step, dict):
                raise DataError(f"trajectory {t} step {s} of {path} should be a dict, got {type(step).__name__}")
    return data


def _field(step: dict[str, Any], key: str, where: str, check: Callable[[Any], bool], what: str) -> Any:
    if key not in step:
        raise DataError(f"{where}: missing key {key!r}")
    value = step[key]
    if not check(value):
        raise DataError(f"{where}: key {key!r} should be {what}, got {type(value).__name__} {str(value)[:60]!r}")
    return value


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.number)) or (torch.is_tensor(v) and v.numel() == 1)


def _vector(v: Any) -> bool:
    return (torch.is_tensor(v) or isinstance(v, np.ndarray)) and np.asarray(v).ndim >= 1


def _resolve(image_path: str, images: Path, where: str) -> Path:
    """The local file of a released image path: the ``<path_to_images>`` prefix (or any leading folders) replaced."""
    rel = image_path[len(IMAGE_PREFIX) :].lstrip("/") if image_path.startswith(IMAGE_PREFIX) else Path(image_path).name
    if os.path.normpath(rel).split(os.sep)[0] == "..":  # the file's text must not reach past the folder given
        raise DataError(f"{where}: image {image_path!r} leads outside the images folder {images}")
    local = images / rel
    if not local.is_file():
        raise DataError(f"{where}: image {image_path!r} not found as {local}")
    return local


def _digirl_screens(traj: list[dict[str, Any]], images: Path, wheres: list[str]) -> tuple[list[Path], list[Path]]:
    """The screens before and after each step of a DigiRL trajectory.

    DigiRL stores as a step's ``image_path`` the screenshot taken after its
    action, named ``<episode>_<k>.png`` for the k-th screen of the episode.
    So the screen a step acts on is the previous step's ``image_path``, and
    the first step's is the episode's screen 0, which no step names: it is
    ``<episode>_0`` beside step 0's ``<episode>_1``.
    """
    after = [_resolve(step["image_path"], images, w) for step, w in zip(traj, wheres, strict=True)]
    first = Path(traj[0]["image_path"])
    stem, _, k = first.stem.rpartition("_")
    if not stem or k != "1":
        raise DataError(f"{wheres[0]}: a DigiRL image_path ends in _1 on the first step (the screen after its action, "
                        f"<episode>_1{first.suffix}), got {traj[0]['image_path']!r}")  # fmt: skip
    start = _resolve(
        str(first.with_name(f"{stem}_0{first.suffix}")), images, wheres[0] + " (the episode's first screen)"
    )
    return [start, *after[:-1]], after


def _family(task: str, task_set: str) -> str:
    try:
        return parse_task(task, task_set).family
    except UnsupportedInstruction:
        return "unsupported"  # the simulator has no such task; the data is still usable offline


def _check_step(step: dict[str, Any], where: str, digiq: bool,
                arrays: dict[str, list[np.ndarray]]) -> tuple[float, list[str] | None]:  # fmt: skip
    """Check one step's keys and types; collect its arrays; return its reward and (Digi-Q) its candidates."""
    for key in _TEXT:
        _field(step, key, where, lambda v: isinstance(v, str), "a string")
    reward = float(_field(step, "reward", where, _is_number, "a number"))
    _field(step, "done", where, lambda v: isinstance(v, (bool, np.bool_)) or _is_number(v), "a bool")
    for key in _ARRAYS:
        if key in step:
            arrays[key].append(np.asarray(_field(step, key, where, _vector, "an array"), np.float32))
    if not digiq:
        return reward, None
    _field(step, "next_image_path", where, lambda v: isinstance(v, str), "a string")
    joined = _field(step, "action_list", where, lambda v: isinstance(v, (str, list)), "a string or list")
    cands = joined.split(SPLIT) if isinstance(joined, str) else list(joined)
    if cands[0].strip() != step["action"].strip():
        raise DataError(f"{where}: action_list[0] should be the action taken, {step['action'][:60]!r}")
    return reward, cands


def import_legacy(src: Path | str, out: Path | str, images: Path | str, *, task_set: str, trust_pickle: bool = False,
                  gamma: float = 0.95) -> dict[str, Any]:  # fmt: skip
    """Convert one released file into a dataset folder ``out``; returns counts of what was written.

    Every step is checked before anything is written, so a broken file
    leaves ``out`` untouched; ``out`` must not already hold steps.
    """
    data = load_legacy(src, trust_pickle=trust_pickle)
    images = Path(images)
    store = TrajectoryStore(out)
    if store.parts():
        raise DataError(f"{out} already holds a dataset; import into an empty folder")
    digiq = all(k in data[0][0] for k in _DIGIQ)
    steps: list[Step] = []
    copied: dict[Path, str] = {}  # each screenshot once, however many steps show it
    candidates: list[list[str]] = []
    arrays: dict[str, list[np.ndarray]] = {name: [] for name in _ARRAYS}
    for t, traj in enumerate(data):
        rewards = []
        for s, step in enumerate(traj):
            reward, cands = _check_step(step, f"{src} trajectory {t} step {s}", digiq, arrays)
            rewards.append(reward)
            if cands is not None:
                candidates.append(cands)
        returns = mc_returns(rewards, gamma)
        ids = [(int(step.get("traj_id", t)), int(step.get("step_id", s))) for s, step in enumerate(traj)]
        wheres = [f"{src} trajectory {t} step {s}" for s in range(len(traj))]
        if digiq:
            before = [_resolve(step["image_path"], images, w) for step, w in zip(traj, wheres, strict=True)]
            after = [_resolve(step["next_image_path"], images, w) for step, w in zip(traj, wheres, strict=True)]
        else:
            before, after = _digirl_screens(traj, images, wheres)
        for s, step in enumerate(traj):
            (traj_id, step_id) = ids[s]
            rel = copied.setdefault(before[s], f"images/{traj_id:06d}_{step_id:02d}{before[s].suffix}")
            next_rel = copied.setdefault(after[s], f"images/{traj_id:06d}_{step_id:02d}_next{after[s].suffix}")
            steps.append(Step(traj_id=traj_id, step_id=step_id, task=step["task"], task_set=task_set,
                              family=_family(step["task"], task_set), observation=step["observation"],
                              next_observation=step["next_observation"], image_path=rel, next_image_path=next_rel,
                              action=step["action"], valid=parse_action(step["action"]).is_valid,
                              reward=rewards[s], done=bool(step["done"]),
                              mc_return=float(step.get("mc_return", returns[s])),
                              trajectory_reward=float(step.get("trajectory_reward", max(rewards)))))  # fmt: skip
    for name, rows in arrays.items():
        if rows and len(rows) != len(steps):
            raise DataError(f"{src}: {name} is on {len(rows)} of {len(steps)} steps; it must be on all or none")
    _write(store, steps, copied.items(), candidates, {k: v for k, v in arrays.items() if v})
    return {"trajectories": len(data), "steps": len(steps), "format": "digiq" if digiq else "digirl",
            "candidates": len(candidates[0]) if candidates else 0,
            "arrays": sorted(k for k, v in arrays.items() if v)}  # fmt: skip


def _write(store: TrajectoryStore, steps: Sequence[Step], copies: Iterable[tuple[Path, str]],
           candidates: Sequence[list[str]], arrays: dict[str, list[np.ndarray]]) -> None:  # fmt: skip
    """Images first, then the side files, the step table last: a run cut short leaves no table to trust."""
    for local, rel in copies:
        with atomic_path(store.path(rel)) as tmp:
            shutil.copyfile(local, tmp)
    if candidates:
        write_candidates(store.root / "candidates.parquet", [s.traj_id for s in steps], [s.step_id for s in steps],
                         candidates)  # fmt: skip
    for name, rows in arrays.items():
        with atomic_path(store.root / f"{name}.npy") as tmp:
            with open(tmp, "wb") as f:
                np.save(f, np.stack(rows))
    store.write_part(steps)
