"""Each stage's code, reduced to digests that change only when what it computes can: ``python -m digiq.fingerprint``.

DVC reruns a stage when one of its deps changes. A stage runs every digiq
module its notebook or command imports, followed through their imports; with
those files as deps, a reworded docstring or help text in a module every stage
imports (``digiq/config.py``) reran the whole pipeline. So each stage depends
instead on ``fingerprints/<stage>.json``, written by the first stage of
``dvc.yaml`` (``always_changed``: it runs on every ``dvc repro``, in a few
seconds): for each module the stage runs, a digest of its syntax tree with what
only people read left out (comments and layout, which the tree never holds;
docstrings and other bare strings; the literal text of ``help=`` arguments). The
file's bytes, and so DVC's hash of it, stay the same until code the stage runs
changes, and then DVC reruns exactly the stages that run that code.

A package's data files (its ``data/`` folder: the task generator's entity
lists) are read by its code as the code is, so they count as its code: a
stage depends on every byte of the data of each package it runs.

The modules are found statically (pure ``ast``, nothing imported): the
notebooks after ``papermill`` and the ``python -m`` modules in a stage's
``cmd``, then every digiq import of those, in functions too, with the packages
Python initialises on the way.
"""

from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import json
import re
import shlex
from pathlib import Path

import yaml

from digiq.io import atomic_write_text
from digiq.paths import ROOT

__all__ = [
    "STAGE",
    "imported_modules",
    "digiq_closure",
    "entry_modules",
    "normalized",
    "stage_code",
    "fingerprint_file",
    "write_fingerprints",
    "main",
]

PACKAGE = "digiq"
STAGE = "fingerprints"  # the dvc.yaml stage that writes them, and their folder
DATA = "data"  # a package's folder of data files its code reads


def module_file(module: str, root: Path) -> Path | None:
    """The file that runs for ``module`` (``digiq/a/b.py`` or ``digiq/a/b/__init__.py``); None if not ours."""
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def with_parents(module: str) -> list[str]:
    """``digiq.x.y`` and the packages Python initialises first when importing it: ``digiq``, ``digiq.x``."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def package_of(path: Path, root: Path) -> str:
    """The package a relative import in ``path`` starts from (a package's ``__init__`` is its own package)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1])


def imported_modules(tree: ast.AST, package: str = "") -> set[str]:
    """Every module an import anywhere in ``tree`` names, in functions too (a lazy import runs as well).

    ``from a import b`` names ``a`` and, in case ``b`` is a submodule rather than a plain name, ``a.b``;
    callers keep only the names that resolve to a file. Relative imports resolve against ``package``.
    """
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # `from .. import x` in package a.b.c: level 1 is a.b.c, level 2 is a.b
                anchor = package.rsplit(".", node.level - 1)[0]
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return found


def digiq_closure(modules: set[str], root: Path = ROOT) -> set[Path]:
    """The digiq files that run when ``modules`` are imported: them, their parent packages, their imports."""
    files: set[Path] = set()
    todo = [m for m in modules if m.split(".")[0] == PACKAGE]
    while todo:
        for name in with_parents(todo.pop()):
            path = module_file(name, root)
            if path is None or path in files:
                continue
            files.add(path)
            todo.extend(_parsed(path.read_text(encoding="utf-8"), package_of(path, root))[0])
    return files


@functools.cache
def _parsed(source: str, package: str) -> tuple[frozenset[str], str]:
    """The digiq modules ``source`` imports and the SHA-256 of its :func:`normalized` form.

    Keyed by the text itself, so a file many stages run is parsed once, and an edited one anew.
    """
    imports = imported_modules(ast.parse(source), package)
    digest = hashlib.sha256(normalized(source).encode()).hexdigest()
    return frozenset(m for m in imports if m.split(".")[0] == PACKAGE), digest


def notebook_imports(notebook: Path) -> set[str]:
    """The modules a notebook's code cells import; IPython magics and shell lines are blanked out first."""
    modules: set[str] = set()
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = re.sub(r"^\s*[%!].*$", "", "".join(cell["source"]), flags=re.MULTILINE)
        modules |= imported_modules(ast.parse(source, filename=str(notebook)))
    return modules


def entry_modules(cmd: str, root: Path = ROOT) -> set[str]:
    """The modules a stage cmd starts: notebooks after ``papermill`` and ``python -m MODULE``."""
    words = shlex.split(cmd.replace("&&", " && "))
    modules: set[str] = set()
    for before, word in zip(words, words[1:]):
        if before == "papermill":
            modules |= notebook_imports(root / word)
        elif before == "-m":  # `python -m pkg` runs pkg/__main__.py when pkg is a package
            main = f"{word}.__main__"
            modules |= {word, main} if module_file(main, root) else {word}
    return modules


def _reads_doc(tree: ast.AST) -> bool:
    """Whether code in ``tree`` reads a ``__doc__`` (a CLI's description, say): then its docstrings are data."""
    return any(
        (isinstance(node, ast.Name) and node.id == "__doc__")
        or (isinstance(node, ast.Attribute) and node.attr == "__doc__")
        for node in ast.walk(tree)
    )


def _is_text(statement: ast.stmt) -> bool:
    """A bare string statement: a docstring, or a string nothing uses."""
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def normalized(source: str, filename: str = "<source>") -> str:
    """``source`` as the code it runs: its syntax tree, unparsed, without what only people read.

    Comments and layout are gone with the parse. Bare strings (docstrings
    among them) go unless the module reads a ``__doc__``; a ``help=`` argument
    that is a plain string literal becomes ``""``: the help of a config field
    (:mod:`digiq.config`) or of a command-line option, which no stage computes
    with. Any other string, f-strings and error messages included, stays.
    """
    tree = ast.parse(source, filename=filename)
    drop_text = not _reads_doc(tree)
    for node in ast.walk(tree):
        if drop_text:
            for name in ("body", "orelse", "finalbody"):
                block = getattr(node, name, None)
                if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                    # A block of text alone becomes `pass`: the same code, and still a block.
                    setattr(node, name, [s for s in block if not _is_text(s)] or [ast.Pass()])
        if isinstance(node, ast.keyword) and node.arg == "help" and isinstance(node.value, ast.Constant):
            if isinstance(node.value.value, str):
                node.value = ast.Constant("")
    return ast.unparse(tree)


def stage_code(cmd: str, root: Path = ROOT) -> dict[str, str]:
    """Every digiq file ``cmd`` runs (relative posix path) and the SHA-256 of its :func:`normalized` source, and
    every data file of the packages it runs (under a package's ``data/`` folder) and the SHA-256 of its bytes."""
    modules = digiq_closure(entry_modules(cmd, root), root)
    code = {path.relative_to(root).as_posix(): _parsed(path.read_text(encoding="utf-8"), package_of(path, root))[1]
            for path in modules}  # fmt: skip
    data = {path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for package in modules if package.name == "__init__.py"
            for path in (package.parent / DATA).rglob("*") if path.is_file()}  # fmt: skip
    return dict(sorted({**code, **data}.items()))


def fingerprint_file(stage: str) -> str:
    """Where stage ``stage``'s fingerprint lives, relative to the repository root: one of its deps."""
    return f"{STAGE}/{stage}.json"


def write_fingerprints(root: Path = ROOT) -> list[Path]:
    """One fingerprint per stage of ``root``'s dvc.yaml but this one, each written whole, and no other file in their
    folder (the stage's one output: a stage dropped from dvc.yaml leaves no fingerprint behind); the files written."""
    stages = yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    written = []
    for name, stage in stages.items():
        if name == STAGE:
            continue
        path = root / fingerprint_file(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Sorted and indented alike every time: the same code gives the same bytes, which is what DVC compares.
        atomic_write_text(path, json.dumps(stage_code(stage["cmd"], root), indent=1, sort_keys=True) + "\n")
        written.append(path)
    for stale in set((root / STAGE).glob("*.json")) - set(written):
        stale.unlink()
    return written


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m digiq.fingerprint", description="Write fingerprints/<stage>.json "
                                 "for every stage of dvc.yaml: the digests of the code each stage runs.")  # fmt: skip
    ap.add_argument("--root", type=Path, default=ROOT, help="repository root holding dvc.yaml")
    args = ap.parse_args(argv)
    for path in write_fingerprints(args.root):
        print(path.relative_to(args.root).as_posix())


if __name__ == "__main__":
    main()
