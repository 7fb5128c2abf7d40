"""The pipeline's stages in order, read from ``dvc.yaml``: the one list of them that the report, the docs'
stage table, the tests and starting from imported data read.

``dvc.yaml`` already names every stage, says what it does (``desc``, which
``dvc stage list`` prints too), its command (for a notebook stage, the
notebook papermill runs), what it reads and what it writes; a second list
beside it would drift. A stage's number is its notebook's (``06`` in
``notebooks/06_critic.ipynb``). Adding a stage is its module, its notebook,
its ``dvc.yaml`` entry and, if it has knobs, its config group
(``digiq/config.py``, its values in ``params.yaml``); the stage table of
``docs/pipeline.md`` is generated from this list, and
``tests/test_pipeline.py`` fails when a list elsewhere names the stages
itself.

    python -m digiq.pipeline                          # the stages, their notebooks and outputs
    python -m digiq.pipeline --docs docs/pipeline.md  # regenerate the docs' stage table
"""

from __future__ import annotations

import argparse
import functools
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from digiq.io import fill_block
from digiq.paths import ROOT

__all__ = ["Stage", "stages", "stage", "downstream", "ancestors", "producers", "stage_table", "TABLE", "main"]

TABLE = ("<!-- stages:start -->", "<!-- stages:end -->")  # the generated block of docs/pipeline.md

_NOTEBOOK = re.compile(r"papermill (notebooks/(\d+)_\w+\.ipynb)")


def _paths(entries: list[str | dict]) -> tuple[str, ...]:
    """The paths of a ``deps``/``outs``/``metrics`` list, whose entries are a path or {path: options}."""
    return tuple(e if isinstance(e, str) else next(iter(e)) for e in entries)


@dataclass(frozen=True)
class Stage:
    """One stage of ``dvc.yaml``: its name, what it does, its notebook (None for a command-line stage), what it
    reads and what it writes."""

    name: str
    desc: str
    cmd: str
    notebook: str | None
    deps: tuple[str, ...]
    outs: tuple[str, ...]
    metrics: tuple[str, ...]

    @property
    def number(self) -> int | None:
        """The notebook's number: ``6`` for ``notebooks/06_critic.ipynb``; None without a notebook."""
        return None if self.notebook is None else int(Path(self.notebook).name.split("_")[0])

    @property
    def module(self) -> str | None:
        """The stage module a stage without a notebook runs (``python -m digiq.stages.critic_inputs``, through the
        pinned-kernels wrapper as every stage): ``"critic_inputs"``; None for any other command."""
        own = f"python -m digiq.stages.{self.name}"
        return self.name if self.cmd in (own, f"python -m digiq.kernels {own}") else None

    @property
    def data(self) -> tuple[str, ...]:
        """What it writes for other stages: its outputs without its executed notebook."""
        return tuple(o for o in self.outs if not o.startswith("docs/"))


@functools.cache
def stages(dvc_yaml: Path = ROOT / "dvc.yaml") -> tuple[Stage, ...]:
    """Every stage of ``dvc_yaml``, in its order (the order ``dvc repro`` may run them in)."""
    out = []
    for name, spec in yaml.safe_load(dvc_yaml.read_text())["stages"].items():
        found = _NOTEBOOK.search(spec["cmd"])
        out.append(Stage(name, spec.get("desc", ""), spec["cmd"], found.group(1) if found else None,
                         _paths(spec.get("deps", [])), _paths(spec.get("outs", [])),
                         _paths(spec.get("metrics", []))))  # fmt: skip
    return tuple(out)


def stage(name: str, dvc_yaml: Path = ROOT / "dvc.yaml") -> Stage:
    """The stage called ``name``; a ValueError naming the known ones otherwise."""
    for s in stages(dvc_yaml):
        if s.name == name:
            return s
    raise ValueError(f"no stage {name!r} in {dvc_yaml}; known: {[s.name for s in stages(dvc_yaml)]}")


def producers(s: Stage, dvc_yaml: Path = ROOT / "dvc.yaml") -> list[str]:
    """The stages whose outputs ``s`` reads (an output folder, a file inside one, or the folder a file is in)."""

    def under(path: str, folder: str) -> bool:
        return path == folder or path.startswith(folder.rstrip("/") + "/")

    return [other.name for other in stages(dvc_yaml) if other.name != s.name
            and any(under(dep, out) or under(out, dep) for dep in s.deps for out in other.outs + other.metrics)]  # fmt: skip


def ancestors(names: set[str], skip: set[str] = frozenset(), dvc_yaml: Path = ROOT / "dvc.yaml") -> set[str]:
    """Every stage whose outputs ``names`` read, directly or through other stages; not ``skip`` nor what only they
    read (stages whose outputs come from elsewhere, e.g. imported data)."""
    found: set[str] = set()
    todo = list(names)
    while todo:
        for p in producers(stage(todo.pop(), dvc_yaml), dvc_yaml):
            if p not in found and p not in skip:
                found.add(p)
                todo.append(p)
    return found


def downstream(name: str, dvc_yaml: Path = ROOT / "dvc.yaml") -> list[str]:
    """``name`` and every stage that reads its outputs, directly or not, in ``dvc.yaml``'s order."""
    return [s.name for s in stages(dvc_yaml) if s.name == name or name in ancestors({s.name}, dvc_yaml=dvc_yaml)]


def _folded(paths: tuple[str, ...]) -> list[str]:
    """``paths`` with more than three files of one folder shown as one pattern (``fingerprints/*.json``)."""
    by_folder: dict[str, list[str]] = {}
    for p in paths:
        by_folder.setdefault(str(Path(p).parent), []).append(p)
    out: list[str] = []
    for p in paths:
        folder = by_folder[str(Path(p).parent)]
        if len(folder) <= 3:
            out.append(p)
        elif p == folder[0]:
            out.append(f"{Path(p).parent}/*{Path(p).suffix}")
    return out


def stage_table(dvc_yaml: Path = ROOT / "dvc.yaml") -> str:
    """The stages as a Markdown table for ``docs/pipeline.md``: number, name, executed notebook (the notebook itself
    where no run executed it yet), what each does and writes for the stages after it (``docs/`` links are relative
    to that page)."""
    rows = ["| | stage | notebook | does | writes |", "|---|---|---|---|---|"]
    for s in stages(dvc_yaml):
        number = "" if s.number is None else f"{s.number:02d}"
        if s.notebook is None:
            notebook = "(command line)"
        elif (dvc_yaml.parent / "docs" / "notebooks" / Path(s.notebook).name).exists():
            notebook = f"[`{Path(s.notebook).stem}`](notebooks/{Path(s.notebook).name})"
        else:  # a stage the committed run did not have: its notebook as written, until a run executes it
            notebook = f"[`{Path(s.notebook).stem}`](../{s.notebook}) (not run yet)"
        writes = ", ".join(f"`{o}`" for o in _folded(s.data + tuple(m for m in s.metrics if m not in s.data)))
        rows.append(f"| {number} | {s.name} | {notebook} | {s.desc} | {writes or '-'} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m digiq.pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=Path, help="a page whose stage-table block to regenerate (docs/pipeline.md)")
    args = parser.parse_args(argv)
    if args.docs:
        fill_block(args.docs, TABLE, stage_table())
        return
    for s in stages():
        number = "--" if s.number is None else f"{s.number:02d}"
        print(f"{number} {s.name:<16} {s.notebook or '(command line)':<36} {', '.join(s.data) or '-'}")


if __name__ == "__main__":
    main()
