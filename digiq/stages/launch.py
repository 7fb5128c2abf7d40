"""Run a stage in this process, or a data-parallel one in several (``accelerate launch``):
``python -m digiq.stages.launch MODULE``.

Every stage's notebook calls :func:`run_stage` with its module's ``run``. A
stage runs right there, in the notebook's kernel, unless its module is data
parallel (``DATA_PARALLEL``: the base policy's SFT, the VLM's fine-tune, the
critics, the actors) and ``compute.processes`` is N > 1: then it starts
``accelerate launch --num_processes N -m digiq.stages.launch MODULE`` (data
parallel, :mod:`digiq.parallel`) and returns the metrics the main process
wrote, so the notebook reads the same either way. With
``compute.pinned_kernels``, a stage whose kernel was not started pinned
(:mod:`digiq.kernels`: a notebook opened in JupyterLab) runs the same way in
one pinned process of its own.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from digiq.config import ComputeConfig, Settings, load_settings
from digiq.kernels import check_cpu, is_pinned, pinned_children, pinned_environ
from digiq.paths import Paths

__all__ = ["StageFunction", "run_stage", "main"]

# A stage: its module's ``run(settings, paths)``, which returns the metrics it also writes.
StageFunction = Callable[[Settings, Paths], dict[str, Any]]


def run_stage(stage: StageFunction, paths: Paths, params_file: Path | str) -> dict[str, Any]:
    """Run ``stage``, in ``compute.processes`` processes if its module is data parallel; its metrics (what the
    stage function returns).

    ``stage`` is a stage module's ``run`` (e.g. :func:`digiq.stages.critic.run`), so a notebook imports
    exactly the module it runs, and DVC's deps follow from its imports.
    """
    module, name = stage.__module__, stage.__module__.rsplit(".", 1)[-1]
    if stage.__name__ != "run" or not module.startswith("digiq.stages."):
        raise ValueError(f"run_stage takes a stage module's run, got {module}.{stage.__name__}")
    settings = load_settings(params_file)
    compute = settings.compute
    parallel = compute.processes > 1 and getattr(sys.modules[module], "DATA_PARALLEL", False)
    if compute.pinned_kernels:
        check_cpu()
        if not parallel and not is_pinned():  # a kernel started as it was (JupyterLab): the stage runs pinned anyway
            return _in_pinned_process(module, paths, params_file, compute)
        torch.set_num_threads(compute.threads)
    if not parallel:
        return stage(settings, paths)
    # accelerate's multi-process launcher (torchrun underneath; "multi_gpu" in name only): every process
    # joins one group, on the GPUs or, without GPUs or with compute.cpu, on the CPU (digiq.parallel.state).
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
           str(compute.processes), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "-m", "digiq.stages.launch", module, "--root", str(paths.root), "--params", str(params_file)]  # fmt: skip
    # N processes share the cores: one thread each
    threads = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")} if not compute.pinned_kernels else {}
    env = {**(pinned_environ(1) if compute.pinned_kernels else {}), **threads}
    if compute.cpu:
        env["ACCELERATE_USE_CPU"] = "true"
    _run(compute, cmd, env, name)
    return _read(paths, name)


def _in_pinned_process(module: str, paths: Paths, params_file: Path | str, compute: ComputeConfig) -> dict[str, Any]:
    """Stage ``module`` run in one spawned process that starts pinned (:mod:`digiq.kernels`); its error, if any, is
    raised here as it was raised there."""
    with (pinned_children(compute, compute.threads),
          ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool):  # fmt: skip
        return pool.submit(_run_module, module, paths, Path(params_file), compute.threads).result()


def _run_module(module: str, paths: Paths, params_file: Path, threads: int) -> dict[str, Any]:
    torch.set_num_threads(threads)
    return importlib.import_module(module).run(load_settings(params_file), paths)


def _run(compute: ComputeConfig, cmd: list[str], env: dict[str, str], name: str) -> None:
    """Run a stage's command in other processes, with ``env`` beside this process's environment; a failure raises
    the stage's own error, picked out of the processes' logs."""
    done = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
    if done.returncode != 0:
        lines = (done.stdout + done.stderr).splitlines()
        errors = sorted({line.split(_FAILED, 1)[1] for line in lines if _FAILED in line})
        detail = "\n".join(errors) if errors else "\n".join(lines[-40:])  # the stage's own error, else the log's end
        raise RuntimeError(f"stage {name} on {compute.processes} processes failed:\n{detail}")


_FAILED = "digiq.stages.launch failed: "


def _read(paths: Paths, name: str) -> dict[str, Any]:
    return json.loads((paths.metrics / f"{name}.json").read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m digiq.stages.launch", description=__doc__.splitlines()[0])
    ap.add_argument("module", help="a data-parallel stage's module, e.g. digiq.stages.critic (its run runs)")
    ap.add_argument("--root", default=None, help="pipeline root (default: this repository)")
    ap.add_argument("--params", default=None, help="params file (default: ROOT/params.yaml)")
    args = ap.parse_args(argv)
    paths = Paths(Path(args.root)) if args.root else Paths()
    settings = load_settings(Path(args.params) if args.params else paths.root / "params.yaml")
    compute = settings.compute
    if compute.pinned_kernels and compute.processes == 1:
        torch.set_num_threads(compute.threads)
    try:
        importlib.import_module(args.module).run(settings, paths)
    except Exception as e:  # marked, so that run_stage can pick the cause out of N processes' logs
        print(f"{_FAILED}{type(e).__name__}: {e}", file=sys.stderr)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
