"""Shared plumbing of the pipeline stages: task lists, metrics files, timing, plots."""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

import matplotlib

matplotlib.use("Agg")  # headless: stages run under papermill and DVC
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from digiq.io import (  # noqa: E402
    StageError,
    atomic_folder,
    atomic_path,
    atomic_write_text,
    clear_leftovers,
    swap_in,
)
from digiq.kernels import in_use  # noqa: E402
from digiq.lock import stage_lock  # noqa: E402
from digiq.paths import Paths  # noqa: E402
from digiq.viz.colours import row_colours  # noqa: E402

__all__ = ["write_metrics", "timed", "save_curve_plot", "log_curves", "written_whole",
           "one_run_at_a_time", "online_curves_figure", "seed_curve", "per_seed_total", "save_figure"]  # fmt: skip


Entry = TypeVar("Entry", bound=Callable[..., Any])  # a stage's entry function


def one_run_at_a_time(stage: str) -> Callable[[Entry], Entry]:
    """Decorator of ``stage``'s entry (the function its notebook calls, given ``paths``): the only live run of it.

    The run's main process holds the stage's lock (:func:`digiq.lock.stage_lock`
    on :meth:`Paths.lock`) from the entry's start to its end. A second run started
    while the first is alive (a notebook left running when DVC was killed) stops
    at once, naming the first's PID, instead of writing the same outputs beside
    it; once the first has ended, however it ended, the lock is free. The other
    processes of a multi-process run work for the main one and lock nothing.
    """

    def decorate(entry: Entry) -> Entry:
        signature = inspect.signature(entry)
        if "paths" not in signature.parameters:
            raise TypeError(f"{entry.__qualname__}: a stage's entry takes paths, under which its lock lives")

        @functools.wraps(entry)
        def run(*args: Any, **kwargs: Any) -> Any:
            from digiq import parallel

            paths = signature.bind(*args, **kwargs).arguments["paths"]
            with stage_lock(paths.lock(stage), stage) if parallel.is_main() else contextlib.nullcontext():
                return entry(*args, **kwargs)

        return cast(Entry, run)

    return decorate


@contextmanager
def written_whole(paths: Paths, folder: str) -> Iterator[Paths]:
    """Run a training stage into a temporary folder, swapped in for its output ``folder`` when the stage ends well.

    Yields ``paths`` with that folder (``vlm``, ``critics`` or ``actors``) moved to
    ``.<name>.partial-<PID>`` beside it. A run cut short leaves the previous run's
    folder whole, never a mix of this run's seeds and an earlier run's that
    the next stage would take for one run. The PID is the run's main process's,
    which every process of a multi-process run learns from it: one run's
    processes share the folder, and no two runs ever do. It runs inside the
    stage's entry (:func:`one_run_at_a_time`), whose lock says no other run of
    the stage is alive: the temporary folders of other runs here are what runs
    cut short left, and are removed.
    """
    from digiq import parallel

    final = getattr(paths, folder)
    partial = final.with_name(f".{final.name}.partial-{parallel.broadcast(os.getpid())}")
    if parallel.is_main():
        clear_leftovers(final)  # the output a swap cut short had moved aside, put back; temporary folders removed
        for left in final.parent.glob(f".{final.name}.partial*"):  # a dead run's folder
            shutil.rmtree(left, ignore_errors=True)
        partial.mkdir(parents=True)
    parallel.barrier()
    yield paths.writing(folder, partial)
    parallel.barrier()  # every process has written
    if parallel.is_main():
        swap_in(partial, final)
    parallel.barrier()


def write_metrics(paths: Paths, stage: str, metrics: dict[str, Any]) -> Path:
    path = paths.metrics / f"{stage}.json"
    atomic_write_text(path, json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    return path


@contextmanager
def timed(metrics: dict[str, Any], key: str = "wall_time_s") -> Iterator[None]:
    """Record the block's wall time as ``metrics[key]``; a stage's own (``wall_time_s``) with the CPU kernels it ran
    (:func:`digiq.kernels.in_use`), which decide its bits."""
    t0 = time.perf_counter()
    yield
    metrics[key] = round(time.perf_counter() - t0, 2)
    if key == "wall_time_s":
        metrics["cpu_kernels"] = in_use()


def log_curves(folder: Path, curves: dict[str, list[float]]) -> None:
    """Each curve step by step, as dvclive logs a training run: ``folder/plots/metrics/<name>.tsv``.

    ``dvc plots diff`` then draws two commits' or experiments' curves over
    each other. The folder is written into a temporary one swapped in whole
    (:func:`digiq.io.atomic_folder`), so no curve of an earlier run with
    other rows is left in it, and a run cut short leaves the earlier curves.
    """
    from dvclive import Live  # imported here: dvclive loads DVC's machinery, which only the stages need
    from scmrepo.exceptions import SCMError

    with atomic_folder(folder) as tmp:
        try:
            live = Live(dir=str(tmp), save_dvc_exp=False, dvcyaml=False, report=None)
        except SCMError as e:  # dvclive reads the commit it logs against
            raise StageError(f"cannot log curves to {folder}: {e}; commit once (git commit) before running a "
                             "stage") from e  # fmt: skip
        with live:
            for step in range(max(map(len, curves.values()), default=0)):
                live.step = step
                for name, ys in curves.items():
                    if step < len(ys):
                        live.log_metric(re.sub(r"\W+", "_", name).strip("_"), float(ys[step]))
        (tmp / "metrics.json").unlink(missing_ok=True)  # the last values only; stage metrics live in metrics/


SHARED_PANEL = 4  # the most curves one panel holds; more are drawn as small multiples, one curve a panel


def save_curve_plot(path: Path, curves: dict[str, list[float]], title: str, ylabel: str = "loss") -> Path:
    """Learning curves as a PNG (renders anywhere, no charting library from the network), and logged by
    :func:`log_curves` into the folder of the same name, for ``dvc plots diff``.

    Up to :data:`SHARED_PANEL` curves share one panel; more are small multiples on shared axes, one curve
    a panel titled by its name, four panels a row, so that none hides another.
    """
    log_curves(path.with_suffix(""), curves)
    if len(curves) <= SHARED_PANEL:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for name, ys in curves.items():
            ax.plot(range(len(ys)), ys, label=name)
        ax.set(title=title, xlabel="step", ylabel=ylabel)
        ax.grid(alpha=0.3)
        if len(curves) > 1:
            ax.legend()
        fig.tight_layout()
        return save_figure(fig, path)
    cols = 4
    rows = -(-len(curves) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3 * cols, 2.2 * rows), sharex=True, sharey=True, squeeze=False)
    for ax, (name, ys) in zip(axes.flat, curves.items(), strict=False):
        ax.plot(range(len(ys)), ys, lw=1)
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(curves) :]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path)


def seed_curve(per_seed: list[list[dict[str, Any]]], y: str, x: str = "env_steps"
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:  # fmt: skip
    """A curve over the rounds every seed's run has: ``x`` summed round by round (mean over seeds), and ``y`` at
    each round, its mean, lowest and highest over seeds; ``None`` where some seed has no round."""
    n = min((len(rounds) for rounds in per_seed), default=0)
    if n == 0:
        return None
    xs = np.mean([np.cumsum([r[x] for r in rounds[:n]]) for rounds in per_seed], 0)
    ys = np.array([[r[y] for r in rounds[:n]] for rounds in per_seed])
    return xs, ys.mean(0), ys.min(0), ys.max(0)


def per_seed_total(by_task_set: dict[str, Any], key: str, seeds: int) -> float:
    """The mean over seeds of ``key`` summed over every round of each task set's runs (``{"per_seed": [...]}``)."""
    return float(np.mean([sum(r[key] for part in by_task_set.values() for r in part["per_seed"][s])
                          for s in range(seeds)]))  # fmt: skip


def online_curves_figure(rows: dict[str, Any], levels: dict[str, float] | None = None) -> Figure:
    """Success of each online row's rounds against environment steps and wall time (mean over seeds, band: range).

    ``rows`` maps each curve's name to its runs' rounds (``{"per_seed": [...]}``, one task set's part of an
    entry of ``metrics/digirl_online.json``'s ``rows``); ``levels`` are other
    policies' success rates drawn as horizontal lines (an offline method's
    level on the same kind of tasks).
    """
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
    colours = row_colours(list(rows))
    for row, entry in rows.items():
        for ax, key in zip(axes, ("env_steps", "wall_time_s"), strict=True):
            if (curve := seed_curve(entry["per_seed"], "success", key)) is None:
                continue
            x, mean, low, high = curve
            ax.plot(x, mean, marker="o", ms=3, color=colours[row], label=row)
            ax.fill_between(x, low, high, color=colours[row], alpha=0.15)
    for (name, level), style in zip((levels or {}).items(), ("--", ":", "-.", (0, (5, 5))) * 4, strict=False):
        for ax in axes:
            ax.axhline(level, color="grey", linestyle=style, label=name)
    axes[0].set(xlabel="environment steps collected online", ylabel="success of the round's episodes")
    axes[1].set(xlabel="wall time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def save_figure(fig: Figure, path: Path) -> Path:
    """``fig`` as a PNG at ``path``, written whole; the figure is closed."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return path
