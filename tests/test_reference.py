"""docs/settings.md: every knob a run uses, generated from the configs and the params files, never stale."""

import shutil

from digiq.config import SECTIONS
from digiq.paths import ROOT
from digiq.reference import REFERENCE, settings_markdown


def test_the_committed_reference_is_what_the_configs_and_params_give():
    assert REFERENCE.read_text() == settings_markdown(), "run `python -m digiq.reference` and commit docs/settings.md"


def test_every_knob_is_listed_with_its_value_and_where_it_comes_from(tmp_path):
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    shutil.copytree(ROOT / "params", tmp_path / "params")
    text = (tmp_path / "params.yaml").read_text().replace("  gamma: 0.95 ", "  gamma: 0.9 ", 1)
    (tmp_path / "params.yaml").write_text(text)
    page = settings_markdown(tmp_path / "params.yaml")
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    assert len(rows) == sum(len(cls.model_fields) for cls in SECTIONS.values())
    assert "| `gamma` | 0.9 | params.yaml | discount (Digi-Q: 0.95)" in page  # the critic's, as the file sets it
    assert "| `batch_size` | 128 | default |" in page  # the critic's, set in no file
    assert "| `workers` | 2 | params/compute.yaml |" in page
