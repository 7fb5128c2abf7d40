"""env_setup/ scripts: shellcheck-clean, strict, and each explains itself."""

import os
import shutil
import subprocess

import pytest
from conftest import ROOT

SCRIPTS = sorted((ROOT / "env_setup").glob("*.sh"))
RUNNABLE = [p for p in SCRIPTS if p.name != "common.sh"]


def test_the_scripts_are_there():
    assert [p.name for p in RUNNABLE] == ["create_avd.sh", "install_sdk.sh", "make_snapshot.sh", "start_emulators.sh"]


def test_scripts_pass_shellcheck():
    exe = shutil.which("shellcheck")
    if exe is None:
        pytest.skip("shellcheck is not installed (.ci/run installs it; or: apt-get install shellcheck)")
    r = subprocess.run([exe, "-x", *SCRIPTS, ROOT / ".ci" / "run"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("script", RUNNABLE, ids=lambda p: p.name)
def test_scripts_are_strict_and_print_usage(script):
    assert "set -euo pipefail" in script.read_text() and os.access(script, os.X_OK)
    r = subprocess.run(["bash", script, "-h"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.startswith("usage:") and "Verify:" in r.stdout
    bad = subprocess.run(["bash", script, "extra", "args"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "usage:" in bad.stderr
