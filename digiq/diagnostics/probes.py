"""Learned probes: what the critic's inputs allow, fit to the answers a critic never sees.

:func:`feature_probe` regresses the true values on the critic's inputs and
:func:`expert_probe` ranks candidates by the expert's choices; both are
cross-fitted, so their scores on a state come from a model that did not see
it. A probe far above the critic says its inputs hold what TD does not get out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from digiq.models.critic import mlp, pair_mlp, same_candidates

__all__ = ["within_state_share", "feature_probe", "expert_probe", "expert_probe_half"]


def within_state_share(candidates: np.ndarray, parts: Sequence[str]) -> dict[str, float]:
    """Per named equal slice of the features (S, N, D): the share of its variance between a state's candidates.

    Near 0, the representation hardly changes with the action: every
    candidate of a state looks alike to the critic, whatever it learns.
    """
    out = {}
    for name, x in zip(parts, np.split(np.asarray(candidates, np.float64), len(parts), axis=-1), strict=True):
        total = x.reshape(-1, x.shape[-1]).var(0).sum()
        out[name] = round(float(x.var(1).sum(-1).mean() / total), 4) if total > 0 else 0.0
    return out


def feature_probe(state: np.ndarray, candidates: np.ndarray, oracle: np.ndarray, valid: np.ndarray, *, seed: int,
                  hidden: int = 256, steps: int = 400) -> np.ndarray:  # fmt: skip
    """Scores (S, N) from the critic's inputs, fit to the oracle values themselves, cross-fitted over two halves.

    An MLP shaped like a Q head regresses each candidate's oracle value minus
    its state's mean (the part a ranking needs) from (state, candidate)
    features, and scores the states it was not fit on. It has what no critic
    has, the true values, so its ranking bounds what a critic on these
    features could learn from this many states: at random level, the cause
    is the representation, not TD learning.
    """
    g = torch.Generator().manual_seed(seed)
    s, c = torch.as_tensor(np.asarray(state)), torch.as_tensor(np.asarray(candidates))
    x = torch.cat([s[:, None].expand(-1, c.shape[1], -1), c], -1)
    w = torch.as_tensor(valid, dtype=torch.float32)
    y = torch.as_tensor(oracle, dtype=torch.float32)
    y = y - (y * w).sum(1, keepdim=True) / w.sum(1, keepdim=True).clamp(min=1)
    half = torch.randperm(len(x), generator=g) < len(x) // 2
    scores = np.zeros(oracle.shape, np.float32)
    for fit in (half, ~half):
        torch.manual_seed(seed)
        net = mlp(x.shape[-1], hidden)
        opt = torch.optim.AdamW(net.parameters(), lr=3e-4, weight_decay=1e-2)
        for _ in range(steps):
            loss = (((net(x[fit])[..., 0] - y[fit]) ** 2) * w[fit]).sum() / w[fit].sum().clamp(min=1)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            scores[(~fit).numpy()] = net(x[~fit])[..., 0].numpy()
    return scores


def expert_probe(state: np.ndarray, candidates: np.ndarray, right: np.ndarray, valid: np.ndarray,
                 episodes: np.ndarray, *, seed: int, hidden: int | None = 256, epochs: int = 40) -> np.ndarray:  # fmt: skip
    """Scores (S, N) from the critic's inputs, fit to the expert's choices, cross-fitted over two halves of episodes.

    An MLP shaped like a Q head, or with ``hidden`` None a linear scorer
    (layer norm, then one linear map): what a linear read of the critic's
    inputs gets, beside what a network as big as the critic's gets.

    Where :func:`feature_probe` has the true values of a few hundred sampled
    states, this ranker has the expert's verdict (``right``, from
    :func:`expert_equivalent`) at every stored state whose valid candidates
    include both right and wrong ones: a softmax over each such state's valid
    candidates, pulled towards its right ones, by an MLP shaped like a Q head.
    Each state is scored by the half fitted on the other episodes
    (``episodes``: its trajectory id), so a pick is never one it was shown.
    It has a signal no critic has, a label on every candidate, where TD
    learns from the one action each state took and the return the base got
    after it. A probe far above the critic says the inputs carry what the
    ranking needs, and what the critic lacks is the signal; a probe near
    random says the representation is the limit. Torch's global generator is
    left as it was: the stage trains its actors after this.

    The two fits are :func:`expert_probe_half`'s, which a stage runs as separate jobs.
    """
    scores = np.zeros(np.shape(valid), np.float32)
    for half in (0, 1):
        rows, half_scores = expert_probe_half(state, candidates, right, valid, episodes, half=half, seed=seed,
                                              hidden=hidden, epochs=epochs)  # fmt: skip
        scores[rows] = half_scores
    return scores


def expert_probe_half(state: np.ndarray, candidates: np.ndarray, right: np.ndarray, valid: np.ndarray,
                      episodes: np.ndarray, *, half: int, seed: int, hidden: int | None = 256,
                      epochs: int = 40) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """One of :func:`expert_probe`'s two fits: the rows it scores (those of the other half's episodes) and their
    scores (rows, N).

    ``half`` 0 fits on the episodes drawn first, 1 on the rest. Both draw
    their batches from one stream seeded by ``seed``, as one after the other
    would: fit 1 first replays the draws of fit 0, which costs nothing to
    speak of, so the halves run apart (in two jobs) give what one run gives.
    The ranker reads each pair as :func:`~digiq.models.critic.pair_mlp` does
    (each state's distinct candidates, the state's share of the first layer
    once), the same function as on the concatenated rows up to float rounding.
    """
    if half not in (0, 1):
        raise ValueError(f"an expert probe has halves 0 and 1, got {half}")
    ok = torch.as_tensor(np.asarray(valid, bool))
    hit = torch.as_tensor(np.asarray(right, bool)) & ok
    informative = (hit.any(1) & (ok & ~hit).any(1)).numpy()
    s, c = torch.as_tensor(np.asarray(state)), torch.as_tensor(np.asarray(candidates))
    same = same_candidates(c)
    rng = np.random.default_rng(seed)
    ids = np.unique(episodes)
    first = np.isin(episodes, rng.permutation(ids)[: len(ids) // 2])
    if half == 1:  # the stream as fit 0 leaves it: one shuffle of its rows per epoch
        before = np.flatnonzero(first & informative)
        for _ in range(epochs if len(before) else 0):
            rng.permutation(before)
    fit = first if half == 0 else ~first

    def logits(net: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
        return pair_mlp(net, s[idx], c[idx], same[idx]).masked_fill(~ok[idx], -1e9)

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        d_in = s.shape[1] + c.shape[2]
        net = mlp(d_in, hidden) if hidden else nn.Sequential(nn.LayerNorm(d_in), nn.Linear(d_in, 1))
        # A linear map has one layer to move and no hidden units to saturate: it takes a larger step.
        opt = torch.optim.AdamW(net.parameters(), lr=3e-4 if hidden else 1e-2, weight_decay=1e-2)
        train = np.flatnonzero(fit & informative)
        for _ in range(epochs if len(train) else 0):
            for batch in np.array_split(rng.permutation(train), max(1, len(train) // 64)):
                idx = torch.as_tensor(batch)
                target = hit[idx].float() / hit[idx].sum(1, keepdim=True)
                loss = -(target * torch.log_softmax(logits(net, idx), 1)).sum(1).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        held = np.flatnonzero(~fit)
        with torch.no_grad():
            return held, logits(net, torch.as_tensor(held)).numpy()
