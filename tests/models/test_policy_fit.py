"""Fitting the policy to rows (SFT and every actor), and its checkpoints."""

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers.modeling_outputs import BaseModelOutput

from digiq import parallel
from digiq.env.actions import format_action, press_enter, type_text
from digiq.models.policy import AutoUIPolicy, PolicyConfig
from digiq.models.policy_fit import FitRow, ImitationLoss, fit_policy
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
        logp, tokens = policy._summed_logprobs(prompts, images, actions, group=32)
        per_row = -logp / tokens.clamp(min=1)
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


def whole_batch_loss(model: AutoUIPolicy, prompts: list[str], images: torch.Tensor, actions: list[str],
                     weights: torch.Tensor | None = None, per_token: bool = True,
                     clamp: tuple[float, float] | None = None) -> torch.Tensor:  # fmt: skip
    """The loss as one forward pass computed it: the whole batch padded to its longest prompt and action, the
    next-token distribution over the whole vocabulary at every position, the targets' log-probabilities read off it
    (the mean over an action's tokens, unclamped: the default loss)."""
    assert per_token and clamp is None
    enc = model.encode(prompts, images)
    labels = model._labels(actions)
    pad = model.tokenizer.pad_token_id
    written = F.pad(model.t5._shift_right(labels.masked_fill(labels == -100, pad)), (1, 0), value=pad)
    out = model.t5(encoder_outputs=BaseModelOutput(last_hidden_state=enc["states"]), attention_mask=enc["mask"],
                   decoder_input_ids=written[:, 1:], output_hidden_states=True)  # fmt: skip
    probs = model._next_token_probs(enc, out.logits, out.decoder_hidden_states[-1], written)
    logp = torch.log(probs.clamp_min(1e-12)).gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    keep = labels != -100
    per_row = -(logp * keep).sum(-1) / keep.sum(-1).clamp(min=1)
    if weights is None:
        return per_row.mean()
    return (per_row * weights).sum() / weights.abs().sum().clamp(min=1e-8)


def _uneven_rows(n: int) -> tuple[list[str], torch.Tensor, list[str]]:
    """Rows whose prompts (the actions before) and actions (typed words) differ in length, as real ones do."""
    rng = random.Random(0)
    words = ["jazz", "the news in Peru", "a cheap pair of running shoes", "7am", "clock"]
    prompts = [f"Previous Actions: {' PRESS_BACK' * rng.randrange(8)} Goal: search for {rng.choice(words)}"
               for _ in range(n)]  # fmt: skip
    actions = [format_action(type_text(rng.choice(words))) if i % 3 else format_action(press_enter()) for i in range(n)]
    images = torch.randint(0, 256, (n, 114, 54, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    return prompts, images, actions


@pytest.mark.parametrize("copy", [True, False])
def test_the_loss_in_groups_of_like_length_and_its_gradients_are_the_whole_batchs(copy):
    """Dropout off, the loss of rows taken in groups, each reading its targets' probabilities only, is the whole
    batch's full-vocabulary loss, and so are its gradients, up to float rounding."""
    tok = train_tokenizer(default_corpus(n_tasks=20, seed=0), vocab_size=300)
    torch.manual_seed(0)
    policy = AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, d_kv=8, image_dim=32, dropout=0.0, copy=copy), tok)
    prompts, images, actions = _uneven_rows(13)
    weights = torch.tensor([1.0, -2.0, 0.5, 3.0, 1.0, -0.25, 2.0, 1.0, 1.0, 0.75, -1.0, 1.5, 1.0])
    results = []
    for loss in (lambda: whole_batch_loss(policy, prompts, images, actions, weights),
                 lambda: policy.loss(prompts, images, actions, weights, group=4)):  # fmt: skip
        policy.zero_grad()
        value = loss()
        value.backward()
        results.append((value.detach(), [p.grad.clone() for p in policy.parameters() if p.grad is not None]))
    (want, want_grads), (got, got_grads) = results
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    assert len(got_grads) == len(want_grads) > 10
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def test_a_batch_goes_through_the_model_in_groups_of_like_length():
    """By default 32 rows at a time, each group padded to its own longest prompt: the encoder sees far fewer tokens
    than the batch padded to its longest, and every row once."""
    policy = _tiny_policy()
    prompts, images, actions = _uneven_rows(64)
    seen: list[torch.Tensor] = []
    policy.t5.encoder.register_forward_hook(lambda module, args, kwargs, out: seen.append(kwargs["input_ids"]),
                                            with_kwargs=True)  # fmt: skip
    with torch.no_grad():
        policy.loss(prompts, images, actions)
    lengths = sorted(len(ids) for ids in policy.tokenizer(prompts).input_ids)
    assert [ids.shape for ids in seen] == [(32, lengths[31]), (32, lengths[63])]
    assert sum(ids.numel() for ids in seen) < 0.85 * 64 * lengths[-1]


def test_each_step_fits_the_batch_it_drew_whole():
    """The groups change the order of rows inside a step, not which rows a step fits: each optimizer step's rows
    are the batch drawn for it, every row once."""
    from digiq.models.policy_fit import _batches

    policy = _tiny_policy()
    prompts, images, actions = _uneven_rows(13)
    shots = {f"s{i}": images[i] for i in range(13)}
    fit = [FitRow(prompts[i], f"s{i}", actions[i]) for i in range(13)]
    steps: list[list[list[int]]] = [[]]
    policy.t5.encoder.register_forward_hook(lambda module, args, kwargs, out: steps[-1].extend(
        ids[mask.bool()].tolist() for ids, mask in zip(kwargs["input_ids"], kwargs["attention_mask"], strict=True)
    ), with_kwargs=True)  # fmt: skip
    real_step = torch.optim.AdamW.step

    def step_then_next(self, *args, **kwargs):
        steps.append([])
        return real_step(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.optim.AdamW, "step", step_then_next)
        fit_policy(policy, fit, shots, updates=5, batch_size=6, lr=1e-3, seed=3)
    drawn = [batch for _, batch in _batches(fit, 6, 5, random.Random(3), None)]
    ids = policy.tokenizer([r.prompt for r in fit], truncation=True, max_length=policy.cfg.max_input_tokens).input_ids
    by_prompt = {r.prompt: tuple(row) for r, row in zip(fit, ids, strict=True)}
    assert len(steps) == 6 and steps[-1] == []
    for rows, batch in zip(steps, drawn, strict=False):
        assert sorted(map(tuple, rows)) == sorted(by_prompt[r.prompt] for r in batch)


def test_with_dropout_the_fits_end_as_the_whole_batch_fits_end():
    """Dropout draws its masks per group, so the curves differ step by step; over seeds, the loss a fit ends at is
    the whole-batch loss's, within the spread of the seeds."""
    prompts, images, actions = _uneven_rows(24)
    shots = {f"s{i}": images[i] for i in range(24)}
    fit = [FitRow(prompts[i], f"s{i}", actions[i]) for i in range(24)]
    tok = train_tokenizer(default_corpus(n_tasks=20, seed=0), vocab_size=300)
    starts, ends = [], {"whole": [], "groups": []}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a fit's worker process runs
    try:
        for seed in range(8):
            for name in ends:
                torch.manual_seed(seed)
                policy = AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, d_kv=8, image_dim=32, dropout=0.1), tok)
                with pytest.MonkeyPatch.context() as patch:
                    if name == "whole":
                        patch.setattr(AutoUIPolicy, "loss", whole_batch_loss)
                    curve = fit_policy(policy, fit, shots, updates=12, batch_size=12, lr=3e-3, seed=seed)
                starts.append(curve[0]["loss"])
                ends[name].append(float(np.mean([p["loss"] for p in curve[-4:]])))
    finally:
        torch.set_num_threads(threads)
    diff = np.array(ends["groups"]) - np.array(ends["whole"])
    assert (diff != 0).all()  # the dropout masks differ
    assert abs(diff.mean()) < 3 * diff.std(ddof=1) / np.sqrt(len(diff)), ends
    assert np.mean(list(ends.values())) < 0.8 * np.mean(starts)  # the fits learn


def test_the_released_loss_sums_an_action_s_tokens_and_clamps_their_probabilities():
    """Released Digi-Q's actor: -sum of an action's token log-probabilities, each probability in [0.001, 0.99]; a
    token beyond the clamp gives no gradient."""
    policy = _tiny_policy()
    prompts, images, actions = _rows(3)
    logp, tokens = policy._summed_logprobs(prompts, images, actions, group=32)
    summed = policy.loss(prompts, images, actions, per_token=False)
    assert float(summed.detach()) == pytest.approx(float(-logp.detach().mean()), rel=1e-6)
    assert float(policy.loss(prompts, images, actions).detach()) == pytest.approx(
        float((-logp / tokens).detach().mean()), rel=1e-6
    )
    # A clamp every untrained token's probability lies outside (all below 0.5): every one held at log(0.5).
    clamped = policy.loss(prompts, images, actions, per_token=False, clamp=(0.5, 0.9))
    assert float(clamped.detach()) == pytest.approx(float(-(tokens * np.log(0.5)).float().mean()), rel=1e-6)
    policy.zero_grad()
    clamped.backward()
    assert all(p.grad is None or not p.grad.any() for p in policy.parameters())
    policy.zero_grad()
    policy.loss(prompts, images, actions, per_token=False, clamp=(1e-9, 0.999999)).backward()
    assert any(p.grad is not None and p.grad.any() for p in policy.parameters())


def test_a_fit_without_dropout_keeps_the_model_as_at_inference(monkeypatch):
    """As released Digi-Q's actor never enters train mode: dropout off during the fit."""
    policy = AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, d_kv=8, image_dim=32, dropout=0.3),
                          train_tokenizer(default_corpus(n_tasks=20, seed=0), vocab_size=300))  # fmt: skip
    shots = {"s": torch.zeros(114, 54, 3, dtype=torch.uint8)}
    fit = [FitRow(f"Goal: open app {i}", "s", format_action(press_enter())) for i in range(4)]
    modes: list[bool] = []
    real = AutoUIPolicy.loss
    monkeypatch.setattr(AutoUIPolicy, "loss", lambda self, *a, **k: modes.append(self.training) or real(self, *a, **k))
    fit_policy(policy, fit, shots, updates=2, batch_size=2, lr=1e-3, seed=0, loss=ImitationLoss(dropout=False))
    fit_policy(policy, fit, shots, updates=2, batch_size=2, lr=1e-3, seed=0)
    assert modes == [False, False, True, True] and not policy.training
