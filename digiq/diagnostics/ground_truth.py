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
objective prefers the right candidate at all. :func:`expert_equivalent` marks
the candidates that do what the noiseless expert would do next.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from digiq.config import EnvConfig
from digiq.data.trajectories import observation_text
from digiq.env.actions import Action, ActionType, parse_action
from digiq.env.catalog import stable_int
from digiq.env.device import SimDevice
from digiq.env.expert import Expert, next_action
from digiq.env.gym_env import AndroidSimEnv
from digiq.env.hierarchy import describe, hierarchy_xml
from digiq.env.state import DeviceState, Dynamics
from digiq.env.tasks import Task, parse_task
from digiq.noise import noise_key
from digiq.rollout import Policy, RolloutBatch, episode_seed

__all__ = [
    "replay",
    "candidate_values",
    "stored_state_values",
    "behaviour_values",
    "expert_equivalent",
    "expert_kind",
    "expert_matrix",
]

_ENDING = (ActionType.STATUS_TASK_COMPLETE, ActionType.STATUS_TASK_IMPOSSIBLE)


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
    seed: int  # the copy's device seed, which also keys the policy's sampling noise in this branch
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
                branch_seed = stable_int("behaviour", seed, j, c, r)
                branches.append(_Branch(j, text, device.clone(seed=branch_seed), branch_seed, task, [*earlier, text],
                                        task.max_steps - len(earlier), action))  # fmt: skip
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
            noise = [noise_key(b.seed, b.taken) for b in chunk]  # the branch's own draws, whatever the chunk
            for b, text in zip(chunk, policy.act(RolloutBatch(shots, prompts, [], noise)), strict=True):
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

    Stage 08 groups its support and keep diagnostics by it: a kind the base
    never samples, or one the critic never picks, shows up across families.
    """
    return next_action(device, task).type.name


def expert_matrix(env: EnvConfig, collect_seed: int, steps: pd.DataFrame,
                   cands: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(S, N): which candidates of each stored state do what the simulator's expert would there; (S,): its kind of action.

    Each collected episode is replayed once, and every state's candidates are
    checked on copies of it (:func:`expert_equivalent`). It
    feeds the perfect critic's rows and the expert-pick and support diagnostics.
    """
    right = np.zeros((len(steps), len(cands.action_list.iat[0])), bool)
    kinds = np.empty(len(steps), object)
    for _, traj in steps.groupby("traj_id", sort=True):
        traj = traj.sort_values("step_id")
        task = parse_task(traj.task.iat[0], traj.task_set.iat[0])
        device = replay(task, episode_seed(collect_seed, int(traj.traj_id.iat[0])), [], Dynamics.of(env), env.width)
        for i, action in zip(traj.index, traj.action, strict=True):
            right[i] = expert_equivalent(device, task, list(cands.action_list.iat[i]))
            kinds[i] = expert_kind(device, task)
            device.step(parse_action(action))
    return right, kinds.astype(str)
