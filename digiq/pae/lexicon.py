"""The built-in proposer's declared world knowledge (``lexicon.txt`` beside this file, or a file of your own).

A language model proposing tasks for a phone knows things the phone's screens
do not show: cities, dishes, gadgets, what Maps is for. The built-in proposer
(:mod:`digiq.pae.propose`) takes that knowledge from this file only, so each
word of a proposal that no screen showed points to one of its lines.

The format: ``[kind]`` opens a section; each later non-empty line that is not
a ``#`` comment is one value of that kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_LEXICON", "Entry", "Lexicon"]

DEFAULT_LEXICON = Path(__file__).with_name("lexicon.txt")


@dataclass(frozen=True)
class Entry:
    """One value and the line of the lexicon file it is written on (1-based)."""

    value: str
    line: int


@dataclass(frozen=True)
class Lexicon:
    """The file's values by kind, in file order; ``path`` is how proposals cite the file."""

    path: str
    kinds: dict[str, tuple[Entry, ...]]

    @classmethod
    def read(cls, path: Path | str = DEFAULT_LEXICON) -> Lexicon:
        """Read a lexicon file.

        Raises:
            ValueError: a value before any ``[kind]`` header, an empty or repeated kind, or a value written twice
                in one kind (each naming the file and line).
        """
        kinds: dict[str, list[Entry]] = {}
        current: list[Entry] | None = None
        for number, raw in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            where = f"{path}:{number}"
            if line.startswith("[") and line.endswith("]"):
                kind = " ".join(line[1:-1].split())
                if not kind or kind in kinds:
                    raise ValueError(f"{where}: {'an empty' if not kind else 'a repeated'} section [{kind}]")
                current = kinds[kind] = []
            elif current is None:
                raise ValueError(f"{where}: the value {line!r} comes before any [kind] header")
            elif any(e.value.lower() == line.lower() for e in current):
                raise ValueError(f"{where}: {line!r} is written twice in one section")
            else:
                current.append(Entry(line, number))
        # Where each value is cited from: the default by its place in the repository, so every clone writes the same.
        name = "digiq/pae/lexicon.txt" if Path(path).resolve() == DEFAULT_LEXICON.resolve() else str(path)
        return cls(name, {kind: tuple(entries) for kind, entries in kinds.items()})

    def __getitem__(self, kind: str) -> tuple[Entry, ...]:
        """The entries of ``kind``; none when the lexicon has no such section."""
        return self.kinds.get(kind, ())

    def purposes(self) -> dict[str, tuple[str, Entry]]:
        """What each app is for, by the name its icon shows: ``{"Maps": ("places", entry)}`` from ``Maps: places``.

        Raises:
            ValueError: a ``[purpose]`` line without ``app: purpose``.
        """
        out = {}
        for entry in self["purpose"]:
            app, sep, purpose = entry.value.partition(":")
            if not sep or not app.strip() or not purpose.strip():
                raise ValueError(f"{self.path}:{entry.line}: a [purpose] line is 'app: purpose', got {entry.value!r}")
            out[app.strip()] = (purpose.strip(), entry)
        return out
