"""Every dvc.yaml stage lists, in its deps, each digiq source file its command runs.

A module a stage imports but does not list leaves DVC calling the stage up to date after that
module changed, so its outputs go stale silently. The files a stage runs are found statically
(pure ``ast``, nothing imported, so this stays fast): the notebooks after ``papermill`` and the
``python -m digiq.xxx`` modules in its cmd, then every digiq import of those, transitively.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "digiq"
STAGES: dict[str, dict] = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def module_file(module: str) -> Path | None:
    """The file that runs for ``module`` (``digiq/a/b.py`` or ``digiq/a/b/__init__.py``); None if not ours."""
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def with_parents(module: str) -> list[str]:
    """``digiq.x.y`` and the packages Python initialises first when importing it: ``digiq``, ``digiq.x``."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def package_of(path: Path) -> str:
    """The package a relative import in ``path`` starts from (a package's ``__init__`` is its own package)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
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


def digiq_closure(modules: set[str]) -> set[Path]:
    """The digiq files that run when ``modules`` are imported: them, their parent packages, their imports."""
    files: set[Path] = set()
    todo = [m for m in modules if m.split(".")[0] == PACKAGE]
    while todo:
        for name in with_parents(todo.pop()):
            path = module_file(name)
            if path is None or path in files:
                continue
            files.add(path)
            tree = ast.parse(path.read_text(), filename=str(path))
            todo.extend(m for m in imported_modules(tree, package_of(path)) if m.split(".")[0] == PACKAGE)
    return files


def notebook_imports(notebook: Path) -> set[str]:
    """The modules a notebook's code cells import; IPython magics and shell lines are blanked out first."""
    cells = json.loads(notebook.read_text())["cells"]
    modules: set[str] = set()
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        source = re.sub(r"^\s*[%!].*$", "", source, flags=re.MULTILINE)
        modules |= imported_modules(ast.parse(source, filename=str(notebook)))
    return modules


def entry_modules(cmd: str) -> set[str]:
    """The modules a stage cmd starts: notebooks after ``papermill`` and ``python -m MODULE``."""
    words = shlex.split(cmd.replace("&&", " && "))
    modules: set[str] = set()
    for before, word in zip(words, words[1:]):
        if before == "papermill":
            modules |= notebook_imports(ROOT / word)
        elif before == "-m":  # `python -m pkg` runs pkg/__main__.py when pkg is a package
            modules |= {word, f"{word}.__main__"}
    return modules


def uncovered(files: set[Path], deps: list[str]) -> list[str]:
    """The files (relative posix paths) that no dep names, itself or as a folder that holds it."""
    dep_paths = [(ROOT / d).resolve() for d in deps]
    return sorted(f.relative_to(ROOT).as_posix() for f in files if not any(f == d or d in f.parents for d in dep_paths))


@pytest.mark.parametrize("name", list(STAGES))
def test_stage_deps_cover_the_digiq_files_it_runs(name: str) -> None:
    stage = STAGES[name]
    entries = entry_modules(stage["cmd"])
    assert any(m.split(".")[0] == PACKAGE for m in entries), f"no digiq entry point found in {stage['cmd']!r}"
    missing = uncovered(digiq_closure(entries), stage.get("deps", []))
    listing = "\n".join(f"      - {m}" for m in missing)
    assert not missing, f"dvc.yaml stage {name!r} runs files its deps omit; add to its deps:\n{listing}"


def test_closure_follows_lazy_imports_parents_and_submodules() -> None:
    rel = {p.relative_to(ROOT).as_posix() for p in digiq_closure(entry_modules(STAGES["critic"]["cmd"]))}
    # the stage's own module, what it imports, and the packages imported on the way
    assert {"digiq/stages/launch.py", "digiq/config.py", "digiq/stages/critic.py", "digiq/models/critic.py"} <= rel
    assert {"digiq/__init__.py", "digiq/stages/__init__.py"} <= rel
    assert "digiq/stages/actor.py" not in rel  # another stage's module
    assert ROOT / "digiq/env/__main__.py" in digiq_closure(entry_modules(STAGES["tasks"]["cmd"]))  # python -m digiq.env
    # an import inside a function counts
    assert "digiq.oracle" in imported_modules(ast.parse("def f():\n    from digiq import oracle\n"))
    # `from digiq.env import actions` style: a submodule named after `import`
    tree = ast.parse("from digiq.env import actions\nfrom . import hierarchy")
    assert {"digiq.env", "digiq.env.actions", "digiq.env.hierarchy"} <= imported_modules(tree, "digiq.env")
    assert uncovered({ROOT / "digiq/env/tasks.py"}, ["digiq/env"]) == []
    assert uncovered({ROOT / "digiq/env/tasks.py"}, ["digiq/env.py", "data/tasks"]) == ["digiq/env/tasks.py"]
