"""Stage 02: candidates sampled in whole batches by one-thread workers, each state encoded once for its redraws.

The reference is the stage's loop as it ran in the notebook's process: every
batch of ``batch_states`` steps sampled, then its invalid candidates drawn
again by sampling their prompts and screenshots anew. The stage's table must
hold the same lists, on one worker or several.
"""

import shutil
from dataclasses import replace

import pyarrow.parquet as pq
import pytest

from digiq.config import AugmentConfig, ComputeConfig
from digiq.data.trajectories import TrajectoryStore
from digiq.env.actions import parse_action
from digiq.models.policy import AutoUIPolicy
from digiq.noise import noise_key
from digiq.paths import Paths
from digiq.stages.augment_actions import run_augment

# 4 candidates (3 sampled) a state, 5 states a batch: several batches, and jobs, over the small root's steps.
CFG = AugmentConfig(n_candidates=4, batch_states=5, max_resample=2)


@pytest.fixture
def augment_root(values_root, tmp_path) -> Paths:
    """The small pipeline root's offline data and its untrained base policy, its actions cut to 16 tokens: every
    sample is invalid, so every candidate is drawn again."""
    paths = Paths(tmp_path)
    shutil.copytree(Paths(values_root).offline, paths.offline)
    policy = AutoUIPolicy.load(Paths(values_root).base_policy)
    policy.cfg = replace(policy.cfg, max_action_tokens=16)
    policy.save(paths.base_policy, stage="base_policy")
    return paths


def loop_in_one_process(paths: Paths, cfg: AugmentConfig) -> tuple[list[list[str]], int]:
    """The candidate lists and the redraw count as the stage's loop made them, batch by batch in this process."""
    model = AutoUIPolicy.load(paths.base_policy)
    store = TrajectoryStore(paths.offline)
    steps = store.read().select(["traj_id", "step_id", "observation", "image_path", "action"]).to_pylist()
    lists, resampled = [], 0
    for start in range(0, len(steps), cfg.batch_states):
        batch = steps[start : start + cfg.batch_states]
        images = model.screen.prepare(store.load_images([s["image_path"] for s in batch]))
        prompts = [s["observation"] for s in batch]
        keys = [noise_key(cfg.seed, s["traj_id"], s["step_id"]) for s in batch]
        samples = model.sample(prompts, images, n=cfg.n_candidates - 1, temperature=cfg.temperature, noise=keys)
        for attempt in range(1, cfg.max_resample + 1):
            bad = [(i, j) for i, row in enumerate(samples) for j, a in enumerate(row) if not parse_action(a).is_valid]
            if not bad:
                break
            resampled += len(bad)
            redo = model.sample([prompts[i] for i, _ in bad], images[[i for i, _ in bad]], n=1,
                                temperature=cfg.temperature,
                                noise=[noise_key(keys[i], j, attempt) for i, j in bad])  # fmt: skip
            for (i, j), new in zip(bad, redo, strict=True):
                samples[i][j] = new[0]
        lists += [[s["action"], *row] for s, row in zip(batch, samples, strict=True)]
    return lists, resampled


@pytest.mark.parametrize("workers", [1, 2])
def test_the_candidates_are_the_one_process_loops_on_any_number_of_workers(augment_root, workers):
    want, resampled = loop_in_one_process(augment_root, CFG)
    metrics = run_augment(CFG, augment_root, ComputeConfig(workers=workers))
    got = pq.read_table(augment_root.candidates).column("action_list").to_pylist()
    assert len(got) == metrics["states"] > 2 * CFG.batch_states  # several batches, so several jobs on 2 workers
    assert got == want
    assert metrics["resampled"] == resampled == metrics["states"] * (CFG.n_candidates - 1) * CFG.max_resample
    assert metrics["sampled_valid_rate"] == 0  # drawn again twice, and kept, marked invalid


def test_each_state_is_encoded_once_for_its_first_draws_and_its_redraws(augment_root, monkeypatch):
    """The screen's CNN and the T5 encoder run once per state; redraws decode from the first draws' states."""
    encoded: list[int] = []
    encode = AutoUIPolicy._encode_tokens

    def counted(self, enc, screenshots):
        encoded.append(len(screenshots))
        return encode(self, enc, screenshots)

    monkeypatch.setattr(AutoUIPolicy, "_encode_tokens", counted)
    metrics = run_augment(CFG, augment_root)
    assert metrics["resampled"] > 0
    assert sum(encoded) == metrics["states"]
