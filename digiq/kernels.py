"""Pinned CPU kernels: a run gives the same bits on any x86-64 machine with AVX2.

Which CPU code a float operation runs decides its last bits, and so every
result downstream: torch (ATen), MKL and oneDNN each pick, per machine, the
widest vector instructions the CPU has (AVX-512 on one machine, AVX2 on
another), and a reduction split over threads adds its parts in an order
that depends on how many threads there are. With ``compute.pinned_kernels``
(on by default) every process a stage starts runs:

- ATen's, MKL's and oneDNN's AVX2 code whatever the CPU offers beyond it
  (MKL in its strict reproducible mode, which also makes its results
  independent of its threads);
- a fixed number of torch threads: ``compute.threads`` in the stage's own
  process (the notebook's kernel), one in each worker process, and
  ``compute.job_cpus`` in each Ray job;
- Python's string hashing seeded alike (the order of a set of strings).

These are environment variables that the libraries read once, when they
first run, so they are set before the process starts: DVC starts each stage
through ``python -m digiq.kernels CMD`` (:func:`main`), which sets them and
runs ``CMD`` (papermill, then the notebook's kernel, inherit them); worker
processes get them from :func:`pinned_children`, Ray jobs from the
cluster's runtime environment. A stage run in a process that is not pinned
(a notebook opened in JupyterLab) runs in a pinned process of its own
instead (:func:`digiq.stages.launch.run_stage`), whatever the environment
says.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from digiq.config import ComputeConfig, load_settings

__all__ = ["PINNED_ISA", "pinned_environ", "is_pinned", "in_use", "pinned_children", "check_cpu", "main"]

# The instruction set every kernel library is held to, as each library's variable spells it.
PINNED_ISA = {
    "ATEN_CPU_CAPABILITY": "avx2",  # torch's own kernels (softmax, reductions, element-wise ops)
    "MKL_CBWR": "AVX2,STRICT",  # MKL's BLAS and LAPACK: the AVX2 branch, results independent of its threads
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN's (convolutions, linear layers and activations through mkldnn)
    "DNNL_MAX_CPU_ISA": "AVX2",  # the same, as oneDNN before 2.5 names it
}
_X86 = ("x86_64", "amd64")


def pinned_environ(threads: int) -> dict[str, str]:
    """The variables a pinned process starts with, ``threads`` torch (OpenMP, MKL) threads."""
    isa = PINNED_ISA if platform.machine().lower() in _X86 else {}  # other CPUs: only what decides them alike
    return {**isa, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONHASHSEED": "0"}


def is_pinned(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process started pinned: every variable set as :func:`pinned_environ` sets it (threads apart,
    which a process sets for itself) and, once torch is loaded, its kernels at AVX2."""
    want = {k: v for k, v in pinned_environ(1).items() if not k.endswith("_NUM_THREADS")}
    if any(environ.get(k) != v for k, v in want.items()):
        return False
    torch = sys.modules.get("torch")
    return torch is None or "ATEN_CPU_CAPABILITY" not in want or torch.backends.cpu.get_cpu_capability() == "AVX2"


def in_use() -> str:
    """The kernels this process runs, as a stage's metrics record them: ``"AVX2, 2 threads, pinned"``."""
    import torch

    pinned = ", pinned" if is_pinned() else ""
    return f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads{pinned}"


def check_cpu() -> None:
    """Refuse, naming the setting, a CPU on which pinned kernels cannot give the pinned bits: an x86-64 without AVX2.

    Raises:
        RuntimeError: the CPU lacks AVX2.
    """
    if platform.machine().lower() not in _X86:
        return
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return  # not Linux: the libraries' own dispatch decides, as on any machine without the file
    if "avx2" not in flags:
        raise RuntimeError("compute.pinned_kernels: this CPU has no AVX2, so no run here can give the pinned "
                           "bits; set compute.pinned_kernels: false to run with its own kernels")  # fmt: skip


@contextmanager
def pinned_children(compute: ComputeConfig, threads: int) -> Iterator[None]:
    """Processes started inside the block (spawned workers) start pinned, ``threads`` threads each; this process's
    own environment is put back after."""
    if not compute.pinned_kernels:
        yield
        return
    saved = dict(os.environ)
    os.environ.update(pinned_environ(threads))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main(argv: list[str] | None = None) -> None:
    """``python -m digiq.kernels [--params FILE] CMD...``: run ``CMD`` pinned as the params' compute group says."""
    ap = argparse.ArgumentParser(prog="python -m digiq.kernels", description=main.__doc__)
    ap.add_argument("--params", type=Path, default=None, help="params file (default: ./params.yaml)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="the command to run, with its arguments")
    args = ap.parse_args(argv)
    if not args.cmd:
        ap.error("give the command to run pinned, e.g. python -m digiq.kernels papermill IN.ipynb OUT.ipynb")
    compute = load_settings(args.params or Path.cwd() / "params.yaml").compute
    env = dict(os.environ)
    if compute.pinned_kernels:
        try:
            check_cpu()
        except RuntimeError as e:
            ap.exit(2, f"{ap.prog}: error: {e}\n")
        env.update(pinned_environ(compute.threads))
    try:
        os.execvpe(args.cmd[0], args.cmd, env)
    except OSError as e:
        ap.exit(2, f"{ap.prog}: error: cannot run {args.cmd[0]!r}: {e.strerror}\n")


if __name__ == "__main__":
    main()
