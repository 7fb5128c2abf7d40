"""A stage's fingerprint changes with the code it runs, and only with that code: text for people changes nothing."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from digiq.demo import make_workspace
from digiq.fingerprint import STAGE, normalized, write_fingerprints
from digiq.paths import ROOT

COMPUTE = [name for name in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"] if name != STAGE]

SOURCE = '''"""A module."""

import argparse

LIMIT = 3  # the most tries


def tries(n: int) -> int:
    """How many tries ``n`` asks for, at most LIMIT."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return min(n, LIMIT)


def cli() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="Count tries.")
    ap.add_argument("--n", type=int, help="how many tries")
    return ap
'''


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('"""A module."""', '"""A module, reworded."""'),  # a docstring
        ("# the most tries", "# at most this many"),  # a comment
        ('help="how many tries"', 'help="how many tries to make"'),  # a help text
        ("    return min(n, LIMIT)", "    return min(\n        n,\n        LIMIT,\n    )"),  # layout
        ('    """How many tries ``n`` asks for, at most LIMIT."""\n', ""),  # a docstring removed
    ],
)
def test_text_for_people_leaves_the_code_as_it_was(old: str, new: str) -> None:
    assert old in SOURCE
    assert normalized(SOURCE.replace(old, new)) == normalized(SOURCE)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("LIMIT = 3", "LIMIT = 4"),  # a default
        ("min(n, LIMIT)", "max(n, LIMIT)"),  # a line of a function
        ("got {n}", "got {n!r}"),  # an error message
        ('description="Count tries."', 'description="Count the tries."'),  # not a help= argument
        ('help="how many tries"', 'help=f"how many tries, at most {LIMIT}"'),  # an f-string help computes
    ],
)
def test_code_changes_the_normalized_source(old: str, new: str) -> None:
    assert old in SOURCE
    assert normalized(SOURCE.replace(old, new)) != normalized(SOURCE)


def test_a_module_that_reads_a_docstring_keeps_its_docstrings() -> None:
    source = SOURCE.replace('description="Count tries."', "description=__doc__")
    assert normalized(source.replace("A module.", "Another module.")) != normalized(source)


def test_a_block_of_text_alone_stays_a_block() -> None:
    code = normalized('def f() -> None:\n    """Nothing to do."""\n\n\nclass C:\n    "Empty."\n')
    assert code == "def f() -> None:\n    pass\n\nclass C:\n    pass"
    ast.parse(code)


def _append(text: str) -> str:
    return text + "\n_EDITED = 1\n"  # a module-level statement: code


def _reword_docstring(text: str) -> str:
    return text.replace('"""', '"""Reworded. ', 1)


# (file, edit, the stages whose fingerprints it changes): the two kinds of edit of each kind of file.
EDITS = [
    ("digiq/config.py", lambda t: t.replace('help="screenshot width in pixels;', 'help="width of a screenshot;'), []),
    ("digiq/config.py", _reword_docstring, []),
    ("digiq/stages/critic.py", _reword_docstring, []),
    ("digiq/viz/viewers.py", _append, []),
    ("digiq/report.py", _append, []),
    ("digiq/tables.py", _append, ["critic", "diagnostics", "eval", "pae"]),
    ("digiq/stages/augment_actions.py", _append, ["augment_actions"]),
    ("digiq/config.py", lambda t: t.replace("ad_rate: float = _knob(0.3,", "ad_rate: float = _knob(0.31,"), COMPUTE),
    # Package data is code to the stages: an entity the task generator may draw changes the tasks, and through the
    # tokenizer's corpus every model.
    ("digiq/env/data/city.txt", lambda t: t + "Reykjavik\n", COMPUTE),
]
EDIT_IDS = [f"{path}-{'code' if stale else 'text'}-{i}" for i, (path, _, stale) in enumerate(EDITS)]


def _edit(repo: Path, path: str, edit) -> str:
    """Apply ``edit`` to ``repo/path``; the text it had, to put back."""
    before = (repo / path).read_text()
    after = edit(before)
    assert after != before, f"the edit of {path} found nothing to change"
    (repo / path).write_text(after)
    return before


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    """What the fingerprint stage reads (the package, the notebooks and dvc.yaml), copied as the demo copies them."""
    repo = tmp_path_factory.mktemp("fingerprints") / "copy"
    make_workspace(repo)
    return repo


@pytest.mark.parametrize(("path", "edit", "stale"), EDITS, ids=EDIT_IDS)
def test_an_edit_changes_exactly_the_fingerprints_of_the_stages_that_run_it(copy, path, edit, stale) -> None:
    before = {p.name: p.read_bytes() for p in write_fingerprints(copy)}
    assert sorted(before) == sorted(f"{name}.json" for name in COMPUTE)
    original = _edit(copy, path, edit)
    try:
        after = {p.name: p.read_bytes() for p in write_fingerprints(copy)}
    finally:
        (copy / path).write_text(original)
    assert sorted(name.removesuffix(".json") for name in before if after[name] != before[name]) == sorted(stale)
    assert json.loads(before["critic.json"])["digiq/stages/critic.py"]  # one digest per module, by path


def _dvc(repo: Path, *args: str) -> str:
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}", "TQDM_DISABLE": "1"}
    done = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=1800)  # fmt: skip
    assert done.returncode == 0, f"dvc {' '.join(args)}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout


def _stale(repo: Path) -> list[str]:
    """The stages ``dvc status`` calls changed after the fingerprints are brought up to date, that stage aside."""
    _dvc(repo, "repro", STAGE)
    status = json.loads(_dvc(repo, "status", "--json") or "{}")
    assert status.get(STAGE) == ["always changed"], status
    return sorted(name for name in status if name != STAGE)


@pytest.mark.slow  # the whole pipeline under `dvc repro`, then `dvc status` after each edit
@pytest.mark.parametrize(("path", "edit", "stale"), EDITS, ids=EDIT_IDS)
def test_dvc_reruns_exactly_the_stages_whose_code_changed(demo_run, path, edit, stale) -> None:
    pipeline = demo_run.workspace  # the demo's whole pipeline, run under `dvc repro`
    assert _stale(pipeline) == []  # the run left every stage up to date
    original = _edit(pipeline, path, edit)
    try:
        assert _stale(pipeline) == sorted(stale)
    finally:
        (pipeline / path).write_text(original)
    assert _stale(pipeline) == []
