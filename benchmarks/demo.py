"""``make demo``'s time: the whole pipeline at the demo preset in a fresh scratch workspace, and each stage's part.

    python benchmarks/demo.py [--workspace DIR]

The demo is meant for a newcomer's first run, within 10 minutes on 2
cores. It runs here exactly as ``make demo`` runs it (:func:`digiq.demo.run_demo`)
in a new workspace, so that every stage runs; the stages' own wall times
come from their metrics (``wall_time_s``), the rest of the total being DVC's
and papermill's start-up of each stage.

Last line: ``demo_s=<number>``, the whole run's wall seconds.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from digiq.demo import run_demo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", type=Path, default=None, help="an empty folder (default: a new temporary one)")
    args = ap.parse_args()
    workspace = args.workspace or Path(tempfile.mkdtemp(prefix="digiq-demo-bench-")) / "workspace"
    start = time.perf_counter()
    run_demo(workspace)
    total = time.perf_counter() - start
    stages = {
        p.stem: json.loads(p.read_text()).get("wall_time_s") for p in sorted((workspace / "metrics").glob("*.json"))
    }
    stage_time = {name: t for name, t in stages.items() if isinstance(t, (int, float))}
    for name, t in sorted(stage_time.items(), key=lambda item: -item[1]):
        print(f"{name:<16} {t:8.1f} s")
    print(f"stages' own time {sum(stage_time.values()):.0f} s of {total:.0f} s")
    print(f"demo_s={total:.0f}")


if __name__ == "__main__":
    main()
