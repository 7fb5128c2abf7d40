"""Pinned kernels: every process a stage starts runs AVX2 kernels with fixed threads, whatever its environment says."""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from digiq.config import ComputeConfig
from digiq.kernels import PINNED_ISA, is_pinned, pinned_environ
from digiq.paths import ROOT
from digiq.workers import map_jobs

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 kernels")

# What a machine may advertise: its widest kernels, many threads, MKL choosing its own code path.
ADVERTISED = {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "7", "MKL_CBWR": "AUTO", "ONEDNN_MAX_CPU_ISA": "ALL"}
REPORT = (
    "import json, os, torch; from digiq.kernels import is_pinned; print(json.dumps({'isa': "
    "torch.backends.cpu.get_cpu_capability(), 'threads': torch.get_num_threads(), 'pinned': is_pinned(), "
    "'hashseed': os.environ.get('PYTHONHASHSEED')}))"
)


def _through_wrapper(tmp_path: Path, pinned: bool) -> dict:
    params = yaml.safe_load((ROOT / "params" / "compute.yaml").read_text())
    params["compute"].update({"pinned_kernels": pinned, "threads": 1})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    outside = {k: v for k, v in os.environ.items() if k not in pinned_environ(1)}  # as if started unpinned
    env = {**outside, **ADVERTISED, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, "-m", "digiq.kernels", "python", "-c", REPORT], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_stage_wrapper_pins_whatever_the_environment_advertises(tmp_path):
    assert _through_wrapper(tmp_path, pinned=True) == {"isa": "AVX2", "threads": 1, "pinned": True, "hashseed": "0"}
    unpinned = _through_wrapper(tmp_path, pinned=False)  # the setting off: the environment's own choice
    assert unpinned["threads"] > 1 and not unpinned["pinned"] and unpinned["hashseed"] is None


def _kernels(_: int) -> tuple[str, int, bool]:
    return torch.backends.cpu.get_cpu_capability(), torch.get_num_threads(), is_pinned()


def test_workers_start_pinned_with_one_thread_and_this_process_keeps_its_environment(monkeypatch):
    for k, v in ADVERTISED.items():
        monkeypatch.setenv(k, v)
    before = dict(os.environ)
    got = map_jobs(_kernels, [0, 1, 2], ComputeConfig(workers=2))
    assert got == [("AVX2", 1, True)] * 3 and dict(os.environ) == before
    off = map_jobs(_kernels, [0, 1], ComputeConfig(workers=2, pinned_kernels=False))
    assert all(not pinned for _, _, pinned in off)


def test_pinned_kernels_give_other_bits_than_a_machine_s_widest_ones_where_it_has_wider():
    """What the setting is for: torch's softmax differs in its last bits between AVX2 and AVX-512 kernels."""
    code = ("import torch, hashlib; torch.manual_seed(0); x = torch.randn(333, 517); "
            "print(hashlib.sha256(torch.softmax(x, 1).numpy().tobytes()).hexdigest())")  # fmt: skip
    run = [sys.executable, "-c", code]
    widest = subprocess.run(run, capture_output=True, text=True, env={**os.environ, "ATEN_CPU_CAPABILITY": "default"})
    pinned = subprocess.run(run, capture_output=True, text=True, env={**os.environ, **pinned_environ(1)})
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        pytest.skip("this CPU's widest kernels are AVX2's: nothing to tell apart")
    assert widest.stdout != pinned.stdout and len(pinned.stdout.strip()) == 64


def test_the_pinned_variables_hold_every_library_to_avx2():
    env = pinned_environ(4)
    assert {k: env[k] for k in PINNED_ISA} == PINNED_ISA and env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "4"


def test_a_stage_run_from_a_process_that_is_not_pinned_runs_pinned_and_raises_its_own_errors(tmp_path):
    """A notebook opened in JupyterLab starts its kernel as the environment is: its stage runs pinned anyway."""
    params = {"propose": {"per_group": 2, "crawl_depth": 2}, "env": {"width": 108}}
    for name in ("compute", "devices"):
        params.update(yaml.safe_load((ROOT / "params" / f"{name}.yaml").read_text()))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    code = ("import json, sys; from pathlib import Path; from digiq.paths import Paths; "
            "from digiq.stages.launch import run_stage; from digiq.stages.propose import run; "
            "root = Path(sys.argv[1]); print(json.dumps(run_stage(run, Paths(root), root / 'params.yaml')))")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in pinned_environ(1)} | ADVERTISED
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["cpu_kernels"] == "AVX2, 2 threads, pinned"
    params["propose"]["per_group"] = 0  # out of range: the stage's own error comes back as it was raised
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    failed = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    own_error = "ConfigError: params.yaml: propose: per_group must be >= 1"
    assert failed.returncode == 1 and own_error in failed.stderr, failed.stderr[-2000:]
