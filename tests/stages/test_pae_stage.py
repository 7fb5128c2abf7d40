"""The pae stage at tiny size: the learned evaluator fitted and thresholded, the three rows, and the panels."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from digiq.config import ActorConfig, DigiRLConfig, EnvConfig, PAEConfig, ProposeConfig
from digiq.data.trajectories import TrajectoryStore
from digiq.env.taskgen import generate_tasks
from digiq.env.tasks import TASK_SETS, parse_task
from digiq.io import StageError
from digiq.models.policy import AutoUIPolicy, PolicyConfig
from digiq.models.tokenizer import default_corpus, train_tokenizer
from digiq.models.vlm import ScreenVLM, VLMConfig
from digiq.pae.learned import LearnedEvaluator
from digiq.pae.proposals import read_proposals
from digiq.paths import Paths
from digiq.rollout import ExpertPolicy, rollout
from digiq.stages.eval import pae_comparisons
from digiq.stages.pae import THRESHOLD_EPISODES, practice_curves_figure, proposal_pools, run_pae
from digiq.stages.propose import run_propose

WIDTH = 108
PROPOSE = ProposeConfig(per_group=3, crawl_depth=3)
CFG = PAEConfig(evaluator_epochs=0.5, evaluator_batch=16, threshold_episodes=3)
DIGIRL = DigiRLConfig(rounds=2, episodes_per_round=3, env_steps=None, n_envs=3, actor_updates=1)


@pytest.fixture(scope="module")
def pae_root(tmp_path_factory) -> Paths:
    """Task lists, a tiny base policy and pretrained VLM, the noisy expert's episodes as offline data, proposals."""
    paths = Paths(tmp_path_factory.mktemp("pae"))
    for ts in TASK_SETS:
        for split, n in (("train", 8), ("val", 4), ("test", 6)):
            paths.task_list(ts, split).parent.mkdir(parents=True, exist_ok=True)
            paths.task_list(ts, split).write_text("\n".join(generate_tasks(ts, split, n, seed=3)) + "\n")
    tok = train_tokenizer(default_corpus(n_tasks=50), vocab_size=400)
    torch.manual_seed(0)
    AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, num_layers=1, image_dim=32), tok).save(paths.base_policy)
    ScreenVLM.tiny(tok, VLMConfig(image_size=32, vision_hidden=32, hidden=32, layers=1)).save(paths.vlm_pretrained)
    tasks = [parse_task(t, ts) for ts in TASK_SETS for t in generate_tasks(ts, "train", 5, seed=4)]
    rollout(ExpertPolicy(noise=0.2, seed=1), tasks, n_envs=4, width=WIDTH, store=TrajectoryStore(paths.offline))
    paths.demos.mkdir(parents=True)  # as a released base policy leaves it: no demonstrations
    run_propose(PROPOSE, EnvConfig(width=WIDTH), paths)
    return paths


def test_the_learned_evaluator_needs_a_stored_success(pae_root, tmp_path):
    failing = Paths(tmp_path)
    shutil.copytree(pae_root.data, failing.data, ignore=shutil.ignore_patterns("pae"))
    failing.pae.mkdir()
    shutil.copy(pae_root.pae_proposals, failing.pae_proposals)
    for part in failing.offline.glob("steps-*.parquet"):  # every stored step failed
        table = pq.read_table(part)
        pq.write_table(table.set_column(table.schema.get_field_index("reward"), "reward",
                                        pa.array([0.0] * table.num_rows)), part)  # fmt: skip
    (failing.offline / "manifest.json").unlink()  # parts changed by hand: read as a store without a manifest
    with pytest.raises(StageError, match="no stored step of .* finished its task.*pae.evaluator to judge or oracle"):
        run_pae(CFG, DIGIRL, ActorConfig(batch_size=4), EnvConfig(width=WIDTH), failing, seeds=1)


def test_the_stage_fits_the_evaluator_runs_every_row_and_measures_both(pae_root):
    metrics = run_pae(CFG, DIGIRL, ActorConfig(batch_size=4), EnvConfig(width=WIDTH), pae_root, seeds=1)
    ev = metrics["evaluator"]
    assert ev["examples"] > ev["examples_yes"] > 0
    assert ev["threshold_episodes_done"] == 0 and ev["threshold"] == 1.0  # the untrained base did no validation task
    assert LearnedEvaluator.load(pae_root.pae_evaluator).threshold == pytest.approx(ev["threshold"], abs=1e-6)
    held = TrajectoryStore(pae_root.pae_evaluator / THRESHOLD_EPISODES).read().to_pandas()
    val = {t for ts in TASK_SETS for t in pae_root.task_list(ts, "val").read_text().splitlines()[:3]}
    assert set(held.task) <= val and held.traj_id.nunique() == 6  # the validation lists' first episodes
    assert set(metrics["rows"]) == {"pae", "pae_oracle", "pae_human"}
    for row in metrics["rows"]:
        for ts in TASK_SETS:
            assert (pae_root.pae_policy(row, 0, ts) / "config.json").exists()
            assert len(metrics["rows"][row]["by_task_set"][ts]["per_seed"][0]) == 2
    human = TrajectoryStore(pae_root.pae_runs / "seed0" / "pae_human" / "general" / "round000").read().to_pandas()
    assert set(human.task) <= set(pae_root.task_list("general", "train").read_text().splitlines())
    panel = metrics["proposer_panel"]
    assert 0 < panel["valid"] <= 1 and panel["proposals"] == len(read_proposals(pae_root.pae_proposals))
    assert set(panel["test_lines_unmatched"]) == set(TASK_SETS)
    oracle = metrics["evaluator_panel"]["pae_oracle"]["all"]
    assert oracle["agreement"] in (None, 1.0)  # the device's check against itself
    assert json.loads((pae_root.metrics / "pae.json").read_text())["rows"] == metrics["rows"]
    assert (pae_root.plots / "pae.png").exists()


def test_a_task_set_without_proposals_of_its_own_practises_on_all_of_them(pae_root):
    general_only = [p for p in read_proposals(pae_root.pae_proposals) if p.task_set == "general"]
    pools = proposal_pools(general_only)
    assert [t.instruction for t in pools["webshop"]] == [p.instruction for p in general_only]
    assert {t.task_set for t in pools["webshop"]} == {"webshop"}


def test_pae_comparisons_run_on_all_tasks_and_on_those_no_proposal_matched():
    ones, zeros = np.ones((2, 6), np.int8), np.zeros((2, 6), np.int8)
    half = np.array([[1, 1, 1, 0, 0, 0]] * 2, np.int8)
    arrays = {"pae": {"general": ones}, "base": {"general": half}, "pae_human": {"general": zeros},
              "filtered_bc_online": {"general": half}, "pae_oracle": {"general": ones}}  # fmt: skip
    out = pae_comparisons(arrays, {"general": [3, 4, 5, 40]})  # a line past the list (a shorter n_tasks) is passed over
    assert out["all"]["general"]["pae-base"]["diff"] == 50.0 and out["all"]["general"]["pae-pae_human"]["diff"] == 100.0
    assert out["unmatched"]["general"]["pae-base"]["diff"] == 100.0 and out["unmatched_tasks"] == {"general": 3}
    assert out["unmatched"]["general"]["pae_oracle-pae"]["n_tasks"] == 3


def _rounds(truth: list[float], verdicts: list[float]) -> list[dict[str, float]]:
    return [{"env_steps": 100, "ground_truth_success": t, "success": v} for t, v in zip(truth, verdicts, strict=True)]


def test_the_practice_curves_draw_every_row_and_the_verdicts_of_the_judged_ones_only():
    # Twelve rows: more than the colour cycle has colours.
    rows = {f"row{i}": {"by_task_set": {ts: {"per_seed": [_rounds([0.1, 0.2], [0.3, 0.4]), _rounds([0.3, 0.4, 0.5], [0.5, 0.6, 0.7])]}
                                        for ts in TASK_SETS}} for i in range(12)}  # fmt: skip
    fig = practice_curves_figure(rows, judged={"row11"})
    for ax in fig.axes:
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert set(lines) == {f"row{i}: the device's check" for i in range(12)} | {"row11: the evaluator's verdicts"}
        truth, verdicts = lines["row11: the device's check"], lines["row11: the evaluator's verdicts"]
        assert list(truth.get_xdata()) == [100, 200]  # the rounds both seeds have
        assert list(truth.get_ydata()) == pytest.approx([0.2, 0.3])  # mean over the seeds
        assert list(verdicts.get_ydata()) == pytest.approx([0.4, 0.5])
        assert verdicts.get_linestyle() == "--" and truth.get_color() == verdicts.get_color()
    assert [ax.get_title() for ax in fig.axes] == ["General", "Web Shopping"]
