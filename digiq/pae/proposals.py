"""Proposed tasks, one per line: what both proposers write and the practice loop reads.

Each line is a JSON object: the instruction, the task set that gives its step
limit, the app it is for, which proposer wrote it, the screens it was written
from, and for each value filled into it where that value came from (a screen
of the crawl, a line of the lexicon, or the LLM's own words). The file is a
DVC output, so a rerun of the practice loop needs no endpoint.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from digiq.io import atomic_write_text

__all__ = ["SOURCES", "TASK_SETS", "Proposal", "Slot", "read_proposals", "write_proposals"]

SOURCES = ("screen", "lexicon", "llm")
TASK_SETS = ("general", "webshop")  # the step limits a proposal may ask for: 10 and 20 steps


@dataclass(frozen=True)
class Slot:
    """A value filled into a proposal: ``source`` is screen, lexicon or llm; ``where`` the screen's path
    (``"home"``, ``"Settings > Apps & notifications"``) or the lexicon's ``file:line``."""

    name: str
    value: str
    source: str
    where: str


@dataclass(frozen=True)
class Proposal:
    """One proposed task. ``frame`` is the built-in proposer's sentence with its slots (empty for an LLM's)."""

    instruction: str
    task_set: str
    app: str
    proposer: str
    context: tuple[str, ...]
    frame: str = ""
    slots: tuple[Slot, ...] = ()

    def __post_init__(self) -> None:
        if not self.instruction.strip():
            raise ValueError(f"a proposal for {self.app!r} by {self.proposer!r} has an empty instruction")
        if self.task_set not in TASK_SETS:
            raise ValueError(f"proposal {self.instruction!r}: task_set must be one of {list(TASK_SETS)}, "
                             f"got {self.task_set!r}")  # fmt: skip
        bad = [s.source for s in self.slots if s.source not in SOURCES]
        if bad:
            raise ValueError(f"proposal {self.instruction!r}: slot sources must be among {list(SOURCES)}, got {bad}")


def write_proposals(path: Path, proposals: Sequence[Proposal]) -> None:
    """One JSON object per line, in order; written whole or not at all."""
    atomic_write_text(path, "".join(json.dumps(asdict(p), ensure_ascii=False) + "\n" for p in proposals))


def read_proposals(path: Path) -> list[Proposal]:
    """The proposals of a file :func:`write_proposals` wrote.

    Raises:
        ValueError: naming the file and line of a line that is not a proposal, or a file with none.
    """
    out = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            slots = tuple(Slot(**s) for s in row.pop("slots", ()))
            out.append(Proposal(**{**row, "context": tuple(row["context"]), "slots": slots}))
        except (json.JSONDecodeError, TypeError, KeyError, ValueError, AttributeError) as e:
            raise ValueError(f"{path}:{number}: not a proposal ({type(e).__name__}: {e})") from None
    if not out:
        raise ValueError(f"{path}: no proposals")
    return out
