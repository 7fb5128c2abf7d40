"""A first whole run in minutes: every stage, every notebook executed, at the demo preset, in a scratch workspace.

    python -m digiq.demo [--workspace DIR]      (make demo)

The workspace is a copy of what the pipeline runs (the package, the
notebooks, ``dvc.yaml``, the params files and DVC's settings) with
``params/presets/demo.yaml`` written into its params files; ``dvc repro``
then runs every stage there, and the run ends with its results table
(``RESULTS.md``) and figures (``plots/``). This checkout's ``dvc.lock``,
metrics, notebooks and data are never touched. Run again, the demo copies
the code anew and ``dvc repro`` reruns only what changed.

The run is committed in the workspace's own git repository, so that a
setting is tried there as a DVC experiment, beside the run::

    dvc exp run -S eval.temperature=0      (reruns only the stages that read it)
    dvc exp show --only-changed

The demo's numbers show what each stage makes on a handful of tasks, not
what the method does: ``make repro`` is the run at the paper's scale.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from digiq.io import atomic_write_text
from digiq.paths import ROOT, Paths
from digiq.preset import apply_preset
from digiq.report import results_markdown

__all__ = ["DEMO_PRESET", "make_workspace", "workspace_environ", "run_demo", "output_digests", "environment", "main"]

DEMO_PRESET = ROOT / "params" / "presets" / "demo.yaml"
DEFAULT_WORKSPACE = Path(tempfile.gettempdir()) / "digiq-demo"
MARK = ".digiq-demo"  # in a workspace this module made: the only kind of folder it writes over
# .gitignore: the workspace's commits leave out what the checkout's do (bytecode, checkpoints, data/ in DVC's cache).
COPIED = ("digiq", "notebooks", "params", "dvc.yaml", "params.yaml", ".dvcignore", ".dvc/config", ".gitignore")
RESULTS = "RESULTS.md"
BIN = Path(sys.executable).parent  # the stages' `python` and `papermill` are this interpreter's


class DemoError(RuntimeError):
    """The demo cannot run where it was asked to (the message names the folder and why)."""


def make_workspace(workspace: Path, preset: Path = DEMO_PRESET, source: Path = ROOT) -> list[str]:
    """Copy what the pipeline runs from ``source`` into ``workspace`` and write ``preset`` into its params files;
    the settings the preset changed, one line each.

    Raises:
        DemoError: ``workspace`` is inside ``source``, or holds files this module did not put there.
    """
    workspace, source = workspace.resolve(), source.resolve()
    if workspace == source or source in workspace.parents:
        # DVC would find the workspace's dvc.yaml as a part of this checkout's pipeline.
        raise DemoError(f"demo workspace {workspace} is inside the checkout {source}: choose a folder outside it")
    if workspace.exists() and any(workspace.iterdir()) and not (workspace / MARK).exists():
        raise DemoError(f"demo workspace {workspace} holds files that no demo put there: choose an empty folder")
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / MARK).touch()
    for name in COPIED:  # the code anew; what the stages wrote (data/, metrics/, plots/, dvc.lock) stays
        src, dst = source / name, workspace / name
        if dst.is_dir():
            shutil.rmtree(dst)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
        else:
            shutil.copy2(src, dst)
    fresh = not (workspace / ".git").exists()
    if fresh:
        _git(workspace, "init", "-q")
    # The workspace's own committer: `dvc exp run` commits each experiment and stops where git knows no user.
    _git(workspace, "config", "user.name", "digiq demo")
    _git(workspace, "config", "user.email", "demo@localhost")
    if fresh:  # a clone's commit: dvclive logs its curves against one
        _git(workspace, "commit", "-q", "--allow-empty", "-m", "digiq demo workspace")
    return apply_preset(preset, workspace / "params.yaml")


def _git(workspace: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=workspace, check=True)


def _commit_run(workspace: Path) -> None:
    """Commit what the run left in ``workspace`` (its params, ``dvc.lock``, metrics, notebooks; data/ stays in
    DVC's cache): the baseline ``dvc exp run`` starts from and ``dvc exp show`` compares with. A rerun that changed
    nothing commits nothing, so the experiments made on the run stay listed under it."""
    _git(workspace, "add", "-A")
    if subprocess.run(["git", "diff", "--cached", "--quiet"], cwd=workspace).returncode == 1:  # 1: changes staged
        _git(workspace, "commit", "-q", "-m", "digiq demo run")


def workspace_environ(workspace: Path) -> dict[str, str]:
    """The environment a stage runs in within ``workspace``: :data:`BIN` first on ``PATH``, and the workspace's copy
    of the package imported before any other."""
    # Every stage process imports the workspace's copy of the package (a notebook's kernel would otherwise put an
    # inherited PYTHONPATH first), so its outputs land in the workspace, whose root that copy knows.
    python_path = os.pathsep.join(p for p in (str(workspace.resolve()), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": python_path,
            "TQDM_DISABLE": "1"}  # fmt: skip


def run_demo(workspace: Path, preset: Path = DEMO_PRESET, source: Path = ROOT) -> str:
    """The whole pipeline at ``preset`` in ``workspace`` (:func:`make_workspace`, then ``dvc repro``); its results
    table, also written to ``workspace/RESULTS.md``.

    Raises:
        DemoError: the workspace is refused, or ``dvc repro`` failed (its output's end in the message).
    """
    for line in make_workspace(workspace, preset, source):
        print(f"  {line}")
    print(f"dvc repro in {workspace} ...", flush=True)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "dvc", "repro"], cwd=workspace, env=workspace_environ(workspace),
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    if done.returncode != 0:
        raise DemoError(f"dvc repro failed in {workspace} (rc {done.returncode}):\n{done.stdout[-4000:]}")
    results = results_markdown(Paths(workspace)).replace("](plots/", f"]({workspace / 'plots'}/")
    (workspace / RESULTS).write_text(results + "\n", encoding="utf-8")
    _commit_run(workspace)
    figures = sorted((workspace / "plots").glob("*.png"))
    return "\n".join([
        f"The demo's whole pipeline ran in {time.perf_counter() - start:.0f} s in {workspace}.",
        "Its numbers show what each stage makes on a handful of tasks, not what the method does.", "",
        results, "", f"Figures ({len(figures)}):", *(f"  {f}" for f in figures), "",
        f"Executed notebooks: {workspace / 'docs' / 'notebooks'}", "",
        "Try a setting as a DVC experiment beside this run (only the stages that read it rerun):",
        f"  cd {shlex.quote(str(workspace))} && export PATH={shlex.quote(str(BIN))}:$PATH PYTHONPATH=$PWD",
        "  dvc exp run -S eval.temperature=0 && dvc exp show --only-changed",
    ])  # fmt: skip


# The libraries whose versions decide the demo's bits, beside the kernels every stage runs pinned to.
LIBRARIES = ("torch", "numpy", "pyarrow", "pandas", "pillow", "transformers", "tokenizers", "safetensors",
             "matplotlib", "dvclive", "pydantic")  # fmt: skip


def environment() -> dict[str, str]:
    """What, beside the code, decides the demo's outputs bit for bit: the machine's kind, Python, the libraries."""
    return {"machine": platform.machine(), "python": platform.python_version(),
            **{name: metadata.version(name) for name in LIBRARIES}}  # fmt: skip


def _steady(value: Any) -> Any:
    """Parsed JSON without what differs from one run of the same code to the next: wall times, speeds and the CPU
    kernels a stage ran (the same under pinned kernels, but the machine's own name for them)."""
    if isinstance(value, dict):
        return {k: _steady(v) for k, v in value.items() if not k.endswith(("time_s", "_per_s")) and k != "cpu_kernels"}
    return [_steady(v) for v in value] if isinstance(value, list) else value


def output_digests(workspace: Path) -> dict[str, str]:
    """A SHA-256 per output of the run in ``workspace``: each metrics file, and each folder under ``data/`` and
    ``plots/`` as one digest of its files' paths and digests; JSON without its wall times and speeds
    (:func:`_steady`). Left out: the stages' lock files and the PNG figures (two draw wall times; every curve's
    values are in the metrics and dvclive's logs, which count).

    The same code and :func:`environment` give the same digests: what a change that moves no result must leave
    as it was.
    """
    parts: dict[str, list[str]] = {}
    for folder in ("data", "metrics", "plots"):
        for path in sorted(p for p in (workspace / folder).rglob("*") if p.is_file()):
            rel = path.relative_to(workspace)
            if path.suffix in (".lock", ".png") or path.name.startswith("."):
                continue
            data = path.read_bytes()
            if path.suffix == ".json":
                data = json.dumps(_steady(json.loads(data)), sort_keys=True).encode()
            unit = rel.as_posix() if folder == "metrics" or len(rel.parts) == 2 else "/".join(rel.parts[:2])
            parts.setdefault(unit, []).append(f"{rel.as_posix()} {hashlib.sha256(data).hexdigest()}")
    return {unit: hashlib.sha256("\n".join(lines).encode()).hexdigest() for unit, lines in parts.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m digiq.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", type=Path, default=DEFAULT_WORKSPACE,
                    help=f"scratch folder of the demo's run, outside this checkout (default {DEFAULT_WORKSPACE})")  # fmt: skip
    ap.add_argument("--preset", type=Path, default=DEMO_PRESET, help="the settings written into the copy's params")
    ap.add_argument("--record", type=Path, default=None,
                    help="also write the run's output digests and environment to this file (tests/demo_outputs.json: "
                    "what the tests hold a later run to)")  # fmt: skip
    args = ap.parse_args(argv)
    try:
        print(run_demo(args.workspace, args.preset))
        if args.record:
            record = {"environment": environment(), "digests": output_digests(args.workspace)}
            atomic_write_text(args.record, json.dumps(record, indent=1, sort_keys=True) + "\n")
    except DemoError as e:
        print(f"digiq.demo: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
