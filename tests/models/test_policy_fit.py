"""Fitting the policy to rows (SFT and every actor), and its checkpoints."""

from types import SimpleNamespace

import pytest
import torch

from digiq import parallel
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
    """Stage 07's budget: 7 updates of 2 rows over 5 rows are 3 batches a pass, the passes reshuffled."""
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


def _tiny_policy() -> AutoUIPolicy:
    tok = train_tokenizer(default_corpus(n_tasks=20, seed=0), vocab_size=300)
    torch.manual_seed(0)
    return AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, d_kv=8, image_dim=32, dropout=0.0), tok).eval()


def _rows(n: int) -> tuple[list[str], torch.Tensor, list[str]]:
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 114, 54, 3), dtype=torch.uint8, generator=gen)
    return [f"Goal: open app {i}" for i in range(n)], images, [f"Action Decision: TYPE: app {i}" for i in range(n)]


def test_a_weighted_loss_is_normalised_by_the_size_of_the_weights():
    """REINFORCE's weights have either sign: sum(w * NLL) / sum(|w|), never / sum(w) (here 0)."""
    policy = _tiny_policy()
    prompts, images, actions = _rows(3)
    with torch.no_grad():
        nll = [float(policy.loss(prompts[i : i + 1], images[i : i + 1], actions[i : i + 1])) for i in range(3)]
        weights = torch.tensor([1.5, -2.0, 0.5])  # sums to 0
        weighted = float(policy.loss(prompts, images, actions, weights))
        assert weighted == pytest.approx((1.5 * nll[0] - 2.0 * nll[1] + 0.5 * nll[2]) / 4.0, rel=1e-5)
        # The same per-row NLLs as the batch computes them: the signed weights over sum |w| exactly, and positive
        # weights the weighted mean it always was (/ sum(w)), bit for bit; weights of 1 the plain mean.
        logp, keep = policy._token_logprobs(prompts, images, actions)
        per_row = -(logp * keep).sum(-1) / keep.sum(-1).clamp(min=1)
        assert torch.equal(policy.loss(prompts, images, actions, weights), (per_row * weights).sum() / 4.0)
        w = torch.tensor([2.0, 1.0, 3.0])
        assert torch.equal(policy.loss(prompts, images, actions, w), (per_row * w).sum() / w.sum())
        ones = policy.loss(prompts, images, actions, torch.ones(3))
        assert float(ones) == pytest.approx(float(policy.loss(prompts, images, actions)), rel=1e-6)


def test_processes_sharing_a_batch_of_signed_weights_take_the_one_process_step(monkeypatch):
    """Each process's share of a batch counts its rows' |w|: the averaged gradients are the whole batch's."""
    policy = _tiny_policy()
    prompts, images, actions = _rows(5)
    weights = [1.0, -3.0, 0.5, -0.25, 2.0]  # uneven, of both signs, summing to 0.25

    def grads(rows: list[int], share: float) -> list[torch.Tensor]:
        policy.zero_grad()
        loss = policy.loss([prompts[i] for i in rows], images[rows], [actions[i] for i in rows],
                           torch.tensor([weights[i] for i in rows]))  # fmt: skip
        (loss * share).backward()
        return [p.grad.clone() for p in policy.parameters() if p.grad is not None]

    whole = grads(list(range(5)), 1.0)
    per_process = []
    for rank in (0, 1):  # what each of two processes computes (their all-reduce averages the gradients)
        monkeypatch.setattr(parallel, "state", lambda rank=rank: SimpleNamespace(num_processes=2, process_index=rank))
        mine, share = parallel.shard(list(range(5)), weights)
        assert mine == list(range(rank, 5, 2))
        per_process.append(grads(mine, share))
    for g, g0, g1 in zip(whole, *per_process, strict=True):
        torch.testing.assert_close((g0 + g1) / 2, g, atol=1e-6, rtol=1e-4)


def test_drawn_batches_imitate_only_the_drawn_states_that_have_a_row():
    """Released Digi-Q's actor batches: states drawn with replacement, a state the method kept nothing of imitating
    nothing; a step that drew no row leaves the weights as they are."""
    policy = _tiny_policy()
    shots = {"s": torch.zeros(114, 54, 3, dtype=torch.uint8)}
    fit = [FitRow(f"Goal: open app {i}", "s", format_action(press_enter())) for i in range(3)]
    curve = fit_policy(policy, fit, shots, updates=6, batch_size=4, lr=1e-4, seed=0, weight_decay=0.0,
                       grad_clip=0.01, one_cycle=False, draws_from=3)  # fmt: skip
    assert len(curve) == 6 and all(p["loss"] > 0 for p in curve)  # every draw lands on a row
    before = [p.clone() for p in policy.parameters()]
    # one row among a million states: one draw a step almost never lands on it
    curve = fit_policy(policy, fit[:1], shots, updates=3, batch_size=1, lr=1e-2, seed=0, one_cycle=False,
                       draws_from=10**6)  # fmt: skip
    assert [p["loss"] for p in curve] == [0.0, 0.0, 0.0]
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))
    with pytest.raises(ValueError, match="drawing from 2 states needs updates and at least one state per row"):
        fit_policy(policy, fit, shots, updates=2, batch_size=2, lr=1e-4, seed=0, draws_from=2)


def test_weights_far_below_one_keep_their_ratios():
    """AWR at a small beta: exp((A - 1) / beta) is tiny for every row; the loss only sees their ratios."""
    from digiq.models.policy_fit import _loss

    policy = _tiny_policy()
    prompts, images, actions = _rows(3)
    shots = {f"s{i}": images[i] for i in range(3)}
    rows = [FitRow(prompts[i], f"s{i}", actions[i], w) for i, w in enumerate((1e-60, 3e-60, 2e-60))]
    same = [FitRow(r.prompt, r.image_path, r.action, w) for r, w in zip(rows, (1.0, 3.0, 2.0), strict=True)]
    with torch.no_grad():
        assert float(_loss(policy, rows, shots)) == pytest.approx(float(_loss(policy, same, shots)), rel=1e-6)
