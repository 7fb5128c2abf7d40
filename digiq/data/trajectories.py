"""Trajectory storage: a Parquet step table plus PNG screenshots.

A dataset is a folder::

    steps-00000.parquet, steps-00001.parquet, ...   one row per step, Digi-Q field names
    images/000123_04.png                            screenshot of trajectory 123, step 4
    images/000123_04.hierarchy.json                 its view hierarchy (optional: collect.view_hierarchy)
    manifest.json                                   each part's SHA-256 digest and row count

Parts are written whole and atomically (temp name, then rename), and
screenshots before the part that references them, so a run killed half way
keeps every finished part and can resume after it. Field names follow
Digi-Q's release so its users feel at home (see :data:`STEP_SCHEMA`).

Nothing read from a store is trusted unchecked: a byte flipped on disk must
be an error naming its file, never other data. Every Parquet file of the
package is written with page checksums and read with them verified
(:func:`write_parquet`, :func:`read_parquet`); a store's parts are also checked
against the digests its manifest recorded when they were written, which
covers what page checksums leave out (page headers, the footer, the schema).
A store without a manifest (written before manifests, or assembled by hand)
is read under its page checksums alone, and gets one on its next write.
Every path a store holds (``image_path``, ``next_image_path``) is relative to
its folder and must resolve inside it (:meth:`TrajectoryStore.path`).

A stage that collects a store as its output fills it beside its place and
swaps it in whole at the end (:func:`store_made_whole`): a kill leaves the
previous output as it was, and the next run with the same settings resumes
the unfinished store, one with other settings starts it anew. The settings
are kept with the store (``made_with.json``).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import typing
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path, PurePath

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from digiq.env.tasks import TASK_SETS
from digiq.io import atomic_path, atomic_write_text, require, swap_in

__all__ = [
    "Step",
    "STEP_SCHEMA",
    "DataError",
    "TrajectoryStore",
    "store_made_whole",
    "returns_discount",
    "mc_returns",
    "observation_text",
    "split_trajectories",
    "heldout_rows",
    "data_task_sets",
    "step_ids",
    "write_parquet",
    "read_parquet",
    "read_table",
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
MANIFEST = "manifest.json"  # in a store's folder: what its parts held when they were written
MADE_WITH = "made_with.json"  # in a store a stage collects: the settings it was collected with
FAULTS = "faults.jsonl"  # a store's fault log: appended to, so never shared between two folders


def write_parquet(table: pa.Table, where: Path | pa.NativeFile) -> None:
    """Write ``table`` (to a file or a stream) with a CRC-32 on every page, which :func:`read_parquet` verifies."""
    pq.write_table(table, where, write_page_checksum=True)


def read_parquet(source: Path | pa.Buffer, what: str, columns: Sequence[str] | None = None) -> pa.Table:
    """A Parquet file (``columns`` of it, or all), page checksums verified and every value checked.

    ``source`` is the file or its bytes; ``what`` names the file in errors
    ("candidates file PATH"). A file that cannot be read, a page whose
    checksum fails, a missing column, or a column whose values are not what
    its type says (text that is not UTF-8, which would otherwise stop whoever
    converts it, far from here, with a bare UnicodeDecodeError) is a
    :class:`DataError` naming the file and the column.
    """
    try:
        with pq.ParquetFile(pa.BufferReader(source) if isinstance(source, pa.Buffer) else source,
                            page_checksum_verification=True) as file:  # fmt: skip
            names = file.schema_arrow.names
            missing = [c for c in columns or () if c not in names]
            table = None if missing else file.read(columns=columns)
    # A changed byte in the footer can make a huge length (MemoryError) or a column name that is not UTF-8.
    except (pa.ArrowException, OSError, MemoryError, UnicodeDecodeError) as e:
        raise DataError(f"corrupt {what}: {type(e).__name__}: {e}") from None
    if table is None:
        raise DataError(f"{what} lacks field(s) {missing}")
    for name in table.column_names:
        try:
            table.column(name).validate(full=True)
        except pa.ArrowException as e:
            raise DataError(f"corrupt {what}: column {name!r} does not decode: {e}") from None
    return table


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
    """A dataset folder of step-table parts, screenshots, and the manifest of the parts."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.images = self.root / "images"
        self.manifest = self.root / MANIFEST

    def image_name(self, traj_id: int, step_id: int) -> str:
        return f"images/{traj_id:06d}_{step_id:02d}.png"

    def path(self, rel: str) -> Path:
        """The file of ``rel``, a path this store holds (relative to its folder), refused by name unless it lies
        inside the folder once ``..`` and symbolic links are followed: a step's path must not reach a file elsewhere.
        """
        try:
            root = self.root.resolve()
            inside = not PurePath(rel).is_absolute() and (root / rel).resolve().is_relative_to(root)
        except (OSError, ValueError, RuntimeError) as e:  # a NUL byte, a loop of links
            raise DataError(f"path {rel!r} in the store {self.root} does not resolve: {e}") from None
        if not inside:
            raise DataError(f"path {rel!r} in the store {self.root} leads outside its folder: "
                            "a store's paths are relative to its folder and stay inside it")  # fmt: skip
        return self.root / rel

    def save_image(self, rel: str, pixels: np.ndarray) -> None:
        with atomic_path(self.path(rel)) as tmp:
            Image.fromarray(pixels).save(tmp, format="PNG", compress_level=1)

    @staticmethod
    def hierarchy_name(image: str) -> str:
        """Where the view hierarchy of the screen ``image`` (a relative screenshot path) is stored."""
        return str(Path(image).with_suffix(".hierarchy.json"))

    def save_hierarchy(self, image: str, xml: str, size: tuple[int, int]) -> None:
        """Store the screen ``image``'s view hierarchy with the screen's (width, height) that its bounds are in."""
        atomic_write_text(
            self.path(self.hierarchy_name(image)), json.dumps({"width": size[0], "height": size[1], "xml": xml})
        )

    def has_hierarchy(self, image: str) -> bool:
        """Whether the screen ``image``'s view hierarchy was stored (``collect.view_hierarchy``)."""
        return self.path(self.hierarchy_name(image)).exists()

    def load_hierarchy(self, image: str) -> tuple[str, tuple[int, int]]:
        """The stored (XML, (width, height)) of the screen ``image``; a missing or broken file is named."""
        path = self.path(self.hierarchy_name(image))
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            return str(record["xml"]), (int(record["width"]), int(record["height"]))
        except FileNotFoundError:
            raise DataError(f"no view hierarchy {path}: collect the data with collect.view_hierarchy: true") from None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DataError(f"cannot read view hierarchy {path}: {e!r}") from None

    def parts(self) -> list[Path]:
        return sorted(p for p in self.root.glob("steps-*.parquet") if _PART.match(p.name))

    def _manifest(self) -> tuple[dict[str, dict], dict[str, dict]] | None:
        """The manifest's ``parts`` (name -> ``{"sha256", "rows"}`` of each part written) and ``pending`` (the part
        being put in place, if any); ``None`` for a store without one."""
        try:
            record = json.loads(self.manifest.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise DataError(f"cannot read the manifest {self.manifest}: {e!r}") from None
        try:
            parts, pending = dict(record["parts"]), dict(record["pending"])
            for name, entry in (*parts.items(), *pending.items()):
                # A name is joined to the folder: only a part's own name may stand there.
                if not _PART.match(name) or not isinstance(entry["sha256"], str) or not isinstance(entry["rows"], int):
                    raise ValueError(f"entry {name!r}: {entry!r}")
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(f"the manifest {self.manifest} is not a store's manifest: {e!r}") from None
        return parts, pending

    def _recorded(self) -> dict[str, dict] | None:
        """What the manifest says each part holds (``None`` for a store without one).

        A pending part whose file is in place counts as written: the run was
        killed after the rename, before the manifest moved it to ``parts``,
        and its digest was recorded before the rename. A pending part with no
        file never got there (killed before the rename) and is no part.
        """
        manifest = self._manifest()
        if manifest is None:
            return None
        parts, pending = manifest
        return {**parts, **{name: e for name, e in pending.items() if (self.root / name).exists()}}

    def _write_manifest(self, parts: dict[str, dict], pending: dict[str, dict]) -> None:
        text = json.dumps({"parts": dict(sorted(parts.items())), "pending": pending}, indent=1)
        atomic_write_text(self.manifest, text + "\n")

    def _read_part(self, path: Path, entry: dict | None, columns: Sequence[str] | None) -> tuple[str, pa.Table]:
        """One part's SHA-256 digest and table, checked against its manifest ``entry`` (when the store has a
        manifest) and its page checksums."""
        try:
            data = path.read_bytes()
        except OSError as e:
            raise DataError(f"cannot read trajectory part {path}: {e}") from None
        digest = _digest(data)
        if entry is not None and digest != entry["sha256"]:
            raise DataError(f"corrupt trajectory part {path}: its SHA-256 digest {digest} differs from the "
                            f"{entry['sha256']} that {self.manifest} recorded when it was written")  # fmt: skip
        return digest, read_parquet(pa.py_buffer(data), f"trajectory part {path}", columns)

    def part_tables(self, columns: Sequence[str] | None = None) -> list[tuple[Path, pa.Table]]:
        """Every part with its table (``columns`` of it, or all), in part order; a part that is not what its
        manifest recorded (changed, gone, or never written by this store) or whose page checksums fail is a
        :class:`DataError` naming the file and what failed."""
        parts, recorded = self.parts(), self._recorded()
        if recorded is None:
            return [(p, self._read_part(p, None, columns)[1]) for p in parts]
        gone = sorted(set(recorded) - {p.name for p in parts})
        if gone:
            raise DataError(f"trajectory part(s) {gone} of {self.root} are gone, though {self.manifest} records them "
                            "as written: restore them (dvc checkout), or collect into a new folder")  # fmt: skip
        stray = [p for p in parts if p.name not in recorded]
        if stray:
            raise DataError(f"trajectory part {stray[0]} is not in {self.manifest}: this store did not write it "
                            "(copied in by hand?); move it out of the folder")  # fmt: skip
        return [(p, self._read_part(p, recorded[p.name], columns)[1]) for p in parts]

    def write_part(self, steps: Iterable[Step]) -> Path:
        """Append one part holding ``steps`` (whole trajectories; their images already saved)."""
        return self.write_table(pa.Table.from_pylist([asdict(s) for s in steps], schema=STEP_SCHEMA))

    def write_table(self, table: pa.Table) -> Path:
        """Append one part holding ``table`` (rows of :data:`STEP_SCHEMA`: whole trajectories, their images already
        saved); returns its path.

        The part's digest enters the manifest as ``pending`` before the part
        is renamed into place, and moves to ``parts`` after, so a run killed
        at any point leaves a store that reads whole (:meth:`_recorded`). A
        store without a manifest gets one here, recording the parts it holds
        once each reads under its page checksums.
        """
        if table.num_rows == 0:
            raise DataError(f"refusing to write an empty part to {self.root}")
        recorded = self._recorded()
        if recorded is None:
            recorded = {}
            for p in self.parts():
                digest, held = self._read_part(p, None, ["traj_id"])
                recorded[p.name] = {"sha256": digest, "rows": held.num_rows}
        names = set(recorded) | {p.name for p in self.parts()}  # a stray part keeps its name: it is not overwritten
        index = max(int(_PART.match(n).group(1)) for n in names) + 1 if names else 0
        path = self.root / f"steps-{index:05d}.parquet"
        sink = pa.BufferOutputStream()
        write_parquet(table, sink)
        data = sink.getvalue().to_pybytes()
        entry = {"sha256": _digest(data), "rows": table.num_rows}
        self._write_manifest(recorded, {path.name: entry})
        with atomic_path(path) as tmp:
            tmp.write_bytes(data)
        self._write_manifest({**recorded, path.name: entry}, {})
        return path

    def read(self) -> pa.Table:
        """All parts as one table, ordered by trajectory and step; a missing dataset or a corrupt part names the file."""
        parts = self.part_tables(STEP_SCHEMA.names)
        if not parts:
            raise DataError(
                f"no trajectory data in {self.root} (expected steps-*.parquet); run the stage that writes it"
            )
        tables = []
        for p, t in parts:
            try:
                tables.append(t.cast(STEP_SCHEMA))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise DataError(f"trajectory part {p} has a field of the wrong type: {e}") from None
        table = pa.concat_tables(tables).sort_by([("traj_id", "ascending"), ("step_id", "ascending")])
        traj, step = (table.column(c).to_numpy() for c in ("traj_id", "step_id"))
        twice = (traj[1:] == traj[:-1]) & (step[1:] == step[:-1])
        if twice.any():  # a part copied or written twice would silently double its rows
            t, s = int(traj[1:][twice][0]), int(step[1:][twice][0])
            holding = [
                p.name for (p, _), tb in zip(parts, tables, strict=True) if t in set(tb.column("traj_id").to_pylist())
            ]
            raise DataError(f"trajectory {t} step {s} is stored twice in {self.root} (parts {holding})")
        return table

    def stored_ids(self) -> set[int]:
        """The trajectory ids already stored (none for a new folder): what a resumed run skips.

        Parts hold trajectories in the order they finished, not in id order,
        so this is read from every part, never inferred from the highest id.
        """
        return {i for _, t in self.part_tables(["traj_id"]) for i in t.column("traj_id").to_pylist()}

    def load_image(self, rel: str) -> np.ndarray:
        path = self.path(rel)
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


def _settings(made_with: Mapping[str, typing.Any]) -> dict[str, typing.Any]:
    """``made_with`` as it reads back from JSON, so a record on disk and settings in hand compare equal."""
    return json.loads(json.dumps(made_with, sort_keys=True, default=str))


def _made_with(folder: Path) -> dict[str, typing.Any] | None:
    """The settings recorded in ``folder`` (``None``: no record, or one that does not read)."""
    try:
        return json.loads((folder / MADE_WITH).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def returns_discount(root: Path) -> float | None:
    """The discount of the Monte-Carlo returns stored at ``root``, as the stage that collected them recorded it
    (``collect.gamma`` in its ``made_with.json``); ``None`` where nothing recorded it (an imported store)."""
    gamma = ((_made_with(root) or {}).get("collect") or {}).get("gamma")
    return float(gamma) if gamma is not None else None


@contextmanager
def store_made_whole(root: Path, made_with: Mapping[str, typing.Any]) -> Iterator[TrajectoryStore]:
    """A store for a stage to collect at ``root``, filled beside it and swapped in whole when the block ends.

    The store is built in ``.<name>.partial`` beside ``root`` with
    ``made_with`` (the settings that decide what is collected: params
    groups, the task lists, the collecting policy's digests) recorded in it.
    A run killed half way leaves ``root`` as it was, never a mix of two
    runs; the next run with the same settings resumes the partial store
    after its last finished part, and one with other settings starts it
    anew. A finished output made with the same settings is taken up again
    (hard links; the fault log copied), so a rerun has nothing left to do.
    """
    record = _settings(made_with)
    partial = root.with_name(f".{root.name}.partial")
    if partial.exists() and _made_with(partial) != record:
        shutil.rmtree(partial)  # another run's settings: nothing of it may enter this output
    if not partial.exists() and root.is_dir() and _made_with(root) == record:
        _link_tree(root, partial)
    partial.mkdir(parents=True, exist_ok=True)
    atomic_write_text(partial / MADE_WITH, json.dumps(record, indent=1, sort_keys=True) + "\n")
    yield TrajectoryStore(partial)
    swap_in(partial, root)


def _link_tree(src: Path, dst: Path) -> None:
    """``src`` copied to ``dst`` as hard links (files are replaced, never written in place), the fault log, which
    is appended to, as a copy; through a temporary name, so a kill leaves no half copy."""
    tmp = dst.with_name(f"{dst.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)

    def link(a: str, b: str) -> None:
        if Path(a).name == FAULTS:
            shutil.copy2(a, b)
        else:
            os.link(a, b)

    shutil.copytree(src, tmp, copy_function=link)
    os.replace(tmp, dst)


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
    table = read_parquet(path, f"{what} file {path}")
    missing = set(fields) - set(table.column_names)
    if missing:
        raise DataError(f"{what} file {path} lacks field(s) {sorted(missing)}")
    return table
