"""Run one tiny online run (tests/stages/test_digirl_online.py): ``ROOT ROW ROUNDS``; the test may kill it part-way."""

import sys
from pathlib import Path

from digiq.algos.digirl_online import run_online_job
from digiq.paths import Paths

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stages"))
from test_digirl_online import tiny_job  # noqa: E402

if __name__ == "__main__":
    run_online_job(tiny_job(Paths(Path(sys.argv[1])), sys.argv[2], int(sys.argv[3])))
