"""Roll policies out on many simulated devices at once; record trajectories.

Used by collection (stage 01) and evaluation (stage 08). A policy sees a batch
of screenshots and AutoUI text prompts and answers with AutoUI action
strings; the scripted expert also gets the envs (its privileged view).
Finished trajectories are written in parts, so an interrupted collection
keeps what it finished and resumes after it.

Envs come from ``env_factory`` (default: in-process simulated phones); envs
on devices over adb are stepped from threads, so a pool of devices works in
parallel. A device fault ends the episode without writing it and the episode
is started again, from its start and seed, on the next free device; a device
that cannot start an episode is retired and the others go on. Faults are
logged and, with a store, appended to ``faults.jsonl`` beside the data.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from tqdm.auto import tqdm

from digiq.data.trajectories import Step, TrajectoryStore, mc_returns, observation_text
from digiq.env.actions import format_action
from digiq.env.adb_env import DeviceFault
from digiq.env.catalog import stable_int
from digiq.env.expert import Expert
from digiq.env.gym_env import AndroidSimEnv, PhoneEnv
from digiq.env.hierarchy import describe
from digiq.env.state import Dynamics
from digiq.env.tasks import Task

__all__ = [
    "RolloutBatch", "Policy", "ExpertPolicy", "EpisodeResult", "rollout", "episode_seed", "success_by", "FAULTS_FILE"
]  # fmt: skip

log = logging.getLogger(__name__)
FAULTS_FILE = "faults.jsonl"


@dataclass(frozen=True)
class RolloutBatch:
    screenshots: np.ndarray  # (B, H, W, 3) uint8
    observations: list[str]  # AutoUI prompts
    envs: list[PhoneEnv]  # for privileged policies only; models must not look


class Policy(Protocol):
    def act(self, batch: RolloutBatch) -> list[str]: ...


class ExpertPolicy:
    """The scripted expert as a :class:`Policy` (one noise stream per env slot).

    With ``plan``, actions carry AutoUI's full "Action Plan" (the types still to
    come); without, just the current type, which is shorter and easier to imitate.
    """

    def __init__(self, noise: float = 0.0, seed: int = 0, plan: bool = False) -> None:
        self.noise, self.seed, self.plan = noise, seed, plan
        self._experts: dict[int, Expert] = {}

    def act(self, batch: RolloutBatch) -> list[str]:
        out = []
        for env in batch.envs:
            ex = self._experts.setdefault(
                id(env), Expert(self.noise, stable_int("expert", self.seed, len(self._experts)))
            )
            assert env.task is not None
            action = ex.act(env.device, env.task)
            out.append(format_action(action, ex.plan(env.device, env.task) if self.plan else None))
        return out


@dataclass(frozen=True)
class EpisodeResult:
    index: int
    task: str
    task_set: str
    family: str
    success: bool
    steps: int


def success_by(rows: Sequence, key: str) -> dict[str, float]:
    """Success rate per value of ``key`` over episode records (anything with ``.success`` and ``key``)."""
    groups: dict[str, list[bool]] = {}
    for r in rows:
        groups.setdefault(getattr(r, key), []).append(bool(r.success))
    return {k: round(sum(v) / len(v), 4) for k, v in sorted(groups.items())}


def episode_seed(seed: int, index: int) -> int:
    """The device seed of episode ``index``: fixed, so a resumed or repeated run replays the same devices."""
    return stable_int("episode", seed, index)


def rollout(
    policy: Policy,
    tasks: Sequence[Task],
    *,
    n_envs: int = 16,
    seed: int = 0,
    dynamics: Dynamics | None = None,
    width: int = 216,
    gamma: float = 0.95,
    store: TrajectoryStore | None = None,
    part_size: int = 64,
    desc: str = "rollout",
    env_factory: Callable[[], PhoneEnv] | None = None,
    max_faults: int = 3,
    screen_text: bool = False,
    hierarchies: bool = False,
) -> list[EpisodeResult]:
    """Run one episode per task, ``n_envs`` at a time.

    With ``store``, every trajectory is written (screenshots as PNG, steps as
    Parquet parts of ``part_size`` trajectories) and tasks already stored are
    skipped, so re-running after an interruption resumes.

    ``env_factory`` makes each env (one device each; see
    :class:`digiq.env.backends.EnvFactory`); by default in-process simulated
    phones with ``dynamics`` and ``width``. An episode is restarted after a
    device fault up to ``max_faults - 1`` times, then given up (and logged).
    With ``screen_text``, prompts end with the screen's elements as text
    (:func:`~digiq.env.hierarchy.describe` of the env's view hierarchy), for a policy that reads them.
    With ``hierarchies`` and ``store``, each screen's view hierarchy is stored
    beside its screenshot (:meth:`TrajectoryStore.save_hierarchy`), for a
    critic that reads what each tap lands on.

    Raises:
        RuntimeError: every device failed while episodes remained (those finished are stored).
    """
    start = store.n_trajectories() if store is not None else 0
    make = env_factory if env_factory is not None else (lambda: AndroidSimEnv(dynamics=dynamics, width=width))
    envs = [make() for _ in range(min(n_envs, max(1, len(tasks) - start)))]
    slots: list[dict | None] = [None] * len(envs)
    retired: set[int] = set()
    results: list[EpisodeResult] = []
    pending: list[Step] = []
    next_index = start
    again: deque[int] = deque()  # episodes to start again after a device fault
    faults: Counter[int] = Counter()
    bar = tqdm(total=len(tasks), initial=start, desc=desc, leave=False)
    threads = ThreadPoolExecutor(len(envs)) if any(e.parallel_steps for e in envs) else None

    keep_xml = hierarchies and store is not None

    def read(env: PhoneEnv, actions: list[str], task: Task) -> tuple[str, tuple[str, tuple[int, int]] | None]:
        """The policy's prompt at the current screen, and the screen's (hierarchy, size) when it is stored."""
        if not (screen_text or keep_xml):
            return observation_text(actions, task.instruction), None
        xml, size = env.view_hierarchy(), env.screen_size()
        screen = describe(xml, size) if screen_text else None
        return observation_text(actions, task.instruction, screen=screen), (xml, size) if keep_xml else None

    def take() -> int | None:
        nonlocal next_index
        if again:
            return again.popleft()
        if next_index < len(tasks):
            next_index += 1
            return next_index - 1
        return None

    def fault(i: int, index: int, step: int, reason: str) -> None:
        faults[index] += 1
        then = "restarted" if faults[index] < max_faults else "abandoned"
        if then == "restarted":
            again.append(index)
        device = getattr(envs[i], "serial", f"env {i}")
        log.warning("episode %d on %s, step %d: %s; %s", index, device, step, reason, then)
        if store is not None:
            store.root.mkdir(parents=True, exist_ok=True)
            record = {"episode": index, "task": tasks[index].instruction, "device": device, "step": step}
            with open(store.root / FAULTS_FILE, "a", encoding="utf-8") as f:
                f.write(json.dumps({**record, "fault": reason, "then": then}) + "\n")

    def retire(i: int) -> None:
        slots[i] = None
        retired.add(i)
        envs[i].close()

    def begin(i: int) -> None:
        index = take()
        if index is None:
            slots[i] = None
            return
        task = tasks[index]
        try:
            obs, _ = envs[i].reset(seed=episode_seed(seed, index), options={"task": task})
            first, xml = read(envs[i], [], task)
        except DeviceFault as e:
            fault(i, index, 0, str(e))
            retire(i)  # a device that cannot even start an episode is out of the pool
            return
        slots[i] = {
            "index": index,
            "task": task,
            "shots": [obs["screenshot"]],
            "actions": [],
            "rewards": [],
            "valid": [],
            "prompts": [first],
            "hierarchies": [xml],
        }

    def finish(slot: dict, success: bool) -> None:
        nonlocal pending
        results.append(
            EpisodeResult(
                slot["index"],
                slot["task"].instruction,
                slot["task"].task_set,
                slot["task"].family,
                success,
                len(slot["actions"]),
            )
        )
        if store is not None:
            pending += _steps(store, slot, gamma)
            if len({s.traj_id for s in pending}) >= part_size:
                store.write_part(pending)
                pending = []
        bar.update(1)

    try:
        for i in range(len(envs)):
            begin(i)
        while any(s is not None for s in slots):
            live = [i for i, s in enumerate(slots) if s is not None]
            batch = RolloutBatch(
                np.stack([slots[i]["shots"][-1] for i in live]),
                [slots[i]["prompts"][-1] for i in live],
                [envs[i] for i in live],
            )
            actions = policy.act(batch)
            if len(actions) != len(live):
                raise ValueError(f"the policy answered {len(actions)} actions for {len(live)} observations")
            stepped: list[Any] = list(
                threads.map(lambda i, a: envs[i].step(a), live, actions)
                if threads is not None
                else (envs[i].step(a) for i, a in zip(live, actions))
            )
            for i, action, (obs, reward, term, trunc, info) in zip(live, actions, stepped, strict=True):
                slot = slots[i]
                if info.get("fault"):
                    fault(i, slot["index"], len(slot["actions"]), info["fault"])
                    if info.get("gone"):
                        retire(i)
                    else:
                        begin(i)
                    continue
                try:
                    text, xml = read(envs[i], [*slot["actions"], action], slot["task"])
                except DeviceFault as e:  # the step happened, but the screen cannot be read: start the episode again
                    fault(i, slot["index"], len(slot["actions"]) + 1, str(e))
                    begin(i)
                    continue
                slot["actions"].append(action)
                slot["rewards"].append(reward)
                slot["valid"].append(info["valid"])
                slot["shots"].append(obs["screenshot"])
                slot["prompts"].append(text)
                slot["hierarchies"].append(xml)
                if term or trunc:
                    finish(slot, bool(reward))
                    begin(i)
            for i, slot in enumerate(slots):  # idle devices pick up episodes put back by a fault
                if slot is None and i not in retired and (again or next_index < len(tasks)):
                    begin(i)
    finally:
        if threads is not None:
            threads.shutdown()
    if store is not None and pending:
        store.write_part(pending)
    bar.close()
    left = len(again) + len(tasks) - next_index
    if left:
        raise RuntimeError(
            f"every device failed with {left} episode(s) left; {len(results)} finished"
            + (f" and are stored in {store.root} (faults in {FAULTS_FILE})" if store is not None else "")
        )
    return sorted(results, key=lambda r: r.index)


def _steps(store: TrajectoryStore, slot: dict, gamma: float) -> list[Step]:
    """Save a finished trajectory's screenshots and turn it into step records."""
    traj, task = slot["index"], slot["task"]
    names = [store.image_name(traj, t) for t in range(len(slot["shots"]))]
    for name, shot, hierarchy in zip(names, slot["shots"], slot["hierarchies"], strict=True):
        if hierarchy is not None:  # before the image: a stored screenshot always has its hierarchy beside it
            store.save_hierarchy(name, *hierarchy)
        store.save_image(name, shot)
    rets = mc_returns(slot["rewards"], gamma)
    total = float(sum(slot["rewards"]))
    n = len(slot["actions"])
    return [
        Step(
            traj_id=traj,
            step_id=t,
            task=task.instruction,
            task_set=task.task_set,
            family=task.family,
            observation=slot["prompts"][t],
            next_observation=slot["prompts"][t + 1],
            image_path=names[t],
            next_image_path=names[t + 1],
            action=slot["actions"][t],
            valid=slot["valid"][t],
            reward=slot["rewards"][t],
            done=t == n - 1,
            mc_return=rets[t],
            trajectory_reward=total,
        )
        for t in range(n)
    ]
