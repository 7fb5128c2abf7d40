import hashlib
import shutil
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from chat_server import ChatServer

from digiq.config import load_settings
from digiq.data import TrajectoryStore
from digiq.demo import run_demo
from digiq.env import parse_task
from digiq.env.actions import format_action, press_back, tap
from digiq.env.taskgen import generate_tasks
from digiq.models.critic import Critic, CriticNetConfig
from digiq.models.policy import AutoUIPolicy, PolicyConfig
from digiq.models.tokenizer import default_corpus, train_tokenizer
from digiq.paths import Paths
from digiq.rollout import ExpertPolicy, rollout
from digiq.stages.critic_inputs import write_critic_inputs

ROOT = Path(__file__).resolve().parents[1]
AITW = ROOT.parent / "shared" / "aitw"
DATA = Path(__file__).resolve().parent / "fixtures"


# What a run writes in a checkout: `make demo` must leave every byte of it as it was.
CHECKOUT = ["dvc.lock", "params.yaml", "params/compute.yaml", "metrics/eval.json", "README.md",
            "docs/notebooks/07_actor.ipynb", "plots/results.png"]  # fmt: skip


def checkout_digests() -> dict[str, str]:
    """The SHA-256 of each of the checkout's files in ``CHECKOUT`` that exists, and the names under its data/ (a
    stage's lock or output there would be a run writing into the checkout)."""
    digests = {p: hashlib.sha256((ROOT / p).read_bytes()).hexdigest() for p in CHECKOUT if (ROOT / p).exists()}
    return digests | {"data/": " ".join(sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "data").rglob("*")))}


class DemoRun(NamedTuple):
    workspace: Path  # every stage run under `dvc repro` at the demo preset
    shown: str  # what the demo printed at its end
    checkout_before: dict[str, str]  # checkout_digests() before it ran


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> DemoRun:
    """``make demo``'s run, once per session."""
    workspace = tmp_path_factory.mktemp("demo") / "workspace"
    before = checkout_digests()
    return DemoRun(workspace, run_demo(workspace), before)


@pytest.fixture(scope="session")
def aitw_dir() -> Path:
    """The real AitW task lists beside the checkout (CI has them); skip where absent."""
    if not (AITW / "general_train.txt").exists():
        pytest.skip(f"AitW task lists not found at {AITW}")
    return AITW


H = 8  # feature width
TAP = (0.25, 0.75)  # candidate 1 of every state taps here
TEXT_D = 16  # the tiny base policy's d_model: the width of each text feature


@pytest.fixture(scope="session")
def values_root(tmp_path_factory) -> Path:
    """A small pipeline root the Q/V viewers can load: expert rollouts as the offline data, three
    candidates per state (the action taken, a tap at TAP, an invalid Back), feature files, a critic
    on the features alone, and an untrained tiny base policy (the critic's text encoder)."""
    root = tmp_path_factory.mktemp("values")
    shutil.copy(ROOT / "params.yaml", root / "params.yaml")
    settings = load_settings(root / "params.yaml")
    paths = Paths(root)
    tasks = [parse_task(t, "general") for t in generate_tasks("general", "train", 5, seed=3)]
    store = TrajectoryStore(paths.offline)
    rollout(ExpertPolicy(noise=0.3, seed=2), tasks, n_envs=5, seed=settings.collect.seed,
            width=settings.env.width, store=store, hierarchies=True)  # fmt: skip
    steps = store.read().to_pandas()
    S, N = len(steps), 3
    lists = [[a, format_action(tap(*TAP)), format_action(press_back())] for a in steps.action]
    paths.candidates.parent.mkdir(parents=True)
    pq.write_table(pa.table({"traj_id": steps.traj_id, "step_id": steps.step_id, "action_list": lists,
                             "valid_list": [[True, True, False]] * S}), paths.candidates)  # fmt: skip
    rng = np.random.default_rng(0)
    feats = paths.features()
    feats.mkdir(parents=True)
    arrays = {"state": (S, H), "next_state": (S, H), "candidates": (S, N, H)}
    for name, shape in arrays.items():
        np.save(feats / f"{name}.npy", rng.normal(size=shape).astype(np.float32))
    np.save(feats / "p_yes.npy", rng.uniform(size=(S, N)).astype(np.float32))
    np.save(feats / "ids.npy", steps[["traj_id", "step_id"]].to_numpy(np.int64))
    torch.manual_seed(0)
    Critic(CriticNetConfig(feature_dim=H, hidden=16)).save(
        paths.critic(0, "digiq", "general"), stage="critic", gamma=0.9, holdout=0.2, split_seed=4
    )
    policy = AutoUIPolicy(PolicyConfig(d_model=TEXT_D, d_ff=32, d_kv=8, num_heads=2, num_layers=1, image_dim=16),
                          train_tokenizer(default_corpus(n_tasks=50)))  # fmt: skip
    policy.save(paths.base_policy, stage="base_policy")
    write_critic_inputs(paths)
    return root


@pytest.fixture
def collect_root(tmp_path) -> Paths:
    """What stage 01 reads: two train tasks per task set and an untrained tiny base policy."""
    paths = Paths(tmp_path)
    for ts in ("general", "webshop"):
        paths.task_list(ts, "train").parent.mkdir(parents=True, exist_ok=True)
        paths.task_list(ts, "train").write_text("\n".join(generate_tasks(ts, "train", 2, seed=3)) + "\n")
    tok = train_tokenizer(default_corpus(n_tasks=50), vocab_size=400)
    torch.manual_seed(0)
    AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, num_layers=1, image_dim=32), tok).save(paths.base_policy)
    return paths


@pytest.fixture
def serve():
    """Start scripted chat servers (:class:`chat_server.ChatServer`) on loopback; they stop after the test."""
    servers = []

    def start(*script):
        servers.append(ChatServer(script))
        return servers[-1]

    yield start
    for s in servers:
        s.close()
