import json
import subprocess
import sys

import pytest
from conftest import DATA, ROOT

from digiq.env import AndroidSimEnv, Expert, parse_task, run_episode
from digiq.env.actions import ActionType
from digiq.env.taskgen import FAMILY_WEIGHTS, generate_tasks

FAMILIES = [(ts, fam) for ts, w in FAMILY_WEIGHTS.items() for fam in w]


@pytest.mark.parametrize("task_set, family", FAMILIES)
@pytest.mark.parametrize("split", ["train", "test"])
def test_expert_solves_every_family(task_set, family, split):
    env = AndroidSimEnv(width=108)
    for i, line in enumerate(generate_tasks(task_set, split, 6, seed=1, families=[family])):
        task = parse_task(line, task_set)
        assert task.family == family
        ok, steps = run_episode(env, task, seed=i, expert=Expert())
        assert ok, f"expert failed {line!r}"
        assert steps <= task.max_steps


def test_noisy_expert_makes_mistakes_but_mostly_recovers():
    env = AndroidSimEnv(width=108)
    lines = generate_tasks("general", "train", 60, seed=2)
    clean = sum(run_episode(env, parse_task(t), i, Expert())[1] for i, t in enumerate(lines))
    results = [run_episode(env, parse_task(t), i, Expert(noise=0.3, seed=i)) for i, t in enumerate(lines)]
    assert sum(steps for _, steps in results) > clean  # mistakes cost steps
    assert 0.5 < sum(ok for ok, _ in results) / len(results) < 1.0


def test_plan_lists_the_remaining_action_types():
    env = AndroidSimEnv(width=108)
    task = parse_task("What's the news in Peru?")
    env.reset(seed=0, options={"task": task})
    plan = Expert().plan(env.device, task)
    assert plan == [ActionType.DUAL_POINT, ActionType.TYPE, ActionType.PRESS_ENTER, ActionType.STATUS_TASK_COMPLETE]


def _check_tasks(*files):
    out = subprocess.run(
        [sys.executable, "-m", "digiq.env", "check-tasks", *map(str, files)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_check_tasks_on_real_aitw_lists(aitw_dir):
    r = _check_tasks(aitw_dir / "general_train.txt", aitw_dir / "webshop_train.txt")
    assert r["parsed"] >= 0.98 * r["total"] and r["expert_success"] == r["parsed"]


def test_check_tasks_on_unseen_aitw_style_instructions():
    r = _check_tasks(DATA / "unseen_general.txt", DATA / "unseen_webshop.txt")
    assert r["parsed"] >= 0.98 * r["total"] and r["expert_success"] == r["parsed"]


def test_check_tasks_reports_unsupported_lines(tmp_path):
    f = tmp_path / "tasks.txt"
    f.write_text("Open the clock\nBake me a cake\n")
    r = _check_tasks(f)
    assert r == {"total": 2, "parsed": 1, "expert_success": 1}


def test_check_tasks_names_a_missing_file(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "digiq.env", "check-tasks", str(tmp_path / "nope.txt")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode != 0 and "nope.txt" in p.stderr


def test_render_demo_writes_a_contact_sheet(tmp_path):
    from PIL import Image

    out = tmp_path / "demo.png"
    subprocess.run(
        [sys.executable, "-m", "digiq.viz", "render-demo", str(out), "--width", "108"],
        check=True,
        cwd=ROOT,
        capture_output=True,
    )
    img = Image.open(out)
    assert img.height > 12 * 200  # one row per family


def test_check_tasks_writes_metrics_per_family(tmp_path):
    f = tmp_path / "tasks.txt"
    f.write_text("Open the clock\nGo to ebay.com\n")
    subprocess.run(
        [sys.executable, "-m", "digiq.env", "check-tasks", str(f), "--metrics", str(tmp_path / "m.json")],
        check=True,
        cwd=ROOT,
        capture_output=True,
    )
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["by_family"] == {
        "go_to_site": {"tasks": 1, "expert_success": 1},
        "open_app": {"tasks": 1, "expert_success": 1},
    }
