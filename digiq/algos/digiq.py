"""Digi-Q (Bai et al., 2025): a TD critic on frozen VLM features, and a policy extracted from it by Best-of-N.

The data are stored steps (s, a, r, s', done) of the base policy on train
tasks, each state with N candidate actions a_0..a_{N-1} the base policy
sampled there (a_0 the action taken). phi(s) and phi(s, a) are frozen
features (the fine-tuned VLM's, with text features of the goal and the
actions; :mod:`digiq.models.critic_inputs`).

**Critic.** Twin heads Q_1, Q_2 over (phi(s), phi(s, a)) and V_1, V_2 over
phi(s), with target copies (bars) soft-updated at rate tau:

    y_Q_j = r + gamma (1 - done) Vbar_j(s')
    y_V_j = Qbar_j(s, a)
    L     = sum_j (Q_j(s, a) - y_Q_j)^2 + sum_j (V_j(s) - y_V_j)^2
    thetabar <- (1 - tau) thetabar + tau theta

over random minibatches of the training trajectories' steps, by AdamW
(weight decay 0: Adam) with the gradient's norm optionally clipped
(:func:`fit_critic`); the held-out trajectories measure it. The twin heads
(``critic.twin_heads``) are either pessimistic, Vbar_j and Qbar_j standing
for min_i Vbar_i and min_i Qbar_i and the actor reading min_j Q_j - min_j V_j,
or, as released Digi-Q trains them, each head on its own target head, the
actor reading max_j Q_j - max_j V_j (:meth:`~digiq.models.critic.Critic.joined`).

**Actor.** At each stored state, K of the N candidates (a_0 always among
them) are scored by A(s, a) = Q(s, a) - V(s), the heads joined; the best
valid one is kept when A clears the task set's threshold
(:func:`best_of_n_picks`), and the base policy is fit to the kept
(s, a*) pairs by maximum likelihood (:func:`imitation_rows`, then
:func:`digiq.models.policy_fit.fit_policy`).

**The paper's extraction ablation**: each state's best drawn candidate
imitated with a weight of its advantage clamped to [0, 1], exp(A / beta)
(AWR) or A itself (REINFORCE), as released Digi-Q weighs them
(:func:`extraction_picks`). **A bound**: Best-of-N with a perfect critic,
the simulator's expert (:func:`perfect_critic_picks`).

**Beyond the paper** (named variants, their own rows): a conservative term
(CQL over the stored candidates, :func:`conservative_penalty`), optionally
gated to steps that moved forward (:func:`moved_forward`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from digiq import parallel
from digiq.config import ActorConfig, CriticConfig
from digiq.data.picks import Picks
from digiq.data.trajectories import heldout_rows
from digiq.models.critic import Critic, CriticNetConfig, TextStart, tower_fields
from digiq.models.policy_fit import FitRow
from digiq.progress import progress
from digiq.rows import EXTRACTIONS

__all__ = [
    "twin_targets",
    "q_targets",
    "td_losses",
    "batch_losses",
    "transition_tensors",
    "build_critic",
    "fit_critic",
    "td_fit",
    "conservative_penalty",
    "conservative_term",
    "moved_forward",
    "drawn_advantages",
    "drawn_among",
    "best_of_n",
    "best_of_n_picks",
    "imitation_rows",
    "extraction_weights",
    "extraction_picks",
    "perfect_critic_picks",
]


# ---------------------------------------------------------------- the critic


def twin_targets(rule: str, heads: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """What each head j regresses on, from the target critic's pair of heads (``critic.twin_heads``): with ``min``
    both their minimum (clipped double Q), with ``each`` head j's own, as released Digi-Q trains them."""
    if rule == "min":
        low = torch.minimum(*heads)
        return low, low
    return heads


def q_targets(target: Critic, batch: dict[str, torch.Tensor], gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """y_Q_j = r + gamma (1 - done) Vbar_j(s') for each head j, Vbar_j by the twin-head rule (:func:`twin_targets`);
    ``batch``'s ``next_state`` as ``target`` reads it (:meth:`~digiq.models.critic.Critic.inputs`)."""
    v1, v2 = twin_targets(target.cfg.twin, target.v(batch["next_state"]))
    return (batch["reward"] + gamma * (1 - batch["done"]) * v1, batch["reward"] + gamma * (1 - batch["done"]) * v2)


def td_losses(
    critic: Critic, target: Critic, batch: dict[str, torch.Tensor], gamma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Q and V losses of one batch of transitions: each head's squared error to its target, summed over heads.

    y_Q_j = r + gamma (1 - done) Vbar_j(s') and y_V_j = Qbar_j(s, a), the target critic's heads by the twin-head
    rule (:func:`twin_targets`). Each critic reads ``batch`` through its own text towers, if it has them
    (:meth:`~digiq.models.critic.Critic.inputs`): the target critic's are the soft-updated copies.
    """
    with torch.no_grad():
        read = {**batch, **target.inputs(batch, ("state", "next_state", "action"))}  # its towers, if it has them
        y_q1, y_q2 = q_targets(target, read, gamma)
        y_v1, y_v2 = twin_targets(target.cfg.twin, target.q(read["state"], read["action"]))
    x = critic.inputs(batch, ("state", "action"))
    q1, q2 = critic.q(x["state"], x["action"])
    v1, v2 = critic.v(x["state"])
    return F.mse_loss(q1, y_q1) + F.mse_loss(q2, y_q2), F.mse_loss(v1, y_v1) + F.mse_loss(v2, y_v2)


def transition_tensors(feats: dict[str, np.ndarray], steps: pd.DataFrame) -> dict[str, torch.Tensor]:
    """One row per stored step: the features of s, s' and the action taken (candidate 0), reward, done, MC return,
    and the text rows of s and s' where ``feats`` has them (a critic with towers)."""
    rows = {k: torch.from_numpy(np.asarray(feats[k])) for k in ("goal_row", "before_rows", "taken_rows") if k in feats}
    return {
        "state": torch.from_numpy(np.asarray(feats["state"])),
        "next_state": torch.from_numpy(np.asarray(feats["next_state"])),
        "action": torch.from_numpy(np.asarray(feats["candidates"][:, 0])),  # index 0: the action taken
        "reward": torch.tensor(steps.reward.to_numpy(), dtype=torch.float32),
        "done": torch.tensor(steps.done.to_numpy(), dtype=torch.float32),
        "mc_return": torch.tensor(steps.mc_return.to_numpy(), dtype=torch.float32),
        **rows,
    }


def build_critic(cfg: CriticConfig, feats: dict[str, np.ndarray], encoder: TextStart | None = None) -> Critic:
    """A fresh critic of ``cfg``'s shape for inputs ``feats`` (initialised from torch's current seed); with
    ``cfg.towers``, its towers copies of ``encoder``'s policy's T5 encoder, reading ``encoder``'s texts."""
    if cfg.towers and encoder is None:
        raise ValueError("a critic with text towers starts from the base policy's encoder: none was given")
    width = encoder.policy.cfg.d_model if cfg.towers else 0  # each text the towers append
    net = CriticNetConfig(
        feature_dim=feats["state"].shape[1] + 3 * width,
        hidden=cfg.hidden,
        action_dim=feats["candidates"].shape[2] + 2 * width,
        text=cfg.text_features,
        targets=cfg.tap_targets,
        typed=cfg.typed_match,
        entries=cfg.list_entries,
        twin=cfg.twin_heads,
        **(tower_fields(encoder.policy, cfg.text_tokens) if cfg.towers else {}),
    )
    return Critic.with_towers(net, encoder.policy).read_texts(encoder.texts) if cfg.towers else Critic(net)


def fit_critic(cfg: CriticConfig, feats: dict[str, np.ndarray], steps: pd.DataFrame, seed: int,
               scored: np.ndarray | None = None, encoder: TextStart | None = None) -> dict[str, Any]:  # fmt: skip
    """Train one critic by TD (seeded by ``seed``) on ``feats`` (:mod:`digiq.models.critic_inputs`, one row per
    stored step) and ``steps`` (their reward, done, MC return and trajectory); the held-out V-vs-return correlation
    measures it.

    ``cfg.holdout`` of the trajectories are held out, drawn by ``cfg.seed``: the
    same ones for every seed's critic, so that the diagnostics (stage 08)
    judge every seed on trajectories none of them trained on. ``cfg.steps``
    updates, each on ``cfg.batch_size`` transitions drawn at random (with
    replacement) from the rest, as released Digi-Q draws its batches. With
    ``cfg.towers`` the critic's text towers start from ``encoder``
    (:func:`build_critic`) and train with the heads at the same rate.
    ``scored`` (states, N) marks the candidates the conservative term
    (``cfg.conservative`` > 0) pushes down, which needs it.
    """
    if cfg.conservative > 0 and scored is None:
        raise ValueError("the conservative term needs the mask of the candidates it scores")
    torch.manual_seed(seed)
    held = heldout_rows(steps.traj_id.to_numpy(), cfg.holdout, cfg.seed)
    train_idx, test_idx = np.flatnonzero(~held), np.flatnonzero(held)
    data = transition_tensors(feats, steps)
    if cfg.conservative > 0:
        data["candidates"] = torch.from_numpy(np.asarray(feats["candidates"]))
        data["scored"] = torch.from_numpy(np.asarray(scored, bool))
        if "action_rows" in feats:
            data["action_rows"] = torch.from_numpy(np.asarray(feats["action_rows"]))
    # The conservative term scores all N candidates of only the batch's first ``penalised`` states (all of them
    # would cost N TD steps); a row carries whether it is one, so that each process's share sums to the batch's.
    penalised = min(cfg.penalty_states, cfg.batch_size)
    names = ("q", "v", "conservative") if cfg.conservative > 0 else ("q", "v")
    dev = parallel.device()
    critic = build_critic(cfg, feats, encoder).to(dev)
    target = critic.target()
    opt = torch.optim.AdamW(critic.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    curves: dict[str, list[float]] = {name: [] for name in names}
    rng = np.random.default_rng(seed)
    for _ in progress(range(cfg.steps), desc=f"TD steps (seed {seed})"):
        opt.zero_grad()  # every process draws the same batch and takes its share of it (digiq.parallel)
        batch = train_idx[rng.integers(0, len(train_idx), cfg.batch_size)]
        rows = [(int(i), pos < penalised) for pos, i in enumerate(batch)]
        loss = parallel.backward_share(rows, partial(batch_losses, cfg, critic, target, data, penalised),
                                       critic.parameters(), names=names)  # fmt: skip
        if cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(critic.parameters(), cfg.grad_clip)
        opt.step()
        target.soft_update(critic, cfg.tau)
        for name in names:
            curves[name].append(loss[name])
    critic.eval()
    with torch.no_grad():
        held = critic.inputs({k: t[test_idx].to(dev) for k, t in data.items()}, ("state",), critic.encode_texts())
        v_held = critic.joined(critic.v(held["state"])).cpu().numpy()
    mc = steps.mc_return.to_numpy()[test_idx]
    corr = float(np.corrcoef(v_held, mc)[0, 1]) if len(test_idx) > 2 and mc.std() > 0 else float("nan")
    fit = td_fit(critic, {k: t[train_idx].to(dev) for k, t in data.items()}, cfg.gamma)
    return {"critic": critic, "curves": curves, "corr": corr, "train": len(train_idx), "heldout": len(test_idx),
            "train_rows": train_idx, **fit}  # fmt: skip


def batch_losses(cfg: CriticConfig, critic: Critic, target: Critic, data: dict[str, torch.Tensor], penalised: int,
                 mine: list[tuple[int, bool]]) -> dict[str, torch.Tensor]:  # fmt: skip
    """The losses of this process's share of a batch (``mine``: rows of ``data``, and whether the conservative term
    scores each; :func:`digiq.parallel.backward_share`): TD on every row (:func:`td_losses`); with
    ``cfg.conservative``, the CQL term on the scored rows (:func:`conservative_term`), scaled so that the shares sum
    to the mean over the batch's ``penalised`` scored states times the batch."""
    dev = parallel.device()
    idx = torch.as_tensor([i for i, _ in mine])
    q_loss, v_loss = td_losses(critic, target, {k: t[idx].to(dev) for k, t in data.items()}, cfg.gamma)
    out = {"q": q_loss, "v": v_loss}
    if cfg.conservative > 0:
        pen = torch.as_tensor([i for i, p in mine if p], dtype=torch.long)
        rows = {k: t[pen].to(dev) for k, t in data.items()}
        term = conservative_term(cfg, critic, target, rows) if len(pen) else q_loss * 0
        out["conservative"] = cfg.conservative * term * cfg.batch_size / penalised / len(mine)
    return out


@torch.no_grad()
def td_fit(critic: Critic, data: dict[str, torch.Tensor], gamma: float) -> dict[str, float]:
    """How far Q of the taken actions is from its TD target, and from V, over ``data`` (the training transitions,
    as :func:`transition_tensors` gives them).

    Best-of-N keeps a pick when Q - V clears a fixed threshold, so Q and V
    must agree where they meet, at the taken action. A conservative term
    strong enough to outweigh TD moves Q off its target by a shift that
    differs from seed to seed, and with it the share of states kept.
    """
    data = {**data, **critic.inputs(data, ("state", "next_state", "action"), critic.encode_texts())}
    q = critic.joined(critic.q(data["state"], data["action"]))
    y_q = critic.joined(q_targets(critic, data, gamma))
    gap = q - critic.joined(critic.v(data["state"]))
    return {"q_td_rmse": float(((q - y_q) ** 2).mean().sqrt()), "q_taken_minus_v": float(gap.mean())}


def conservative_term(cfg: CriticConfig, critic: Critic, target: Critic, rows: dict[str, torch.Tensor]) -> torch.Tensor:
    """The CQL variant's term (beyond the paper; ``cfg.conservative`` > 0) over ``rows``, states whose candidates it
    scores: :func:`conservative_penalty` summed over them, on the scored candidates, and with
    ``cfg.conservative_gate`` only at steps the data's action moved forward (:func:`moved_forward`)."""
    marked = rows["scored"]
    if cfg.conservative_gate:
        marked = marked & moved_forward(target, rows, cfg.gamma)[:, None]
    x = critic.inputs(rows, ("state", "candidates"))
    return conservative_penalty(critic, x["state"], x["candidates"], marked, cfg.conservative_floor).sum()


def conservative_penalty(critic: Critic, state: torch.Tensor, candidates: torch.Tensor, scored: torch.Tensor,
                         floor: float | None = None) -> torch.Tensor:  # fmt: skip
    """Per state (B,): logsumexp of Q over its scored candidates minus Q of the taken one (column 0), both heads summed.

    Minimising it lowers the candidates the data never tried against the one
    it did, unless TD lifts them through shared features (CQL's regulariser,
    Kumar et al. 2020, over the stored candidates instead of sampled actions).
    TD fits Q on the taken action only, yet Best-of-N takes the argmax over
    all candidates, so it picks whichever untaken candidate the heads happen
    to overestimate.

    With ``floor``, an untried candidate's Q enters the sum as no less than
    ``floor``, so the term stops pushing it once it is there (the
    calibration of Cal-QL, with the lowest possible return as the bound).
    Without it, an action that is a candidate almost everywhere and rarely
    taken (Back, Home) has its Q pushed far below any return, where returns
    lie in [0, 1].
    """
    ok = scored.clone()
    ok[:, 0] = True  # the taken action counts even when it did not parse
    q_all = critic.q(state[:, None].expand(-1, candidates.shape[1], -1), candidates)
    if floor is not None:
        q_all = tuple(torch.cat([q[:, :1], q[:, 1:].clamp(min=floor)], 1) for q in q_all)
    return sum(torch.logsumexp(q.masked_fill(~ok, float("-inf")), 1) - q[:, 0] for q in q_all)


@torch.no_grad()
def moved_forward(target: Critic, batch: dict[str, torch.Tensor], gamma: float) -> torch.Tensor:
    """(B,) bool: the data's step raised the target critic's value (r + gamma V(s') > V(s)), or its episode succeeded.

    The conservative term lifts Q of the data's action against the other
    candidates; at every step it also lifts the base's slips, and the
    critic's wrong picks go to the commonest of them (Back).
    ``critic.conservative_gate`` keeps the term to these steps.
    """
    batch = {**batch, **target.inputs(batch, ("state", "next_state"))}
    forward = target.joined(q_targets(target, batch, gamma)) - target.joined(target.v(batch["state"])) > 0
    return forward | (batch["mc_return"] > 0)


# ---------------------------------------------------------------- the actor


def drawn_advantages(critic: Critic, data: dict[str, np.ndarray], valid: np.ndarray, k: int, rng: np.random.Generator,
                     rows: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """(S, N): A = Q(s, a) - V(s) of the K candidates drawn per state of ``data`` (critic inputs, as
    :func:`~digiq.models.critic.inputs_for` gives them; only its ``rows``, if given; 0, the action taken, always
    in); -inf elsewhere.

    A candidate not drawn, or drawn but invalid, gets -inf: Best-of-N never
    picks it and the weighted extractions never imitate it. Every extraction
    of one seed reads this one matrix, so they all see the same candidates.
    """
    x = critic.read(data, np.arange(len(data["state"])) if rows is None else rows, ("state", "candidates"))
    _, _, adv = critic.advantage(x["state"], x["candidates"])
    return drawn_among(adv.cpu().numpy(), valid, k, rng)


def drawn_among(adv: np.ndarray, valid: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """``adv`` (S, N) with -inf but at the K candidates drawn per state (0, the action taken, always in) that are
    valid: :func:`drawn_advantages` of advantages already computed (a critic's scores, stored once per seed)."""
    S, N = valid.shape
    drawn = np.zeros((S, N), bool)
    drawn[:, 0] = True
    for i in range(S):
        drawn[i, 1 + rng.permutation(N - 1)[: max(0, min(k, N) - 1)]] = True
    out = np.array(adv)
    out[~(drawn & valid)] = -np.inf
    return out


def best_of_n(adv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per state: the index of the best drawn valid candidate of :func:`drawn_advantages`, and its advantage."""
    best = adv.argmax(1)
    return best, adv[np.arange(len(adv)), best]


def best_of_n_picks(cfg: ActorConfig, adv: np.ndarray, steps: pd.DataFrame) -> tuple[Picks, dict[str, float]]:
    """Digi-Q's rows: each state's best drawn candidate, kept where its advantage clears the task set's threshold.

    ``adv`` is :func:`drawn_advantages`'s matrix for the seed; ``steps`` the stored steps (their task set).
    """
    best, adv = best_of_n(adv)
    task_sets = steps.task_set.to_numpy()
    kept = adv > cfg.thresholds(task_sets)
    keep = np.flatnonzero(kept)
    stats = {"kept_not_taken_fraction": float(np.mean(best[keep] != 0)) if len(keep) else 0.0,
             **{f"kept_fraction_{ts}": float(kept[task_sets == ts].mean()) for ts in np.unique(task_sets)}}  # fmt: skip
    return Picks(keep, best[keep]), stats


def imitation_rows(steps: pd.DataFrame, cands: pd.DataFrame, picks: Picks) -> list[FitRow]:
    """What the policy is fit to: each picked state's prompt and screenshot, its picked candidate and the row's weight."""
    return [FitRow(steps.observation.iat[i], steps.image_path.iat[i], cands.action_list.iat[i][c], float(w))
            for i, c, w in zip(picks.states, picks.columns, picks.row_weights(), strict=True)]  # fmt: skip


def extraction_weights(cfg: ActorConfig, method: str, adv: np.ndarray) -> np.ndarray:
    """Per state: the weight its best drawn valid candidate (:func:`best_of_n` of ``adv``) is imitated with.

    As released Digi-Q weighs it, on the advantage clamped to [0, 1]:
    ``awr``, exp(A / beta) (Peng et al. 2019); ``reinforce``, A itself (the
    policy-gradient update with the critic's advantage on the base policy's
    own samples; the release's multiplier scales every weight alike, which
    the normalised loss cancels). A state with no valid candidate weighs 0.

    AWR's weights are written exp((A - 1) / beta), the same ratios without
    overflow: at beta = 0.01 exp(A / beta) passes float32's range at
    A = 0.89.
    """
    _, best = best_of_n(adv)
    a = np.clip(np.where(np.isfinite(best), best, 0.0), 0.0, 1.0).astype(np.float64)
    if method == "awr":
        w = np.exp((a - 1.0) / cfg.awr_beta)
    elif method == "reinforce":
        w = a
    else:
        raise ValueError(f"unknown extraction {method!r}; known: {list(EXTRACTIONS)}")
    return np.where(np.isfinite(best), w, 0.0)


def extraction_picks(cfg: ActorConfig, method: str, adv: np.ndarray) -> tuple[Picks, dict[str, float]]:
    """Every state's best drawn valid candidate as a row, weighted by :func:`extraction_weights` (weight 0: no row).

    Also what the weights are, relative to the largest (only their ratios count): the share of states with a
    row, and the share of the weight the top 1% of rows carry.
    """
    best, _ = best_of_n(adv)
    w = extraction_weights(cfg, method, adv)
    states = np.flatnonzero(w > 0)
    weights = w[states] / w[states].max() if len(states) else w[states]
    stats = {"rows_fraction": float(len(states) / max(1, len(w)))}
    if len(states):
        top = np.sort(weights)[::-1][: max(1, len(weights) // 100)]
        stats["top_percent_weight_share"] = float(top.sum() / weights.sum())
    return Picks(states, best[states], weights), stats


def perfect_critic_picks(right: np.ndarray) -> Picks:
    """Best-of-N with a perfect critic: at each stored state, the first candidate that does what the expert would.

    ``right`` is :func:`~digiq.diagnostics.ground_truth.expert_matrix`. States where no candidate does are
    left out, as a critic could not pick what was never sampled. Trained like
    Digi-Q's actor, this policy bounds what any critic could give Digi-Q on
    these data: a target it misses is out of reach of the actor, not of the
    critic.
    """
    states = np.flatnonzero(right.any(1))
    return Picks(states, right[states].argmax(1))
