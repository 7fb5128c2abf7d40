"""digiq.report and digiq.tables: the README's and docs' generated tables; digiq.viz.charts: the results chart."""

import numpy as np
import pytest
import yaml
from PIL import Image

from digiq.paths import ROOT, Paths
from digiq.report import (
    DIAGNOSTICS,
    END,
    RESULTS,
    STAGE_TIMES,
    STAGES,
    START,
    VALIDATION,
    diagnostics_markdown,
    env_steps_table,
    headline_markdown,
    in_docs,
    representation_probe_table,
    results_markdown,
    stage_times_markdown,
    update_readme,
    validation_markdown,
)
from digiq.stages.common import write_metrics
from digiq.stats import sample_std
from digiq.tables import (
    PAPER_CLAIMS,
    Claim,
    claims_table,
    expert_pick_table,
    pick_margin_table,
    rewarded_table,
    wrong_pick_table,
)
from digiq.viz.charts import save_results_chart


def _result(rates: list[float], family: str) -> dict:
    return {"success_rate": float(np.mean(rates)), "success_rate_std": sample_std(rates), "per_seed": rates,
            "n_episodes": 96, "by_family": {family: rates[0]}, "tasks_by_family": {family: 96}}  # fmt: skip


def _base_and_digiq() -> dict:
    """eval.json of two policies over two seeds."""
    return {"base": {"general": _result([0.2, 0.3], "search"), "webshop": _result([0.1, 0.1], "go_to_site")},
            "digiq": {"general": _result([0.5, 0.6], "search"), "webshop": _result([0.3, 0.5], "go_to_site")}}  # fmt: skip


def test_report_fills_the_readme_and_experiments_blocks_from_metrics(tmp_path):
    paths = Paths(tmp_path)
    write_metrics(paths, "eval", _base_and_digiq())
    write_metrics(paths, "ablations", {
        "digiq": _base_and_digiq()["digiq"],
        "digiq_perfect_critic": {"general": _result([0.7, 0.7], "search"), "webshop": _result([0.6, 0.6], "go_to_site")},
        "digiq_awr": {"general": _result([0.4, 0.5], "search"), "webshop": _result([0.3, 0.3], "go_to_site")},
    })  # fmt: skip
    write_metrics(paths, "actor", {"perfect_critic": {"states_with_expert_candidate": 0.772,
                                                      "taken_action_is_expert": 0.395},
                                   "kept_rows": {"digiq": 120.5, "filtered_bc": 80},
                                   "extraction": {"digiq_awr": {"rows": 1530.5, "top_percent_weight_share": 0.9},
                                                  "digiq_reinforce": {"rows": 1020.5}}})  # fmt: skip
    write_metrics(paths, "critic", {"wall_time_s": 12.5, "v_mc_return_corr_heldout": 0.7,
                                    "rewarded_steps": {"webshop": {"select_first": {"steps": 4.0, "q_taken": 0.0888}}}})  # fmt: skip
    write_metrics(paths, "collect", {"success_rate_by_family": {"select_first": 0.029}})
    write_metrics(paths, "diagnostics", {"states": 10, "informative_states": 4,
                                    "expert_support": {"webshop": {"select_first": {"states": 40, "taken_is_expert": 0.3,
                                                                                    "expert_candidate": 0.65}}},
                                    "rows_expert_share": {"digiq": {"general": 0.2, "webshop": 0.61},
                                                          "filtered_bc": {"general": None, "webshop": 0.7}},
                                    "rows_expert_on_offer": {"digiq": {"general": 0.25, "webshop": 0.8},
                                                             "filtered_bc": {"general": None, "webshop": 0.9}},
                                    "rows_expert_share_where_on_offer": {
                                        "digiq": {"general": 0.8, "webshop": 0.7625},
                                        "filtered_bc": {"general": None, "webshop": 0.7778}},
                                    "expert_support_by_kind": {"webshop": {"PRESS_BACK": {
                                        "states": 12, "taken_is_expert": 0.1, "expert_candidate": 0.6}}},
                                    "digiq_rows_by_kind": {"webshop": {"PRESS_BACK": {"kept": 0.4, "expert": 0.0}}},
                                    "top1_hit_rate": {"uninformed": 0.3, "base_sample": 0.25, "critic": 0.5},
                                    "oracle_value_of_pick": {"uninformed": 0.45, "base_sample": 0.4, "critic": 0.6,
                                                             "best": 0.8},
                                    "expert_pick": {"states": 50, "informative_states": 30,
                                                    "hit_rate": {"uninformed": 0.45, "base_sample": 0.4,
                                                                 "critic_finetuned": 0.55},
                                                    "hit_rate_general": {"uninformed": 0.33, "base_sample": 0.3,
                                                                         "critic_finetuned": 0.35},
                                                    "hit_rate_webshop": {"uninformed": 0.55, "base_sample": 0.5,
                                                                         "critic_finetuned": 0.75},
                                                    "kind_rate": {"uninformed": 0.7, "base_sample": 0.8,
                                                                  "critic_finetuned": 0.9},
                                                    "within_kind_rate": {"uninformed": 0.64, "base_sample": 0.5,
                                                                         "critic_finetuned": 0.61}},
                                    "probes": {"finetuned": {"changes_screen": {"auroc": 0.91234, "n_test": 300},
                                                             "tap_on_goal_element": {"absent": "no taps"}},
                                               "blind": {"changes_screen": {"auroc": None, "n_test": 4},
                                                         "tap_on_goal_element": {"auroc": 0.5, "n_test": 8}},
                                               "control": {"changes_screen": {"auroc": 0.6, "n_test": 300},
                                                           "tap_on_goal_element": {"auroc": 0.7, "n_test": 80}}},
                                    "critic_wrong_picks": {"general": {"wrong_picks": 610.3, "kinds": {
                                        "PRESS_BACK": {"critic": 0.373, "data": 0.2228, "expert": 0.0}}}}})  # fmt: skip
    write_metrics(paths, "skills", {"policy": "base", "seed": 0,
                                    "none": {"general": {"success_rate": 0.2}, "webshop": {"success_rate": 0.4}},
                                    "type": {"general": {"success_rate": 0.45}, "webshop": {"success_rate": 0.85}}})  # fmt: skip
    md = results_markdown(paths)
    assert "| base | 25.0 ± 7.1 | 10.0 ± 0.0 |" in md and "over 2 seed(s); 96 General and 96 Web Shopping" in md
    assert "No `metrics/comparisons.json`" in md  # no margin is stated without its interval
    assert "| digiq | 55.0 ± 7.1 | 40.0 ± 14.1 |" in md and "| digiq_perfect_critic | 70.0 ± 0.0 | 60.0 ± 0.0 |" in md
    assert "77.2% of states have one, and the data's own action is it in 39.5%" in md
    assert "| digiq_awr | 45.0 ± 7.1 | 30.0 ± 0.0 |" in md  # an extraction row, and its note (not digiq_reinforce's,
    assert "digiq_awr: Digi-Q's critic and exactly Best-of-N's drawn candidates" in md  # which was not evaluated)
    assert (
        "digiq_awr weighs it by exp(A / beta), 1530.5 rows per seed, the top 1% of them carrying 90% of the weight"
    ) in md
    assert "digiq_reinforce weighs" not in md
    md = diagnostics_markdown(paths)
    assert "| alone | 20.0 | 40.0 |" in md and "| + the expert's type | 45.0 | 85.0 |" in md
    assert "| general | search | 20.0 | 50.0 |" in md and "| critic | 12.5 |" in stage_times_markdown(paths)
    assert "| critic | 50.0 | 0.600 |" in md and "4 of 10 sampled states" in md
    assert (
        "| ranking | all | general | webshop | right kind |" in md
        and "| critic_finetuned | 55.0 | 35.0 | 75.0 | 90.0 |" in md
    )
    assert "| uninformed | 45.0 | 33.0 | 55.0 | 70.0 | 64.0 |" in md and "| uninformed | 30.0 | 0.450 |" in md
    assert "over the 30 of 50 states" in md and "trajectories no critic trained on" in md
    assert "| webshop | select_first | 40 | 2.9 | 30.0 | 65.0 |" in md  # where the data can teach
    assert "| webshop | PRESS_BACK | 12 | 10.0 | 60.0 | 40.0 | 0.0 |" in md  # ... by the expert's kind of action
    assert "| digiq | 120.5 | 20.0 | 61.0 | 25.0 | 80.0 | 80.0 | 76.2 |" in md
    assert "| filtered_bc | 80 | - | 70.0 | - | 90.0 | - | 77.8 |" in md
    assert "| general | PRESS_BACK | 37.3 | 22.3 | 0.0 |" in md and "(general 610.3 per seed" in md
    assert "| webshop | select_first | 4 | 0.089 |" in md  # the critic at the data's rewarded steps
    assert "| finetuned | 0.912 (300) | - |" in md and "| control | 0.600 (300) | 0.700 (80) |" in md  # the probes
    assert "| blind | - | 0.500 (8) |" in md  # scored rows of one class only: no AUROC
    assert expert_pick_table({}) == [
        "Expert picks off (`diagnostics.oracle_states: 0`)."
    ]  # notebook 07 with the stage off
    assert (
        "off" in representation_probe_table({})[0]
        and "off" in wrong_pick_table({})[0]
        and "No rewarded step" in rewarded_table({})[0]
    )  # notebooks 06 and 05
    readme, docs = tmp_path / "README.md", tmp_path / "docs"
    readme.write_text(f"intro\n{START}\nold\n{END}\nrest\n")
    docs.mkdir()
    (docs / "experiments.md").write_text(f"{VALIDATION[0]}\nold\n{VALIDATION[1]}\nnotes\n")
    (docs / "diagnostics.md").write_text(f"notes\n{DIAGNOSTICS[0]}\nold\n{DIAGNOSTICS[1]}\n")
    (docs / "pipeline-time.md").write_text(f"notes\n{STAGE_TIMES[0]}\nold\n{STAGE_TIMES[1]}\n")
    (docs / "results.md").write_text(f"# Results\n{RESULTS[0]}\nold\n{RESULTS[1]}\nreading\n")
    update_readme(readme, paths, docs)
    page = (docs / "results.md").read_text()
    assert "old" not in page and "| base | 25.0" in page and page.endswith("reading\n")
    assert "](../plots/results.png)" in page and "Ablations" in page  # every table, linked from docs/
    assert "run `make val` after `make repro`" in (docs / "experiments.md").read_text()  # no metrics/val/ yet
    text = readme.read_text()
    assert "old" not in text and "| base | 25.0" in text and text.endswith("rest\n")
    assert "Ablations" not in text  # the README's block is the headline: the rest is on the results page
    diagnostics = (docs / "diagnostics.md").read_text()
    assert "old" not in diagnostics and "| alone | 20.0 | 40.0 |" in diagnostics
    assert "| critic | 12.5 |" in (docs / "pipeline-time.md").read_text()
    (docs / "pipeline-time.md").write_text("no block\n")
    with pytest.raises(ValueError, match="no <!-- stage-times:start -->"):
        update_readme(readme, paths, docs)
    for row, rate in (("base", 0.2), ("digiq", 0.35)):  # what `make val` writes, one python -m digiq.evaluate per row
        run = {ts: {"success_rate": rate, "success_rate_std": 0.01, "n_episodes": 320} for ts in ("general", "webshop")}
        write_metrics(paths, f"val/{row}", {**run, "seeds": 3})
    assert "| digiq | 35.0 ± 1.0 | 35.0 ± 1.0 |" in validation_markdown(paths)
    stopped = {"partial": {"seeds_done": [0, 1], "seeds_missing": [{"seed": 2, "policy": "x", "why": "truncated"}]}}
    write_metrics(paths, "val/digiq", {**run, "seeds": 2, **stopped})  # a run that lost a seed says so in its row
    shown = validation_markdown(paths)
    assert "| digiq (partial: 2 of 3 seeds) | 35.0 ± 1.0 |" in shown and "over 3 seeds" in shown


def test_results_chart_is_a_png_with_one_bar_per_policy_and_task_set(tmp_path):
    results = {p: {"general": _result([r, r], "search"), "webshop": _result([r, r + 0.2], "go_to_site")}
               for p, r in (("base", 0.2), ("digiq", 0.6))}  # fmt: skip
    path = save_results_chart(results, tmp_path / "results.png", "test")
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size[0] > 300


def test_env_steps_table_gives_the_mean_rounds_one_decimal():
    rounds = [[{}] * 10, [{}] * 11, [{}] * 11]  # three seeds' rounds: 10.666... on average
    by_set = {"general": {"per_seed": rounds}, "webshop": {"per_seed": rounds}}  # one run per task set
    online = {"offline_env_steps": 5000,
              "rows": {"filtered_bc_online": {"by_task_set": by_set, "env_steps": 8440, "online_env_steps": 8440,
                                              "wall_time_s": 212.4}}}  # fmt: skip
    table = env_steps_table(online, ["base", "digiq"])
    assert "| digiq | 5,000 | 0 | - | - |" in table and "| filtered_bc_online | 8,440 | 8,440 | 10.7 | 212 |" in table


def test_report_puts_the_paper_s_train_columns_beside_the_test_ones(tmp_path):
    paths = Paths(tmp_path)
    write_metrics(paths, "eval", _base_and_digiq())
    write_metrics(paths, "eval_train", {"off": "eval.train_tasks is 0"})
    assert "| policy | General test | Web Shopping test |" in results_markdown(paths)
    train = {"base": {"general": {**_result([0.4, 0.4], "search"), "n_episodes": 50}},
             "digiq": {"general": {**_result([0.7, 0.9], "search"), "n_episodes": 50}}}  # fmt: skip
    write_metrics(paths, "eval_train", train)  # imported data with General trajectories only: no Web Shopping train
    md = results_markdown(paths)
    assert "| policy | General train | General test | Web Shopping test |" in md
    assert "| base | 40.0 ± 0.0 | 25.0 ± 7.1 | 10.0 ± 0.0 |" in md and "| digiq | 80.0 ± 14.1 | 55.0 ± 7.1 |" in md
    assert "train: the tasks of the first 50 trajectories per task set in the offline data" in md


def _pair(diff: float, lo: float, hi: float) -> dict:
    """One comparison of comparisons.json: A - B in points and its 95% interval."""
    return {"diff": diff, "ci95": [lo, hi], "n_tasks": 96, "seeds": 2}


def _verdicts(comparisons: dict) -> dict[str, str]:
    """Each paper claim's verdict (the table's last column), by its comparison."""
    rows = claims_table(comparisons)[2 : 2 + len(PAPER_CLAIMS)]
    return {c.comparison: row.rsplit("|", 2)[1].strip() for c, row in zip(PAPER_CLAIMS, rows)}


def test_claims_table_judges_each_claim_by_its_intervals():
    comparisons = {
        "general": {"digiq-filtered_bc": _pair(8.0, 2.0, 14.0),  # holds on both: reproduced
                    "digiq-digirl_offline": _pair(6.0, 1.0, 11.0),  # holds on one, reversed on the other
                    "digiq_untuned-digiq": _pair(-5.0, -8.0, -2.0),  # at least one: holds here, 0 held on the other
                    "digiq_n1-digiq": _pair(3.0, -1.0, 7.0),  # not below: 0 held on both is no refutation
                    "digiq_awr-digiq": _pair(-1.0, -4.0, 2.0),  # 0 held on both
                    "digiq_reinforce-digiq": _pair(-9.0, -12.0, -6.0)},  # missing on the other task set
        "webshop": {"digiq-filtered_bc": _pair(4.0, 0.5, 7.5),
                    "digiq-digirl_offline": _pair(-5.0, -9.0, -1.0),
                    "digiq_untuned-digiq": _pair(-2.0, -6.0, 2.0),
                    "digiq_n1-digiq": _pair(1.0, -2.0, 4.0),
                    "digiq_awr-digiq": _pair(0.5, -3.0, 4.0)},
    }  # fmt: skip
    assert _verdicts(comparisons) == {
        "digiq-filtered_bc": "**reproduced**",
        "digiq-digirl_offline": "**not reproduced**",
        "digiq_untuned-digiq": "**reproduced**",
        "digiq_n1-digiq": "**reproduced**",
        "digiq_awr-digiq": "**no detectable difference**",
        "digiq_reinforce-digiq": "**not measured**",
        "digirl_online-filtered_bc_online": "**not measured**",  # a run without the online stage
        "digirl_off2on-digirl_offline": "**not measured**",
    }
    table = "\n".join(claims_table(comparisons))
    # cells are in the claim's direction: the untuned ablation's -5.0 [-8.0, -2.0] is Digi-Q's lead of +5.0
    assert "`digiq - digiq_untuned > 0` on at least one task set | +5.0 [+2.0, +8.0], holds | " in table
    assert "+2.0 [-2.0, +6.0], no detectable difference | **reproduced** |" in table
    assert "| -5.0 [-9.0, -1.0], reversed | **not reproduced** |" in table  # Digi-Q behind offline DigiRL
    assert "`digiq - digiq_n1 ≥ 0` on both task sets | -3.0 [-7.0, +1.0], no detectable difference" in table
    assert "| +9.0 [+6.0, +12.0], holds | not measured | **not measured** |" in table  # REINFORCE, General only
    assert table.splitlines()[-1].startswith("Each cell: the claimed winner's lead in points")


def test_claims_table_requires_what_each_claim_says():
    holds, straddles = _pair(-5.0, -8.0, -2.0), _pair(-1.0, -4.0, 2.0)  # for an "A - B < 0" claim
    # a "both" claim holding on one task set only, 0 held on the other, is not reproduced
    ahead = _pair(5.0, 2.0, 8.0)  # for an "A - B > 0" claim
    both = {"general": {"digiq-filtered_bc": ahead}, "webshop": {"digiq-filtered_bc": _pair(1.0, -2.0, 4.0)}}
    assert _verdicts(both)["digiq-filtered_bc"] == "**not reproduced**"
    # "at least one": holding on one task set reproduces it, unless it is reversed on the other
    one = {"general": {"digiq_untuned-digiq": holds}, "webshop": {"digiq_untuned-digiq": straddles}}
    assert _verdicts(one)["digiq_untuned-digiq"] == "**reproduced**"
    one["webshop"]["digiq_untuned-digiq"] = _pair(4.0, 1.0, 7.0)
    assert _verdicts(one)["digiq_untuned-digiq"] == "**not reproduced**"
    one["general"]["digiq_untuned-digiq"] = straddles
    assert _verdicts(one)["digiq_untuned-digiq"] == "**not reproduced**"  # reversed on one, 0 held on the other
    one["webshop"]["digiq_untuned-digiq"] = straddles
    assert _verdicts(one)["digiq_untuned-digiq"] == "**no detectable difference**"
    # "not below": Best-of-1 detectably ahead on one task set refutes it; Best-of-16 ahead on both reproduces it
    n1 = {"general": {"digiq_n1-digiq": _pair(6.0, 1.0, 11.0)}, "webshop": {"digiq_n1-digiq": straddles}}
    assert _verdicts(n1)["digiq_n1-digiq"] == "**not reproduced**"
    n1["general"]["digiq_n1-digiq"] = holds
    assert _verdicts(n1)["digiq_n1-digiq"] == "**reproduced**"
    # a comparison missing on either task set is not measured, whatever the other says; no file: none measured
    assert _verdicts({"general": {"digiq-filtered_bc": ahead}})["digiq-filtered_bc"] == "**not measured**"
    assert set(_verdicts({}).values()) == {"**not measured**"}


def test_a_claim_names_a_known_relation_and_requirement():
    with pytest.raises(ValueError, match="relation '=>' is not one of"):
        Claim("x", "a-b", "=>", "both")
    with pytest.raises(ValueError, match="on='all' is not one of"):
        Claim("x", "a-b", ">", "all")
    with pytest.raises(ValueError, match="comparison 'a' is not a key 'A-B'"):
        Claim("x", "a", ">", "both")
    with pytest.raises(ValueError, match="a weak \\(<=\\) claim is judged on both task sets"):
        Claim("x", "a-b", "<=", "at least one")


def test_results_end_with_the_paper_s_claims_after_the_ablations(tmp_path):
    paths = Paths(tmp_path)
    write_metrics(paths, "eval", _base_and_digiq())
    assert "The paper's claims" not in results_markdown(paths)  # no comparisons, no verdicts
    write_metrics(paths, "ablations", {"digiq": _base_and_digiq()["digiq"], "digiq_n1": _base_and_digiq()["base"]})
    compared = {ts: {"digiq-base": _pair(30.0, 20.0, 40.0), "digiq_n1-digiq": _pair(-30.0, -40.0, -20.0)}
                for ts in ("general", "webshop")}  # fmt: skip
    write_metrics(paths, "comparisons", compared)
    md = results_markdown(paths)
    claims = md.index("The paper's claims, each judged by its comparison's interval:")
    assert md.index("| digiq_n1 - digiq |") < claims  # after the ablations' comparisons
    assert md[claims:].splitlines()[2:] == claims_table(compared)  # the whole table, to the end of the results
    lead = "+30.0 [+20.0, +40.0], holds"  # Best-of-1 30 points behind: Best-of-16 not below it
    assert f"`digiq - digiq_n1 ≥ 0` on both task sets | {lead} | {lead} | **reproduced** |" in md
    assert "`digiq - filtered_bc > 0` on both task sets | not measured | not measured | **not measured** |" in md


def test_stage_time_table_lists_every_stage_that_writes_metrics_and_their_sum(tmp_path):
    """A stage of dvc.yaml with a metrics file and no row would drop its time from the table and the total."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    timed = [name for name, stage in stages.items()
             if any(next(iter(m)) == f"metrics/{name}.json" for m in stage.get("metrics", []))]  # fmt: skip
    assert timed and set(timed) <= set(STAGES), set(timed) - set(STAGES)
    paths = Paths(tmp_path)
    write_metrics(paths, "vlm_pretrain", {"wall_time_s": 240.0})
    write_metrics(paths, "critic", {"wall_time_s": 90.5})
    write_metrics(paths, "eval_timing", {"wall_time_s": 30.0})
    write_metrics(paths, "eval", _base_and_digiq())
    md = stage_times_markdown(paths)
    assert "| vlm_pretrain | 240.0 |" in md
    assert "| all stages | 360 (6 min) | |" in md


def test_results_give_the_critic_s_margin_over_the_uninformed_level_with_its_interval(tmp_path):
    paths = Paths(tmp_path)
    write_metrics(paths, "eval", _base_and_digiq())
    margin = {
        "all": {"diff": 13.04, "ci95": [10.2, 15.9], "units": 4409, "clusters": 461, "seeds": 3},
        "general": {"diff": 14.3, "ci95": [9.9, 18.1], "units": 1200, "clusters": 200, "seeds": 3},
        "webshop": {"diff": 1.0, "ci95": [-2.0, 4.0], "units": 3209, "clusters": 261, "seeds": 3},
    }
    rates = {"critic_digiq": 0.459, "uninformed": 0.329}
    write_metrics(paths, "diagnostics", {"critic_pick_margin": margin,
                                         "expert_pick": {"states": 5000, "informative_states": 4409,
                                                         "hit_rate": rates, "hit_rate_general": rates,
                                                         "hit_rate_webshop": rates}})  # fmt: skip
    md = results_markdown(paths)
    assert "| held-out states | all | General | Web Shopping |" in md
    assert "| Digi-Q's critic picks the expert's action (%) | 45.9 | 45.9 | 45.9 |" in md
    assert "| uninformed level (%) | 32.9 | 32.9 | 32.9 |" in md
    assert "| critic - uninformed (points, 95% CI) | +13.0 [+10.2, +15.9] | +14.3 [+9.9, +18.1] | " in md
    assert "+1.0 [-2.0, +4.0], no detectable difference |" in md and "4,409 informative stored states of the 461" in md
    assert "interval" in diagnostics_markdown(paths)
    assert "off" in pick_margin_table({}, {})[0]


def test_results_judge_pae_s_claims_on_all_test_tasks_and_on_those_no_proposal_matched(tmp_path):
    paths = Paths(tmp_path)
    write_metrics(paths, "eval", _base_and_digiq())
    assert "PAE's claims" not in results_markdown(paths)  # no PAE rows evaluated
    every = {ts: {"pae-base": _pair(10.0, 4.0, 16.0), "pae-pae_human": _pair(-8.0, -12.0, -3.0),
                  "pae-filtered_bc_online": _pair(1.0, -3.0, 5.0), "pae_oracle-pae": _pair(6.0, 1.0, 11.0)}
             for ts in ("general", "webshop")}  # fmt: skip
    unmatched = {"general": {"pae-base": _pair(2.0, -4.0, 8.0), "pae-pae_human": _pair(-5.0, -9.0, -1.0)}}
    write_metrics(paths, "pae_eval", {"all": every, "unmatched": unmatched,
                                      "unmatched_tasks": {"general": 57, "webshop": 0}})  # fmt: skip
    write_metrics(paths, "pae", {"proposer_panel": {"proposals": 200, "valid": 0.8, "expert_success_on_valid": 0.9},
                                 "evaluator_panel": {"pae": {"all": {"precision": 0.7, "recall": 0.5,
                                                                     "agreement": 0.85}}}})  # fmt: skip
    md = results_markdown(paths)
    assert "PAE's claims ([docs/pae.md](docs/pae.md))" in md
    hold = "+10.0 [+4.0, +16.0], holds"
    assert f"`pae - base > 0` on both task sets | {hold} | {hold} | **reproduced** |" in md
    assert "`pae - pae_human ≥ 0` on both task sets | -8.0 [-12.0, -3.0], reversed" in md  # reported whatever it says
    assert "On the test tasks whose goal no proposal has (57 General, 0 Web Shopping):" in md
    assert "| +2.0 [-4.0, +8.0], no detectable difference | not measured | **not measured** |" in md
    assert "Every PAE comparison on those tasks:" in md  # the other comparisons there too, as numbers, not claims
    assert "| pae - pae_human | -5.0 [-9.0, -1.0] |" in md
    assert "200 proposals: 80.0% map to a task the simulator can check" in md and "precision 70.0%" in md


def test_the_readme_is_one_page_and_its_generated_blocks_are_the_committed_metrics():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert f"{START}\n{headline_markdown(Paths(ROOT))}\n{END}" in readme
    page = (ROOT / "docs" / "results.md").read_text()
    assert f"{RESULTS[0]}\n{in_docs(results_markdown(Paths(ROOT)))}\n{RESULTS[1]}" in page
