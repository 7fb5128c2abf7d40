"""Every dvc.yaml stage depends on a fingerprint that covers each digiq source file its command runs.

A module a stage runs but its fingerprint leaves out would let DVC call the stage up to date after that
module changed, so its outputs would go stale silently. The fingerprint stage finds the files statically
(:mod:`digiq.fingerprint`); these tests check that each stage depends on its fingerprint, that the static
search follows every kind of import, and that it finds every digiq module a stage's imports really load.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from digiq.fingerprint import (
    STAGE,
    digiq_closure,
    entry_modules,
    fingerprint_file,
    imported_modules,
    notebook_imports,
    stage_code,
    write_fingerprints,
)
from digiq.paths import ROOT

STAGES: dict[str, dict] = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
COMPUTE = [name for name in STAGES if name != STAGE]


def test_the_fingerprint_stage_comes_first_runs_every_time_and_writes_one_file_per_stage(tmp_path) -> None:
    assert next(iter(STAGES)) == STAGE and STAGES[STAGE]["always_changed"] is True
    # Its one output is the folder: no second list of the stages to keep beside dvc.yaml's.
    assert STAGES[STAGE]["outs"] == [{STAGE: {"cache": False}}]
    shutil.copy2(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    for code in ("digiq", "notebooks"):  # what the fingerprints digest, read where it is
        (tmp_path / code).symlink_to(ROOT / code)
    (tmp_path / STAGE).mkdir()
    (tmp_path / STAGE / "a_dropped_stage.json").write_text("{}")
    write_fingerprints(tmp_path)
    assert sorted(p.name for p in (tmp_path / STAGE).iterdir()) == sorted(
        Path(fingerprint_file(name)).name for name in COMPUTE
    )


@pytest.mark.parametrize("name", COMPUTE)
def test_a_stage_depends_on_its_fingerprint_instead_of_its_code_files(name: str) -> None:
    deps = STAGES[name]["deps"]
    assert fingerprint_file(name) in deps, f"dvc.yaml stage {name!r}: add {fingerprint_file(name)} to its deps"
    # A code file among the deps would rerun the stage for a reworded docstring again. A data file the package
    # ships (the built-in proposer's lexicon) is a dep of its own: no fingerprint covers it.
    assert not [d for d in deps if d.startswith("digiq") and d.endswith(".py")], (
        f"dvc.yaml stage {name!r}: code deps {deps}"
    )
    assert any(m.split(".")[0] == "digiq" for m in entry_modules(STAGES[name]["cmd"])), STAGES[name]["cmd"]


# Run in a fresh interpreter: a stage's imports, then every digiq source file Python loaded for them.
_LOADED = """
import json, sys
exec(sys.stdin.read())
files = {getattr(m, "__file__", None) for name, m in list(sys.modules.items()) if name.split(".")[0] == "digiq"}
print(json.dumps(sorted(f for f in files if f)))
"""


def _imports_of(cmd: str) -> str:
    """The import statements a stage's entries run first: its notebooks' imports, or its ``-m`` modules."""
    if "papermill" not in cmd:
        return "\n".join(f"import {m}" for m in sorted(entry_modules(cmd)))
    notebook = ROOT / cmd.split("papermill ")[1].split()[0]
    statements = []
    for cell in json.loads(notebook.read_text())["cells"]:
        if cell["cell_type"] == "code":
            tree = ast.parse("".join(cell["source"]))
            statements += [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return "\n".join(statements)


@pytest.mark.slow  # one interpreter per stage, each importing torch
@pytest.mark.parametrize("name", COMPUTE)
def test_the_fingerprint_covers_every_digiq_file_the_stage_s_imports_load(name: str) -> None:
    """What Python really loads, against what the static search found: an import it cannot see fails here."""
    cmd = STAGES[name]["cmd"]
    done = subprocess.run([sys.executable, "-c", _LOADED], input=_imports_of(cmd), capture_output=True, text=True,
                          cwd=ROOT, check=True)  # fmt: skip
    loaded = {str(ROOT.joinpath(p).resolve().relative_to(ROOT)) for p in json.loads(done.stdout)}
    missing = sorted(loaded - set(stage_code(cmd)))
    assert len(loaded) > 5 and not missing, f"stage {name!r} runs files its fingerprint omits: {missing}"


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
    # a notebook's magics and shell lines are no Python, and do not stop the search
    assert "digiq.paths" in notebook_imports(ROOT / "notebooks" / "06_critic.ipynb")


@pytest.mark.parametrize("name", COMPUTE)
def test_no_stage_runs_the_viewers_or_the_readme_generator(name: str) -> None:
    """The interactive viewers and the README's tables change without rerunning any compute."""
    files = set(stage_code(STAGES[name]["cmd"]))
    assert not files & {"digiq/viz/viewers.py", "digiq/report.py"}, name
