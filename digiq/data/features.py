"""The critic's input arrays: stage 05's VLM representations and the text features beside them.

One folder per VLM (``data/features/finetuned``; ``untuned`` and ``blind`` for the VLM ablations),
row-aligned with the offline step table sorted by (traj_id, step_id):
``state.npy`` (S, H), ``next_state.npy`` (S, H), ``candidates.npy`` (S, N, H')
(H' = H for the VLMs here; released data may differ),
``p_yes.npy`` (S, N), and ``ids.npy`` (S, 2): each row's (traj_id, step_id),
so that rows which no longer match the step table (a rerun of stage 01, a
file from elsewhere) are caught on load rather than trained on. The text
features (``data/critic_inputs``, :mod:`digiq.stages.critic_inputs`) are laid
out the same way; :func:`critic_inputs` puts both together as a critic reads
them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from digiq.data.trajectories import DataError, TrajectoryStore, step_ids
from digiq.io import atomic_path, require
from digiq.paths import Paths

__all__ = ["FEATURE_FILES", "TEXT_FILES", "TEXT_OPTIONAL", "TEXT_ROWS", "TEXTS", "save_features", "load_features",
           "load_text_features", "load_text_rows", "critic_inputs"]  # fmt: skip

FEATURE_FILES = ("state", "next_state", "candidates", "p_yes", "ids")
# The critic_inputs stage's arrays: always, then only where the view hierarchies were stored.
TEXT_FILES = ("goal", "before", "taken", "actions", "typed")
TEXT_OPTIONAL = ("tapped", "entries", "distinct")
# The texts themselves, for a critic that encodes them (digiq.models.critic_text): every distinct text once
# (TEXTS, a JSON list), and each step's and candidate's rows in it: the goal (S,); the previous action's type and
# typed text (S, 2); the action taken's, s' 's previous action (S, 2); each candidate's (S, N, 2).
TEXTS = "texts.json"
TEXT_ROWS = ("goal_row", "before_rows", "taken_rows", "action_rows")


def save_features(folder: Path, arrays: dict[str, np.ndarray], ids: np.ndarray) -> None:
    """Write arrays (float32; a mask stays bool, rows of a table int64) and their rows' (traj_id, step_id) into
    ``folder``, each file atomically."""
    folder.mkdir(parents=True, exist_ok=True)

    def stored(a: np.ndarray) -> np.ndarray:
        a = np.asarray(a)
        return (
            a if a.dtype == bool else a.astype(np.int64) if np.issubdtype(a.dtype, np.integer) else a.astype(np.float32)
        )

    typed = [(n, stored(a)) for n, a in arrays.items()]
    for name, arr in [*typed, ("ids", np.asarray(ids, np.int64))]:
        with atomic_path(folder / f"{name}.npy") as tmp:
            with open(tmp, "wb") as f:
                np.save(f, arr)


def _check_rows(paths: Paths, folder: Path, ids: np.ndarray, stage: str) -> np.ndarray:
    """The step table's (traj_id, step_id) rows, once ``ids`` (a folder's ``ids.npy``) are checked to be them."""
    table = step_ids(TrajectoryStore(paths.offline).read())
    if ids.shape != table.shape or not np.array_equal(table, ids):
        S = len(ids)
        k = next((i for i in range(min(len(table), S)) if tuple(table[i]) != tuple(ids[i])), min(len(table), S))
        raise DataError(f"the rows of {folder} are not the steps of {paths.offline}: {S} rows for {len(table)} steps, "
                        f"first differing at row {k}; rerun {stage}")  # fmt: skip
    return table


def _load(path: Path, stage: str) -> np.ndarray:
    require(stage, path)
    try:
        return np.load(path, mmap_mode="r")
    except ValueError as e:
        raise DataError(f"corrupt feature file {path}: {e}") from None


def load_features(paths: Paths, vlm: str = "finetuned") -> dict[str, np.ndarray]:
    """The stage-05 arrays of one VLM, memory-mapped, checked against the step table and against each other.

    Raises:
        DataError: naming the file that is missing, unreadable, not float32 (``ids``: not integer), of
            the wrong shape, holds a non-finite value, or whose rows are not the step table's. Rows are
            counted against the step table, so a file cut short is the one named, not its intact neighbour.
    """
    out = {}
    folder = paths.features(vlm)
    for name in FEATURE_FILES:
        out[name] = _load(folder / f"{name}.npy", "embed")
    table = _check_rows(paths, folder, out["ids"], "embed")
    ndim = {"state": 2, "next_state": 2, "candidates": 3, "p_yes": 2}
    for name, n in ndim.items():
        arr = out[name]
        if arr.ndim != n or len(arr) != len(table):
            raise DataError(f"feature file {folder / name}.npy has shape {arr.shape}, expected {n} dimensions and "
                            f"{len(table)} rows (ids.npy's, one per step); rerun embed")  # fmt: skip
        if arr.dtype != np.float32:  # what embed writes; the critic's float32 layers take nothing else
            raise DataError(f"feature file {folder / name}.npy holds {arr.dtype}, not float32; rerun embed")
    # Candidates may be wider than states: Digi-Q's released data hold BLIP-2 states beside LLaVA candidates.
    for name, other, axis in (("next_state", "state", 1), ("p_yes", "candidates", 1)):
        if out[name].shape[axis] != out[other].shape[axis]:
            raise DataError(f"feature file {folder / name}.npy has shape {out[name].shape}, but {other}.npy has "
                            f"{out[other].shape}: their axis {axis} must agree; rerun embed")  # fmt: skip
    for name in ("state", "next_state", "candidates"):
        for i in range(0, len(table), 4096):
            if not np.isfinite(out[name][i : i + 4096]).all():
                raise DataError(f"feature file {folder / name}.npy holds a non-finite value in rows {i}-{i + 4095}")
    return out


def load_text_features(paths: Paths) -> dict[str, np.ndarray]:
    """The critic_inputs stage's arrays (:data:`TEXT_FILES`, and those of :data:`TEXT_OPTIONAL` it wrote),
    memory-mapped and checked against the step table: one row per step, the per-candidate ones of one width N.

    Raises:
        DataError: naming the file that is missing, unreadable, of the wrong rows or shape.
    """
    folder = paths.critic_inputs
    out = {name: _load(folder / f"{name}.npy", "critic_inputs") for name in (*TEXT_FILES, "ids")}
    out.update({name: _load(folder / f"{name}.npy", "critic_inputs") for name in TEXT_OPTIONAL
                if (folder / f"{name}.npy").exists()})  # fmt: skip
    table = _check_rows(paths, folder, out.pop("ids"), "critic_inputs")
    N = out["actions"].shape[1] if out["actions"].ndim == 3 else -1
    for name, arr in out.items():
        per_candidate = name not in ("goal", "before", "taken")
        if len(arr) != len(table) or (per_candidate and (arr.ndim < 2 or arr.shape[1] != N)):
            raise DataError(f"{folder / name}.npy has shape {arr.shape}: expected {len(table)} rows"
                            f"{f' of {N} candidates' if per_candidate else ''}; rerun critic_inputs")  # fmt: skip
    return out


def load_text_rows(paths: Paths) -> tuple[list[str], dict[str, np.ndarray]]:
    """The critic_inputs stage's texts (:data:`TEXTS`) and each step's and candidate's rows in them
    (:data:`TEXT_ROWS`), checked against the step table and the texts.

    Raises:
        DataError: naming the file that is missing, unreadable, of the wrong rows or shape, or that points past
            the texts.
    """
    folder = paths.critic_inputs
    require("critic_inputs", folder / TEXTS)
    try:
        texts = json.loads((folder / TEXTS).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"corrupt {folder / TEXTS}: {e}; rerun critic_inputs") from None
    if not (isinstance(texts, list) and all(isinstance(t, str) for t in texts)):
        raise DataError(f"{folder / TEXTS} is not a list of texts; rerun critic_inputs")
    rows = {name: _load(folder / f"{name}.npy", "critic_inputs") for name in (*TEXT_ROWS, "ids")}
    table = _check_rows(paths, folder, rows.pop("ids"), "critic_inputs")
    shapes = {"goal_row": (len(table),), "before_rows": (len(table), 2), "taken_rows": (len(table), 2)}
    for name, arr in rows.items():
        want = shapes.get(name, (len(table), arr.shape[1] if arr.ndim == 3 else -1, 2))
        if arr.shape != want or not np.issubdtype(arr.dtype, np.integer):
            raise DataError(f"{folder / name}.npy has shape {arr.shape} ({arr.dtype}): expected {want} rows of "
                            f"{TEXTS}; rerun critic_inputs")  # fmt: skip
        if arr.size and (arr.min() < 0 or arr.max() >= len(texts)):
            raise DataError(f"{folder / name}.npy points past the {len(texts)} texts of {TEXTS}; rerun critic_inputs")
    return texts, rows


def critic_inputs(paths: Paths, vlm: str = "finetuned", *, text: bool, towers: bool = False, targets: bool = False,
                  typed: bool = False, entries: bool = False) -> dict[str, np.ndarray]:  # fmt: skip
    """``state`` (S, Ds), ``next_state`` (S, Ds), ``candidates`` (S, N, Da): what a critic reads.

    Stage 05's features of ``vlm``; with ``text``, followed by the text
    features of the goal and the previous action (s' has the step's own
    action as its previous one) and, per candidate, its type and typed text
    (:data:`digiq.models.critic_inputs.STATE_TEXT`, ``ACTION_TEXT``); with
    ``targets``, the label of the element a tap lands on, with ``typed``, the
    typed text's match with the goal, and with ``entries``, which entry of a
    list a tap lands on, last. With ``towers`` (a critic that encodes the
    texts itself, :mod:`digiq.models.critic_text`), the text features are
    left out and the texts' rows (:data:`TEXT_ROWS`) given instead; the
    candidates' other inputs follow the VLM's features all the same. The
    critics, the actors, the diagnostics and the Q/V viewer all read them
    here, so a critic always sees the inputs it was trained on.
    """
    feats = load_features(paths, vlm)
    out = {name: feats[name] for name in ("state", "next_state", "candidates")}
    if (targets or typed or entries or towers) and not text:
        raise ValueError("the towers, the tapped element, the typed match and the list entry are text features: "
                         "towers, targets, typed and entries need text")  # fmt: skip
    if not text:
        return out
    words = load_text_features(paths)
    if words["actions"].shape[1] != out["candidates"].shape[1]:
        raise DataError(f"{paths.critic_inputs} has {words['actions'].shape[1]} candidates a state but "
                        f"{paths.features(vlm)} {out['candidates'].shape[1]}; rerun critic_inputs")  # fmt: skip
    extra = [("tapped", targets), ("typed", typed), ("entries", entries)]
    for name, wanted in extra:
        if wanted and name not in words:
            raise DataError(f"{paths.critic_inputs} has no {name}.npy: the view hierarchies were not stored with "
                            "the steps (collect with collect.view_hierarchy: true)")  # fmt: skip
    others = [words[name] for name, wanted in extra if wanted]
    if towers:
        return {**out, "candidates": np.concatenate([out["candidates"], *others], 2) if others else out["candidates"],
                **load_text_rows(paths)[1]}  # fmt: skip
    return {
        "state": np.concatenate([out["state"], words["goal"], words["before"]], 1),
        "next_state": np.concatenate([out["next_state"], words["goal"], words["taken"]], 1),
        "candidates": np.concatenate([out["candidates"], words["actions"], *others], 2),
    }
