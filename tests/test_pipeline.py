"""The one list of stages (digiq.pipeline, read from dvc.yaml) and what is derived from it."""

import ast
import json
import os
import shutil
import subprocess
import sys
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
    assert sorted(staged) == [n for n in notebooks if n != "notebooks/13_explore_values.ipynb"]
    assert [s.number for s in STAGES if s.notebook] == list(range(len(staged)))  # 00, 01, ... in dvc.yaml's order


def test_every_notebook_stage_has_its_module_and_every_stage_module_its_stage():
    """A stage module runs from its notebook or, for a stage without one, as ``python -m digiq.stages.<name>``."""
    modules = {p.stem for p in (ROOT / "digiq" / "stages").glob("*.py")} - {"__init__", "common", "launch"}
    assert modules == {s.name for s in STAGES if s.notebook or s.module}


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


def test_no_stage_imports_another_stage():
    """A stage reads another's outputs, never its code: what two stages share lives in the package
    (digiq.algos, digiq.models, digiq.data, ...), beside the stages' own helpers (common, launch)."""
    support = {"digiq.stages.common", "digiq.stages.launch", "digiq.stages"}
    found = {}
    for path in sorted((ROOT / "digiq" / "stages").glob("*.py")):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
                imported.update(f"{node.module}.{a.name}" for a in node.names if node.module == "digiq.stages")
            elif isinstance(node, ast.Import):
                imported.update(a.name for a in node.names)
        stages = sorted(m for m in imported if m.startswith("digiq.stages") and m not in support
                        and m != f"digiq.stages.{path.stem}")  # fmt: skip
        if stages and path.stem not in ("common", "launch", "__init__"):
            found[path.name] = stages
    assert found == {}


def test_every_committed_metrics_file_is_a_stage_s_output():
    """A metrics file no stage writes goes stale beside the ones a run rewrites (the rerun folders are kept runs)."""
    written = {m for s in STAGES for m in s.metrics + s.outs}
    committed = {p.relative_to(ROOT).as_posix() for p in (ROOT / "metrics").glob("*.json")}
    assert committed and committed <= written, sorted(committed - written)


def test_a_list_of_stages_in_a_module_is_found(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(f"ORDER = {tuple(NAMES[2:8])!r}\nOTHER = ('critic', 'actor')\n")
    assert _stage_lists(module) == [(1, NAMES[2:8])]


def test_what_a_stage_reads_and_what_depends_on_it_follow_dvc_yaml():
    assert pipeline.producers(pipeline.stage("critic")) == ["fingerprints", "base_policy", "collect",
                                                            "augment_actions", "embed", "critic_inputs"]  # fmt: skip
    assert pipeline.downstream("critic") == ["critic", "actor", "diagnostics", "digirl_online", "eval"]
    assert "digirl_online" in pipeline.producers(pipeline.stage("eval"))  # through a metrics file it reads
    with pytest.raises(ValueError, match="no stage 'critics'"):
        pipeline.stage("critics")


# A stage a researcher might add: how many words each train task takes, with one knob.
NEW_STAGE_MODULE = '''"""How many train tasks take more than a number of words."""

from __future__ import annotations

from typing import Any

from digiq.config import Settings, load_settings
from digiq.data.task_lists import read_tasks
from digiq.env.tasks import TASK_SETS
from digiq.paths import Paths
from digiq.stages.common import timed, write_metrics


def run(settings: Settings, paths: Paths) -> dict[str, Any]:
    cfg = settings.task_words
    metrics: dict[str, Any] = {}
    with timed(metrics):
        for ts in TASK_SETS:
            tasks = read_tasks(paths, ts, "train", stage="task_words")
            metrics[ts] = sum(len(t.instruction.split()) > cfg.more_than for t in tasks)
    write_metrics(paths, "task_words", metrics)
    return metrics


if __name__ == "__main__":
    run(load_settings(), Paths())
'''

# Its knobs' class, and their group in the root of settings.
NEW_STAGE_CONFIG = '''class TaskWordsConfig(Knobs):
    """The task_words stage."""

    more_than: int = _knob(6, help="count the tasks of more words than this", at_least=0, at_most=100)


class Settings(BaseModel):'''
NEW_STAGE_GROUP = """    task_words: TaskWordsConfig = Field(default_factory=TaskWordsConfig)
    variants: dict[str, CriticConfig]"""

NEW_STAGE_DVC = {
    "desc": "How many train tasks of each task set take more than task_words.more_than words",
    "cmd": "python -m digiq.stages.task_words",
    "deps": ["fingerprints/task_words.json", "data/tasks"],
    "params": ["task_words"],
    "metrics": [{"metrics/task_words.json": {"cache": False}}],
}


@pytest.mark.slow  # a real dvc repro
def test_a_stage_is_added_in_dvc_yaml_its_module_and_its_knobs(tmp_path):
    """dvc.yaml, the stage's module, its knobs' class and group in config.py, their group in params.yaml (a notebook
    stage adds its notebook): the stage list, its code fingerprint, the stage-time table and DVC follow, and its knob
    reruns it."""
    repo = tmp_path / "repo"
    for folder in ("digiq", "notebooks", "params"):
        shutil.copytree(ROOT / folder, repo / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (repo / ".dvc").mkdir()
    for rel in (".dvcignore", ".dvc/config"):
        shutil.copy2(ROOT / rel, repo / rel)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["tasks"].update({"n_train": 5, "n_val": 2, "n_test": 3, "n_test_webshop": 3})
    params["task_words"] = {"more_than": 6}  # 4. its knobs' group in params.yaml
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    # 1. dvc.yaml: the stage (its fingerprint comes with it)
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    dvc["stages"]["task_words"] = NEW_STAGE_DVC
    (repo / "dvc.yaml").write_text(yaml.safe_dump(dvc, sort_keys=False))
    # 2. its module; 3. its knobs
    (repo / "digiq" / "stages" / "task_words.py").write_text(NEW_STAGE_MODULE)
    config = (repo / "digiq" / "config.py").read_text()
    config = config.replace("class Settings(BaseModel):", NEW_STAGE_CONFIG, 1)
    config = config.replace("    variants: dict[str, CriticConfig]", NEW_STAGE_GROUP, 1)
    (repo / "digiq" / "config.py").write_text(config)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    env = {**os.environ, "PYTHONPATH": str(repo), "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}

    def run(*args: str) -> str:
        done = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    run(sys.executable, "-m", "dvc", "repro", "task_words")
    words = json.loads((repo / "metrics" / "task_words.json").read_text())
    assert set(words) == {"general", "webshop", "wall_time_s", "cpu_kernels"} and 0 < words["general"] <= 5
    assert "task_words.py" in (repo / "fingerprints" / "task_words.json").read_text()
    derived = json.loads(run(sys.executable, "-c", (
        "import json; from digiq import pipeline, report; from digiq.paths import Paths; "
        "print(json.dumps({'stages': [s.name for s in pipeline.stages()], 'times': report.stage_times_markdown("
        "Paths()), 'after_tasks': pipeline.downstream('tasks')}))")))  # fmt: skip
    assert derived["stages"] == [*NAMES, "task_words"] and "task_words" in derived["after_tasks"]
    assert f"| task_words | {words['wall_time_s']} |" in derived["times"]
    assert "task_words" not in run(sys.executable, "-m", "dvc", "status", "task_words")  # up to date
    params["task_words"] = {"more_than": 0}
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    assert "task_words" in run(sys.executable, "-m", "dvc", "status", "task_words")  # its knob changed
    run(sys.executable, "-m", "dvc", "repro", "task_words")
    assert json.loads((repo / "metrics" / "task_words.json").read_text())["general"] == 5
