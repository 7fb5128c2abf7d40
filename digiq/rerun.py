"""How far a whole rerun moves the results: two pipeline runs' test tables side by side.

A pipeline run has one base policy and one offline dataset; its seeds repeat
only the critic, the actors and their evaluation, so the sample std over
seeds says nothing about how much a rerun with another base policy would
move the numbers. ``python -m digiq.rerun --other DIR`` compares this
checkout's results (``metrics/``, ``params.yaml``) with another whole run's,
kept in ``DIR`` as that run's ``eval.json``, ``comparisons.json`` and
``params.yaml``: every row both runs have, per task set, and every
comparison of both, with its interval in each run. The table goes into the
reruns page, docs/experiments-reruns.md, between ``<!-- rerun:start -->``
and ``<!-- rerun:end -->``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from digiq.config import load_params, with_defaults
from digiq.env.tasks import TASK_SETS
from digiq.io import fill_block
from digiq.paths import Paths
from digiq.tables import TASK_SET_NAMES, pct

__all__ = ["params_differences", "rerun_markdown", "RERUN"]

RERUN = ("<!-- rerun:start -->", "<!-- rerun:end -->")  # in docs/experiments-reruns.md


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.update(_flat(v, key + ".") if isinstance(v, dict) and v else {key: v})
    return out


def params_differences(first: dict[str, Any], second: dict[str, Any]) -> list[str]:
    """``key: a -> b`` for every params key whose value differs between two runs (missing reads as ``-``)."""
    a, b = _flat(first), _flat(second)
    return [f"`{k}`: {a.get(k, '-')} -> {b.get(k, '-')}" for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


def _read(folder: Path, name: str) -> dict[str, Any]:
    p = folder / name
    if not p.exists():
        raise FileNotFoundError(f"{p} is missing: a run's folder needs eval.json, comparisons.json and params.yaml")
    return with_defaults(load_params(p)) if p.suffix == ".yaml" else json.loads(p.read_text())


def _interval(c: dict[str, Any]) -> str:
    lo, hi = c["ci95"]
    return f"{c['diff']:+.1f} [{lo:+.1f}, {hi:+.1f}]" + ("" if lo > 0 or hi < 0 else " n.s.")


def rerun_markdown(first: Path, first_params: Path, second: Path) -> str:
    """Both runs' success per row and task set with the move between them, then both runs' comparisons.

    ``first`` holds this checkout's ``eval.json`` and ``comparisons.json``
    (``first_params`` its params file); ``second`` the other run's, with the
    params file it ran with.
    """
    runs = [(_read(first, "eval.json"), _read(first, "comparisons.json")),
            (_read(second, "eval.json"), _read(second, "comparisons.json"))]  # fmt: skip
    changed = params_differences(_read(first_params.parent, first_params.name), _read(second, "params.yaml"))
    rows = [r for r in runs[0][0] if r in runs[1][0]]
    if not rows:
        raise ValueError(f"{first} and {second} share no evaluated row")
    head = [f"{TASK_SET_NAMES[ts]} {part}" for ts in TASK_SETS for part in ("run 1", "run 2", "move")]
    out = ["Runs differ in " + ("; ".join(changed) if changed else "nothing in their params") + ".", "",
           "| policy | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]  # fmt: skip
    moves: dict[str, list[float]] = {ts: [] for ts in TASK_SETS}
    for row in rows:
        cells = []
        for ts in TASK_SETS:
            a, b = (run[0][row][ts]["success_rate"] for run in runs)
            moves[ts].append(abs(b - a))
            cells += [pct(a), pct(b), f"{100 * (b - a):+.1f}"]
        out.append(f"| {row} | " + " | ".join(cells) + " |")
    largest = ", ".join(f"{TASK_SET_NAMES[ts]} {100 * max(moves[ts]):.1f}" for ts in TASK_SETS)
    mean = ", ".join(f"{TASK_SET_NAMES[ts]} {100 * sum(moves[ts]) / len(moves[ts]):.1f}" for ts in TASK_SETS)
    out += ["", f"Success rate (%), each the mean over the run's seeds on the whole test lists. Largest move of a "
            f"row: {largest} points; mean move: {mean}.", ""]  # fmt: skip
    names = [
        n for n in runs[0][1].get(TASK_SETS[0], {}) if all(n in run[1].get(ts, {}) for run in runs for ts in TASK_SETS)
    ]
    if names:
        head = [f"{TASK_SET_NAMES[ts]} run {i}" for ts in TASK_SETS for i in (1, 2)]
        out += ["| comparison | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
        for name in names:
            cells = [_interval(run[1][ts][name]) for ts in TASK_SETS for run in runs]
            out.append(f"| {name.replace('-', ' - ', 1)} | " + " | ".join(cells) + " |")
        out += ["", "A - B in points with its 95% paired bootstrap interval within each run (n.s.: the interval "
                "holds 0, no detectable difference)."]  # fmt: skip
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other", required=True, help="the other run's eval.json, comparisons.json and params.yaml")
    ap.add_argument("--experiments", default=str(Paths().root / "docs" / "experiments-reruns.md"))
    args = ap.parse_args()
    paths = Paths()
    body = rerun_markdown(paths.metrics, paths.root / "params.yaml", Path(args.other))
    fill_block(Path(args.experiments), RERUN, body)
    print(body)


if __name__ == "__main__":
    main()
