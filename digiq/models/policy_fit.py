"""Fit the policy by (weighted) negative log-likelihood of chosen actions.

One loop serves the base policy's SFT on demonstrations (stage 00) and the
actors of stage 07 (Best-of-N picks, Filtered BC, offline DigiRL): they
differ only in which (state, action, weight) rows they hand in.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from digiq import parallel
from digiq.data.trajectories import TrajectoryStore
from digiq.models.policy import AutoUIPolicy
from digiq.progress import progress

__all__ = ["FitRow", "ImitationLoss", "load_screens", "fit_policy", "demo_rows"]


@dataclass(frozen=True)
class FitRow:
    prompt: str
    image_path: str
    action: str
    weight: float = 1.0


@dataclass(frozen=True)
class ImitationLoss:
    """How a fit scores its rows: the mean of an action's token log-probabilities or (``per_token`` false) their
    sum; each token's probability clamped to ``clamp`` (low, high) or not; dropout on while fitting or not. The
    defaults are this repository's SFT; released Digi-Q's actor sums, clamps to [0.001, 0.99] and never turns
    dropout on."""

    per_token: bool = True
    clamp: tuple[float, float] | None = None
    dropout: bool = True


def load_screens(
    model: AutoUIPolicy, store: TrajectoryStore, paths: Sequence[str], chunk: int = 64
) -> dict[str, torch.Tensor]:
    """Screenshots at the model's input size, loaded once (full-size frames would not fit in memory).

    Resized ``chunk`` at a time: one resize per image leaves the allocator
    with thousands of odd-sized holes and the process several GB larger.
    """
    names = sorted(set(paths))
    out: dict[str, torch.Tensor] = {}
    for i in progress(range(0, len(names), chunk), desc="load screenshots"):
        batch = names[i : i + chunk]
        small = model.screen.prepare(store.load_images(batch))
        out.update(zip(batch, small, strict=True))
    return out


def fit_policy(
    model: AutoUIPolicy,
    rows: Sequence[FitRow],
    screens: dict[str, torch.Tensor],
    *,
    epochs: int | None = None,
    updates: int | None = None,
    batch_size: int,
    lr: float,
    seed: int,
    weight_decay: float = 0.01,
    grad_clip: float = 1.0,
    one_cycle: bool = True,
    draws_from: int | None = None,
    loss: ImitationLoss = ImitationLoss(),
    desc: str = "fit policy",
) -> list[dict[str, float]]:
    """Train in place for ``epochs`` passes over ``rows`` or ``updates`` optimizer steps; returns the loss curve.

    AdamW with ``weight_decay`` (0: Adam), the gradient's norm clipped at
    ``grad_clip``, the learning rate on a one-cycle schedule peaking at
    ``lr`` or, without ``one_cycle``, constant.

    Batches: by default passes over ``rows``, reshuffled each time they run
    out. With ``draws_from``, every step instead draws ``batch_size`` of
    ``draws_from`` stored states uniformly with replacement, as released
    Digi-Q draws its actor's batches; ``rows`` are the first ``len(rows)``
    of them, one per state, and a drawn state past them (one the method
    kept nothing of) imitates nothing. A fixed number of ``updates`` gives
    every method the same training budget whatever the number of rows it
    keeps (stage 07).

    ``loss`` says how the rows are scored (:class:`ImitationLoss`: the mean
    or the sum over an action's tokens, a clamp of their probabilities,
    dropout on or off).

    Under ``accelerate launch`` each process takes its share of every batch
    and the gradients are averaged (:mod:`digiq.parallel`): the same steps
    as one process on the whole batch. The curve has one point per
    optimizer step; a step that drew no row has loss 0 and leaves the
    weights as they are.
    """
    if not rows:
        raise ValueError(f"{desc}: no training rows")
    if (epochs is None) == (updates is None):
        raise ValueError(f"{desc}: give epochs or updates, not {'both' if epochs is not None else 'neither'}")
    if draws_from is not None and (updates is None or draws_from < len(rows)):
        raise ValueError(f"{desc}: drawing from {draws_from} states needs updates and at least one state per row "
                         f"({len(rows)} rows)")  # fmt: skip
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model.to(parallel.device())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    total = updates if updates is not None else epochs * ((len(rows) + batch_size - 1) // batch_size)
    sched = None
    if one_cycle:
        # torch's OneCycleLR divides by warm-up share x steps - 1, which is 0 for a fit of exactly 10 steps at 0.1.
        warm_up = 0.1 if total != 10 else 0.15
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=total, pct_start=warm_up)
    curve: list[dict[str, float]] = []
    model.train(loss.dropout)
    bar = progress(total=total, desc=desc)
    for epoch, batch in _batches(rows, batch_size, total, rng, draws_from):
        value = 0.0
        if batch:
            opt.zero_grad()
            value = parallel.backward_share(batch, lambda mine: {"loss": _loss(model, mine, screens, loss)},
                                            model.parameters(), weights=[r.weight for r in batch])["loss"]  # fmt: skip
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            opt.step()
        if sched is not None:
            sched.step()
        curve.append({"step": len(curve), "epoch": epoch, "loss": value})
        bar.update(1)
        bar.set_postfix(loss=f"{value:.3f}")
    bar.close()
    model.eval()
    return curve


def _batches(rows: Sequence[FitRow], batch_size: int, total: int, rng: random.Random,
             draws_from: int | None) -> Iterator[tuple[int, list[FitRow]]]:  # fmt: skip
    """``total`` batches of ``rows`` with their epoch: passes over the reshuffled rows, or, with ``draws_from``,
    ``batch_size`` states drawn uniformly with replacement, those past ``rows`` left out (:func:`fit_policy`)."""
    if draws_from is not None:
        for _ in range(total):
            drawn = [rng.randrange(draws_from) for _ in range(batch_size)]
            yield 0, [rows[i] for i in drawn if i < len(rows)]
        return
    order = list(range(len(rows)))
    done, epoch = 0, 0
    while done < total:
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            if done == total:
                return
            yield epoch, [rows[i] for i in order[start : start + batch_size]]
            done += 1
        epoch += 1


def _loss(model: AutoUIPolicy, rows: Sequence[FitRow], screens: dict[str, torch.Tensor],
          loss: ImitationLoss = ImitationLoss()) -> torch.Tensor:  # fmt: skip
    """The weighted NLL of ``rows`` (preloaded screens).

    The loss is normalised by the weights' sum, so only their ratios count; they are scaled to a largest of 1 in
    double precision first, so that AWR's exp(A / beta) at a small beta, tiny for every row, keeps its ratios.
    """
    images = torch.stack([screens[r.image_path] for r in rows])
    weights = torch.tensor([r.weight for r in rows], dtype=torch.float64)
    weights = (weights / weights.abs().max().clamp(min=1e-300)).to(torch.float32).to(model.device)
    return model.loss([r.prompt for r in rows], images, [r.action for r in rows], weights,
                      per_token=loss.per_token, clamp=loss.clamp)  # fmt: skip


def demo_rows(store: TrajectoryStore) -> list[FitRow]:
    """Every stored step as an imitation row (for SFT on demonstrations)."""
    t = store.read().to_pandas()
    return [FitRow(r.observation, r.image_path, r.action) for r in t.itertuples()]
