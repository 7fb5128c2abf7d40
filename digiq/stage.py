"""Run a training stage in this process or in several (``accelerate launch``): ``python -m digiq.stage NAME``.

The notebooks of stages 00, 03, 05 and 06 call :func:`run_stage`. With
``compute.processes: 1`` the stage runs right there, in the notebook's
kernel. With N > 1 it starts ``accelerate launch --num_processes N -m
digiq.stage NAME`` (data parallel, :mod:`digiq.parallel`) and returns the
metrics the main process wrote, so the notebook reads the same either way.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from digiq.config import (
    AblationsConfig,
    ActorConfig,
    BasePolicyConfig,
    CollectConfig,
    ComputeConfig,
    CriticConfig,
    DeviceConfig,
    EnvConfig,
    ExperimentConfig,
    TasksConfig,
    VLMFinetuneConfig,
    load_params,
    load_section,
)
from digiq.paths import Paths

__all__ = ["STAGES", "run_stage", "main"]


def _base_policy(p: dict[str, Any], paths: Paths) -> dict[str, Any]:
    from digiq.train.base_policy import run_base_policy

    return run_base_policy(
        load_section(BasePolicyConfig, "base_policy", p),
        load_section(EnvConfig, "env", p),
        paths,
        split_seed=load_section(TasksConfig, "tasks", p).split_seed,
    )


def _vlm_finetune(p: dict[str, Any], paths: Paths) -> dict[str, Any]:
    from digiq.train.vlm_finetune import run_vlm_finetune

    return run_vlm_finetune(load_section(VLMFinetuneConfig, "vlm_finetune", p), paths)


def _critic(p: dict[str, Any], paths: Paths) -> dict[str, Any]:
    from digiq.train.critic import run_critic

    ablations = load_section(AblationsConfig, "ablations", p)
    return run_critic(load_section(CriticConfig, "critic", p), paths,
                      seeds=load_section(ExperimentConfig, "experiment", p).seeds,
                      untuned=ablations.untuned_vlm, untuned_seeds=ablations.seeds)  # fmt: skip


def _actor(p: dict[str, Any], paths: Paths) -> dict[str, Any]:
    from digiq.train.actor import run_actor

    actor, ablations = load_section(ActorConfig, "actor", p), load_section(AblationsConfig, "ablations", p)
    if load_section(DeviceConfig, "devices", p).backend == "emulator" and (
        actor.oracle_states or ablations.perfect_critic
    ):
        raise ValueError("actor.oracle_states must be 0 and ablations.perfect_critic false with devices.backend "
                         "emulator: both replay the collected episodes in the simulator, and these happened on "
                         "real devices")  # fmt: skip
    return run_actor(actor, paths, seeds=load_section(ExperimentConfig, "experiment", p).seeds, ablations=ablations,
                     env=load_section(EnvConfig, "env", p),
                     collect=load_section(CollectConfig, "collect", p))  # fmt: skip


# The stages that train; what each returns is also in metrics/<name>.json (actor: actor.json and oracle.json).
STAGES: dict[str, Callable[[dict[str, Any], Paths], dict[str, Any]]] = {
    "base_policy": _base_policy,
    "vlm_finetune": _vlm_finetune,
    "critic": _critic,
    "actor": _actor,
}


def run_stage(name: str, paths: Paths, params_file: Path | str) -> dict[str, Any]:
    """Run stage ``name`` with ``compute.processes`` processes; its metrics (what the stage function returns)."""
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}; stages that train: {sorted(STAGES)}")
    params = load_params(params_file)
    compute = load_section(ComputeConfig, "compute", params)
    if compute.processes == 1:
        return STAGES[name](params, paths)
    # accelerate's multi-process launcher (torchrun underneath; "multi_gpu" in name only): every process
    # joins one group, on the GPUs or, without GPUs or with compute.cpu, on the CPU (digiq.parallel.state).
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
           str(compute.processes), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "-m", "digiq.stage", name, "--root", str(paths.root), "--params", str(params_file)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}  # N processes share the cores
    if compute.cpu:
        env["ACCELERATE_USE_CPU"] = "true"
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        lines = (done.stdout + done.stderr).splitlines()
        errors = sorted({line.split(_FAILED, 1)[1] for line in lines if _FAILED in line})
        detail = "\n".join(errors) if errors else "\n".join(lines[-40:])  # the stage's own error, else the log's end
        raise RuntimeError(f"stage {name} on {compute.processes} processes failed:\n{detail}")
    if name == "actor":
        return {k: _read(paths, k) for k in ("actor", "oracle") if (paths.metrics / f"{k}.json").exists()}
    return _read(paths, name)


_FAILED = "digiq.stage failed: "


def _read(paths: Paths, name: str) -> dict[str, Any]:
    return json.loads((paths.metrics / f"{name}.json").read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m digiq.stage", description=__doc__.splitlines()[0])
    ap.add_argument("name", choices=sorted(STAGES))
    ap.add_argument("--root", default=None, help="pipeline root (default: this repository)")
    ap.add_argument("--params", default=None, help="params file (default: ROOT/params.yaml)")
    args = ap.parse_args(argv)
    paths = Paths(Path(args.root)) if args.root else Paths()
    params = load_params(Path(args.params) if args.params else paths.root / "params.yaml")
    try:
        STAGES[args.name](params, paths)
    except Exception as e:  # marked, so that run_stage can pick the cause out of N processes' logs
        print(f"{_FAILED}{type(e).__name__}: {e}", file=sys.stderr)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
