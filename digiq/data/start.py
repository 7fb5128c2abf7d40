"""Start the pipeline from imported data: at stage 02, 04 or 06 instead of collecting on the simulator.

``import-legacy`` turns a released file into a dataset folder (steps,
screenshots, and for Digi-Q files the candidates and features). This module
places one or more such folders where the skipped stages would have written
their outputs:

- ``augment_actions`` (02): the steps into ``data/offline`` (stage 01's output);
- ``vlm_finetune`` (04): also the candidates into ``data/candidates`` (stage 02's);
- ``critic`` (06): also the features into ``data/features/finetuned`` (stage 05's):
  ``image_features`` as the state, ``next_image_features`` as the next
  state, ``q_rep_out_list`` as the candidates' representations.

Then ``dvc repro`` of the stages above the start that the import does not
replace (:func:`upstream_stages`: the base policy, which the actors start
from, so set ``base_policy.checkpoint`` for the released AutoUI; and below
the critic, the VLM) and ``dvc repro --downstream STAGE`` run the rest
(``make repro-from`` does all three).

Several folders (General and Web Shopping are released as separate files)
are merged; each keeps its screenshots in its own subfolder, and trajectory
ids are shifted so that they stay distinct.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from digiq import pipeline
from digiq.config import Settings
from digiq.data.candidates import CANDIDATE_FIELDS
from digiq.data.trajectories import DataError, TrajectoryStore, read_parquet, step_ids, write_parquet
from digiq.io import atomic_folder
from digiq.paths import Paths

__all__ = ["START_STAGES", "place_imported", "upstream_stages"]

# Stage -> what the imported folders must hold for the pipeline to start there.
START_STAGES = {
    "augment_actions": (),
    "vlm_finetune": ("candidates.parquet",),
    "critic": ("candidates.parquet", "image_features.npy", "next_image_features.npy", "q_rep_out_list.npy"),
}
# Stage -> the stages whose outputs the import writes in their place: the steps, the candidates, the features.
REPLACED = {
    "augment_actions": ("collect",),
    "vlm_finetune": ("collect", "augment_actions"),
    "critic": ("collect", "augment_actions", "embed"),
}


def _check_settings(stage: str, settings: Settings) -> None:
    """Refuse settings that need what imported data cannot give, naming the key to change."""
    if settings.diagnostics.oracle_states > 0:
        raise DataError("diagnostics.oracle_states must be 0 with imported data: the oracle replays each episode in the "
                        "simulator, and imported episodes did not happen there")  # fmt: skip
    if settings.ablations.perfect_critic:
        raise DataError("ablations.perfect_critic must be false with imported data: the simulator's expert picks "
                        "the perfect critic's candidates, and imported episodes did not happen there")  # fmt: skip
    critics = {"critic": settings.critic}
    critics.update({f"variants.{name}": cfg for name, cfg in settings.variants.items()})
    for where, cfg in critics.items():
        for key in ("tap_targets", "list_entries"):
            if getattr(cfg, key):
                raise DataError(f"{where}.{key} must be false with imported data (or the variant left out): it reads "
                                "the view hierarchy stored beside each screenshot (collect.view_hierarchy), and "
                                "released files have none")  # fmt: skip
    for ablation in ("untuned_vlm", "blind_vlm"):
        if stage == "critic" and getattr(settings.ablations, ablation):
            raise DataError(f"ablations.{ablation} must be false when starting at the critic: the released files "
                            "hold only the fine-tuned VLM's features (start at vlm_finetune to compute others)")  # fmt: skip


def upstream_stages(stage: str) -> list[str]:
    """The stages to run before ``dvc repro --downstream stage`` on imported data: those whose outputs ``stage`` or
    a stage after it reads, apart from the ones the import replaces, in ``dvc.yaml``'s order.

    ``dvc repro --downstream`` runs no stage above ``stage``, so each of these
    must have run, each alone (``dvc repro --single-item``: some read what the
    import placed): the code fingerprints, the task lists, the base policy,
    which the actors start from, the critic's text inputs and, below the
    critic, the VLM (its pretraining, and its fine-tune where the embed stage
    needs it).
    """
    if stage not in START_STAGES:
        raise DataError(f"cannot start at {stage!r}: choose one of {sorted(START_STAGES)}")
    after = pipeline.downstream(stage)
    needed = pipeline.ancestors(set(after), skip={*REPLACED[stage], *after})
    return [s.name for s in pipeline.stages() if s.name in needed]


def _read(folder: Path, stage: str) -> tuple[pa.Table, pa.Table | None, dict[str, np.ndarray]]:
    """One imported folder's steps, candidates and feature arrays, each sorted by (traj_id, step_id)."""
    for name in START_STAGES[stage]:
        if not (folder / name).exists():
            raise DataError(f"{folder} lacks {name}, which starting at {stage} needs (a DigiRL file has no "
                            f"candidates or features: start it at augment_actions)")  # fmt: skip
    store = TrajectoryStore(folder)
    steps = store.read()
    # The importer wrote the side files in the released file's order; the step table reads back sorted.
    written = pa.concat_tables([t for _, t in store.part_tables(["traj_id", "step_id"])])
    order = np.lexsort((written.column("step_id").to_numpy(), written.column("traj_id").to_numpy()))
    cands = None
    if "candidates.parquet" in START_STAGES[stage]:
        cands = read_parquet(folder / "candidates.parquet", f"candidates file {folder / 'candidates.parquet'}",
                             CANDIDATE_FIELDS)  # fmt: skip
        cands = cands.sort_by([("traj_id", "ascending"), ("step_id", "ascending")])
        if any(
            not np.array_equal(cands.column(c).to_numpy(), steps.column(c).to_numpy()) for c in ("traj_id", "step_id")
        ):
            raise DataError(f"{folder / 'candidates.parquet'} does not list the same steps as {folder}'s step table")
    arrays = {}
    for name in START_STAGES[stage]:
        if name.endswith(".npy"):
            arr = np.load(folder / name)
            if arr.shape[0] != len(order):
                raise DataError(f"{folder / name} has {arr.shape[0]} rows for {len(order)} steps")
            arrays[name.removesuffix(".npy")] = arr[order]
    return steps, cands, arrays


def _with_column(table: pa.Table, name: str, values: pa.ChunkedArray) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, values)


def _shift_ids(table: pa.Table, offset: int) -> pa.Table:
    """``table`` with ``offset`` added to its trajectory ids (merged folders keep distinct ids)."""
    ids = table.column("traj_id")
    return _with_column(table, "traj_id", pc.add(ids, pa.scalar(offset, ids.type)))


def place_imported(folders: list[Path | str], paths: Paths, stage: str, settings: Settings) -> dict[str, Any]:
    """Write the imported ``folders`` as the outputs of the stages before ``stage``; returns what was placed.

    Everything is read and checked first; each output folder is then swapped
    in whole, so an interrupted run leaves the previous outputs or the new ones.
    """
    if stage not in START_STAGES:
        raise DataError(f"the pipeline can start from imported data at {sorted(START_STAGES)}, not {stage!r}")
    if not folders:
        raise DataError("name at least one imported folder (python -m digiq.data import-legacy writes them)")
    _check_settings(stage, settings)
    read = [(Path(f), *_read(Path(f), stage)) for f in folders]
    offset, steps_out, cands_out, arrays_out = 0, [], [], []
    for k, (_, steps, cands, arrays) in enumerate(read):
        steps = _shift_ids(steps, offset)
        for col in ("image_path", "next_image_path"):  # each folder's screenshots live under part<k>/
            steps = _with_column(steps, col, pc.binary_join_element_wise(f"part{k}", steps.column(col), "/"))
        steps_out.append(steps)
        if cands is not None:
            cands_out.append(_shift_ids(cands, offset))
        arrays_out.append(arrays)
        offset = int(pc.max(steps.column("traj_id")).as_py()) + 1
    features = {}
    for name in arrays_out[0]:
        dims = {a[name].shape[1:] for a in arrays_out}
        if len(dims) > 1:
            raise DataError(f"the imported folders' {name} differ in shape {sorted(dims)}; they cannot be merged")
        features[name] = np.concatenate([a[name] for a in arrays_out])
    with atomic_folder(paths.offline) as tmp:
        for k, (folder, *_rest) in enumerate(read):
            shutil.copytree(folder / "images", tmp / f"part{k}" / "images")
        merged = TrajectoryStore(tmp)
        for steps in steps_out:
            merged.write_table(steps)
    placed = {"stage": stage, "folders": [str(f) for f, *_ in read], "steps": sum(len(s) for s in steps_out),
              "offline": str(paths.offline)}  # fmt: skip
    if cands_out:
        with atomic_folder(paths.candidates.parent) as tmp:
            write_parquet(pa.concat_tables(cands_out), tmp / paths.candidates.name)
        placed["candidates"] = str(paths.candidates)
    if features:
        with atomic_folder(paths.features()) as tmp:
            for ours, theirs in (("state", "image_features"), ("next_state", "next_image_features"),
                                 ("candidates", "q_rep_out_list")):  # fmt: skip
                np.save(tmp / f"{ours}.npy", features[theirs].astype(np.float32))
            # The released files keep no P(Yes) of the VLM's answer: NaN says "unknown" to the viewers.
            np.save(tmp / "p_yes.npy", np.full(features["q_rep_out_list"].shape[:2], np.nan, np.float32))
            merged = pa.concat_tables(steps_out)
            np.save(tmp / "ids.npy", step_ids(merged))
        placed["features"] = str(paths.features())
    return placed
