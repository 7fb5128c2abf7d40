"""Trajectory storage: a Parquet step table plus PNG screenshots.

A dataset is a folder::

    steps-00000.parquet, steps-00001.parquet, ...   one row per step, Digi-Q field names
    images/000123_04.png                            screenshot of trajectory 123, step 4
    images/000123_04.hierarchy.json                 its view hierarchy (optional: collect.view_hierarchy)

Parts are written whole and atomically (temp name, then rename), and
screenshots before the part that references them, so a run killed half way
keeps every finished part and can resume after it. Field names follow
Digi-Q's release so its users feel at home (see :data:`STEP_SCHEMA`).
"""

from __future__ import annotations

import json
import random
import re
import typing
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from digiq.env.tasks import TASK_SETS
from digiq.io import atomic_path, atomic_write_text, require

__all__ = [
    "Step",
    "STEP_SCHEMA",
    "DataError",
    "TrajectoryStore",
    "mc_returns",
    "observation_text",
    "split_trajectories",
    "heldout_rows",
    "data_task_sets",
    "step_ids",
]


class DataError(ValueError):
    """A data file is missing, corrupt, or does not have the expected fields."""


@dataclass(frozen=True)
class Step:
    """One transition, with Digi-Q's field names (plus ``family``, ``task_set``, ``valid``)."""

    traj_id: int
    step_id: int
    task: str
    task_set: str
    family: str
    observation: str  # the policy's text input: "Previous Actions: ... Goal: ..."
    next_observation: str
    image_path: str  # relative to the dataset folder
    next_image_path: str
    action: str  # raw AutoUI action string
    valid: bool  # whether ``action`` parsed as a valid action
    reward: float
    done: bool
    mc_return: float
    trajectory_reward: float


_ARROW = {int: pa.int64(), str: pa.string(), bool: pa.bool_(), float: pa.float64()}
_HINTS = typing.get_type_hints(Step)
STEP_SCHEMA = pa.schema([(f.name, _ARROW[_HINTS[f.name]]) for f in fields(Step)])
_PART = re.compile(r"^steps-(\d{5})\.parquet$")


def mc_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """Discounted returns G_t = r_t + gamma * G_{t+1} of one trajectory."""
    out, g = [0.0] * len(rewards), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        g = rewards[t] + gamma * g
        out[t] = g
    return out


def observation_text(previous_actions: Sequence[str], task: str, history: int = 1, screen: str | None = None) -> str:
    """AutoUI's input text: the last ``history`` actions (their decision part), then the goal.

    ``screen``, the screen's elements as text (:func:`digiq.env.hierarchy.describe`),
    follows as `` Screen: ...`` for a policy that reads it; AutoUI's own prompt has none.
    """
    recent = previous_actions[-history:] if history else []
    prev = " ".join(a.split("Action Decision: ")[-1] for a in recent)
    text = f"Previous Actions: {prev} Goal: {task}".replace("  ", " ")
    return text if screen is None else f"{text} Screen: {screen}".rstrip()


class TrajectoryStore:
    """A dataset folder of step-table parts and screenshots."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.images = self.root / "images"

    def image_name(self, traj_id: int, step_id: int) -> str:
        return f"images/{traj_id:06d}_{step_id:02d}.png"

    def save_image(self, rel: str, pixels: np.ndarray) -> None:
        with atomic_path(self.root / rel) as tmp:
            Image.fromarray(pixels).save(tmp, format="PNG", compress_level=1)

    @staticmethod
    def hierarchy_name(image: str) -> str:
        """Where the view hierarchy of the screen ``image`` (a relative screenshot path) is stored."""
        return str(Path(image).with_suffix(".hierarchy.json"))

    def save_hierarchy(self, image: str, xml: str, size: tuple[int, int]) -> None:
        """Store the screen ``image``'s view hierarchy with the screen's (width, height) that its bounds are in."""
        atomic_write_text(
            self.root / self.hierarchy_name(image), json.dumps({"width": size[0], "height": size[1], "xml": xml})
        )

    def has_hierarchy(self, image: str) -> bool:
        """Whether the screen ``image``'s view hierarchy was stored (``collect.view_hierarchy``)."""
        return (self.root / self.hierarchy_name(image)).exists()

    def load_hierarchy(self, image: str) -> tuple[str, tuple[int, int]]:
        """The stored (XML, (width, height)) of the screen ``image``; a missing or broken file is named."""
        path = self.root / self.hierarchy_name(image)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            return str(record["xml"]), (int(record["width"]), int(record["height"]))
        except FileNotFoundError:
            raise DataError(f"no view hierarchy {path}: collect the data with collect.view_hierarchy: true") from None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DataError(f"cannot read view hierarchy {path}: {e!r}") from None

    def parts(self) -> list[Path]:
        return sorted(p for p in self.root.glob("steps-*.parquet") if _PART.match(p.name))

    def write_part(self, steps: Iterable[Step]) -> Path:
        """Append one part holding ``steps`` (whole trajectories; their images already saved)."""
        rows = [asdict(s) for s in steps]
        if not rows:
            raise DataError(f"refusing to write an empty part to {self.root}")
        parts = self.parts()
        index = int(_PART.match(parts[-1].name).group(1)) + 1 if parts else 0
        path = self.root / f"steps-{index:05d}.parquet"
        with atomic_path(path) as tmp:
            pq.write_table(pa.Table.from_pylist(rows, schema=STEP_SCHEMA), tmp)
        return path

    def read(self) -> pa.Table:
        """All parts as one table, ordered by trajectory and step; a missing dataset or a corrupt part names the file."""
        parts = self.parts()
        if not parts:
            raise DataError(
                f"no trajectory data in {self.root} (expected steps-*.parquet); run the stage that writes it"
            )
        tables = []
        for p in parts:
            try:
                t = pq.read_table(p)
            except (pa.ArrowInvalid, OSError) as e:
                raise DataError(f"corrupt trajectory part {p}: {e}") from None
            missing = [n for n in STEP_SCHEMA.names if n not in t.column_names]
            if missing:
                raise DataError(f"trajectory part {p} lacks field(s) {missing}")
            try:
                tables.append(t.select(STEP_SCHEMA.names).cast(STEP_SCHEMA))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise DataError(f"trajectory part {p} has a field of the wrong type: {e}") from None
        table = pa.concat_tables(tables).sort_by([("traj_id", "ascending"), ("step_id", "ascending")])
        traj, step = (table.column(c).to_numpy() for c in ("traj_id", "step_id"))
        twice = (traj[1:] == traj[:-1]) & (step[1:] == step[:-1])
        if twice.any():  # a part copied or written twice would silently double its rows
            t, s = int(traj[1:][twice][0]), int(step[1:][twice][0])
            holding = [
                p.name for p, tb in zip(parts, tables, strict=True) if t in set(tb.column("traj_id").to_pylist())
            ]
            raise DataError(f"trajectory {t} step {s} is stored twice in {self.root} (parts {holding})")
        return table

    def stored_ids(self) -> set[int]:
        """The trajectory ids already stored (none for a new folder): what a resumed run skips.

        Parts hold trajectories in the order they finished, not in id order,
        so this is read from every part, never inferred from the highest id.
        """
        ids: set[int] = set()
        for p in self.parts():
            try:
                ids.update(pq.read_table(p, columns=["traj_id"]).column("traj_id").to_pylist())
            except (pa.ArrowInvalid, OSError, KeyError) as e:
                raise DataError(f"corrupt trajectory part {p}: {e}") from None
        return ids

    def load_image(self, rel: str) -> np.ndarray:
        path = self.root / rel
        try:
            with Image.open(path) as im:
                return np.array(im.convert("RGB"))  # writable: torch warns on a read-only array
        except (OSError, ValueError) as e:
            raise DataError(f"cannot read screenshot {path}: {e}") from None

    def load_images(self, rels: Sequence[str]) -> np.ndarray:
        """Screenshots of one size as one (n, H, W, 3) array; one of another size than most is named.

        Whoever stacks screenshots (a batch, a before-after pair) reads them
        here, so a screenshot of the wrong size names its file.
        """
        images = [self.load_image(r) for r in rels]
        shapes = Counter(im.shape for im in images)
        if len(shapes) > 1:
            (usual, count), *_ = shapes.most_common()
            odd = next(i for i, im in enumerate(images) if im.shape != usual)
            like = next(i for i, im in enumerate(images) if im.shape == usual)
            raise DataError(f"screenshot {self.root / rels[odd]} is {images[odd].shape[1]}x{images[odd].shape[0]} "
                            f"pixels, but {self.root / rels[like]} and {count - 1} other(s) read with it are "
                            f"{usual[1]}x{usual[0]}")  # fmt: skip
        return np.stack(images)


def step_ids(table: pa.Table) -> np.ndarray:
    """(rows, 2) int64 array of a table's (traj_id, step_id): how feature files name and check their rows."""
    return np.stack([table.column(c).to_numpy() for c in ("traj_id", "step_id")], 1).astype(np.int64)


def split_trajectories(traj_ids: list[int], holdout: float, seed: int) -> set[int]:
    """The held-out trajectory ids (a fixed fraction, by seed)."""
    ids = sorted(set(traj_ids))
    random.Random(seed).shuffle(ids)
    return set(ids[: max(1, round(holdout * len(ids)))]) if len(ids) > 1 else set()


def heldout_rows(traj_ids: np.ndarray, holdout: float, seed: int, task_sets: np.ndarray | None = None) -> np.ndarray:
    """(rows,) bool: the steps of the trajectories :func:`split_trajectories` holds out; with ``task_sets`` (one per
    row), within each task set apart, as each task set's critic holds out its own (stage 06)."""
    traj_ids = np.asarray(traj_ids)
    if task_sets is not None:
        task_sets = np.asarray(task_sets)
        held = np.zeros(len(traj_ids), bool)
        for ts in np.unique(task_sets):
            mine = task_sets == ts
            held[mine] = heldout_rows(traj_ids[mine], holdout, seed)
        return held
    return np.isin(traj_ids, sorted(split_trajectories(traj_ids.tolist(), holdout, seed)))


def data_task_sets(task_sets: Iterable[str]) -> list[str]:
    """The task sets among the stored steps' ``task_sets``, in :data:`~digiq.env.tasks.TASK_SETS`' order: one
    critic and one actor are trained for each (imported data may hold one only)."""
    held = set(task_sets)
    return [ts for ts in TASK_SETS if ts in held] + sorted(held - set(TASK_SETS))


def read_table(path: Path, fields: Sequence[str], what: str, stage: str) -> pa.Table:
    """A Parquet table one stage wrote for another: a missing file names ``stage``, a corrupt or incomplete one ``what``."""
    require(stage, path)
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"corrupt {what} file {path}: {e}") from None
    missing = set(fields) - set(table.column_names)
    if missing:
        raise DataError(f"{what} file {path} lacks field(s) {sorted(missing)}")
    return table
