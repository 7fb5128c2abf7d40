from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
AITW = ROOT.parent / "shared" / "aitw"
DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def aitw_dir() -> Path:
    """The real AitW task lists beside the checkout (CI has them); skip where absent."""
    if not (AITW / "general_train.txt").exists():
        pytest.skip(f"AitW task lists not found at {AITW}")
    return AITW
