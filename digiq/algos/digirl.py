"""DigiRL's learning rule: two success classifiers, the doubly-robust step advantage and two hard filters.

DigiRL (Bai et al., 2024) improves a policy from episodes whose only reward
is the outcome, 1 at the step that completes the instruction and 0 elsewhere:

- the **instruction-level value** V_inst(c) is the probability that an
  episode of instruction c succeeds: a classifier of the outcome on the
  instruction's features. An episode's ``r - V_inst(c)`` says how much it
  teaches: a success on an instruction that usually fails teaches most, a
  success on one that always succeeds teaches nothing. Ranking episodes by
  it and replaying the top share is DigiRL's automatic curriculum;
- the **step-level value** V_step(s, c) is the probability that the episode
  succeeds from state s: a classifier of the outcome on the state's
  features, trained on s and on the next state with the same label. Two
  heads are trained and the smaller read, DigiRL's guard against
  overestimation;
- the **step advantage** mixes the trajectory's outcome with a one-step
  value difference (:func:`step_advantages`): at step h of an episode of
  T steps with outcome r,
  ``A_h = w_h + (1 - w_h) (r_h + V(s_{h+1}) - V(s_h))`` with
  ``w_h = lam ** (T - 1 - h) * r``. Near the end of a success the outcome
  dominates; early on, and all through a failure, the value difference
  does. Steps with ``A_h > 1 / H`` (H the task set's step limit) are kept,
  and the policy is fit to them by maximum likelihood (weight 0 or 1).

The paper's values are the defaults (``lam`` 0.5, the 1/H threshold, the
top tenth of episodes). The classifiers read frozen features; which ones is
the caller's choice (the online stage uses the base policy's own encoder, as
DigiRL reads the frozen BLIP-2 and RoBERTa features beside its policy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from digiq.config import DigiRLConfig
from digiq.data.picks import DIGIRL_STEP_FEATURES, Picks, read_stored, write_stored
from digiq.data.trajectories import TrajectoryStore
from digiq.env.tasks import MAX_STEPS
from digiq.io import atomic_path
from digiq.models.critic import mlp
from digiq.models.policy import AutoUIPolicy
from digiq.paths import Paths

__all__ = [
    "state_features",
    "instruction_features",
    "SuccessClassifier",
    "fit_success_classifier",
    "step_advantages",
    "trajectory_advantages",
    "keep_steps",
    "instruction_priorities",
    "curriculum",
    "DigiRLValues",
    "digirl_offline_picks",
    "digirl_steps",
    "StepFeatures",
    "store_steps",
    "step_features",
    "write_offline_step_features",
    "read_offline_step_features",
    "fit_and_select",
]


@torch.no_grad()
def state_features(policy: AutoUIPolicy, prompts: list[str], screenshots: np.ndarray, batch: int = 64) -> np.ndarray:
    """(B, d_model) float32: the policy's fused encoder states (prompt and screen) averaged over the prompt's tokens.

    What V_step reads. Take them from a frozen copy of the base policy, so
    that the features of a state do not drift as the policy learns.
    """
    out = []
    for i in range(0, len(prompts), batch):
        enc = policy.encode(prompts[i : i + batch], screenshots[i : i + batch])
        mask = enc["mask"][..., None].to(enc["states"].dtype)
        out.append(((enc["states"] * mask).sum(1) / mask.sum(1).clamp(min=1)).float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, policy.cfg.d_model), np.float32)


def instruction_features(policy: AutoUIPolicy, instructions: list[str]) -> np.ndarray:
    """(B, d_model) float32: the policy's text encoder on each instruction alone: what V_inst reads."""
    return policy.text_features(instructions).float().cpu().numpy()


class SuccessClassifier(nn.Module):
    """``heads`` MLP classifiers of success from the same features; the smallest probability is the value."""

    def __init__(self, feature_dim: int, hidden: int = 256, heads: int = 1) -> None:
        super().__init__()
        if heads < 1:
            raise ValueError(f"a success classifier needs at least one head, got heads={heads}")
        self.heads = nn.ModuleList(mlp(feature_dim, hidden) for _ in range(heads))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """(len(x), heads) logits of success."""
        return torch.cat([h(x) for h in self.heads], 1)

    @torch.no_grad()
    def value(self, x: np.ndarray | torch.Tensor, batch: int = 4096) -> np.ndarray:
        """P(success) of each row by the most pessimistic head, as float32."""
        x = torch.as_tensor(np.asarray(x, np.float32))
        out = [torch.sigmoid(self.logits(x[i : i + batch])).min(1).values for i in range(0, len(x), batch)]
        return torch.cat(out).numpy() if out else np.zeros(0, np.float32)


def fit_success_classifier(net: SuccessClassifier, x: np.ndarray, success: np.ndarray, *, updates: int, batch: int,
                           lr: float, seed: int) -> list[float]:  # fmt: skip
    """``updates`` AdamW steps of binary cross-entropy on minibatches drawn with replacement; the loss curve.

    Every head sees the same minibatch: they differ by their initialisation,
    as DigiRL's two heads do.
    """
    if len(x) != len(success):
        raise ValueError(f"{len(x)} feature rows for {len(success)} success labels")
    if len(x) == 0:
        raise ValueError("no rows to fit a success classifier on")
    xs = torch.as_tensor(np.asarray(x, np.float32))
    ys = torch.as_tensor(np.asarray(success, np.float32))
    opt = torch.optim.AdamW(net.parameters(), lr=lr)
    gen = np.random.default_rng(seed)
    curve = []
    net.train()
    for _ in range(updates):
        idx = torch.from_numpy(gen.integers(0, len(xs), batch))
        logits = net.logits(xs[idx])
        loss = F.binary_cross_entropy_with_logits(logits, ys[idx, None].expand_as(logits))
        opt.zero_grad()
        loss.backward()
        opt.step()
        curve.append(loss.item())
    net.eval()
    return curve


def _episode_starts(ids: np.ndarray) -> np.ndarray:
    """The row where each episode begins, in a step table sorted by episode."""
    return np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]]) if len(ids) else np.zeros(0, int)


def step_advantages(rewards: Sequence[float], v: Sequence[float], v_next: Sequence[float], lam: float) -> np.ndarray:
    """DigiRL's doubly-robust advantage of each step of one episode, in step order.

    ``rewards`` are the step rewards (the outcome is their sum: 1 for a
    success, 0 for a failure); ``v`` and ``v_next`` are V_step of each step's
    state and next state. See the module docstring for the formula.
    """
    r = np.asarray(rewards, np.float64)
    v, v_next = np.asarray(v, np.float64), np.asarray(v_next, np.float64)
    if not len(r) == len(v) == len(v_next):
        raise ValueError(f"one episode needs as many rewards ({len(r)}), values ({len(v)}) and next values "
                         f"({len(v_next)})")  # fmt: skip
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must lie in [0, 1], got {lam}")
    outcome = float(r.sum())
    if outcome not in (0.0, 1.0):
        raise ValueError(f"DigiRL's advantage needs an outcome reward of 0 or 1 per episode, got a sum of {outcome}")
    w = lam ** np.arange(len(r) - 1, -1, -1, dtype=np.float64) * outcome
    return w + (1.0 - w) * (r + v_next - v)


def trajectory_advantages(traj_ids: np.ndarray, rewards: np.ndarray, v: np.ndarray, v_next: np.ndarray,
                          lam: float) -> np.ndarray:  # fmt: skip
    """:func:`step_advantages` of every step of a step table sorted by (trajectory, step), in its row order."""
    traj_ids = np.asarray(traj_ids)
    if len(traj_ids) and (np.diff(traj_ids) < 0).any():
        raise ValueError("the steps must be sorted by trajectory (and by step within one)")
    out = np.empty(len(traj_ids), np.float64)
    starts = _episode_starts(traj_ids)
    for a, b in zip(starts, np.r_[starts[1:], len(traj_ids)], strict=True):
        out[a:b] = step_advantages(rewards[a:b], v[a:b], v_next[a:b], lam)
    return out


def keep_steps(advantages: np.ndarray, horizons: np.ndarray) -> np.ndarray:
    """DigiRL's hard step filter: the advantage exceeds 1 / H, H each step's task-set step limit (a bool mask)."""
    return np.asarray(advantages) > 1.0 / np.asarray(horizons, np.float64)


def instruction_priorities(outcomes: np.ndarray, v_inst: np.ndarray) -> np.ndarray:
    """r - V_inst(c) of each episode: how much more it did than its instruction's episodes usually do."""
    return np.asarray(outcomes, np.float64) - np.asarray(v_inst, np.float64)


def curriculum(outcomes: np.ndarray, v_inst: np.ndarray, top: float) -> np.ndarray:
    """The episodes DigiRL replays: indices of the top ``top`` share by :func:`instruction_priorities`, best first.

    Ties at the cut are all kept (as a percentile threshold keeps them), so
    at least ``ceil(top * n)`` episodes come back; ties keep their order.
    """
    if not 0.0 < top <= 1.0:
        raise ValueError(f"the replayed share must lie in (0, 1], got {top}")
    priority = instruction_priorities(outcomes, v_inst)
    if len(priority) == 0:
        return np.zeros(0, int)
    order = np.argsort(-priority, kind="stable")
    cut = priority[order[int(np.ceil(top * len(priority))) - 1]]
    return order[priority[order] >= cut]


class DigiRLValues:
    """V_inst on instruction features and V_step (two heads) on state features, trained together between rounds."""

    def __init__(self, feature_dim: int, hidden: int = 256, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.instruction = SuccessClassifier(feature_dim, hidden, heads=1)
        self.step = SuccessClassifier(feature_dim, hidden, heads=2)

    def fit(self, instructions: np.ndarray, outcomes: np.ndarray, states: np.ndarray, next_states: np.ndarray,
            step_outcomes: np.ndarray, *, updates: int, batch: int, lr: float, seed: int) -> dict[str, list[float]]:  # fmt: skip
        """``updates`` steps of each classifier: V_inst on (instruction, outcome) per episode; V_step on each
        step's state and next state, both labelled with the episode's outcome. The loss curves."""
        return {
            "instruction": fit_success_classifier(self.instruction, instructions, outcomes, updates=updates,
                                                  batch=batch, lr=lr, seed=seed),
            "step": fit_success_classifier(self.step, np.concatenate([states, next_states]),
                                           np.concatenate([step_outcomes, step_outcomes]), updates=updates,
                                           batch=batch, lr=lr, seed=seed + 1),
        }  # fmt: skip

    def save(self, folder: Path) -> None:
        """Both classifiers' weights, as ``folder/values.pt`` (the online stage's checkpoint of a round)."""
        with atomic_path(folder / "values.pt") as tmp:
            torch.save({"instruction": self.instruction.state_dict(), "step": self.step.state_dict()}, tmp)

    def load_state(self, folder: Path) -> None:
        state = torch.load(folder / "values.pt", weights_only=True)
        self.instruction.load_state_dict(state["instruction"])
        self.step.load_state_dict(state["step"])


def digirl_steps(episode: np.ndarray, rewards: np.ndarray, horizons: np.ndarray, v: np.ndarray, v_next: np.ndarray,
                 v_inst: np.ndarray, *, lam: float, top: float) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The steps DigiRL fits the policy to (row indices) and every step's advantage.

    Rows are steps sorted by episode and step; ``episode`` numbers them,
    ``rewards`` are the step rewards, ``horizons`` each step's step limit,
    ``v``/``v_next`` V_step of its state and next state and ``v_inst`` V_inst of
    its instruction. A step is kept when its episode is among the replayed
    ones (:func:`curriculum` over the episodes here) and its advantage
    exceeds 1 / H (:func:`keep_steps`).
    """
    episode = np.asarray(episode)
    adv = trajectory_advantages(episode, rewards, v, v_next, lam)
    first = _episode_starts(episode)
    outcomes = np.add.reduceat(np.asarray(rewards, np.float64), first) if len(first) else np.zeros(0)
    replayed = np.zeros(len(first), bool)
    replayed[curriculum(outcomes, np.asarray(v_inst)[first], top)] = True
    in_replay = np.repeat(replayed, np.diff(np.r_[first, len(episode)]))
    return np.flatnonzero(in_replay & keep_steps(adv, horizons)), adv


@dataclass(frozen=True)
class StepFeatures:
    """The frozen features DigiRL's value functions read, one row per step of a step table."""

    state: np.ndarray  # (S, d): the step's state (prompt and screen)
    next_state: np.ndarray  # (S, d): the state it led to
    instruction: np.ndarray  # (S, d): its episode's instruction alone

    def take(self, rows: np.ndarray) -> StepFeatures:
        return StepFeatures(self.state[rows], self.next_state[rows], self.instruction[rows])

    @staticmethod
    def concat(parts: Sequence[StepFeatures]) -> StepFeatures:
        return StepFeatures(*(np.concatenate([getattr(p, k) for p in parts]) for k in ("state", "next_state",
                                                                                       "instruction")))  # fmt: skip


def store_steps(store: TrajectoryStore, task_set: str | None = None) -> pd.DataFrame:
    """The steps of ``store`` (only ``task_set``'s, if given), sorted by trajectory and step: the rows, in their
    order, whose :func:`step_features` DigiRL's value functions read.

    The encoder's floats depend in their last bits on which rows share a
    batch, so whoever computes one task set's offline features computes them
    from these rows, and the actor stage's and the online stage's agree bit for bit.
    """
    steps = store.read().to_pandas()
    if task_set is not None:
        steps = steps[steps.task_set == task_set]
    return steps.sort_values(["traj_id", "step_id"], kind="stable").reset_index(drop=True)


def step_features(policy: AutoUIPolicy, steps: pd.DataFrame, screens: dict[str, torch.Tensor],
                  key: str = "") -> StepFeatures:  # fmt: skip
    """:class:`StepFeatures` of every row of ``steps`` from the frozen ``policy``.

    ``screens`` holds each screenshot at the policy's input size under
    ``key + image_path`` (:func:`~digiq.models.policy_fit.load_screens`).
    """
    if steps.empty:
        d = policy.cfg.d_model
        return StepFeatures(*(np.zeros((0, d), np.float32) for _ in range(3)))

    # Each distinct (prompt, screenshot) and instruction is encoded once: a step's s' is the next step's s, and an
    # episode's steps share its instruction, so this halves the states' encoder passes and leaves one per task.
    n = len(steps)
    pairs = [*zip(steps.observation, steps.image_path), *zip(steps.next_observation, steps.next_image_path)]
    distinct = list(dict.fromkeys(pairs))
    position = {pair: i for i, pair in enumerate(distinct)}
    encoded = state_features(policy, [prompt for prompt, _ in distinct],
                             torch.stack([screens[key + path] for _, path in distinct]))  # fmt: skip
    rows = np.array([position[pair] for pair in pairs])
    tasks = list(dict.fromkeys(steps.task))
    task_row = {task: i for i, task in enumerate(tasks)}
    instruction = instruction_features(policy, tasks)[[task_row[t] for t in steps.task]]
    return StepFeatures(encoded[rows[:n]], encoded[rows[n:]], instruction)


def write_offline_step_features(paths: Paths, steps: pd.DataFrame, by_set: dict[str, StepFeatures]) -> None:
    """Store each task set's :func:`step_features` of the offline data (of :func:`store_steps`' rows) as one row per
    stored step of ``steps`` (the step table), for :func:`read_offline_step_features`."""
    of_set = steps.task_set.to_numpy()
    rows = np.concatenate([np.flatnonzero(of_set == ts) for ts in by_set])  # task set after task set
    in_order = StepFeatures.concat(list(by_set.values())).take(np.argsort(rows))
    write_stored(paths, DIGIRL_STEP_FEATURES, steps, {k.name: getattr(in_order, k.name) for k in fields(StepFeatures)})


def read_offline_step_features(paths: Paths, task_set: str, stage: str) -> StepFeatures:
    """The offline step features of ``task_set`` that :func:`write_offline_step_features` stored, in
    :func:`store_steps`' order; ``stage`` is the stage reading them (named if they are missing)."""
    steps = TrajectoryStore(paths.offline).read().to_pandas()
    names = tuple(k.name for k in fields(StepFeatures))
    stored = read_stored(paths, DIGIRL_STEP_FEATURES, steps, names, stage)
    rows = np.flatnonzero(steps.task_set.to_numpy() == task_set)
    return StepFeatures(**{k: stored[k][rows] for k in names})


def fit_and_select(values: DigiRLValues, feats: StepFeatures, steps: pd.DataFrame, cfg: DigiRLConfig,
                   seed: int) -> tuple[np.ndarray, dict[str, Any]]:  # fmt: skip
    """Fit ``values`` on ``steps`` (sorted by ``episode``, then step) and pick the rows DigiRL imitates.

    ``steps`` needs ``episode`` (one number per episode), ``reward``,
    ``trajectory_reward`` and ``task_set``. Returns the kept row indices
    (:func:`digirl_steps`) and what the fit and the filter did: the last
    value losses, the mean advantage and the shares of episodes and steps kept.
    """
    episode = steps.episode.to_numpy()
    first = _episode_starts(episode)
    outcome = (steps.trajectory_reward.to_numpy() > 0).astype(np.float32)
    losses = values.fit(feats.instruction[first], outcome[first], feats.state, feats.next_state, outcome,
                        updates=cfg.value_updates, batch=cfg.value_batch, lr=cfg.value_lr, seed=seed)  # fmt: skip
    horizons = steps.task_set.map(MAX_STEPS).to_numpy()
    kept, adv = digirl_steps(episode, steps.reward.to_numpy(), horizons, values.step.value(feats.state),
                             values.step.value(feats.next_state), values.instruction.value(feats.instruction),
                             lam=cfg.lam, top=cfg.replay_top)  # fmt: skip
    tail = max(1, cfg.value_updates // 10)
    return kept, {
        "value_loss_instruction": round(float(np.mean(losses["instruction"][-tail:])), 4),
        "value_loss_step": round(float(np.mean(losses["step"][-tail:])), 4),
        "mean_advantage": round(float(adv.mean()), 4) if len(adv) else 0.0,
        "kept_steps": len(kept),
        "kept_episodes": len(np.unique(episode[kept])),
        "buffer_episodes": len(first),
    }


def digirl_offline_picks(cfg: DigiRLConfig, feats: StepFeatures, steps: pd.DataFrame,
                         seed: int) -> tuple[Picks, dict[str, Any]]:  # fmt: skip
    """Offline DigiRL's rows: its value functions fit on the offline data, then its step filter and curriculum.

    ``feats`` is :func:`offline_step_features`. The taken action of each kept
    step is imitated (weight 1); also what the fit and the filter did.
    """
    order = np.lexsort((steps.step_id.to_numpy(), steps.traj_id.to_numpy()))
    ordered = steps.iloc[order].assign(episode=steps.traj_id.to_numpy()[order])
    values = DigiRLValues(feats.state.shape[1], seed=seed)
    kept, stats = fit_and_select(values, feats.take(order), ordered, cfg, seed)
    return Picks.taken(np.sort(order[kept])), stats
