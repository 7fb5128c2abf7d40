"""The critic: double Q(s, a) and double V(s) heads over frozen VLM features and the texts, with target copies.

Q reads the state's features and the (state, action) representation (of
the same size, or ``action_dim``); V reads the state's features. Both may
end with text features of the goal and the actions (``text``): as released
Digi-Q reads them, through text towers trained with the heads
(``towers``; :mod:`digiq.models.critic_text`), or frozen averages computed
once (:mod:`digiq.models.critic_inputs`). The heads are small MLPs; with
towers, most of a TD step is the towers'.

A critic with towers reads its texts as rows of a table (``texts.json`` of
the critic_inputs stage; :meth:`Critic.read_texts`), and :meth:`Critic.inputs`
appends the towers' encodings to the VLM's features as the frozen averages
are appended.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import nn
from transformers import PreTrainedTokenizerBase, T5Config

from digiq.config import TWIN_HEADS
from digiq.data.features import critic_inputs, load_text_rows
from digiq.io import require
from digiq.models.checkpoint import load_weights, read_meta, read_tokenizer, read_typed_config, save_checkpoint
from digiq.models.critic_text import TextTable, TextTowers, encoder_stack, vocabulary_digest
from digiq.models.policy import AutoUIPolicy
from digiq.paths import Paths

__all__ = ["CriticNetConfig", "TextStart", "tower_fields", "Critic", "mlp", "same_candidates", "pair_mlp",
           "load_critics", "per_task_set", "critic_scores", "inputs_for", "trained_inputs"]  # fmt: skip

# The text rows a critic with towers reads (digiq.data.features.TEXT_ROWS).
ROW_KEYS = ("goal_row", "before_rows", "taken_rows", "action_rows")
# Whose type and typed text each input of the heads reads: a state's previous action's, s' 's (the action taken),
# the action taken's, each candidate's.
ACTION_ROWS = {"state": "before_rows", "next_state": "taken_rows", "action": "taken_rows", "candidates": "action_rows"}
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
    # Whether the text features are the critic's own towers' (critic.text_encoder "trained"), copies of the base
    # policy's T5 encoder: their shape, the longest text they read in tokens, and their tokenizer's vocabulary
    # (vocabulary_digest). Without towers the inputs carry frozen averages instead.
    towers: bool = False
    text_d_model: int = 0
    text_d_ff: int = 0
    text_d_kv: int = 0
    text_heads: int = 0
    text_layers: int = 0
    text_vocab: int = 0
    text_tokens: int = 0
    vocab_digest: str = ""

    def __post_init__(self) -> None:
        if self.twin not in TWIN_HEADS:
            raise ValueError(f"twin must be one of {list(TWIN_HEADS)}, got {self.twin!r}")
        if self.towers and not (self.text and self.text_d_model > 0 and self.text_tokens > 0 and self.vocab_digest):
            raise ValueError("towers need text, their T5 shape, text_tokens and the vocabulary's digest")

    def tower_shape(self, tokenizer: PreTrainedTokenizerBase) -> T5Config:
        """The towers' T5 encoder configuration."""
        return T5Config(vocab_size=self.text_vocab, d_model=self.text_d_model, d_ff=self.text_d_ff,
                        d_kv=self.text_d_kv, num_heads=self.text_heads, num_layers=self.text_layers,
                        feed_forward_proj="gated-gelu", dropout_rate=0.0,
                        pad_token_id=tokenizer.pad_token_id)  # fmt: skip


class TextStart(NamedTuple):
    """What a new critic's towers start from: the base policy (its T5 encoder and tokenizer) and the texts its
    inputs' rows point at (the critic_inputs stage's ``texts.json``)."""

    policy: AutoUIPolicy
    texts: Sequence[str]

    @classmethod
    def of(cls, paths: Paths, device: str = "cpu") -> "TextStart":
        """The pipeline's: its base policy (stage 00) and the critic_inputs stage's texts."""
        require("critic", paths.base_policy / "config.json")
        return cls(AutoUIPolicy.load(paths.base_policy, device=device), load_text_rows(paths)[0])


def tower_fields(policy: AutoUIPolicy, text_tokens: int) -> dict[str, object]:
    """:class:`CriticNetConfig`'s tower fields for towers copied from ``policy``'s T5 encoder."""
    pc = policy.cfg
    return {"towers": True, "text_d_model": pc.d_model, "text_d_ff": pc.d_ff, "text_d_kv": pc.d_kv,
            "text_heads": pc.num_heads, "text_layers": pc.num_layers,
            "text_vocab": policy.t5.shared.num_embeddings, "text_tokens": text_tokens,
            "vocab_digest": vocabulary_digest(policy.tokenizer)}  # fmt: skip


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
    """The twin Q and V heads, and with ``cfg.towers`` the text towers they read (:class:`TextTowers`) with their
    tokenizer."""

    def __init__(self, cfg: CriticNetConfig, towers: TextTowers | None = None,
                 tokenizer: PreTrainedTokenizerBase | None = None) -> None:  # fmt: skip
        super().__init__()
        if cfg.towers != (towers is not None) or (towers is not None and tokenizer is None):
            raise ValueError("a critic has text towers and their tokenizer exactly when its config says towers")
        self.cfg = cfg
        q_in = cfg.feature_dim + (cfg.action_dim or cfg.feature_dim)
        self.q1, self.q2 = mlp(q_in, cfg.hidden), mlp(q_in, cfg.hidden)
        self.v1, self.v2 = mlp(cfg.feature_dim, cfg.hidden), mlp(cfg.feature_dim, cfg.hidden)
        self.towers, self.tokenizer = towers, tokenizer
        self.table: TextTable | None = None  # the texts the rows of its inputs point at (read_texts)
        self._encoded: dict[str, torch.Tensor] | None = None  # every text through the towers, for scoring

    @classmethod
    def with_towers(cls, cfg: CriticNetConfig, policy: AutoUIPolicy) -> "Critic":
        """A critic whose towers start as copies of ``policy``'s T5 encoder (``cfg``: :func:`tower_fields`')."""
        return cls(cfg, TextTowers(policy.t5.encoder, policy.cfg.d_model), policy.tokenizer)

    def read_texts(self, texts: Sequence[str]) -> "Critic":
        """Tokenize the texts its inputs' rows point at (a no-op without towers); returns the critic."""
        if self.tokenizer is not None:
            self.table = TextTable.of(texts, self.tokenizer, self.cfg.text_tokens)
            self._encoded = None
        return self

    def train(self, mode: bool = True) -> "Critic":
        self._encoded = None  # trained towers encode differently
        return super().train(mode)

    def inputs(self, batch: Mapping[str, torch.Tensor], keys: Sequence[str],
               encoded: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
        """``batch``'s ``keys`` ("state", "next_state", "action", "candidates") as the heads read them.

        Without towers, ``batch``'s own arrays. With them, ``batch`` holds the
        VLM's features (the candidates' with their extra inputs) and the text
        rows (``goal_row``, ``before_rows``, ``taken_rows``, ``action_rows``;
        :data:`~digiq.data.features.TEXT_ROWS`), and the towers' encodings
        follow them: a state's goal and previous action's type and typed text
        (s' 's previous action is the one taken), an action's type and typed
        text. Each tower is called once over the distinct texts of every key,
        or with ``encoded`` they are read from :meth:`encode_texts`' table.
        """
        if self.towers is None:
            return {key: batch[key] for key in keys}
        if self.table is None:
            raise ValueError("the critic's towers read rows of a text table: call read_texts first")
        requests: dict[str, tuple[str, torch.Tensor]] = {}
        for key in keys:
            if key in ("state", "next_state"):
                requests["goal"] = ("goal", batch["goal_row"])
            rows = batch[ACTION_ROWS[key]]
            requests[f"{key} type"] = ("action_type", rows[..., 0])
            requests[f"{key} text"] = ("typed_text", rows[..., 1])
        if encoded is None:
            texts = self.towers.encode(self.table, requests)
        else:
            texts = {key: encoded[tower][rows.to(encoded[tower].device)] for key, (tower, rows) in requests.items()}
        out = {}
        for key in keys:
            own = (texts[f"{key} type"], texts[f"{key} text"])
            goal = (texts["goal"],) if key in ("state", "next_state") else ()
            out[key] = torch.cat([batch[key], *goal, *own], -1)
        return out

    def encode_texts(self) -> dict[str, torch.Tensor] | None:
        """Every text of its table through each tower once (kept until the critic trains again); None without
        towers."""
        if self.towers is None:
            return None
        if self.table is None:
            raise ValueError("the critic's towers read rows of a text table: call read_texts first")
        if self._encoded is None:
            self._encoded = self.towers.encode_all(self.table)
        return self._encoded

    def read(self, data: Mapping[str, np.ndarray], rows: np.ndarray, keys: Sequence[str]) -> dict[str, torch.Tensor]:
        """:meth:`inputs` of ``data``'s ``rows`` (numpy arrays, as :func:`inputs_for` gives them) on the critic's
        device, the texts read from :meth:`encode_texts`."""
        device = next(self.parameters()).device
        batch = {k: torch.from_numpy(np.asarray(data[k])[rows]).to(device) for k in (*keys, *ROW_KEYS) if k in data}
        return self.inputs(batch, keys, self.encode_texts())

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
        """A frozen copy: the TD targets are the same function of the inputs all along."""
        t = copy.deepcopy(self, {id(self.table): self.table, id(self.tokenizer): self.tokenizer})  # those shared
        t.requires_grad_(False)
        return t.eval()

    @torch.no_grad()
    def soft_update(self, source: "Critic", tau: float) -> None:
        for p, s in zip(self.parameters(), source.parameters(), strict=True):
            p.mul_(1 - tau).add_(s, alpha=tau)

    def save(self, folder: Path | str, **meta: object) -> None:
        """Weights, config (the towers' shape among it) and, with towers, their tokenizer."""
        save_checkpoint(folder, self, "critic", self.cfg, tokenizer=self.tokenizer, **meta)

    @classmethod
    def load(cls, folder: Path | str) -> "Critic":
        """A critic :meth:`save` wrote. One whose towers' weights are missing, or whose saved tokenizer is not of the
        vocabulary its towers were trained with, is refused naming the file."""
        cfg = read_typed_config(folder, "critic", CriticNetConfig)
        towers = tokenizer = None
        if cfg.towers:
            tokenizer = read_tokenizer(folder)
            if vocabulary_digest(tokenizer) != cfg.vocab_digest:
                raise ValueError(f"critic checkpoint {folder}: its tokenizer ({Path(folder) / 'tokenizer'}) is not "
                                 "of the vocabulary its text towers were trained with; copy the checkpoint whole, "
                                 "or rerun the critic stage")  # fmt: skip
            towers = TextTowers(encoder_stack(cfg.tower_shape(tokenizer)), cfg.text_d_model)
        critic = cls(cfg, towers, tokenizer)
        load_weights(folder, critic)
        return critic.eval()


def load_critics(paths: Paths, seed: int, row: str, task_sets: Sequence[str]) -> dict[str, Critic]:
    """``row``'s stage-06 critics of one seed, one per task set of ``task_sets`` (those the data hold), each with
    the critic_inputs stage's texts where it has towers (:meth:`Critic.read_texts`)."""
    critics = {ts: Critic.load(paths.critic(seed, row, ts)) for ts in task_sets}
    if any(c.cfg.towers for c in critics.values()):
        texts = load_text_rows(paths)[0]
        for critic in critics.values():
            critic.read_texts(texts)
    return critics


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

    def q_and_v(critic: Critic, rows: np.ndarray) -> np.ndarray:
        x = critic.read(data, rows, ("state", "candidates"))
        q, v, _ = critic.advantage(x["state"], x["candidates"])
        return torch.cat([q, v[:, None]], 1).cpu().numpy()

    both = per_task_set(task_sets, critics, q_and_v)
    return {"q": both[:, :-1], "v": both[:, -1]}


def inputs_for(paths: Paths, vlm: str, net: CriticNetConfig) -> dict[str, np.ndarray]:
    """:func:`~digiq.data.features.critic_inputs` as a trained critic's config says it was trained (stage 07, the
    Q/V viewer)."""
    return critic_inputs(paths, vlm, text=net.text, towers=net.towers, targets=net.targets, typed=net.typed,
                         entries=net.entries)  # fmt: skip


def trained_inputs(paths: Paths, rows: Sequence[str], frozen_text: bool = False) -> dict[str, dict[str, np.ndarray]]:
    """Each stage-06 row's critic inputs, as its seed-0 checkpoints say they were trained (every task set's critic
    of a row reads the same inputs); built once per distinct set. With ``frozen_text``, a critic with towers is given
    the frozen averages in their place: what a probe of the critic's inputs fits on.

    Rows whose critics read the same VLM's features with the same options
    share one build (the paper's row and its ablations over N, for instance).
    """
    built: dict[tuple[str, CriticNetConfig], dict[str, np.ndarray]] = {}
    out: dict[str, dict[str, np.ndarray]] = {}
    for row in rows:
        first = next(p for p in sorted((paths.critics / "seed0" / row).iterdir()) if p.is_dir())
        net = read_typed_config(first, "critic", CriticNetConfig)
        key = (str(read_meta(first).get("vlm", "finetuned")), replace(net, towers=False) if frozen_text else net)
        if key not in built:
            built[key] = inputs_for(paths, *key)
        out[row] = built[key]
    return out
