"""Oracle action values: what only a simulator can tell about a critic.

For a stored state, the device is rebuilt exactly (episodes are deterministic
given their seed, so replaying the recorded actions reaches the same state),
each candidate action is taken on independent copies of it, and a fixed
continuation policy (the scripted expert, with some noise) plays on to the
step limit. The discounted success, averaged over a few such rollouts, is the
candidate's true value Q*(s, a) under that continuation.

Comparing the critic's top-ranked candidate with the truly best ones says
whether a failure of Digi-Q comes from the critic (it ranks badly) or from
the actor (the ranking is right but the policy does not learn from it).
:func:`behaviour_values` continues with the policy that collected the data
instead: the values Digi-Q's critic is trained towards, which say whether its
objective prefers the right candidate at all. :func:`expert_probe` fits a
ranker on the critic's own inputs to the expert's choices, which says whether
those inputs, or the signal TD gets from the data, limit the critic.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from digiq.config import EXPERT_SKILLS
from digiq.data.trajectories import observation_text
from digiq.env.actions import Action, ActionType, format_action, parse_action
from digiq.env.catalog import stable_int
from digiq.env.device import SimDevice
from digiq.env.expert import Expert, next_action
from digiq.env.gym_env import AndroidSimEnv
from digiq.env.hierarchy import describe, hierarchy_xml
from digiq.env.state import DeviceState, Dynamics
from digiq.env.tasks import Task
from digiq.models.critic import mlp
from digiq.rollout import Policy, RolloutBatch

__all__ = [
    "replay",
    "candidate_values",
    "stored_state_values",
    "behaviour_values",
    "behaviour_report",
    "expert_equivalent",
    "ranking_report",
    "expert_pick_report",
    "action_kinds",
    "wrong_pick_report",
    "support_report",
    "group_masks",
    "expert_kind",
    "within_state_share",
    "expert_probe",
    "feature_probe",
    "ExpertSkill",
]

_ENDING = (ActionType.STATUS_TASK_COMPLETE, ActionType.STATUS_TASK_IMPOSSIBLE)


class ExpertSkill:
    """A policy with one skill taken from the simulator's noiseless expert: where does its success go?

    - ``type``: when both type, the expert's text replaces the policy's.
    - ``tap``: when both touch the screen, the expert's points replace the policy's.
    - ``action_type``: when the kinds differ, the expert's action replaces the policy's.

    Everything else stays the policy's own. The rise in success over the
    policy alone bounds what mending that one skill could give; for the base
    policy it says which skill the offline methods have to teach. Simulator
    only: the expert reads the device's state.
    """

    def __init__(self, policy: Policy, skill: str) -> None:
        if skill not in EXPERT_SKILLS:
            raise ValueError(f"skill must be one of {EXPERT_SKILLS}, got {skill!r}")
        self.policy, self.skill = policy, skill

    def act(self, batch: RolloutBatch) -> list[str]:
        out = []
        for env, text in zip(batch.envs, self.policy.act(batch), strict=True):
            if not isinstance(env, AndroidSimEnv) or env.task is None:
                raise TypeError(f"ExpertSkill needs in-process simulated phones, got {type(env).__name__}")
            own, expert = parse_action(text), next_action(env.device, env.task)
            same_kind = own.type == expert.type
            lend = {"type": same_kind and own.type == ActionType.TYPE,
                    "tap": same_kind and own.type == ActionType.DUAL_POINT,
                    "action_type": not same_kind}[self.skill]  # fmt: skip
            out.append(format_action(expert) if lend else text)
        return out


def replay(task: Task, seed: int, actions: Sequence[str], dynamics: Dynamics | None, width: int) -> SimDevice:
    """The device of an episode (reset with ``seed``) after ``actions``: the stored state, rebuilt."""
    env = AndroidSimEnv(dynamics=dynamics, width=width)
    env.reset(seed=seed, options={"task": task})
    for a in actions:
        env.step(a)
    return env.device


def candidate_values(
    device: SimDevice,
    task: Task,
    steps_left: int,
    candidates: Sequence[str],
    *,
    rollouts: int,
    noise: float,
    gamma: float,
    seed: int,
) -> np.ndarray:
    """Q*(s, a) per candidate: take it, then the noisy expert until success or the step limit.

    A success ``k`` steps after the candidate is worth ``gamma ** k`` (the
    reward of 1 comes on the step that reaches the goal, as in the data).
    Every rollout runs on its own copy of ``device`` with its own random
    stream, so pop-ups and delays differ between them. Identical candidate
    texts are rolled out once: their values cannot differ, and a separate
    estimate each would only add noise to the ranking.
    """
    distinct = list(dict.fromkeys(candidates))  # duplicates (common at a confident state) share one estimate
    value: dict[str, float] = {}
    for c, text in enumerate(distinct):
        first = parse_action(text)
        total = 0.0
        for r in range(rollouts):
            branch = stable_int("oracle", seed, c, r)
            dev = device.clone(seed=branch)
            expert = Expert(noise, seed=branch)
            action = first
            for k in range(steps_left):
                dev.step(action)
                if task.goal.check(dev.state):
                    total += gamma**k
                    break
                if action.type in _ENDING:
                    break
                action = expert.act(dev, task)
        value[text] = total / rollouts
    return np.array([value[text] for text in candidates])


def stored_state_values(
    task: Task,
    seed: int,
    earlier: Sequence[str],
    candidates: Sequence[str],
    *,
    dynamics: Dynamics | None,
    width: int,
    rollouts: int,
    noise: float,
    gamma: float,
    branch_seed: int,
) -> np.ndarray:
    """Q*(s, a) of ``candidates`` at a stored state: episode ``seed`` replayed through ``earlier`` actions."""
    device = replay(task, seed, earlier, dynamics, width)
    return candidate_values(device, task, task.max_steps - len(earlier), candidates, rollouts=rollouts, noise=noise,
                            gamma=gamma, seed=branch_seed)  # fmt: skip


@dataclass
class _Branch:
    """One rollout of :func:`behaviour_values`: a candidate taken on a copy of a stored state, then the policy."""

    state: int  # which start
    text: str  # the candidate
    device: SimDevice
    task: Task
    history: list[str]  # every action of the episode so far, the candidate and the policy's included
    steps_left: int
    action: Action  # the action to take next
    value: float = 0.0
    taken: int = 0  # actions taken since the candidate's copy was made
    done: bool = False


def behaviour_values(
    starts: Sequence[tuple[SimDevice, Task, Sequence[str], Sequence[str]]],
    policy: Policy,
    *,
    rollouts: int,
    gamma: float,
    seed: int,
    screen_text: bool = False,
    batch: int = 256,
) -> list[np.ndarray]:
    """Q of the behaviour policy, per candidate of each start: take it, then ``policy`` until success or the step limit.

    ``starts`` are (device at a stored state, task, the episode's actions
    before it, candidates). Digi-Q's TD critic estimates exactly this when
    ``policy`` is the one that collected the data: its V target is Q of the
    data's own action, so Q is the collecting policy's value, and Best-of-N
    over it is one step of improvement on that policy. Where every candidate
    is worth 0 here (the policy fails after any of them), that objective
    prefers nothing, however well a critic learns it. Invalid candidates are
    worth 0 and not rolled out; identical texts share one estimate, as in
    :func:`candidate_values`. The policy acts on every live rollout at once,
    ``batch`` at a time, seeing the prompts the data's policy saw.
    """
    branches: list[_Branch] = []
    for j, (device, task, earlier, candidates) in enumerate(starts):
        for c, text in enumerate(dict.fromkeys(candidates)):
            action = parse_action(text)
            if not action.is_valid:
                continue
            for r in range(rollouts):
                branches.append(_Branch(j, text, device.clone(seed=stable_int("behaviour", seed, j, c, r)), task,
                                        [*earlier, text], task.max_steps - len(earlier), action))  # fmt: skip
    live = branches
    while live:
        for b in live:
            b.device.step(b.action)
            if b.task.goal.check(b.device.state):
                b.value, b.done = gamma**b.taken, True
            b.taken += 1
            b.done = b.done or b.action.type in _ENDING or b.taken >= b.steps_left
        live = [b for b in live if not b.done]
        for start in range(0, len(live), batch):
            chunk = live[start : start + batch]
            prompts = [observation_text(b.history, b.task.instruction,
                                        screen=describe(hierarchy_xml(b.device.screen().widgets)) if screen_text else None)
                       for b in chunk]  # fmt: skip
            shots = np.stack([b.device.screenshot() for b in chunk])
            for b, text in zip(chunk, policy.act(RolloutBatch(shots, prompts, [])), strict=True):
                b.action = parse_action(text)
                b.history.append(text)
    totals: list[dict[str, list[float]]] = [{} for _ in starts]
    for b in branches:
        totals[b.state].setdefault(b.text, []).append(b.value)
    return [np.array([float(np.mean(totals[j].get(text, [0.0]))) for text in candidates])
            for j, (_, _, _, candidates) in enumerate(starts)]  # fmt: skip


def expert_equivalent(device: SimDevice, task: Task, candidates: Sequence[str]) -> np.ndarray:
    """Which candidates do what the noiseless expert would do here (a perfect critic's picks).

    A candidate counts when it leaves the device in the very state the
    expert's action leaves it in, both taken on calm copies with the same
    random stream: tapping anywhere inside the right widget counts, typing a
    word with a typo does not. Ending the episode counts only when the expert
    ends it too (a no-op tap and "task complete" leave the same state, but not
    the same episode).
    """
    expert = next_action(device, task)

    def after(action: Action) -> DeviceState:
        branch = device.clone(Dynamics.calm(), seed=0)
        branch.step(action)
        return branch.state

    target, ends = after(expert), expert.type in _ENDING
    out = np.zeros(len(candidates), bool)
    for i, text in enumerate(candidates):
        action = parse_action(text)
        out[i] = action.is_valid and (action.type in _ENDING) == ends and after(action) == target
    return out


def expert_kind(device: SimDevice, task: Task) -> str:
    """The kind of action the noiseless expert takes here (``DUAL_POINT``, ``TYPE``, ``PRESS_HOME`` ...).

    Stage 06 groups its support and keep diagnostics by it: a kind the base
    never samples, or one the critic never picks, shows up across families.
    """
    return next_action(device, task).type.name


def ranking_report(
    oracle: np.ndarray, valid: np.ndarray, scores: dict[str, np.ndarray], tolerance: float
) -> dict[str, Any]:
    """How often each ranking's top valid candidate is among the truly best ones.

    ``oracle``, ``valid`` and every ``scores[name]`` are (S, N). The truly best
    candidates of a state are the valid ones within ``tolerance`` of its best
    oracle value (rollouts are noisy). Only states whose valid candidates differ
    in oracle value by more than ``tolerance`` count: elsewhere every pick is
    right. ``random`` is the expected hit rate of a uniform pick.
    """
    o = np.where(valid, oracle, -np.inf)
    best = o.max(1, keepdims=True)
    truly_best = valid & (o >= best - tolerance)
    informative = _spread(oracle, valid) > tolerance
    report: dict[str, Any] = {"states": int(len(oracle)), "informative_states": int(informative.sum())}
    if not informative.any():
        return report
    tb, ok, orc = truly_best[informative], valid[informative], oracle[informative]
    rows = np.arange(len(tb))
    report["top1_hit_rate"] = {"random": round(float((tb.sum(1) / ok.sum(1)).mean()), 4)}
    report["oracle_value_of_pick"] = {
        "random": round(float((np.where(ok, orc, 0).sum(1) / ok.sum(1)).mean()), 4),
        "best": round(float(best[informative].mean()), 4),
    }
    for name, s in scores.items():
        pick = np.where(ok, s[informative], -np.inf).argmax(1)
        report["top1_hit_rate"][name] = round(float(tb[rows, pick].mean()), 4)
        report["oracle_value_of_pick"][name] = round(float(orc[rows, pick].mean()), 4)
    return report


def _spread(values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """(S,) the best minus the worst value among each state's valid candidates."""
    return np.where(valid, values, -np.inf).max(1) - np.where(valid, values, np.inf).min(1)


def behaviour_report(oracle: np.ndarray, behaviour: np.ndarray, valid: np.ndarray, tolerance: float,
                     task_sets: np.ndarray) -> dict[str, dict[str, float | int]]:  # fmt: skip
    """Per task set: of the sampled states whose candidates differ in true value, the share where the behaviour values do not.

    ``behaviour`` is :func:`behaviour_values` of the states, ``oracle`` their
    true values (:func:`candidate_values`). A flat state is one where the
    policy that collected the data fails after every candidate alike, so
    Digi-Q's objective, one step of improvement on that policy, prefers none
    of them, the right one included.
    """
    informative = _spread(oracle, valid) > tolerance
    flat = _spread(behaviour, valid) <= 0.0
    out: dict[str, dict[str, float | int]] = {}
    for ts in ("all", *np.unique(task_sets)):
        mask = informative & ((task_sets == ts) if ts != "all" else True)
        if mask.any():
            out[str(ts)] = {"states": int(mask.sum()), "flat": round(float(flat[mask].mean()), 4)}
    return out


def _expert_hits(right: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(S, N) valid, (S, N) valid and expert-equivalent, and (S,) informative: states with both such and other valid candidates.

    Elsewhere every pick is alike, so the expert-pick diagnostics count only the informative states.
    """
    ok = np.asarray(valid, bool)
    hit = np.asarray(right, bool) & ok
    return ok, hit, hit.any(1) & (ok & ~hit).any(1)


def _top_valid(scores: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """(S,) the column of each state's highest-scored valid candidate."""
    return np.where(ok, scores, -np.inf).argmax(1)


def expert_pick_report(right: np.ndarray, valid: np.ndarray, scores: dict[str, np.ndarray],
                       groups: np.ndarray) -> dict[str, Any]:  # fmt: skip
    """How often each ranking's top valid candidate does what the simulator's expert would, per group of states.

    ``right`` (S, N) marks the expert-equivalent candidates
    (:func:`expert_equivalent`), ``valid`` (S, N) the ones that parse, and
    ``groups`` (S,) names each state's group (its task set). Only states whose
    valid candidates include both right and wrong ones count: elsewhere every
    pick is alike. Unlike :func:`ranking_report` it needs no rollouts, so it
    covers every stored state rather than a sample of a few hundred, at the
    price of judging by the expert's next action instead of the true value.
    ``random`` is the expected rate of a uniform pick among the valid ones.
    """
    ok, hit, informative = _expert_hits(right, valid)
    report: dict[str, Any] = {"states": int(len(hit)), "informative_states": int(informative.sum())}
    rates = {"random": hit.sum(1) / np.maximum(ok.sum(1), 1)}
    for name, s in scores.items():
        rates[name] = hit[np.arange(len(hit)), _top_valid(s, ok)].astype(float)
    groups = np.asarray(groups)
    for group in ["all", *sorted(set(groups.tolist()))]:
        mask = informative & (np.ones(len(hit), bool) if group == "all" else groups == group)
        if mask.any():
            report["hit_rate" + ("" if group == "all" else f"_{group}")] = {
                name: round(float(r[mask].mean()), 4) for name, r in rates.items()
            }
    return report


def action_kinds(action_lists: Sequence[Sequence[str]]) -> np.ndarray:
    """(S, N) str: each candidate's kind of action (``DUAL_POINT``, ``PRESS_BACK`` ...), ``invalid`` where it does not parse."""
    return np.array([[a.type.name if a.is_valid else "invalid" for a in map(parse_action, row)]
                     for row in action_lists])  # fmt: skip


def wrong_pick_report(right: np.ndarray, valid: np.ndarray, scores: Sequence[np.ndarray], kinds: np.ndarray,
                      expert_kinds: np.ndarray, task_sets: np.ndarray) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Per task set: where a ranking's top pick is not the expert's, which kind of action it picks instead.

    Over the informative states (as in :func:`expert_pick_report`) whose
    top valid candidate under ``scores`` (one (S, N) array per seed, pooled)
    is not an expert's: the share of those picks of each kind (``kinds``,
    :func:`action_kinds`), beside the kind of the data's own action (column
    0) and of the expert's (``expert_kinds``, (S,)) at the same states. A
    kind the critic picks far more often than the expert takes it is a bias
    of the critic, not noise: a conservative term raises Q of whatever the
    data took, so the base's commonest slip (Back) rises with it (README,
    results).
    """
    ok, hit, informative = _expert_hits(right, valid)
    rows, kinds, task_sets = np.arange(len(hit)), np.asarray(kinds), np.asarray(task_sets)
    frames = []
    for s in scores:
        pick = _top_valid(s, ok)
        wrong = informative & ~hit[rows, pick]
        frames.append(pd.DataFrame({"task_set": task_sets[wrong], "critic": kinds[rows, pick][wrong],
                                    "data": kinds[wrong, 0], "expert": np.asarray(expert_kinds)[wrong]}))  # fmt: skip
    out: dict[str, dict[str, Any]] = {}
    for ts, picks in pd.concat(frames).groupby("task_set"):
        shares = {column: picks[column].value_counts(normalize=True) for column in ("critic", "data", "expert")}
        kinds_seen = set().union(*(x.index for x in shares.values()))
        names = sorted(kinds_seen, key=lambda k: (-shares["critic"].get(k, 0.0), k))  # most picked first
        out[str(ts)] = {"wrong_picks": round(len(picks) / len(scores), 1),
                        "kinds": {str(k): {c: round(float(x.get(k, 0.0)), 4) for c, x in shares.items()}
                                  for k in names}}  # fmt: skip
    return out


def group_masks(task_sets: np.ndarray, groups: np.ndarray) -> Iterator[tuple[str, str, np.ndarray]]:
    """Each (task set, group) pair present, in sorted order, with the mask of its states."""
    task_sets, groups = np.asarray(task_sets), np.asarray(groups)
    for ts, group in sorted(set(zip(task_sets.tolist(), groups.tolist(), strict=True))):
        yield ts, group, (task_sets == ts) & (groups == group)


def support_report(right: np.ndarray, task_sets: np.ndarray, groups: np.ndarray) -> dict[str, dict[str, Any]]:
    """Per task set and group: how often the data's action, and any stored candidate, does what the expert would.

    ``right`` (S, N) marks the expert-equivalent candidates
    (:func:`expert_equivalent`), column 0 being the data's own action. An
    offline method learns only what the data hold: where no candidate does
    what the expert would, no critic can pick it and no actor can imitate it,
    so a family whose states rarely have one stays where the base left it,
    whatever the method (README, results: "Where the data can teach").
    ``groups`` labels each state: its task family, or the kind of the
    expert's action there (:func:`expert_kind`), which shows what the base
    never samples (Home where it is lost in the wrong app).
    """
    hit = np.asarray(right, bool)
    out: dict[str, dict[str, Any]] = {}
    for ts, group, mask in group_masks(task_sets, groups):
        out.setdefault(ts, {})[group] = {"states": int(mask.sum()),
                                         "taken_is_expert": round(float(hit[mask, 0].mean()), 4),
                                         "expert_candidate": round(float(hit[mask].any(1).mean()), 4)}  # fmt: skip
    return out


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
                 episodes: np.ndarray, *, seed: int, hidden: int = 256, epochs: int = 40) -> np.ndarray:  # fmt: skip
    """Scores (S, N) from the critic's inputs, fit to the expert's choices, cross-fitted over two halves of episodes.

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
    """
    ok = torch.as_tensor(np.asarray(valid, bool))
    hit = torch.as_tensor(np.asarray(right, bool)) & ok
    informative = (hit.any(1) & (ok & ~hit).any(1)).numpy()
    s, c = torch.as_tensor(np.asarray(state)), torch.as_tensor(np.asarray(candidates))
    rng = np.random.default_rng(seed)
    ids = np.unique(episodes)
    half = np.isin(episodes, rng.permutation(ids)[: len(ids) // 2])
    scores = np.zeros(ok.shape, np.float32)

    def logits(net: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
        x = torch.cat([s[idx][:, None].expand(-1, c.shape[1], -1), c[idx]], -1)
        return net(x)[..., 0].masked_fill(~ok[idx], -1e9)

    with torch.random.fork_rng():
        for fit in (half, ~half):
            torch.manual_seed(seed)
            net = mlp(s.shape[1] + c.shape[2], hidden)
            opt = torch.optim.AdamW(net.parameters(), lr=3e-4, weight_decay=1e-2)
            train = np.flatnonzero(fit & informative)
            for _ in range(epochs if len(train) else 0):
                for batch in np.array_split(rng.permutation(train), max(1, len(train) // 64)):
                    idx = torch.as_tensor(batch)
                    target = hit[idx].float() / hit[idx].sum(1, keepdim=True)
                    loss = -(target * torch.log_softmax(logits(net, idx), 1)).sum(1).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            with torch.no_grad():
                held = torch.as_tensor(np.flatnonzero(~fit))
                scores[~fit] = logits(net, held).numpy()
    return scores
