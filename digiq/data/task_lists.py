"""The task lists stages read (``data/tasks/<task set>_<split>.txt``, written by the ``tasks`` stage), and a digest
of the tasks a store was collected on."""

from __future__ import annotations

import hashlib

from digiq.env.tasks import Task, UnsupportedInstruction, parse_task
from digiq.io import StageError, require, text_lines
from digiq.paths import Paths

__all__ = ["read_tasks", "tasks_digest"]


def read_tasks(paths: Paths, task_set: str, split: str, n: int | None = None, stage: str = "?") -> list[Task]:
    """The first ``n`` tasks (all with ``None``) of a task list; a list shorter than ``n`` is an error, not a cut.

    A line of them that does not parse, is not UTF-8 or is longer than
    :data:`~digiq.env.tasks.MAX_INSTRUCTION_CHARS` stops the stage, named by
    file and line: a stage's list is generated, so an odd line means a broken file.
    """
    path = paths.task_list(task_set, split)
    require(stage, path)
    lines = [(i, ln, why) for i, ln, why in text_lines(path) if ln.strip()]
    if n is not None and len(lines) < n:
        raise StageError(f"stage {stage}: {path} has {len(lines)} tasks, fewer than the {n} asked; regenerate the "
                         "lists (dvc repro tasks) or ask for fewer")  # fmt: skip
    tasks = []
    for i, line, why in lines[:n]:
        if why is None:
            try:
                tasks.append(parse_task(line, task_set))
                continue
            except UnsupportedInstruction as e:
                why = str(e)
        raise StageError(f"stage {stage}: {path}:{i}: {why}")
    return tasks


def tasks_digest(tasks: list[Task]) -> str:
    """One SHA-256 for a list of tasks in order (task set and instruction): what a store collected on them records."""
    return hashlib.sha256("".join(f"{t.task_set}\t{t.instruction}\n" for t in tasks).encode()).hexdigest()
