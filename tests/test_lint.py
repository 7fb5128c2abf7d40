"""The code passes `make lint`: ruff's checks and its formatting, so that CI (`make test`) holds both."""

import subprocess
import sys

from digiq.paths import ROOT


def test_ruff_checks_and_formatting_pass():
    for args in (
        ["check", "digiq", "tests", "benchmarks", "notebooks"],
        ["format", "--check", "digiq", "tests", "benchmarks"],
    ):
        done = subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
