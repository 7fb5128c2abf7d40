"""Stages up to 08 at the Digi-Q paper's data scale, timed stage by stage: what the pipeline costs there.

Clones this repository's committed HEAD into ``--workdir``, applies
``params/presets/paper_scale.yaml`` there (``python -m digiq.preset``: the
paper's 2,304 trajectories and about the released critic's step budget),
builds the clone's own environment (``make venv``) and runs ``dvc repro
diagnostics``: every stage up to stage 08, in the clone alone. Then prints
each stage's wall time (``wall_time_s`` of its metrics) beside this
checkout's committed run at today's scale, and their ratio.

Stages 09 and 10 do not grow with the offline data (their budgets are online
rounds and the test lists), so the whole pipeline at the paper's scale takes
this table's total plus their committed times, which the last line adds.
Run it alone on the machine: every stage's time is measured.

    python benchmarks/paper_scale.py --workdir /tmp/paper_scale
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from pathlib import Path

from digiq import pipeline
from digiq.paths import ROOT

LAST = "diagnostics"  # the last stage whose cost grows with the offline data
FIXED = ("digirl_online", "eval")  # budgets of rounds and test lists, the same at any data scale


def wall_time(root: Path, stage: str) -> float | None:
    """A stage's wall time in seconds from ``root``'s metrics (evaluation's is in ``eval_timing.json``)."""
    path = root / "metrics" / f"{'eval_timing' if stage == 'eval' else stage}.json"
    return json.loads(path.read_text()).get("wall_time_s") if path.exists() else None


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=cwd, env=env, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, required=True, help="an empty folder for the clone and its run")
    ap.add_argument("--keep", action="store_true", help="reuse a clone already in --workdir (resume a cut run)")
    args = ap.parse_args()
    clone = args.workdir / "digiq"
    if not args.keep:
        shutil.rmtree(clone, ignore_errors=True)
        args.workdir.mkdir(parents=True, exist_ok=True)
        run(["git", "clone", "--quiet", str(ROOT), str(clone)], cwd=args.workdir)
        run(["make", "venv"], cwd=clone)
        run(
            [str(clone / ".venv" / "bin" / "python"), "-m", "digiq.preset", "params/presets/paper_scale.yaml"],
            cwd=clone,
        )
    # The clone's own environment only: a PYTHONPATH pointing at this checkout would run this checkout's code there.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{clone / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"
    run([str(clone / ".venv" / "bin" / "dvc"), "repro", LAST], cwd=clone, env=env)

    print("\n| stage | today's scale (s) | paper's scale (s) | ratio |\n|---|---|---|---|")
    names = [s.name for s in pipeline.stages() if s.name == LAST or LAST in pipeline.downstream(s.name)]
    total = {"today": 0.0, "paper": 0.0}
    for name in names:
        today, paper = wall_time(ROOT, name), wall_time(clone, name)
        if today is None and paper is None:
            continue
        total["today"] += today or 0.0
        total["paper"] += paper or 0.0
        ratio = f"{paper / today:.2f}" if today and paper else "-"
        print(f"| {name} | {today if today is not None else '-'} | {paper if paper is not None else '-'} | {ratio} |")
    fixed = sum(wall_time(ROOT, name) or 0.0 for name in FIXED)
    print(f"| up to {LAST} | {total['today']:.0f} | {total['paper']:.0f} | {total['paper'] / total['today']:.2f} |")
    print(
        f"whole pipeline at the paper's scale: {total['paper'] + fixed:.0f} s ({(total['paper'] + fixed) / 60:.0f} min), "
        f"with {', '.join(FIXED)} at their committed {fixed:.0f} s"
    )


if __name__ == "__main__":
    main()
