"""One live run per stage: a second run refuses, naming the first's PID, until the first has ended, however it ended."""

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from digiq.config import (
    AblationsConfig,
    ActorConfig,
    AugmentConfig,
    BasePolicyConfig,
    CollectConfig,
    DiagnosticsConfig,
    DigiRLConfig,
    EmbedConfig,
    EnvConfig,
    EvalConfig,
    PAEConfig,
    ProposeConfig,
    VLMFinetuneConfig,
    VLMPretrainConfig,
    load_settings,
)
from digiq.io import StageError
from digiq.lock import stage_lock
from digiq.paths import ROOT, Paths
from digiq.rows import all_rows
from digiq.stages.actor import run_actor
from digiq.stages.augment_actions import run_augment
from digiq.stages.base_policy import run_base_policy
from digiq.stages.collect import run_collect
from digiq.stages.critic import run as critic_stage
from digiq.stages.critic import run_critic
from digiq.stages.critic_inputs import write_critic_inputs
from digiq.stages.diagnostics import run_diagnostics
from digiq.stages.digirl_online import run_digirl_online
from digiq.stages.embed import run_embed
from digiq.stages.eval import run_eval
from digiq.stages.pae import run_pae
from digiq.stages.propose import run_propose
from digiq.stages.vlm_finetune import run_vlm_finetune
from digiq.stages.vlm_pretrain import run_vlm_pretrain

# The critic stage as its notebook runs it, on the pipeline root argv[1].
CRITIC_RUN = """
import sys
from pathlib import Path
from digiq.config import load_settings
from digiq.paths import Paths
from digiq.stages.critic import run
root = Path(sys.argv[1])
run(load_settings(root / "params.yaml"), Paths(root))
"""


def _critic_params(root: Path, steps: int) -> None:
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["compute"] = {"processes": 1, "cpu": True, "workers": 1}
    params["critic"].update({"steps": steps, "hidden": 16, "batch_size": 16})
    params["experiment"]["seeds"] = 1
    params["ablations"].update({"untuned_vlm": False, "blind_vlm": False})
    params["variants"] = {}
    (root / "params.yaml").write_text(yaml.safe_dump(params))


def test_a_second_run_refuses_while_the_first_lives_and_runs_whole_once_it_was_killed(values_root, tmp_path):
    """A run left going (its DVC killed) and a second run of the stage: the second stops, naming the first's PID,
    and leaves the first's temporary folder alone; once the first is SIGKILLed, a rerun writes the output whole
    and clears what the dead run left."""
    root = tmp_path / "root"
    shutil.copytree(values_root, root)
    paths = Paths(root)
    _critic_params(root, steps=1_000_000)  # the first run is still training when the second starts
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    first = subprocess.Popen([sys.executable, "-c", CRITIC_RUN, str(root)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not list(paths.critics.parent.glob(".critic.partial*")):  # the first run is writing
            assert first.poll() is None, first.stderr.read()
            assert time.monotonic() < deadline, "the first run never started writing"
            time.sleep(0.2)
        left = list(paths.critics.parent.glob(".critic.partial*"))
        _critic_params(root, steps=8)
        with pytest.raises(
            StageError, match=rf"stage critic: another run of this stage is still going \(PID {first.pid},"
        ):
            critic_stage(load_settings(root / "params.yaml"), paths)
        assert all(p.is_dir() for p in left)  # a live run's folder is never cleared
    finally:
        first.kill()  # SIGKILL: no handler runs, only the kernel releases what the run held
        first.wait()
    critic_stage(load_settings(root / "params.yaml"), paths)
    assert (paths.critic(0, "digiq", "general") / "config.json").is_file()
    assert [p.name for p in paths.critics.parent.iterdir() if p.name.startswith(".")] == []


# Each stage's entry, called as its notebook calls it (the inputs do not matter: the lock is taken first).
ENTRIES: dict[str, Callable[[Paths], object]] = {
    "base_policy": lambda p: run_base_policy(BasePolicyConfig(), EnvConfig(), p),
    "collect": lambda p: run_collect(CollectConfig(), EnvConfig(), p),
    "augment_actions": lambda p: run_augment(AugmentConfig(), p),
    "vlm_pretrain": lambda p: run_vlm_pretrain(VLMPretrainConfig(), VLMFinetuneConfig(), EnvConfig(), p),
    "vlm_finetune": lambda p: run_vlm_finetune(VLMFinetuneConfig(), p),
    "embed": lambda p: run_embed(EmbedConfig(), p),
    "critic_inputs": write_critic_inputs,
    "critic": lambda p: run_critic({}, p),
    "actor": lambda p: run_actor(
        ActorConfig(), p, seeds=1, table=all_rows(AblationsConfig()), env=EnvConfig(), collect=CollectConfig()
    ),  # fmt: skip
    "diagnostics": lambda p: run_diagnostics(
        DiagnosticsConfig(), p, seeds=1, env=EnvConfig(), collect=CollectConfig(), policies=[], threshold=0.0
    ),  # fmt: skip
    "digirl_online": lambda p: run_digirl_online(DigiRLConfig(), ActorConfig(), EnvConfig(), p, seeds=1),
    "propose": lambda p: run_propose(ProposeConfig(), EnvConfig(), p),
    "pae": lambda p: run_pae(PAEConfig(), DigiRLConfig(), ActorConfig(), EnvConfig(), p, seeds=1),
    "eval": lambda p: run_eval(EvalConfig(), EnvConfig(), p, seeds=1, main=[], ablations=[]),
}


def test_every_stage_but_the_task_lists_has_an_entry_here():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert set(stages) - {"fingerprints", "tasks"} == set(ENTRIES)


@pytest.mark.parametrize("stage", list(ENTRIES))
def test_every_stage_refuses_to_run_beside_a_live_run_of_itself(stage, tmp_path):
    paths = Paths(tmp_path)
    with stage_lock(paths.lock(stage), stage), pytest.raises(StageError, match=rf"PID {os.getpid()},"):
        ENTRIES[stage](paths)


def test_the_task_lists_stage_refuses_to_run_beside_a_live_run_of_itself(tmp_path):
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    paths = Paths(tmp_path)
    with stage_lock(paths.lock("tasks"), "tasks"):
        done = subprocess.run([sys.executable, "-m", "digiq.env", "generate-task-lists", "--root", str(tmp_path)],
                              capture_output=True, text=True)  # fmt: skip
    assert done.returncode != 0, done.stdout
    assert f"stage tasks: another run of this stage is still going (PID {os.getpid()}," in done.stderr
    assert not paths.tasks.exists()
