"""The one list of stages (digiq.pipeline, read from dvc.yaml) and what is derived from it."""

import ast
from pathlib import Path

import pytest
import yaml

from digiq import pipeline, report
from digiq.paths import ROOT

STAGES = pipeline.stages()
NAMES = [s.name for s in STAGES]


def test_the_stages_are_dvc_yaml_s_in_its_order_each_saying_what_it_does():
    assert NAMES == list(yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"])
    assert all(len(s.desc) > 40 for s in STAGES), [s.name for s in STAGES if len(s.desc) <= 40]


def test_every_numbered_notebook_but_the_viewer_s_is_one_stage_s_numbered_in_order():
    notebooks = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    staged = [s.notebook for s in STAGES if s.notebook]
    assert sorted(staged) == [n for n in notebooks if n != "notebooks/11_explore_values.ipynb"]
    assert [s.number for s in STAGES if s.notebook] == list(range(len(staged)))  # 00, 01, ... in dvc.yaml's order


def test_every_notebook_stage_has_its_module_and_every_stage_module_its_stage():
    """A stage module runs from its notebook or, for a stage without one, as ``python -m digiq.stages.<name>``."""
    modules = {p.stem for p in (ROOT / "digiq" / "stages").glob("*.py")} - {"__init__", "common", "launch"}
    assert modules == {s.name for s in STAGES if s.notebook or s.cmd == f"python -m digiq.stages.{s.name}"}


def test_the_docs_stage_table_is_the_generated_one():
    page = (ROOT / "docs" / "pipeline.md").read_text()
    start, end = pipeline.TABLE
    assert page.split(start)[1].split(end)[0].strip() == pipeline.stage_table().strip(), (
        "run python -m digiq.pipeline --docs docs/pipeline.md"
    )


def test_the_report_times_every_stage_with_a_metrics_file_and_headlines_only_stages():
    assert report.STAGES == tuple(s.name for s in STAGES if f"metrics/{s.name}.json" in s.metrics)
    assert "vlm_pretrain" in report.STAGES and set(report.HEADLINES) <= set(NAMES)


def _stage_lists(path: Path) -> list[tuple[int, list[str]]]:
    """Literal tuples, lists and sets in ``path`` that name six or more stages: a list of the pipeline, not a test's
    expectation of a few stages it names."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            named = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in NAMES]
            if len(named) >= 6:
                found.append((node.lineno, named))
    return found


def test_no_module_or_test_keeps_a_list_of_the_stages_of_its_own():
    """A second list drifts (the report once left out a stage's time): code reads digiq.pipeline instead."""
    files = [p for folder in ("digiq", "tests", "benchmarks") for p in (ROOT / folder).rglob("*.py")
             if p != Path(__file__)]  # fmt: skip
    lists = {p.relative_to(ROOT).as_posix(): found for p in files if (found := _stage_lists(p))}
    assert lists == {}


def test_a_list_of_stages_in_a_module_is_found(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(f"ORDER = {tuple(NAMES[2:8])!r}\nOTHER = ('critic', 'actor')\n")
    assert _stage_lists(module) == [(1, NAMES[2:8])]


def test_what_a_stage_reads_and_what_depends_on_it_follow_dvc_yaml():
    assert pipeline.producers(pipeline.stage("critic")) == ["fingerprints", "collect", "augment_actions", "embed",
                                                            "critic_inputs"]  # fmt: skip
    assert pipeline.downstream("critic") == ["critic", "actor", "diagnostics", "digirl_online", "eval"]
    assert "digirl_online" in pipeline.producers(pipeline.stage("eval"))  # through a metrics file it reads
    with pytest.raises(ValueError, match="no stage 'critics'"):
        pipeline.stage("critics")
