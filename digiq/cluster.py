"""Stages and rollouts on a Ray cluster: joining it, and the devices of its nodes (``compute.backend: ray``).

Two kinds of work leave the stage's process:

* **Jobs**: stages 05-10's independent jobs (one VLM's features, a critic or
  actor fit, an online run, an evaluation on the simulator), each a Ray task
  (:func:`digiq.workers.map_jobs`, which joins the cluster here).
  Jobs read their inputs from, and save checkpoints into, the repository's
  folder, so on several hosts that folder is shared at the same path
  (docs/cluster.md). A job saves whole files (written aside, then renamed),
  so one started again overwrites, never doubles, what the lost one began.
* **Devices** (this module): a rollout in the stage's process (collection, evaluation on
  devices) steps the devices of every node that offers some. A node offers
  ``N`` devices by the custom resource ``devices`` (``ray start --resources
  '{"devices": N}'``); :func:`cluster_devices` puts one :class:`DeviceHost`
  actor on each such node, which makes that node's devices (simulated
  phones, or emulators through that node's own adb server) and steps them
  when asked. The policy stays in the stage's process, which sees each
  device as a :class:`RemoteEnv`, and steps each host's devices by one call
  to it a step (:func:`step_on_hosts`). The rollout's device pool is then one
  pool over every host: an episode a fault ends starts again on another
  device, a device that keeps failing is retired, and a lost node is a
  fault of each of its devices (gone): its episodes under way start again
  elsewhere, from their start and seed, and the rest go on.

Every job and episode seeds itself, so the cluster computes what the local
backend computes: the same episodes and results, given the same number of
devices per rollout and the same threads per job (``compute.job_cpus``
against the local workers' share of the cores).
"""

from __future__ import annotations

import itertools
import logging
import socket
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from digiq.config import ComputeConfig, DeviceConfig, EnvConfig, JudgeConfig
from digiq.env.adb_env import DeviceFault
from digiq.env.gym_env import PhoneEnv
from digiq.kernels import pinned_environ

__all__ = [
    "DEVICES", "ClusterError", "connect", "live_nodes", "own_error", "device_nodes", "DeviceHost", "RemoteEnv",
    "step_on_hosts", "cluster_devices",
]  # fmt: skip

DEVICES = "devices"  # the custom resource by which a node offers its devices
START_TIMEOUT_S = 300.0  # how long the device hosts may take to start (a process each, importing torch)
_JOINED: str | None = None  # the address connect() joined, if it did
HINT = "start one with `ray start --head` (docs/cluster.md), or set compute.backend: local"


class ClusterError(RuntimeError):
    """No cluster, a cluster that cannot run what was asked, or a job lost more often than ``compute.retries``."""


def connect(compute: ComputeConfig) -> None:
    """Join the cluster at ``compute.address``, once per process.

    A later call naming another address leaves the cluster joined before for
    that one; a cluster this process joined by its own ``ray.init`` is kept.
    """
    global _JOINED
    import ray

    if ray.is_initialized():
        if _JOINED in (None, compute.address):
            return
        ray.shutdown()
    host, sep, port = compute.address.rpartition(":")
    if sep and port.isdigit() and "://" not in host:  # a head's address: ray.init would wait minutes for none there
        try:
            socket.create_connection((host, int(port)), timeout=10).close()
        except OSError as e:
            raise ClusterError(f"compute.backend ray: no Ray cluster at address {compute.address!r} ({e.strerror or e}); "
                               f"{HINT}") from None  # fmt: skip
    try:
        # Workers' output stays in the cluster's logs: a notebook shows the stage's own output only.
        # Jobs start pinned (digiq.kernels) with job_cpus threads, as the cluster's nodes are set up or not.
        env = {"env_vars": pinned_environ(compute.job_cpus)} if compute.pinned_kernels else None
        ray.init(address=compute.address, log_to_driver=False, logging_level=logging.WARNING, runtime_env=env)
    except ConnectionError as e:
        raise ClusterError(
            f"compute.backend ray: no Ray cluster at address {compute.address!r} ({e}); {HINT}"
        ) from None
    _JOINED = compute.address


def live_nodes() -> list[dict[str, Any]]:
    """The cluster's nodes that are alive, as ``ray.nodes()`` describes them."""
    import ray

    return [n for n in ray.nodes() if n["Alive"]]


def own_error(e: Any) -> BaseException:
    """A job's or a host's own error, as itself where Ray could rebuild it (else Ray's wrapper, which names it)."""
    return e.cause if isinstance(e.cause, BaseException) else e


def device_nodes() -> list[tuple[str, str, int]]:
    """The live nodes that offer devices: (node id, address, how many), in the cluster's order."""
    return [(n["NodeID"], n["NodeManagerAddress"], int(n["Resources"][DEVICES])) for n in live_nodes()
            if n["Resources"].get(DEVICES, 0) >= 1]  # fmt: skip


class DeviceHost:
    """One node's devices, made on that node and stepped for a rollout that runs elsewhere (a Ray actor).

    A rollout step's devices on this host are stepped by one call (:meth:`step_many`, from
    :func:`step_on_hosts`): each call is a round trip between processes, often on other nodes, which takes longer
    than a simulated phone's step. Device faults come back as values, per device, ``("fault", why, gone)`` beside ``("ok", result)``: the
    caller's :class:`RemoteEnv` raises them as :class:`~digiq.env.adb_env.DeviceFault` there, where the rollout
    handles them, and a device's fault leaves its batch mates' steps as they are.
    """

    def __init__(self, devices: DeviceConfig, env: EnvConfig, judge: JudgeConfig, count: int) -> None:
        from digiq.env.backends import EnvFactory
        from digiq.env.state import Dynamics
        from digiq.judge import evaluator_for

        self.factory = EnvFactory(devices, Dynamics.of(env), env.width, evaluator_for(devices, judge))
        self.envs: list[PhoneEnv] = [self.factory() for _ in range(count)]
        # Devices that wait on something outside this process (emulators over adb) are stepped from threads, as a
        # rollout steps such devices of its own machine: a batch of them then works in parallel.
        self.threads = ThreadPoolExecutor(count) if any(e.parallel_steps for e in self.envs) else None

    def serials(self) -> list[str]:
        return [getattr(e, "serial", f"phone{i}") for i, e in enumerate(self.envs)]

    @staticmethod
    def _guard(call: Callable[[], Any]) -> tuple[Any, ...]:
        try:
            return ("ok", call())
        except DeviceFault as e:
            return ("fault", str(e), e.gone)

    def reset(self, i: int, seed: int | None, options: dict[str, Any] | None) -> tuple[Any, ...]:
        return self._guard(lambda: self.envs[i].reset(seed=seed, options=options))

    def step_many(self, indices: Sequence[int], actions: Sequence[str]) -> list[tuple[Any, ...]]:
        """Step device ``indices[k]`` by ``actions[k]``, for each ``k``: each device's result or fault, in order."""
        if len(indices) != len(actions):
            raise ValueError(f"step_many: {len(actions)} actions for {len(indices)} devices")
        if len(set(indices)) != len(indices) or not all(0 <= i < len(self.envs) for i in indices):
            raise ValueError(f"step_many: devices {list(indices)} are not distinct devices of this host's "
                             f"{len(self.envs)}")  # fmt: skip

        def step(i: int, action: str) -> tuple[Any, ...]:
            return self._guard(lambda: self.envs[i].step(action))

        if self.threads is not None:
            return list(self.threads.map(step, indices, actions))
        return [step(i, action) for i, action in zip(indices, actions, strict=True)]

    def view_hierarchy(self, i: int) -> tuple[Any, ...]:
        return self._guard(self.envs[i].view_hierarchy)

    def screen_size(self, i: int) -> tuple[Any, ...]:
        return self._guard(self.envs[i].screen_size)

    def close(self, i: int) -> None:
        self.envs[i].close()

    def shutdown(self) -> None:
        if self.threads is not None:
            self.threads.shutdown()
        for env in self.envs:
            env.close()
        self.factory.close()


@dataclass(eq=False)  # one per actor, told apart by identity: the devices of a batch are grouped by their host
class _Host:
    """A :class:`DeviceHost` actor as the rollout's side knows it: where it is, and whether it was lost."""

    actor: Any
    node: str  # Ray's node id
    address: str
    lost: bool = False


class _HostLost(Exception):
    """A host that cannot be reached (its node lost, its actor dead or unreachable): lost for good."""


def _answer(host: _Host, ref: Any) -> Any:
    """What ``host`` answered to the call ``ref`` (None: not made, the host being lost); an error of the host's own
    code is raised as itself.

    Raises:
        _HostLost: the host cannot be reached; it is marked lost from then on.
    """
    import ray
    from ray.exceptions import RayTaskError

    if host.lost:
        raise _HostLost("node lost earlier in the run")
    try:
        return ray.get(ref)
    except RayTaskError as e:
        raise own_error(e) from e
    except ray.exceptions.RayError as e:  # the actor, its node or the call's result is gone
        host.lost = True
        raise _HostLost(f"node lost ({type(e).__name__})") from None


class RemoteEnv:
    """One device of a :class:`DeviceHost`, as a rollout steps it: the :class:`~digiq.env.gym_env.PhoneEnv` calls a
    rollout makes, each one call to the host (steps of several devices: :func:`step_on_hosts`, one per host).

    A host that cannot be reached (its node lost, its actor dead or
    unreachable) is taken as lost for good: a device fault with ``gone``, so
    the rollout retires the device and starts its episode again on another;
    every device of that host is :attr:`gone` from then on. An error in the
    host's own code is raised as itself.
    """

    parallel_steps = False  # a rollout steps its devices together, a call per host (step_on_hosts), not from threads

    def __init__(self, host: _Host, index: int, serial: str) -> None:
        self.host, self.index = host, index
        self.serial = f"{host.address}/{host.node[:8]}/{serial}"  # one host's address may hold several nodes
        self.task: Any = None

    def _call(self, method: str, *args: Any) -> Any:
        ref = None if self.host.lost else getattr(self.host.actor, method).remote(self.index, *args)
        try:
            answer = _answer(self.host, ref)
        except _HostLost as e:
            raise self.fault_for_lost_host(e) from None
        return self.result(answer)

    def result(self, answer: tuple[Any, ...]) -> Any:
        """The result in the host's answer for this device (``("ok", result)``), or its device fault raised here."""
        status, *rest = answer
        if status == "fault":
            raise DeviceFault(rest[0], self.serial, rest[1])
        return rest[0]

    def fault_for_lost_host(self, why: _HostLost) -> DeviceFault:
        """This device's fault for its host's loss: gone for good."""
        return DeviceFault(f"{self.serial}: {why}", self.serial, gone=True)

    @property
    def gone(self) -> bool:
        """Whether the device's host was lost: the rollout retires it rather than start an episode on it."""
        return self.host.lost

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
        self.task = (options or {}).get("task")
        return self._call("reset", seed, options)

    def step(self, action: str) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        return step_on_hosts([self], [action])[0]

    def view_hierarchy(self) -> str:
        return self._call("view_hierarchy")

    def screen_size(self) -> tuple[int, int]:
        return self._call("screen_size")

    def close(self) -> None:
        if not self.host.lost:
            self.host.actor.close.remote(self.index)  # not waited for: the device leaves the pool either way

    @property
    def device(self) -> Any:
        raise RuntimeError(f"{self.serial} is stepped on another node: the scripted expert reads a device's state in "
                           "process, so its rollouts run on local devices")  # fmt: skip


def step_on_hosts(envs: Sequence[RemoteEnv], actions: Sequence[str]
                  ) -> list[tuple[dict[str, Any], float, bool, bool, dict[str, Any]]]:  # fmt: skip
    """Step ``envs[k]`` by ``actions[k]``, for each ``k``: one call per host for all of its devices, every host's
    call under way at once; each device's step, in order.

    A device's fault (its own, or its host's loss) ends its step as an adb
    device's fault does: the episode truncated, the fault named in ``info``.
    Its batch mates' steps are theirs.
    """
    if len(envs) != len(actions):
        raise ValueError(f"step_on_hosts: {len(actions)} actions for {len(envs)} devices")
    by_host: dict[_Host, list[int]] = {}
    for k, env in enumerate(envs):
        by_host.setdefault(env.host, []).append(k)
    calls = [(host, batch, None if host.lost else host.actor.step_many.remote([envs[k].index for k in batch],
                                                                               [actions[k] for k in batch]))
             for host, batch in by_host.items()]  # fmt: skip
    stepped: list[Any] = [None] * len(envs)
    for host, batch, ref in calls:
        try:
            answers = _answer(host, ref)
        except _HostLost as e:
            for k in batch:
                stepped[k] = _truncated(envs[k].fault_for_lost_host(e))
            continue
        for k, answer in zip(batch, answers, strict=True):
            try:
                stepped[k] = envs[k].result(answer)
            except DeviceFault as e:
                stepped[k] = _truncated(e)
    return stepped


def _truncated(fault: DeviceFault) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
    """A step a device fault ended, as an adb device's fault ends it: the episode truncated, the fault named."""
    return {"screenshot": None, "task": ""}, 0.0, False, True, {"fault": str(fault), "gone": fault.gone, "valid": False}


def _interleaved(per_host: Sequence[Sequence[RemoteEnv]]) -> list[RemoteEnv]:
    """Every host's first device, then every host's second, ...: a rollout of fewer devices still uses every host."""
    return [e for row in itertools.zip_longest(*per_host) for e in row if e is not None]


@contextmanager
def cluster_devices(compute: ComputeConfig, devices: DeviceConfig, env: EnvConfig, judge: JudgeConfig,
                    size: int) -> Iterator[Callable[[], PhoneEnv]]:  # fmt: skip
    """An env factory cycling over ``size`` devices of the cluster's hosts, spread over every host that offers some.

    One :class:`DeviceHost` per node offering devices, each holding that
    node's ``devices`` resource while the block runs (a second pool waits
    for them); stopped at the end. The devices of a lost host are still
    handed out, as a local pool hands out a device that vanished: each
    rollout retires them before they take an episode (they are ``gone``).

    Raises:
        ClusterError: no node offers devices, the hosts did not start, or they offer fewer than ``size``.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    connect(compute)
    nodes = device_nodes()
    if not nodes:
        raise ClusterError(f"compute.backend ray: no node of the cluster at {compute.address!r} offers devices: start "
                           "each device host with `ray start --resources '{\"devices\": N}'` (docs/cluster.md)")  # fmt: skip
    host_class = ray.remote(DeviceHost)
    actors = [host_class.options(num_cpus=0, resources={DEVICES: count}, max_concurrency=count, max_restarts=0,
                                 scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
              .remote(devices, env, judge, count) for node, _, count in nodes]  # fmt: skip
    try:
        refs = [a.serials.remote() for a in actors]
        started, _ = ray.wait(refs, num_returns=len(refs), timeout=START_TIMEOUT_S)
        if len(started) < len(refs):
            raise ClusterError(f"the device hosts on {[address for _, address, _ in nodes]} did not start within "
                               f"{START_TIMEOUT_S:g}s: is another rollout holding their devices?")  # fmt: skip
        per_host = []
        for actor, (node, address, _), ref in zip(actors, nodes, refs, strict=True):
            try:
                serials = ray.get(ref)
            except ray.exceptions.RayError as e:  # its devices could not be made there (no adb server, say)
                raise ClusterError(f"the device host on {address} could not start its devices: {e}") from None
            host = _Host(actor, node, address)
            per_host.append([RemoteEnv(host, i, serial) for i, serial in enumerate(serials)])
        chosen = _interleaved(per_host)[:size]
        if len(chosen) < size:
            raise ClusterError(f"a rollout on {size} devices, but the cluster's nodes offer {len(chosen)} "
                               f"({[(address, count) for _, address, count in nodes]}): offer more, or lower n_envs")  # fmt: skip
        pool = itertools.cycle(chosen)
        yield lambda: next(pool)  # type: ignore[return-value]  # a PhoneEnv to the rollout, stepped elsewhere
    finally:
        closing = [actor.shutdown.remote() for actor in actors]
        ray.wait(closing, num_returns=len(closing), timeout=30)  # a lost host has nothing left to close
        for actor in actors:
            ray.kill(actor, no_restart=True)
