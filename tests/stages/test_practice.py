"""PAE's practice runs at tiny size: drawn with replacement from the pool, judged by the evaluator, and nothing the
actor learns from depends on the device's own check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from digiq.algos.digirl_online import GROUND_TRUTH_FILE, OnlineJob, Practice, practice_tasks, run_online_job
from digiq.config import ActorConfig, DeviceConfig, DigiRLConfig, EnvConfig, JudgeConfig
from digiq.data.trajectories import TrajectoryStore
from digiq.env.gym_env import AndroidSimEnv
from digiq.env.tasks import parse_task, unchecked_task
from digiq.models.policy import AutoUIPolicy, PolicyConfig
from digiq.models.tokenizer import default_corpus, train_tokenizer
from digiq.models.vlm import ScreenVLM, VLMConfig
from digiq.pae.learned import LearnedEvaluator
from digiq.paths import Paths

WIDTH = 108
POOL = (
    parse_task("Launch Clock"),
    parse_task("Mute notifications from Audible"),
    unchecked_task("Wake me up at 6:20am"),
)


@pytest.fixture(scope="module")
def practice_root(tmp_path_factory) -> Paths:
    """An untrained tiny base policy and an untrained tiny learned evaluator whose threshold says "done" often."""
    paths = Paths(tmp_path_factory.mktemp("practice"))
    tok = train_tokenizer(default_corpus(n_tasks=50), vocab_size=400)
    torch.manual_seed(0)
    AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, num_layers=1, image_dim=32), tok).save(paths.base_policy)
    vlm = ScreenVLM.tiny(tok, VLMConfig(image_size=32, vision_hidden=32, hidden=32, layers=1), seed=0)
    probabilities = LearnedEvaluator(vlm, 0.5).probabilities(
        ["Launch Clock"] * 2, [[AndroidSimEnv(width=WIDTH).reset(seed=s, options={"task": POOL[0]})[0]["screenshot"]]
                               for s in range(2)], ["nonsense"] * 2)  # fmt: skip
    LearnedEvaluator(vlm, float(probabilities.min())).save(paths.data / "evaluator")  # "done" on most screens
    return paths


def _job(paths: Paths, row: str, evaluator: Path | None, runs: Path) -> OnlineJob:
    """``row`` at tiny size: the learned evaluator saved in ``evaluator``, or (None) the device's own check."""
    cfg = DigiRLConfig(rounds=2, episodes_per_round=5, env_steps=None, n_envs=3, actor_updates=2)
    return OnlineJob(paths, row, 0, "general", cfg, ActorConfig(batch_size=4), EnvConfig(width=WIDTH), DeviceConfig(),
                     JudgeConfig(), practice=Practice(POOL, "learned" if evaluator else "oracle", runs, evaluator))  # fmt: skip


def test_practice_draws_with_replacement_the_same_for_every_row_of_a_seed():
    cfg = DigiRLConfig(episodes_per_round=12)
    drawn = practice_tasks(cfg, POOL, seed=0, task_set="general", round_=0)
    assert len(drawn) == 12 and set(drawn) == set(POOL)  # 12 from 3: repeats
    assert drawn == practice_tasks(cfg, POOL, seed=0, task_set="general", round_=0)
    assert drawn != practice_tasks(cfg, POOL, seed=0, task_set="general", round_=1)


def test_a_practice_run_is_judged_by_its_evaluator_and_reports_ground_truth_beside(practice_root, tmp_path):
    record = run_online_job(_job(practice_root, "pae", practice_root.data / "evaluator", tmp_path))
    assert [r["episodes"] for r in record["rounds"]] == [5, 5]
    run = tmp_path / "seed0" / "pae" / "general"
    truth = json.loads((run / "round000" / GROUND_TRUTH_FILE).read_text())
    steps = TrajectoryStore(run / "round000").read().to_pandas()
    verdicts = steps.groupby("traj_id").trajectory_reward.first().gt(0)
    assert [bool(verdicts[i]) for i, _, _ in truth] == [v for _, v, _ in truth]  # the store holds the verdicts
    assert any(v for _, v, _ in truth)  # the evaluator said "done" ...
    unchecked = [t for i, _, t in truth if practice_tasks(_job(practice_root, "pae", None, tmp_path).cfg, POOL, 0,
                                                          "general", 0)[i] is POOL[2]]  # fmt: skip
    assert unchecked == [None] * len(unchecked)  # ... and the device has nothing to say on a task it cannot check
    assert {"ground_truth_success", "checked_episodes", "kept_steps"} <= set(record["rounds"][0])
    assert (run / "latest" / "policy" / "config.json").exists() and not (run / "latest" / "v_inst.safetensors").exists()


def test_the_learner_reads_nothing_of_the_ground_truth(practice_root, tmp_path, monkeypatch):
    """The same run with the device's check answering at random: every stored step, kept row and weight equal."""
    first = run_online_job(_job(practice_root, "pae", practice_root.data / "evaluator", tmp_path / "a"))
    calls = iter(range(10**6))
    monkeypatch.setattr(AndroidSimEnv, "_succeeded", lambda self: next(calls) % 3 == 0)
    second = run_online_job(_job(practice_root, "pae", practice_root.data / "evaluator", tmp_path / "b"))
    runs = [root / "seed0" / "pae" / "general" for root in (tmp_path / "a", tmp_path / "b")]
    for r in ("round000", "round001"):
        a, b = (TrajectoryStore(run / r).read() for run in runs)
        assert a.equals(b)
        assert (runs[0] / r / GROUND_TRUTH_FILE).read_text() != (runs[1] / r / GROUND_TRUTH_FILE).read_text()
    strip = [{k: v for k, v in round_.items() if k not in ("ground_truth_success", "checked_episodes", "wall_time_s")}
             for round_ in first["rounds"]]  # fmt: skip
    assert strip == [{k: v for k, v in round_.items() if k not in ("ground_truth_success", "checked_episodes",
                                                                   "wall_time_s")} for round_ in second["rounds"]]  # fmt: skip
    weights = [(run / "latest" / "policy" / "model.safetensors").read_bytes() for run in runs]
    assert weights[0] == weights[1]


def test_an_oracle_practice_run_ends_episodes_on_the_devices_check(practice_root, tmp_path):
    record = run_online_job(_job(practice_root, "pae_oracle", None, tmp_path))
    truth = json.loads((tmp_path / "seed0" / "pae_oracle" / "general" / "round000" / GROUND_TRUTH_FILE).read_text())
    assert all(v == bool(t) for _, v, t in truth)  # the verdict is the check (None: cannot check, never a success)
    assert record["rounds"][0]["success"] == record["rounds"][0]["ground_truth_success"]
