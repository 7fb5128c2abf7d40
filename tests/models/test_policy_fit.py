"""Fitting the policy to rows (SFT and every actor), and its checkpoints."""

import pytest
import torch

from digiq.env.actions import format_action, press_enter
from digiq.models.policy import AutoUIPolicy, PolicyConfig
from digiq.models.policy_fit import FitRow, fit_policy
from digiq.models.tokenizer import default_corpus, train_tokenizer


@pytest.mark.parametrize("rows", [9, 10, 11])
def test_a_policy_fits_any_number_of_steps(rows):
    """One row per step: 10 steps is where torch's one-cycle schedule would divide by zero."""
    tok = train_tokenizer(default_corpus(n_tasks=20, seed=0), vocab_size=300)
    torch.manual_seed(0)
    policy = AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, d_kv=8, image_dim=32, dropout=0.0), tok)
    shots = {"s": torch.zeros(114, 54, 3, dtype=torch.uint8)}
    fit = [FitRow(f"Goal: open app {i}", "s", format_action(press_enter())) for i in range(rows)]
    curve = fit_policy(policy, fit, shots, epochs=1, batch_size=1, lr=3e-3, seed=0)
    assert len(curve) == rows
    assert curve[-1]["loss"] < curve[0]["loss"]


def test_a_fixed_number_of_updates_runs_over_the_rows_as_often_as_it_takes():
    """Stage 06's budget: 7 updates of 2 rows over 5 rows are 3 batches a pass, the passes reshuffled."""
    tok = train_tokenizer(default_corpus(n_tasks=20, seed=0), vocab_size=300)
    torch.manual_seed(0)
    policy = AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, d_kv=8, image_dim=32, dropout=0.0), tok)
    shots = {"s": torch.zeros(114, 54, 3, dtype=torch.uint8)}
    fit = [FitRow(f"Goal: open app {i}", "s", format_action(press_enter())) for i in range(5)]
    curve = fit_policy(policy, fit, shots, updates=7, batch_size=2, lr=3e-3, seed=0)
    assert [p["epoch"] for p in curve] == [0, 0, 0, 1, 1, 1, 2]
    for wrong in ({}, {"epochs": 1, "updates": 7}):
        with pytest.raises(ValueError, match="give epochs or updates"):
            fit_policy(policy, fit, shots, batch_size=2, lr=3e-3, seed=0, **wrong)


def test_a_checkpoint_with_tied_weights_is_the_same_bytes_at_every_save(tmp_path):
    """DVC hashes stage outputs: safetensors' own record of tied names came out in a random order per save."""
    tok = train_tokenizer(default_corpus(n_tasks=20, seed=0), vocab_size=300)
    torch.manual_seed(0)
    policy = AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, d_kv=8, image_dim=32, dropout=0.0), tok)
    for i in range(4):
        policy.save(tmp_path / str(i))
    assert len({(tmp_path / str(i) / "model.safetensors").read_bytes() for i in range(4)}) == 1
    loaded = AutoUIPolicy.load(tmp_path / "0")
    for (name, a), b in zip(policy.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert loaded.t5.lm_head.weight is loaded.t5.shared.weight  # tied again on load
