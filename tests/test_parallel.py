"""Data parallelism through accelerate, checked with two CPU processes: the same training as one process."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from transformers import PreTrainedTokenizerFast

from digiq import parallel
from digiq.models.critic import Critic
from digiq.models.vlm import ScreenVLM, VLMConfig
from digiq.paths import Paths
from digiq.stages.collect import run_collect
from digiq.stages.critic import run as critic_stage
from digiq.stages.launch import run_stage
from digiq.stages.vlm_finetune import run as vlm_stage

pytestmark = pytest.mark.slow  # accelerate launch with several processes

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "parallel_fits.py"
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}  # fmt: skip


def test_one_process_keeps_whole_batches():
    rows, share = parallel.shard(list("abc"), [1.0, 2.0, 3.0])
    assert rows == list("abc") and share == 1.0 and parallel.global_mean(2.5) == 2.5


def test_two_processes_train_a_policy_and_a_vlm_as_one_process_does(tmp_path):
    """Uneven weights and a last batch of 3 rows split 2 / 1: the shares must make the gradients exact."""
    one = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "one")], env=_env(), capture_output=True,
                         text=True)  # fmt: skip
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run([*LAUNCH, str(SCRIPT), str(tmp_path / "two")], env=_env(), capture_output=True, text=True)
    assert two.returncode == 0, two.stderr[-2000:]
    a, b = torch.load(tmp_path / "one" / "weights.pt"), torch.load(tmp_path / "two" / "weights.pt")
    for model in ("policy", "vlm"):
        for name, w in a[model].items():
            torch.testing.assert_close(b[model][name], w, atol=2e-4, rtol=1e-4, msg=f"{model} {name}")
    la, lb = (
        [float(x) for x in (tmp_path / run / "losses.txt").read_text().split()] for run in ("one", "two")
    )  # fmt: skip
    assert la == pytest.approx(lb, abs=1e-5)


def _stage_root(values_root: Path, dest: Path, processes: int, **changes: dict) -> Path:
    """A copy of the small pipeline root whose stages run on ``processes`` CPU processes, with groups ``changes``."""
    shutil.copytree(values_root, dest)
    params = yaml.safe_load((dest / "params.yaml").read_text())
    params["compute"] = {"processes": processes, "cpu": True, "workers": 1, "threads": 1}  # one thread, as each of N
    for group, keys in changes.items():
        params[group].update(keys)
    (dest / "params.yaml").write_text(yaml.safe_dump(params))
    return dest


def _critic_root(values_root: Path, dest: Path, processes: int) -> Path:
    return _stage_root(values_root, dest, processes,
                       critic={"steps": 6, "hidden": 16, "batch_size": 16, "penalty_states": 5},  # 5 of 16: split 3/2
                       experiment={"seeds": 1}, ablations={"untuned_vlm": False, "blind_vlm": False})  # fmt: skip


def test_the_critic_stage_on_two_processes_matches_one(values_root, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    one = Paths(_critic_root(values_root, tmp_path / "one", 1))
    two = Paths(_critic_root(values_root, tmp_path / "two", 2))
    m1 = run_stage(critic_stage, one, one.root / "params.yaml")
    m2 = run_stage(critic_stage, two, two.root / "params.yaml")  # accelerate launch, two CPU processes
    assert m2["transitions_train"] == m1["transitions_train"]
    assert m2["q_loss_last"] == pytest.approx(m1["q_loss_last"], rel=1e-3)
    c1, c2 = (Critic.load(p.critic(0, "digiq", "general")) for p in (one, two))
    for (name, w1), w2 in zip(c1.state_dict().items(), c2.state_dict().values(), strict=True):
        torch.testing.assert_close(w2, w1, atol=1e-4, rtol=1e-4, msg=name)


def _vlm_root(values_root: Path, dest: Path, processes: int) -> Path:
    """The small root with a tiny pretrained VLM (its random initialisation) for stage 04 to fine-tune."""
    root = _stage_root(values_root, dest, processes, ablations={"blind_vlm": False},
                       vlm_finetune={"epochs": 1, "batch_size": 5, "train_last_layers": 0, "shard": processes > 1})  # fmt: skip
    paths = Paths(root)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(paths.base_policy / "tokenizer")
    ScreenVLM.tiny(tokenizer, VLMConfig(image_size=32, hidden=32)).save(paths.vlm_pretrained)
    return root


def test_stage_04_sharded_over_two_processes_trains_as_one_process(values_root, tmp_path, monkeypatch):
    """FSDP2 on two CPU processes: each keeps half of the weights, and the fine-tuned VLM is the one-process one."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    one = Paths(_vlm_root(values_root, tmp_path / "one", 1))
    two = Paths(_vlm_root(values_root, tmp_path / "two", 2))
    m1 = run_stage(vlm_stage, one, one.root / "params.yaml")
    m2 = run_stage(vlm_stage, two, two.root / "params.yaml")  # accelerate launch, two CPU processes, sharded
    assert m1["trained_weights_per_process"] == m1["trained_weights"] == m2["trained_weights"]
    assert m2["trained_weights"] / 2 <= m2["trained_weights_per_process"] < 0.52 * m2["trained_weights"]
    assert m2["pairs_train"] % 5 and m2["accuracy_heldout"] == m1["accuracy_heldout"]  # a last, short batch
    w1, w2 = ScreenVLM.load(one.vlm).model.state_dict(), ScreenVLM.load(two.vlm).model.state_dict()
    start = ScreenVLM.load(one.vlm_pretrained).model.state_dict()
    assert w1.keys() == w2.keys()
    # Each process multiplies its own rows (another matrix shape, other rounding) and Adam's normalised steps carry
    # rounding into every weight: the runs agree within 1% of how far the fine-tune moved each weight (measured:
    # 0.3%), where a lost or doubled shard's gradient would move it by a large part of that.
    for name, w in w1.items():
        moved = float((w - start[name]).abs().max())
        torch.testing.assert_close(w2[name], w, atol=max(1e-5, 0.01 * moved), rtol=0, msg=name)
    assert any(not torch.equal(w, start[n]) for n, w in w1.items())  # the fine-tune moved the pretrained weights


def test_a_failing_launched_stage_reports_its_error(tmp_path):
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["compute"] = {"processes": 2, "cpu": True, "workers": 1}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(
        RuntimeError, match=r"stage critic on 2 processes failed:\nStageError: .*missing input .*finetuned"
    ):
        run_stage(critic_stage, Paths(tmp_path), tmp_path / "params.yaml")
    with pytest.raises(ValueError, match="run_stage takes a stage module's run, got digiq.stages.collect.run_collect"):
        run_stage(run_collect, Paths(tmp_path), tmp_path / "params.yaml")
