"""A critic that learns its text encoders, as released Digi-Q's does: its inputs, its TD update, its checkpoint."""

import json
import shutil

import numpy as np
import pytest
import torch
from conftest import TEXT_D, H
from safetensors.torch import load_file, save_file

from digiq.algos.digiq import build_critic, td_losses, transition_tensors
from digiq.config import ActorConfig, CriticConfig
from digiq.data import TrajectoryStore
from digiq.data.features import critic_inputs, load_text_rows
from digiq.models.checkpoint import part_digest
from digiq.models.critic import Critic, TextStart, critic_scores, load_critics
from digiq.models.policy import AutoUIPolicy
from digiq.models.tokenizer import default_corpus, train_tokenizer
from digiq.paths import Paths

CFG = CriticConfig(hidden=16, lr=1e-2)


@pytest.fixture(scope="module")
def start(values_root) -> tuple[Paths, TextStart, dict[str, np.ndarray]]:
    paths = Paths(values_root)
    start = TextStart(AutoUIPolicy.load(paths.base_policy), load_text_rows(paths)[0])
    return paths, start, critic_inputs(paths, text=True, towers=True)


def test_untrained_towers_give_the_frozen_averages_squashed_in_the_same_places(start):
    """At init each tower is the base encoder's average through an identity dense layer and tanh: the inputs are
    the frozen critic's, its text columns squashed; scoring from every text encoded once reads the same."""
    paths, text_start, feats = start
    torch.manual_seed(0)
    critic = build_critic(CFG, feats, text_start).eval()
    frozen = critic_inputs(paths, text=True)
    rows = np.arange(len(feats["state"]))
    batch = {k: torch.from_numpy(np.asarray(v)[rows]) for k, v in feats.items()}
    with torch.no_grad():
        x = critic.inputs(batch, ("state", "next_state", "candidates"))
    for key in ("state", "next_state", "candidates"):
        want = torch.from_numpy(np.asarray(frozen[key]))
        torch.testing.assert_close(x[key][..., :H], want[..., :H])
        torch.testing.assert_close(x[key][..., H:], torch.tanh(want[..., H:]), rtol=1e-4, atol=1e-5)
    read = critic.read(feats, rows, ("state", "candidates"))  # every text through each tower once
    torch.testing.assert_close(read["candidates"], x["candidates"], rtol=1e-5, atol=1e-6)
    assert critic.cfg.feature_dim == H + 3 * TEXT_D and critic.cfg.action_dim == H + 2 * TEXT_D


def test_td_trains_the_towers_and_the_target_s_follow_by_soft_update(start):
    paths, text_start, feats = start
    torch.manual_seed(0)
    critic = build_critic(CFG, feats, text_start)
    target = critic.target()
    steps = TrajectoryStore(paths.offline).read().to_pandas()
    data = transition_tensors(feats, steps)
    goal_before = critic.towers.towers["goal"].pool.weight.detach().clone()
    target_before = target.towers.towers["goal"].pool.weight.detach().clone()
    policy_before = {n: p.detach().clone() for n, p in text_start.policy.named_parameters()}
    opt = torch.optim.Adam(critic.parameters(), lr=1e-2)
    q_loss, v_loss = td_losses(critic, target, {k: t[:16] for k, t in data.items()}, 0.95)
    (q_loss + v_loss).backward()
    moved = [n for n, p in critic.towers.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0]
    assert {n.split(".")[1] for n in moved} == {"goal", "action_type", "typed_text"}  # TD reaches all three
    assert all(p.grad is None for p in target.parameters())
    opt.step()
    target.soft_update(critic, 0.25)
    goal_after = critic.towers.towers["goal"].pool.weight.detach()
    assert not torch.equal(goal_after, goal_before)
    torch.testing.assert_close(target.towers.towers["goal"].pool.weight, 0.75 * target_before + 0.25 * goal_after)
    assert all(torch.equal(p, policy_before[n]) for n, p in text_start.policy.named_parameters())  # a copy


def test_a_critic_with_towers_keeps_its_tokenizer_and_scores_the_same_once_loaded(start, tmp_path):
    paths, text_start, feats = start
    torch.manual_seed(0)
    critic = build_critic(CFG, feats, text_start).eval()
    with torch.no_grad():  # trained a little, so that the towers are no longer the base encoder's
        for p in critic.towers.parameters():
            p.add_(0.01 * torch.randn_like(p))
    folder = paths.critic(7, "digiq", "general")
    critic.save(folder, stage="critic")
    assert (folder / "tokenizer").is_dir()
    loaded = load_critics(paths, 7, "digiq", ["general"])["general"]
    of_set = np.array(["general"] * len(feats["state"]))
    saved, again = critic_scores({"general": critic}, feats, of_set), critic_scores({"general": loaded}, feats, of_set)
    np.testing.assert_array_equal(saved["q"], again["q"])
    np.testing.assert_array_equal(saved["v"], again["v"])
    shutil.rmtree(paths.critics / "seed7")


def _resave(folder, part: str) -> None:
    """Record ``part``'s digest anew in config.json, as a checkpoint saved that way would."""
    config = json.loads((folder / "config.json").read_text())
    config["digests"][part] = part_digest(folder / part)
    (folder / "config.json").write_text(json.dumps(config))


def test_a_checkpoint_without_its_towers_or_with_another_vocabulary_is_refused_naming_the_file(start, tmp_path):
    paths, text_start, feats = start
    torch.manual_seed(0)
    build_critic(CFG, feats, text_start).save(tmp_path / "critic", stage="critic")
    headless = tmp_path / "headless"
    shutil.copytree(tmp_path / "critic", headless)
    weights = load_file(headless / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.startswith("towers.")}, headless / "model.safetensors")
    _resave(headless, "model.safetensors")
    with pytest.raises(ValueError, match=f"cannot load the weights {headless / 'model.safetensors'}"):
        Critic.load(headless)
    other = tmp_path / "other"
    shutil.copytree(tmp_path / "critic", other)
    shutil.rmtree(other / "tokenizer")
    train_tokenizer(default_corpus(n_tasks=20, seed=9), vocab_size=300).save_pretrained(other / "tokenizer")
    _resave(other, "tokenizer")
    with pytest.raises(ValueError, match=f"critic checkpoint {other}: its tokenizer .* not of the vocabulary"):
        Critic.load(other)
    Critic.load(tmp_path / "critic")  # the checkpoint as saved loads


def test_the_knobs_name_a_text_encoder_a_token_loss_or_draws_they_do_not_know():
    with pytest.raises(ValueError, match="text_encoder must be one of"):
        CriticConfig(text_encoder="roberta")
    assert CriticConfig().towers and not CriticConfig(text_encoder="frozen").towers
    assert not CriticConfig(text_features=False).towers  # no text, nothing to encode
    with pytest.raises(ValueError, match="token_loss must be one of"):
        ActorConfig(token_loss="max")
    with pytest.raises(ValueError, match="draws must be one of"):
        ActorConfig(draws="heldout")
    with pytest.raises(ValueError, match="a critic with text towers starts from the base policy's encoder"):
        build_critic(CriticConfig(), {"state": np.zeros((2, 3), np.float32), "candidates": np.zeros((2, 2, 3))})
