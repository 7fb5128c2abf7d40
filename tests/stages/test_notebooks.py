"""Every numbered notebook runs headless under papermill, in order, at a tiny scale."""

import json
import os
import subprocess
import sys
from pathlib import Path

import papermill as pm
import pytest
import yaml

from digiq import pipeline
from digiq.env.actions import ActionType
from digiq.env.taskgen import generate_tasks
from digiq.paths import ROOT, Paths

pytestmark = pytest.mark.slow  # every notebook under papermill

TINY = {
    # 8 demonstrated + 8 collected per task set = the 16 train tasks below
    "base_policy": {"demo_tasks": 8, "epochs": 1, "d_model": 64},
    "collect": {"tasks_per_set": 8, "episodes_general": None, "episodes_webshop": None, "n_envs": 8},
    "augment": {"n_candidates": 4, "max_resample": 1},
    "vlm_pretrain": {"steps": 4, "batch_size": 4, "eval_questions": 4, "hidden": 64},
    "vlm_finetune": {"epochs": 1},
    "critic": {"steps": 4, "hidden": 64},
    "actor": {
        "updates": 3,
        "batch_size": 8,
        "k_candidates": 4,
        "threshold_general": -1.0,
        "threshold_webshop": -1.0,
    },
    "digirl": {
        "rounds": 2,
        "episodes_per_round": 4,
        "n_envs": 4,
        "value_updates": 2,
        "value_batch": 8,
        "actor_updates": 2,
    },
    "propose": {"per_group": 3, "crawl_depth": 3},
    "pae": {"threshold_episodes": 2, "evaluator_epochs": 0.2},
    "diagnostics": {"oracle_states": 6, "oracle_rollouts": 2, "behaviour_rollouts": 2},
    "eval": {"n_tasks": 6, "n_envs": 6, "train_tasks": 5},
    "experiment": {"seeds": 2},
    "ablations": {"untuned_vlm": True, "blind_vlm": True, "n_candidates": [1]},
}
# One named variant, with both of the critic's additions beyond the paper (replaces params.yaml's variants).
VARIANTS = {"digiq_hierarchy": {"conservative": 0.3, "conservative_gate": True, "tap_targets": True,
                                "typed_match": True, "list_entries": True}}  # fmt: skip
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
STAGES = [Path(s.notebook).name for s in pipeline.stages() if s.notebook]  # in the pipeline's order


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pipeline")
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for group, values in TINY.items():
        params.setdefault(group, {}).update(values)
    params["variants"] = VARIANTS
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    paths = Paths(root)
    paths.tasks.mkdir(parents=True)
    for ts in ("general", "webshop"):
        for split, n in (("train", 16), ("val", 2), ("test", 6)):
            paths.task_list(ts, split).write_text("\n".join(generate_tasks(ts, split, n)) + "\n")
    return root


def _noise(executed: Path) -> tuple[int, int]:
    """(lines of stderr, counting progress-bar redraws, and widget outputs with no static image beside them in
    their cell): what an executed notebook shows a reader on the web beyond the stage's own output."""
    lines = bare = 0
    for cell in json.loads(executed.read_text())["cells"]:
        outputs = cell.get("outputs", [])
        images = sum("image/png" in o.get("data", {}) for o in outputs)
        for o in outputs:
            if o.get("name") == "stderr":
                text = "".join(o["text"])
                lines += text.count("\n") + text.count("\r")
            if "application/vnd.jupyter.widget-view+json" in o.get("data", {}) and not images:
                bare += 1
    return lines, bare


def test_noise_counts_progress_redraws_and_widgets_without_a_picture(tmp_path):
    cells = [{"cell_type": "code", "outputs": [{"name": "stderr", "text": ["\rfit: 1/80", "\rfit: 2/80"]},
                                               {"data": {"application/vnd.jupyter.widget-view+json": {}}}]},
             {"cell_type": "code", "outputs": [{"data": {"application/vnd.jupyter.widget-view+json": {}}},
                                               {"data": {"image/png": "..."}}]}]  # fmt: skip
    (tmp_path / "nb.ipynb").write_text(json.dumps({"cells": cells}))
    assert _noise(tmp_path / "nb.ipynb") == (2, 1)


def test_notebooks_are_committed_without_outputs():
    for name in NOTEBOOKS:
        nb = json.loads((ROOT / "notebooks" / name).read_text())
        assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code"), name
        assert any("parameters" in c.get("metadata", {}).get("tags", []) for c in nb["cells"]), name
        ids = [c.get("id") for c in nb["cells"]]
        assert None not in ids and len(set(ids)) == len(ids), f"{name}: every cell has an id of its own"


def test_pipeline_notebooks_run_in_order(workspace):
    assert len(STAGES) == 13
    os.environ.setdefault("TQDM_DISABLE", "1")
    for stage in pipeline.stages():  # in dvc.yaml's order: the notebooks, and the stages without one
        if stage.module:  # this process runs pinned (make test), and so does the stage it starts
            subprocess.run([sys.executable, "-m", f"digiq.stages.{stage.module}", "--root", str(workspace)], check=True)
        elif stage.notebook:
            name = Path(stage.notebook).name
            pm.execute_notebook(
                str(ROOT / stage.notebook),
                str(workspace / f"executed_{name}"),
                parameters={"root": str(workspace), "params_file": str(workspace / "params.yaml")},
                kernel_name="python3",
                progress_bar=False,
                cwd=str(workspace),
            )
    for name in STAGES:  # what a reader of the executed notebook sees: the stage's output, no progress or noise
        stderr, bare = _noise(workspace / f"executed_{name}")
        assert stderr <= 3, (name, stderr)
        assert bare == 0, (name, bare)
    report = json.loads((workspace / "metrics" / "eval.json").read_text())
    online = {"digirl_online", "digirl_off2on", "filtered_bc_online"}
    practice_rows = {"pae", "pae_oracle", "pae_human"}
    assert set(report) == {"base", "digiq", "filtered_bc", "digirl_offline", "digiq_hierarchy"} | online | practice_rows
    pae_eval = json.loads((workspace / "metrics" / "pae_eval.json").read_text())
    assert set(pae_eval["all"]["general"]) == {"pae-base", "pae-pae_human", "pae-filtered_bc_online", "pae_oracle-pae"}
    shown = (workspace / "executed_12_eval.ipynb").read_text()
    assert (workspace / "plots" / "claims.png").stat().st_size > 0  # the claims' forest plot
    assert "on the whole test lists:" in shown and "On the test tasks whose goal no proposal has" in shown
    assert "Practice on proposed tasks improves on the policy it starts from" in shown
    ablations = json.loads((workspace / "metrics" / "ablations.json").read_text())
    assert set(ablations) == {"digiq", "digiq_n1", "digiq_untuned", "digiq_blind", "digiq_perfect_critic",
                              "digiq_awr", "digiq_reinforce"}  # fmt: skip
    for sets in [*report.values(), *ablations.values()]:
        assert set(sets) == {"general", "webshop"}
        for r in sets.values():  # every row on both seeds, the ablations too
            assert r["n_episodes"] == 6 and len(r["per_seed"]) == 2 and r["by_family"]
            assert 0.0 <= r["success_rate"] <= 1.0 and r["first96"]["per_seed"] == r["per_seed"]  # 6 tasks: all of them
            assert r["success_rate_std"] >= 0.0
            assert sum(r["tasks_by_family"].values()) == 6 and set(r["tasks_by_family"]) == set(r["by_family"])
    outcomes = json.loads((workspace / "metrics" / "eval_outcomes.json").read_text())  # every episode, per seed
    assert set(outcomes) == set(report) | set(ablations)
    assert all(len(s) == 6 for sets in outcomes.values() for strings in sets.values() for s in strings)
    comparisons = json.loads((workspace / "metrics" / "comparisons.json").read_text())
    assert {"digiq-base", "digiq-filtered_bc", "digiq_hierarchy-digiq", "digiq_n1-digiq", "digiq_awr-digiq",
            "digiq_reinforce-digiq", "digiq-digirl_off2on", "digirl_online-filtered_bc_online",
            "digirl_off2on-digirl_offline"} <= set(comparisons["general"])  # fmt: skip
    train = json.loads((workspace / "metrics" / "eval_train.json").read_text())  # the paper's train columns
    assert set(train) == set(report) - set(VARIANTS) - practice_rows  # the paper's rows and the online ones
    for policy, sets in train.items():  # the tasks of the first 5 of each task set's 8 collected trajectories
        assert set(sets) == {"general", "webshop"} and all(r["n_episodes"] == 5 for r in sets.values())
        seeds = len({**ablations, **report}[policy]["general"]["per_seed"])  # as many seeds as on the test tasks
        assert all(len(r["per_seed"]) == seeds for r in sets.values())
    # params.yaml's compute.workers: stage 08's evaluations ran in worker processes spawned from the kernel
    assert json.loads((workspace / "metrics" / "eval_timing.json").read_text())["workers"] == 2
    skills = json.loads((workspace / "metrics" / "skills.json").read_text())
    assert set(skills) == {"policy", "seed", "none", "type", "tap", "action_type"}
    for ts in ("general", "webshop"):  # "none" is the base policy's own first-seed run
        assert skills["none"][ts]["success_rate"] == report["base"][ts]["per_seed"][0]
        assert all(skills[s][ts]["n_episodes"] == 6 for s in ("type", "tap", "action_type"))
    models = workspace / "data" / "models"
    for s in (0, 1):  # one critic per row that needs one, on every seed
        assert sorted(p.name for p in (models / "critic" / f"seed{s}").iterdir()) == [
            "digiq", "digiq_blind", "digiq_hierarchy", "digiq_untuned"]  # fmt: skip
    assert sorted(p.name for p in (models / "actors" / "seed1").iterdir()) == sorted(
        {*report, *ablations} - {"base"} - online - practice_rows
    )
    runs = json.loads((workspace / "metrics" / "digirl_online.json").read_text())["rows"]
    assert set(runs) == online  # every row on both seeds, one run per task set
    assert all(set(e["by_task_set"]) == {"general", "webshop"} for e in runs.values())
    assert all(len(r["per_seed"]) == 2 for e in runs.values() for r in e["by_task_set"].values())
    for row in online:  # two rounds of 4 episodes each (TINY), the last policy where stage 12 read it
        for ts, run in runs[row]["by_task_set"].items():
            assert all(len(rounds) == 2 and all(r["episodes"] == 4 for r in rounds) for rounds in run["per_seed"])
            assert (workspace / "data" / "online" / "seed1" / row / ts / "latest" / "policy" / "config.json").exists()
    practice = json.loads((workspace / "metrics" / "pae.json").read_text())  # PAE's rows: every seed and task set
    assert set(practice["rows"]) == {"pae", "pae_oracle", "pae_human"} and "threshold" in practice["evaluator"]
    for row, entry in practice["rows"].items():
        assert all(len(part["per_seed"]) == 2 for part in entry["by_task_set"].values())
        assert (workspace / "data" / "pae" / "runs" / "seed1" / row / "webshop" / "latest" / "policy").is_dir()
    assert json.loads((workspace / "metrics" / "propose.json").read_text())["proposals"] > 0
    actor = json.loads((workspace / "metrics" / "actor.json").read_text())
    perfect = actor["perfect_critic"]  # a perfect critic keeps exactly the states with an expert-equivalent candidate
    assert actor["kept_rows"]["digiq_perfect_critic"] == round(
        perfect["states_with_expert_candidate"] * actor["states"]
    )
    assert 0.0 <= perfect["taken_action_is_expert"] <= perfect["states_with_expert_candidate"] <= 1.0
    # AWR and REINFORCE weigh every drawn valid candidate: at least as many rows as Best-of-N keeps
    assert set(actor["extraction"]) == {"digiq_awr", "digiq_reinforce"}
    assert actor["kept_rows"]["digiq_awr"] == actor["kept_rows"]["digiq_reinforce"] >= actor["kept_rows"]["digiq"]
    diag = json.loads((workspace / "metrics" / "diagnostics.json").read_text())
    shares = diag["rows_expert_share"]  # the share of each policy's rows that are the expert's action
    assert set(shares) == set(actor["kept_rows"]) and len(shares["digiq"]) == 2
    assert all(v in (1.0, None) for v in shares["digiq_perfect_critic"].values())  # its rows are the expert's by design
    assert len(diag["rows_expert_share_per_seed"]["digiq"]) == 2
    # The perfect critic keeps rows only where the expert's action is on offer, and they are all the expert's.
    assert all(v in (1.0, None) for v in diag["rows_expert_on_offer"]["digiq_perfect_critic"].values())
    assert set(diag["rows_expert_share_where_on_offer"]) == set(shares)
    for key in ("rows_expert_on_offer", "rows_expert_share_where_on_offer"):
        assert all(v is None or 0.0 <= v <= 1.0 for by_ts in diag[key].values() for v in by_ts.values())
    support = diag["expert_support"]  # per family, over every stored state
    assert sum(f["states"] for fams in support.values() for f in fams.values()) == actor["states"]
    assert all(
        0.0 <= f["taken_is_expert"] <= f["expert_candidate"] <= 1.0 for fams in support.values() for f in fams.values()
    )
    by_kind = diag["expert_support_by_kind"]  # the same states, grouped by the expert's kind of action
    assert sum(k["states"] for kinds in by_kind.values() for k in kinds.values()) == actor["states"]
    assert all(kind in {t.name for t in ActionType} for kinds in by_kind.values() for kind in kinds)
    kept = diag["digiq_rows_by_kind"]  # Digi-Q's rows per kind, pooled over its seeds
    assert {ts: set(kinds) for ts, kinds in kept.items()} == {ts: set(kinds) for ts, kinds in by_kind.items()}
    assert all(0.0 <= k["kept"] <= 1.0 for kinds in kept.values() for k in kinds.values())
    oracle = diag  # true values of sampled states' candidates
    assert oracle["states"] == 6 and len(oracle["per_seed"]) == 2
    assert set(oracle["candidate_variance_within_state"]) == {"finetuned", "untuned", "blind"}
    behaviour = oracle["behaviour_values"]  # the same states continued by the base policy
    assert behaviour["rollouts"] == 2 and all(0.0 <= v["flat"] <= 1.0 for k, v in behaviour.items() if k == "all")
    if oracle["informative_states"]:
        assert "behaviour_value" in oracle["top1_hit_rate"]
    probes = diag["probes"]  # linear probes of each VLM's features, beside the control's
    assert set(probes) == {"finetuned", "untuned", "blind", "control"}
    assert all(set(r) == {"changes_screen", "tap_on_goal_element"} for r in probes.values())
    pick = oracle["expert_pick"]  # the held-out trajectories' states, judged by the expert's next action
    train = oracle["expert_pick_train"]  # the rest, on which the critics trained
    assert pick["states"] + train["states"] == actor["states"] and 0 < pick["states"] < train["states"]
    assert len(pick["per_seed"]) == 2
    if pick["informative_states"]:
        rankers = {f"{kind}_ranker_{vlm}" for kind in ("mlp", "linear") for vlm in ("finetuned", "untuned", "blind")}
        assert set(pick["hit_rate"]) == {"base_sample", "uninformed", "critic_digiq", "critic_digiq_hierarchy",
                                         "critic_digiq_untuned", "critic_digiq_blind", "taken_action", *rankers}  # fmt: skip
        margin = diag["critic_pick_margin"]["all"]  # Digi-Q's critic against the uninformed level, with its interval
        assert margin["units"] == pick["informative_states"] and margin["seeds"] == 2
        assert margin["ci95"][0] <= margin["diff"] <= margin["ci95"][1]
        assert abs(margin["diff"] - 100 * (pick["hit_rate"]["critic_digiq"] - pick["hit_rate"]["uninformed"])) < 0.05
    assert (workspace / "plots" / "results.png").stat().st_size > 0
    for stage in pipeline.stages():  # every notebook stage times itself (evaluation apart from its results)
        if stage.notebook:
            timing = "eval_timing" if stage.name == "eval" else stage.name
            m = json.loads((workspace / "metrics" / f"{timing}.json").read_text())
            assert m["wall_time_s"] >= 0, stage.name
            # This test's kernels start as the environment is; each stage ran in a pinned process all the same.
            assert m["cpu_kernels"].endswith(", pinned"), (stage.name, m["cpu_kernels"])
    base = json.loads((workspace / "metrics" / "base_policy.json").read_text())
    assert base["demo_episodes"] == sum(base["demo_episodes_by_family"].values()) == 16  # 8 per task set
    collect = json.loads((workspace / "metrics" / "collect.json").read_text())
    assert collect["first_train_task"] == {"general": 8, "webshop": 8}  # the made-up tasks are not in the list


def test_the_values_notebook_shows_both_viewers_with_pictures_headless(workspace):
    out = workspace / "executed_10.ipynb"
    pm.execute_notebook(str(ROOT / "notebooks" / "13_explore_values.ipynb"), str(out), kernel_name="python3",
                        parameters={"root": str(workspace)}, progress_bar=False, cwd=str(workspace))  # fmt: skip
    cells = json.loads(out.read_text())["cells"]
    outputs = [o.get("data", {}) for c in cells if c["cell_type"] == "code" for o in c["outputs"]]
    viewers = [d for d in outputs if "application/vnd.jupyter.widget-view+json" in d]
    assert len(viewers) == 2 and all("image/png" in d for d in viewers)  # each widget carries its picture
    assert _noise(out) == (0, 0)


def test_a_stage_without_its_input_names_what_is_missing(tmp_path):
    nb = ROOT / "notebooks" / "06_critic.ipynb"
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    with pytest.raises(pm.PapermillExecutionError, match="stage critic: missing input .*offline"):
        pm.execute_notebook(
            str(nb),
            str(tmp_path / "out.ipynb"),
            kernel_name="python3",
            progress_bar=False,
            parameters={"root": str(tmp_path), "params_file": str(tmp_path / "params.yaml")},
        )


def test_a_params_key_of_the_wrong_type_is_named(tmp_path):
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["critic"]["steps"] = "many"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(pm.PapermillExecutionError, match=r"critic\.steps must be int"):
        pm.execute_notebook(
            str(ROOT / "notebooks" / "06_critic.ipynb"),
            str(tmp_path / "out.ipynb"),
            kernel_name="python3",
            progress_bar=False,
            parameters={"root": str(tmp_path), "params_file": str(tmp_path / "params.yaml")},
        )
