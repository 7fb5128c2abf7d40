"""Critic heads over frozen VLM features: double Q(s, a) and double V(s), with target copies.

Q reads the state's features and the (state, action) representation (of
the same size, or ``action_dim``); V reads the state's features. Both may
end with text features (``text``; :mod:`digiq.models.critic_inputs`). Both heads
are small MLPs, so TD learning over tens of thousands of transitions takes
seconds on a CPU.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from digiq.config import TWIN_HEADS
from digiq.data.features import critic_inputs
from digiq.models.checkpoint import load_weights, read_meta, read_typed_config, save_checkpoint
from digiq.paths import Paths

__all__ = ["CriticNetConfig", "Critic", "mlp", "same_candidates", "pair_mlp", "load_critics", "per_task_set",
           "critic_scores", "inputs_for", "trained_inputs"]  # fmt: skip

# States scored at once by Critic.advantage: each block's pairs are built and dropped before the next one's.
SCORE_BLOCK = 1024


@dataclass(frozen=True)
class CriticNetConfig:
    feature_dim: int  # the state's features
    hidden: int = 256
    # The (state, action) representation's size; 0 = feature_dim. Released Digi-Q data pairs 1408-d BLIP-2
    # state features with 4096-d LLaVA action representations.
    action_dim: int = 0
    # Whether the inputs end with text features of the goal and the actions (digiq.models.critic_inputs): whoever
    # scores with this critic must build its inputs the same way.
    text: bool = False
    # Whether the candidates' text features end with the label of the element each tap lands on
    # (critic.tap_targets; digiq.stages.critic_inputs.tapped).
    targets: bool = False
    # Whether they end with the typed text's match with the goal (critic.typed_match; critic_inputs.typed_match).
    typed: bool = False
    # Whether they end with which entry of a list a tap lands on (critic.list_entries; critic_inputs.entry_features).
    entries: bool = False
    # How the twin heads are joined (critic.twin_heads): "min", the pessimistic minimum everywhere, or "each",
    # released Digi-Q's: each head trained on its own target head, and the actor reading their maximum.
    twin: str = "min"

    def __post_init__(self) -> None:
        if self.twin not in TWIN_HEADS:
            raise ValueError(f"twin must be one of {list(TWIN_HEADS)}, got {self.twin!r}")


def mlp(d_in: int, hidden: int) -> nn.Sequential:
    """LayerNorm, two GELU layers of width ``hidden``, one output."""
    return nn.Sequential(nn.LayerNorm(d_in), nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                         nn.Linear(hidden, 1))  # fmt: skip


def same_candidates(candidates: torch.Tensor) -> torch.Tensor:
    """(S, N) long: for each candidate of each state (``candidates`` (S, N, D)), the first column of that state whose
    features are the very same (its own column where no earlier one is).

    Rows are matched by a random projection and confirmed element by element, so two candidates share a column
    only when every feature is equal. States are taken :data:`SCORE_BLOCK` at a time, so the rows compared stay few.
    """
    S, N, D = candidates.shape
    projection = torch.randn(D, 2, generator=torch.Generator().manual_seed(0), dtype=candidates.dtype)
    projection = projection.to(candidates.device)
    columns = torch.arange(N, device=candidates.device)
    out = torch.empty((S, N), dtype=torch.long, device=candidates.device)
    for start in range(0, S, SCORE_BLOCK):
        block = candidates[start : start + SCORE_BLOCK]
        B = len(block)
        rows = block.reshape(B * N, D)
        key = (rows @ projection).view(B, N, 2)
        first = (key[:, :, None] == key[:, None, :]).all(-1).to(torch.uint8).argmax(-1)  # argmax: the first match
        offset = torch.arange(B, device=rows.device)[:, None] * N
        flat = (offset + first).view(-1)
        repeated = torch.nonzero(first.view(-1) != columns.repeat(B)).squeeze(1)
        differs = (rows[repeated] != rows[flat[repeated]]).any(1)  # a coincidence of the projection, not a repeat
        flat[repeated[differs]] = repeated[differs]
        out[start : start + B] = flat.view(B, N) - offset
    return out


def pair_mlp(net: nn.Sequential, state: torch.Tensor, candidates: torch.Tensor,
             same: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """``net(cat(state, candidate))[..., 0]`` (B, N) for each state (B, Ds) and its candidates (B, N, Dc), up to
    float rounding, without building the B x N concatenated rows.

    ``net`` starts with a LayerNorm and a Linear (:func:`mlp`, or a linear scorer). Both are split between the
    state's columns and the candidate's: the normalisation's mean and variance are combined from each part's own
    (Chan et al.'s pairwise update, so nothing cancels), and the first layer's product with the state's centred
    features is taken once per state. Only each state's distinct candidates (``same``: :func:`same_candidates`,
    computed when not given) go through the layer's candidate part and the rest of ``net``; the repeats copy
    their values. Gradients flow as through ``net`` itself, so a ranker trains on it.

    Raises:
        ValueError: ``net`` does not start with a LayerNorm and a Linear, or the state's and the candidates'
            widths do not add up to its input.
    """
    norm, first = (net[0], net[1]) if len(net) >= 2 else (None, None)
    if not (isinstance(norm, nn.LayerNorm) and isinstance(first, nn.Linear) and norm.weight is not None
            and norm.bias is not None):  # fmt: skip
        raise ValueError(f"pair_mlp needs a net that starts with an affine LayerNorm and a Linear, got {net}")
    rest = net[2:]
    B, N, dc = candidates.shape
    ds = state.shape[-1]
    if state.shape != (B, ds) or ds + dc != first.in_features:
        raise ValueError(f"states {tuple(state.shape)} and candidates {tuple(candidates.shape)} do not make the "
                         f"{first.in_features}-wide rows the net reads")  # fmt: skip
    same = same_candidates(candidates) if same is None else same
    flat = (torch.arange(B, device=same.device)[:, None] * N + same).view(-1)
    distinct = flat[flat == torch.arange(B * N, device=same.device)]  # sorted: state, then column
    # Rows are picked by index_select throughout: its gradient sums in a fixed order, where indexing's may not.
    owner = distinct // N
    cand = candidates.reshape(B * N, dc).index_select(0, distinct)
    d = ds + dc
    # Each part's mean and sum of squared deviations, then the row's (the pairwise combination of the two).
    mean_s, mean_c = state.mean(1), cand.mean(1)
    centred_s, centred_c = state - mean_s[:, None], cand - mean_c[:, None]
    mean_own = mean_s.index_select(0, owner)
    mean = (ds * mean_own + dc * mean_c) / d
    shift = torch.stack([mean_own - mean, mean_c - mean], 1)  # (U, 2): each part's mean off the row's
    var = ((centred_s * centred_s).sum(1).index_select(0, owner) + (centred_c * centred_c).sum(1)
           + ds * shift[:, 0] ** 2 + dc * shift[:, 1] ** 2) / d  # fmt: skip
    # first(norm(x)) = rstd * (W * gamma)(x - mean) + W beta + b, with x - mean = each part centred plus its shift.
    w = first.weight * norm.weight
    w_s, w_c = w[:, :ds], w[:, ds:]
    h = torch.addmm((centred_s @ w_s.T).index_select(0, owner), shift, torch.stack([w_s.sum(1), w_c.sum(1)]))
    h = torch.addmm(h, centred_c, w_c.T)
    h = torch.addcmul(first.weight @ norm.bias + first.bias, h, torch.rsqrt(var + norm.eps)[:, None])
    out = rest(h)[:, 0]
    return out.index_select(0, torch.searchsorted(distinct, flat)).view(B, N)


class Critic(nn.Module):
    def __init__(self, cfg: CriticNetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        q_in = cfg.feature_dim + (cfg.action_dim or cfg.feature_dim)
        self.q1, self.q2 = mlp(q_in, cfg.hidden), mlp(q_in, cfg.hidden)
        self.v1, self.v2 = mlp(cfg.feature_dim, cfg.hidden), mlp(cfg.feature_dim, cfg.hidden)

    def q(self, state: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([state, action], -1)
        return self.q1(x)[..., 0], self.q2(x)[..., 0]

    def v(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.v1(state)[..., 0], self.v2(state)[..., 0]

    def joined(self, heads: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """One value from the twin heads' pair, as the actor reads it: their minimum, or with ``twin`` "each" their
        maximum (released Digi-Q's A = max(Q1, Q2) - max(V1, V2))."""
        return torch.minimum(*heads) if self.cfg.twin == "min" else torch.maximum(*heads)

    @torch.no_grad()
    def advantage(self, state: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q (B, N), V (B,) and A = Q - V for N candidate representations per state, the heads :meth:`joined`.

        Q is :meth:`q` of each (state, candidate) row up to float rounding, read by :func:`pair_mlp` a block of
        states at a time.
        """
        v = self.joined(self.v(state))
        q = state.new_empty(actions.shape[:2])
        for start in range(0, len(state), SCORE_BLOCK):
            s, a = state[start : start + SCORE_BLOCK], actions[start : start + SCORE_BLOCK]
            same = same_candidates(a)
            q[start : start + SCORE_BLOCK] = self.joined((pair_mlp(self.q1, s, a, same), pair_mlp(self.q2, s, a, same)))
        return q, v, q - v[:, None]

    def target(self) -> "Critic":
        t = copy.deepcopy(self)
        t.requires_grad_(False)
        return t

    @torch.no_grad()
    def soft_update(self, source: "Critic", tau: float) -> None:
        for p, s in zip(self.parameters(), source.parameters(), strict=True):
            p.mul_(1 - tau).add_(s, alpha=tau)

    def save(self, folder: Path | str, **meta: object) -> None:
        save_checkpoint(folder, self, "critic", self.cfg, **meta)

    @classmethod
    def load(cls, folder: Path | str) -> "Critic":
        critic = cls(read_typed_config(folder, "critic", CriticNetConfig))
        load_weights(folder, critic)
        return critic.eval()


def load_critics(paths: Paths, seed: int, row: str, task_sets: Sequence[str]) -> dict[str, Critic]:
    """``row``'s stage-06 critics of one seed, one per task set of ``task_sets`` (those the data hold)."""
    return {ts: Critic.load(paths.critic(seed, row, ts)) for ts in task_sets}


def per_task_set(task_sets: np.ndarray, critics: Mapping[str, Critic],
                 score: Callable[[Critic, np.ndarray], np.ndarray]) -> np.ndarray:  # fmt: skip
    """Each row scored by its own task set's critic: ``score(critic, rows)`` for the rows of each task set, in row order.

    Digi-Q trains one critic per task set, so a stored step of Web Shopping
    is only ever scored by the Web Shopping critic.
    """
    task_sets = np.asarray(task_sets)
    missing = sorted({str(ts) for ts in np.unique(task_sets)} - set(critics))
    if missing:
        raise ValueError(f"no critic for task set(s) {missing}; critics for {sorted(critics)}")
    out: np.ndarray | None = None
    for ts, critic in critics.items():
        rows = np.flatnonzero(task_sets == ts)
        if not len(rows):
            continue
        scored = np.asarray(score(critic, rows))
        if out is None:
            out = np.empty((len(task_sets), *scored.shape[1:]), scored.dtype)
        out[rows] = scored
    if out is None:
        raise ValueError("no rows to score")
    return out


def critic_scores(critics: Mapping[str, Critic], data: Mapping[str, np.ndarray],
                  task_sets: np.ndarray) -> dict[str, np.ndarray]:  # fmt: skip
    """``{"q": (S, N), "v": (S,)}``: :meth:`Critic.advantage`'s Q and V of every state's candidates in ``data``
    (critic inputs), each state scored by its own task set's critic (:func:`per_task_set`)."""
    state, candidates = np.asarray(data["state"]), np.asarray(data["candidates"])

    def q_and_v(critic: Critic, rows: np.ndarray) -> np.ndarray:
        q, v, _ = critic.advantage(torch.from_numpy(state[rows]), torch.from_numpy(candidates[rows]))
        return torch.cat([q, v[:, None]], 1).numpy()

    both = per_task_set(task_sets, critics, q_and_v)
    return {"q": both[:, :-1], "v": both[:, -1]}


def inputs_for(paths: Paths, vlm: str, net: CriticNetConfig) -> dict[str, np.ndarray]:
    """:func:`~digiq.data.features.critic_inputs` as a trained critic's config says it was trained (stage 07, the
    Q/V viewer)."""
    return critic_inputs(paths, vlm, text=net.text, targets=net.targets, typed=net.typed, entries=net.entries)


def trained_inputs(paths: Paths, rows: Sequence[str]) -> dict[str, dict[str, np.ndarray]]:
    """Each stage-06 row's critic inputs, as its seed-0 checkpoints say they were trained (every task set's critic
    of a row reads the same inputs); built once per distinct set.

    Rows whose critics read the same VLM's features with the same options
    share one build (the paper's row and its ablations over N, for instance).
    """
    built: dict[tuple[str, CriticNetConfig], dict[str, np.ndarray]] = {}
    out: dict[str, dict[str, np.ndarray]] = {}
    for row in rows:
        first = next(p for p in sorted((paths.critics / "seed0" / row).iterdir()) if p.is_dir())
        key = (str(read_meta(first).get("vlm", "finetuned")), Critic.load(first).cfg)
        if key not in built:
            built[key] = inputs_for(paths, *key)
        out[row] = built[key]
    return out
