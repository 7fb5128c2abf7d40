"""Roll policies out on many simulated devices at once; record trajectories.

Used by collection (stage 01) and evaluation (stage 12). A policy sees a batch
of screenshots and AutoUI text prompts and answers with AutoUI action
strings; the scripted expert also gets the envs (its privileged view).
Finished trajectories are written in parts, so an interrupted collection
keeps what it finished and resumes after it.

Envs come from ``env_factory`` (default: in-process simulated phones); envs
on devices over adb are stepped from threads, and a cluster's devices by one
call per host, so a pool of devices works in parallel. A device fault ends the episode without writing it and the episode
is started again, from its start and seed, on the next free device; a device
that cannot start an episode is retired and the others go on. A step the
success judge could not judge is a fault of its episode alone: started again
the same way, or (``judge.bad_reply: fail``) ended there as failed. Faults are
logged and, with a store, appended to ``faults.jsonl`` beside the data.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from digiq.cluster import RemoteEnv, cluster_devices, connect, device_nodes, step_on_hosts
from digiq.config import ComputeConfig, DeviceConfig, EnvConfig, JudgeConfig
from digiq.data.trajectories import Step, TrajectoryStore, mc_returns, observation_text
from digiq.env.actions import format_action
from digiq.env.adb_env import DeviceFault
from digiq.env.backends import EnvFactory
from digiq.env.catalog import stable_int
from digiq.env.expert import Expert
from digiq.env.gym_env import AndroidSimEnv, PhoneEnv
from digiq.env.hierarchy import describe
from digiq.env.state import Dynamics
from digiq.env.tasks import Task
from digiq.io import write_error
from digiq.judge import evaluator_for
from digiq.noise import noise_key
from digiq.progress import Progress, progress

__all__ = [
    "RolloutBatch", "Policy", "ExpertPolicy", "EpisodeResult", "rollout", "device_pool", "episode_seed", "success_by",
    "FAULTS_FILE",
]  # fmt: skip

log = logging.getLogger(__name__)
FAULTS_FILE = "faults.jsonl"


@dataclass(frozen=True)
class RolloutBatch:
    screenshots: np.ndarray  # (B, H, W, 3) uint8
    observations: list[str]  # AutoUI prompts
    envs: list[PhoneEnv]  # for privileged policies only; models must not look
    noise: list[int]  # a sampling-noise key per row (digiq.noise): a row's action does not depend on the others


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
    abandoned: bool = False  # given up after device faults: counted as a failure, never left out
    # The device's own check at the end, where an evaluator decided ``success`` (digiq.pae.evaluators.JudgedEnv):
    # for reports only. None where the device decided, or cannot check the task.
    ground_truth: bool | None = None


def success_by(rows: Sequence, key: str) -> dict[str, float]:
    """Success rate per value of ``key`` over episode records (anything with ``.success`` and ``key``)."""
    groups: dict[str, list[bool]] = {}
    for r in rows:
        groups.setdefault(getattr(r, key), []).append(bool(r.success))
    return {k: round(sum(v) / len(v), 4) for k, v in sorted(groups.items())}


def episode_seed(seed: int, index: int) -> int:
    """The device seed of episode ``index``: fixed, so a resumed or repeated run replays the same devices."""
    return stable_int("episode", seed, index)


@dataclass
class Episode:
    """An episode under way on one device: what each step saw, did and earned."""

    index: int  # into the task list: the episode's id and its device seed
    task: Task
    shots: list[np.ndarray]  # one more than actions: the screen after the last action too
    prompts: list[str]  # the policy's prompt at each screen
    hierarchies: list[tuple[str, tuple[int, int]] | None]  # each screen's (view hierarchy, size), when stored
    actions: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    valid: list[bool] = field(default_factory=list)
    ground_truth: bool | None = None  # the last step's ``info["ground_truth"]``, where the env reports one


class _Rollouts:
    """Episodes scheduled on a pool of devices: which starts where, faults and restarts, and finished ones stored.

    Episodes start in task order; one a device fault ends goes back to the
    front of the queue and starts again from its start and seed, on another
    device when one is free, at most ``max_faults`` times, after which it is
    a counted failure (``abandoned``). A device that cannot start an episode,
    or faults in ``max_faults`` episodes in a row, is retired.
    """

    def __init__(self, tasks: Sequence[Task], envs: list[PhoneEnv], *, todo: Sequence[int], seed: int, gamma: float,
                 store: TrajectoryStore | None, part_size: int, max_faults: int, screen_text: bool,
                 hierarchies: bool, bar: Progress) -> None:  # fmt: skip
        self.tasks, self.envs, self.seed, self.gamma = tasks, envs, seed, gamma
        self.store, self.part_size, self.max_faults, self.bar = store, part_size, max_faults, bar
        self.screen_text, self.keep_xml = screen_text, hierarchies and store is not None
        self.episodes: list[Episode | None] = [None] * len(envs)  # per device
        self.retired: set[int] = set()
        self.results: list[EpisodeResult] = []
        self.pending: list[Step] = []  # finished steps not yet written as a part
        self.todo: deque[int] = deque(todo)  # episodes not started yet, in task order
        self.again: deque[int] = deque()  # episodes to start again after a device fault
        self.faults: Counter[int] = Counter()  # per episode
        self.faulted_on: dict[int, int] = {}  # episode -> the device its last fault was on
        self.in_a_row: Counter[int] = Counter()  # per device: episodes in a row that ended in a fault

    def read(self, env: PhoneEnv, actions: list[str], task: Task) -> tuple[str, tuple[str, tuple[int, int]] | None]:
        """The policy's prompt at the current screen, and the screen's (hierarchy, size) when it is stored."""
        if not (self.screen_text or self.keep_xml):
            return observation_text(actions, task.instruction), None
        xml, size = env.view_hierarchy(), env.screen_size()
        screen = describe(xml, size) if self.screen_text else None
        return observation_text(actions, task.instruction, screen=screen), (xml, size) if self.keep_xml else None

    def waiting(self) -> bool:
        """Whether an episode is left to start (a new one, or one a fault put back)."""
        return bool(self.again) or bool(self.todo)

    def _take(self, i: int) -> int | None:
        """The episode device ``i`` starts: first one a fault put back, unless that fault was on ``i`` while
        another device is in the pool to take it (then a new episode, or none until another device frees up)."""
        others = any(j != i and j not in self.retired for j in range(len(self.envs)))
        for index in self.again:
            if self.faulted_on.get(index) != i or not others:
                self.again.remove(index)
                return index
        return self.todo.popleft() if self.todo else None

    def fault(self, i: int, index: int, step: int, reason: str) -> None:
        """Log device ``i``'s fault in episode ``index``; the episode starts again unless it failed too often."""
        self.faults[index] += 1
        self.faulted_on[index] = i
        self.in_a_row[i] += 1
        then = "restarted" if self.faults[index] < self.max_faults else "abandoned"
        if then == "restarted":
            self.again.append(index)
        else:
            task = self.tasks[index]
            self.results.append(EpisodeResult(index, task.instruction, task.task_set, task.family, False, step, True))
            self.bar.update(1)
        self.log_fault(i, index, step, reason, then)

    def log_fault(self, i: int, index: int, step: int, reason: str, then: str) -> None:
        """Write a fault and what became of its episode to the log and to ``faults.jsonl``."""
        device = getattr(self.envs[i], "serial", f"env {i}")
        log.warning("episode %d on %s, step %d: %s; %s", index, device, step, reason, then)
        if self.store is not None:
            self.store.root.mkdir(parents=True, exist_ok=True)
            record = {"episode": index, "task": self.tasks[index].instruction, "device": device, "step": step}
            path = self.store.root / FAULTS_FILE
            try:
                with open(path, "a", encoding="utf-8") as f:
                    f.write(json.dumps({**record, "fault": reason, "then": then}) + "\n")
            except OSError as e:  # a full disk: the write's error names no file
                raise write_error(path, e) from None

    def retire(self, i: int) -> None:
        self.episodes[i] = None
        self.retired.add(i)
        self.envs[i].close()

    def begin(self, i: int) -> None:
        """Start the next waiting episode on device ``i`` (or leave it idle when none is left)."""
        # A device that keeps failing is out: its episodes go elsewhere. So is one known to be gone (on a cluster
        # node that was lost), before it costs an episode a fault.
        if self.in_a_row[i] >= self.max_faults or self.envs[i].gone:
            self.retire(i)
            return
        index = self._take(i)
        if index is None:
            self.episodes[i] = None
            return
        task = self.tasks[index]
        try:
            obs, _ = self.envs[i].reset(seed=episode_seed(self.seed, index), options={"task": task})
            first, xml = self.read(self.envs[i], [], task)
        except DeviceFault as e:
            self.fault(i, index, 0, str(e))
            self.retire(i)  # a device that cannot even start an episode is out of the pool
            return
        self.episodes[i] = Episode(index, task, [obs["screenshot"]], [first], [xml])

    def record(self, i: int, action: str, stepped: tuple[Any, ...]) -> None:
        """Device ``i``'s step: append it to its episode, or handle its fault; start the next episode at the end."""
        episode = self.episodes[i]
        assert episode is not None
        obs, reward, term, trunc, info = stepped
        if info.get("fault"):
            self.fault(i, episode.index, len(episode.actions), info["fault"])
            if info.get("gone"):
                self.retire(i)
            else:
                self.begin(i)
            return
        try:
            text, xml = self.read(self.envs[i], [*episode.actions, action], episode.task)
        except DeviceFault as e:  # the step happened, but the screen cannot be read: start the episode again
            self.fault(i, episode.index, len(episode.actions) + 1, str(e))
            self.begin(i)
            return
        if info.get("verdict_fault"):  # no verdict for this step, counted as the episode's failure
            self.log_fault(i, episode.index, len(episode.actions) + 1, info["verdict_fault"], "counted failed")
        episode.actions.append(action)
        episode.rewards.append(reward)
        episode.valid.append(info["valid"])
        episode.shots.append(obs["screenshot"])
        episode.prompts.append(text)
        episode.hierarchies.append(xml)
        episode.ground_truth = info.get("ground_truth")
        if term or trunc:
            self.finish(i, episode, bool(reward))
            self.begin(i)

    def finish(self, i: int, episode: Episode, success: bool) -> None:
        """Count device ``i``'s finished episode and store its steps, a part at a time."""
        self.in_a_row[i] = 0
        task = episode.task
        self.results.append(EpisodeResult(episode.index, task.instruction, task.task_set, task.family, success,
                                          len(episode.actions), ground_truth=episode.ground_truth))  # fmt: skip
        if self.store is not None:
            self.pending += _steps(self.store, episode, self.gamma)
            if len({s.traj_id for s in self.pending}) >= self.part_size:
                self.store.write_part(self.pending)
                self.pending = []
        self.bar.update(1)

    def flush(self) -> None:
        """Write the finished steps of a last, partial part."""
        if self.store is not None and self.pending:
            self.store.write_part(self.pending)
            self.pending = []


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
    Parquet parts of ``part_size`` trajectories, trajectory id = the task's
    index), also when the run ends by an exception, and the tasks whose ids
    are stored are skipped: re-running after an interruption runs exactly the
    missing ones. A kill loses only the episodes not yet in a part.

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
    stored = store.stored_ids() if store is not None else set()
    todo = [i for i in range(len(tasks)) if i not in stored]
    make = env_factory if env_factory is not None else (lambda: AndroidSimEnv(dynamics=dynamics, width=width))
    envs = [make() for _ in range(min(n_envs, max(1, len(todo))))]
    bar = progress(total=len(tasks), initial=len(tasks) - len(todo), desc=desc)
    run = _Rollouts(tasks, envs, todo=todo, seed=seed, gamma=gamma, store=store, part_size=part_size,
                    max_faults=max_faults, screen_text=screen_text, hierarchies=hierarchies, bar=bar)  # fmt: skip
    threads = ThreadPoolExecutor(len(envs)) if any(e.parallel_steps for e in envs) else None
    try:
        for i in range(len(envs)):
            run.begin(i)
        while any(e is not None for e in run.episodes):
            live = [i for i, e in enumerate(run.episodes) if e is not None]
            episodes = [run.episodes[i] for i in live]
            # Each step's noise is keyed by its episode's seed and the step: a restarted episode, or the same
            # episode of another policy of the same seed, draws the same noise there.
            noise = [noise_key(episode_seed(seed, e.index), len(e.prompts) - 1) for e in episodes]
            batch = RolloutBatch(np.stack([e.shots[-1] for e in episodes]), [e.prompts[-1] for e in episodes],
                                 [envs[i] for i in live], noise)  # fmt: skip
            actions = policy.act(batch)
            if len(actions) != len(live):
                raise ValueError(f"the policy answered {len(actions)} actions for {len(live)} observations")
            stepped = _step_all([envs[i] for i in live], actions, threads)
            for i, action, result in zip(live, actions, stepped, strict=True):
                run.record(i, action, result)
            for i, episode in enumerate(run.episodes):  # idle devices pick up episodes put back by a fault
                if episode is None and i not in run.retired and run.waiting():
                    run.begin(i)
    finally:  # whatever ended the run, the episodes it finished are written
        if threads is not None:
            threads.shutdown()
        run.flush()
        bar.close()
    left = len(run.again) + len(run.todo)
    if left:
        raise RuntimeError(
            f"every device failed with {left} episode(s) left; {sum(not r.abandoned for r in run.results)} finished"
            + (f" and are stored in {store.root} (faults in {FAULTS_FILE})" if store is not None else "")
        )
    return sorted(run.results, key=lambda r: r.index)


def _step_all(envs: list[PhoneEnv], actions: list[str], threads: ThreadPoolExecutor | None) -> list[Any]:
    """Step each env by its action; their steps, in order.

    Devices of a cluster's hosts are stepped by one call per host for all of its devices, every host's at once
    (:func:`digiq.cluster.step_on_hosts`): a call to a host takes longer than a simulated phone's step. Devices that
    wait on something outside this process are stepped from ``threads``, all at once; the others in turn.
    """
    remote = [env for env in envs if isinstance(env, RemoteEnv)]
    if len(remote) == len(envs):
        return step_on_hosts(remote, actions)
    if threads is not None:
        return list(threads.map(lambda env, action: env.step(action), envs, actions))
    return [env.step(action) for env, action in zip(envs, actions, strict=True)]


@contextmanager
def device_pool(devices: DeviceConfig, env: EnvConfig, judge: JudgeConfig, size: int,
                compute: ComputeConfig | None = None) -> Iterator[Callable[[], PhoneEnv]]:  # fmt: skip
    """An env factory cycling over ``size`` envs on ``devices``, reused by every rollout in the block.

    A device backend has only so many devices, so the envs are made once,
    each when a rollout first asks for it (one that asks for fewer opens no
    more), and handed out again in turn; success on a real emulator (or on
    ``adb-sim`` with ``judge.on_adb_sim``) is the VLM ``judge``'s verdict
    (:func:`digiq.judge.evaluator_for`). With
    ``compute.backend: ray`` they are the devices of every node of the
    cluster that offers some (:func:`digiq.cluster.cluster_devices`);
    simulated phones stay in this process where no node offers devices.
    """
    if compute is not None and compute.backend == "ray":
        connect(compute)
        if devices.backend != "sim" or device_nodes():
            with cluster_devices(compute, devices, env, judge, max(1, size)) as pool:
                yield pool
            return
    evaluator = evaluator_for(devices, judge)
    with EnvFactory(devices, Dynamics.of(env), env.width, evaluator) as factory:
        made: list[PhoneEnv] = []
        turn = itertools.count()

        def make() -> PhoneEnv:
            n = next(turn)
            if len(made) < max(1, size):
                made.append(factory())
            return made[n % len(made)]

        yield make


def _steps(store: TrajectoryStore, episode: Episode, gamma: float) -> list[Step]:
    """Save a finished trajectory's screenshots and turn it into step records."""
    traj, task = episode.index, episode.task
    names = [store.image_name(traj, t) for t in range(len(episode.shots))]
    for name, shot, hierarchy in zip(names, episode.shots, episode.hierarchies, strict=True):
        if hierarchy is not None:  # before the image: a stored screenshot always has its hierarchy beside it
            store.save_hierarchy(name, *hierarchy)
        store.save_image(name, shot)
    rets = mc_returns(episode.rewards, gamma)
    total = float(sum(episode.rewards))
    n = len(episode.actions)
    return [
        Step(
            traj_id=traj,
            step_id=t,
            task=task.instruction,
            task_set=task.task_set,
            family=task.family,
            observation=episode.prompts[t],
            next_observation=episode.prompts[t + 1],
            image_path=names[t],
            next_image_path=names[t + 1],
            action=episode.actions[t],
            valid=episode.valid[t],
            reward=episode.rewards[t],
            done=t == n - 1,
            mc_return=rets[t],
            trajectory_reward=total,
        )
        for t in range(n)
    ]
