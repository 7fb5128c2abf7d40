"""``compute.backend: ray`` on a real multi-node Ray cluster on this machine: a head and worker nodes on loopback,
each its own raylet, the workers offering simulated phones by the ``devices`` resource.

Jobs and episodes land on more than one node, give what the local backend gives, and a node killed mid-run
loses no job or episode and doubles none.
"""

import itertools
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import ray
import test_workers
import torch
from ray.cluster_utils import Cluster
from test_workers import critic_root, write_or_read

from digiq.cluster import DEVICES, ClusterError, DeviceHost, RemoteEnv, _Host, cluster_devices, connect, step_on_hosts
from digiq.config import ComputeConfig, DeviceConfig, EnvConfig, EvalConfig, JudgeConfig
from digiq.data.trajectories import TrajectoryStore
from digiq.env import actions as A
from digiq.env.adb_server import AdbSimServer, Fault
from digiq.env.state import Dynamics
from digiq.env.taskgen import generate_tasks
from digiq.env.tasks import parse_task
from digiq.evaluate import EvalJob, run_jobs
from digiq.models.critic import Critic
from digiq.paths import Paths
from digiq.rollout import FAULTS_FILE, RolloutBatch, device_pool, rollout
from digiq.stages.critic import run as critic_stage
from digiq.stages.launch import run_stage
from digiq.workers import IN_PROCESS, map_jobs, map_on_cluster

pytestmark = pytest.mark.slow  # a cluster of several raylets and worker processes

# The jobs below are test modules' functions, which the cluster's workers cannot import: send them by value.
for module in (sys.modules[__name__], test_workers):
    ray.cloudpickle.register_pickle_by_value(module)

WIDTH = 108
TASKS = [parse_task(t, ts) for ts in ("general", "webshop") for t in generate_tasks(ts, "test", 6, seed=11)]


class NoiseTaps:
    """A policy without privileges, as a model samples: each row's action from its own noise key alone."""

    def __init__(self, on_step=None) -> None:
        self.calls, self.on_step = 0, on_step

    def act(self, batch: RolloutBatch) -> list[str]:
        self.calls += 1
        if self.on_step is not None:
            self.on_step(self.calls)
        out = []
        for key in batch.noise:
            rng = np.random.default_rng(key)
            roll = rng.random()
            action = A.task_complete() if roll < 0.08 else A.press_back() if roll < 0.15 else A.tap(*rng.random(2))
            out.append(A.format_action(action))
        return out


def start_cluster(nodes: int, devices: int) -> tuple[Cluster, list]:
    """A head that runs nothing (no CPU) and ``nodes`` worker nodes of one CPU and ``devices`` phones each."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    workers = [cluster.add_node(num_cpus=1, resources={DEVICES: devices}) for _ in range(nodes)]
    cluster.wait_for_nodes()
    return cluster, workers


def test_no_cluster_is_a_named_error():
    """First in the module, before this process joins a cluster: ``connect`` names the address it cannot reach."""
    assert not ray.is_initialized()
    with pytest.raises(ClusterError, match="no Ray cluster at address '127.0.0.1:1'"):
        connect(ComputeConfig(backend="ray", address="127.0.0.1:1"))


@pytest.fixture(scope="module")
def cluster():
    cluster, workers = start_cluster(nodes=2, devices=2)
    yield ComputeConfig(backend="ray", address=cluster.address), workers
    ray.shutdown()
    cluster.shutdown()


def _draws_where(seed: int) -> tuple[list[int], str]:
    """A job that seeds itself and samples, as every fit and evaluation does; and the node it ran on."""
    torch.manual_seed(seed)
    x = torch.randn(32, 32)
    draws = torch.multinomial(torch.softmax(x @ x.T / 8, -1), 1)[:, 0].tolist()
    return draws, ray.get_runtime_context().get_node_id() if ray.is_initialized() else "here"


def test_jobs_run_on_several_nodes_and_give_what_they_give_here(cluster):
    compute, _ = cluster
    seeds = list(range(8))
    here = [_draws_where(s)[0] for s in seeds]
    there = map_jobs(_draws_where, seeds, compute)
    assert [draws for draws, _ in there] == here
    assert len({node for _, node in there}) == 2  # both worker nodes took jobs; the head has no CPU


def test_a_job_waits_for_the_one_it_is_given(cluster, tmp_path):
    out = tmp_path / "written.txt"
    jobs = [("write", out), ("quick", out), ("read", out)]
    assert map_jobs(write_or_read, jobs, cluster[0], after=[None, None, 0]) == ["wrote", "quick", "written"]


def test_a_failing_job_raises_its_own_error(cluster, tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        map_jobs(Path.read_text, [tmp_path / "nothing-here"], cluster[0])


def test_evaluation_jobs_give_the_local_backend_s_episodes(cluster, values_root):
    """Stage 12's jobs on the simulator as Ray tasks: the same episodes as in worker-less local evaluation."""
    tasks = {ts: [t for t in TASKS if t.task_set == ts][:3] for ts in ("general", "webshop")}
    cfg = EvalConfig(n_envs=2, seed=7, temperature=0.8)
    jobs = [EvalJob(Paths(values_root).base_policy, f"seed {s}", s, tasks, cfg, EnvConfig(width=WIDTH), False)
            for s in (0, 1)]  # fmt: skip
    here = run_jobs(jobs, DeviceConfig(), JudgeConfig(), IN_PROCESS)
    there = run_jobs(jobs, DeviceConfig(), JudgeConfig(), cluster[0])
    assert there == here
    assert [r.index for r in there[1]["webshop"]] == [0, 1, 2]


def test_a_rollout_on_the_nodes_devices_equals_the_local_one(cluster, tmp_path):
    """Four phones, two on each worker node, stepped from here: the same episodes and stored bytes as local phones."""
    compute, _ = cluster
    ref, far = TrajectoryStore(tmp_path / "local"), TrajectoryStore(tmp_path / "cluster")
    env, judge = EnvConfig(width=WIDTH), JudgeConfig()
    with device_pool(DeviceConfig(), env, judge, 4) as make:
        a = rollout(NoiseTaps(), TASKS, n_envs=4, seed=3, width=WIDTH, store=ref, part_size=4, env_factory=make)
    with device_pool(DeviceConfig(), env, judge, 4, compute) as make:
        devices = [make() for _ in range(4)]
        b = rollout(NoiseTaps(), TASKS, n_envs=4, seed=3, width=WIDTH, store=far, part_size=4, env_factory=make)
    assert len({d.host.node for d in devices}) == 2  # the four devices: two on each worker node
    assert a == b
    ta, tb = ref.read().to_pandas(), far.read().to_pandas()
    assert ta.equals(tb) and len(ta) > len(TASKS)  # every step, not just one per episode
    assert all((ref.root / p).read_bytes() == (far.root / p).read_bytes() for p in ta.image_path)
    assert not (far.root / FAULTS_FILE).exists()


class CountedActor:
    """A device host's actor handle that notes each call made through it, (host, method, arguments), then makes it."""

    def __init__(self, actor, host: int, calls: list) -> None:
        self.actor, self.host, self.calls = actor, host, calls

    def __getattr__(self, method: str):
        counted = self

        class Method:
            def remote(self, *args):
                counted.calls.append((counted.host, method, args))
                return getattr(counted.actor, method).remote(*args)

        return Method()


def test_a_rollout_step_is_one_call_per_host(cluster):
    """Four phones, two on each worker node: each rollout step is one call to each host that has a device with an
    episode under way, carrying those devices' actions; the episodes are the local phones'."""
    compute, _ = cluster
    env, judge = EnvConfig(width=WIDTH), JudgeConfig()
    with device_pool(DeviceConfig(), env, judge, 4) as make:
        a = rollout(NoiseTaps(), TASKS, n_envs=4, seed=3, width=WIDTH, env_factory=make)
    calls: list = []
    batches: list = []  # per policy step: the calls made before it, and its devices

    class Watched(NoiseTaps):
        def act(self, batch: RolloutBatch) -> list[str]:
            batches.append((len(calls), list(batch.envs)))
            return super().act(batch)

    with device_pool(DeviceConfig(), env, judge, 4, compute) as make:
        devices = [make() for _ in range(4)]
        hosts = list({id(d.host): d.host for d in devices}.values())
        for n, host in enumerate(hosts):
            host.actor = CountedActor(host.actor, n, calls)
        b = rollout(Watched(), TASKS, n_envs=4, seed=3, width=WIDTH, env_factory=make)
    assert b == a and len(hosts) == 2
    assert len(batches) > max(r.steps for r in a)
    for t, (start, stepped) in enumerate(batches):  # the calls after a policy step, up to the next: its steps
        end = batches[t + 1][0] if t + 1 < len(batches) else len(calls)
        made = [(host, method, args[0]) for host, method, args in calls[start:end] if method not in ("reset", "close")]
        each_host = [(n, "step_many", [d.index for d in stepped if d.host is host]) for n, host in enumerate(hosts)]
        assert sorted(made, key=lambda call: call[0]) == [call for call in each_host if call[2]], f"step {t}"


def test_a_device_fault_in_a_host_s_batch_is_that_device_s_alone(cluster, tmp_path):
    """Three phones of an adb simulator here, on one device host, stepped by one call a step; one phone vanishes
    mid-episode. That phone's episode starts again on another; its batch mates' steps go on, their host not lost:
    the local phones' episodes and steps, and one fault."""
    env, judge = EnvConfig(width=WIDTH), JudgeConfig()
    ref, far = TrajectoryStore(tmp_path / "local"), TrajectoryStore(tmp_path / "cluster")
    with device_pool(DeviceConfig(), env, judge, 3) as make:
        a = rollout(NoiseTaps(), TASKS, n_envs=3, seed=3, width=WIDTH, store=ref, env_factory=make)
    with AdbSimServer(3, dynamics=Dynamics.of(env), width=WIDTH) as server:
        doomed = server.serials[1]
        server.inject(doomed, Fault("vanish", after=12))  # mid-episode
        devices = DeviceConfig(backend="adb-sim", adb_port=server.port, timeout_s=1.0)
        actor = ray.remote(DeviceHost).options(num_cpus=0).remote(devices, env, judge, 3)
        try:
            host = _Host(actor, "test-host", "127.0.0.1")
            phones = [RemoteEnv(host, i, serial) for i, serial in enumerate(ray.get(actor.serials.remote()))]
            pool = itertools.cycle(phones)
            b = rollout(NoiseTaps(), TASKS, n_envs=3, seed=3, width=WIDTH, store=far, env_factory=lambda: next(pool))
        finally:
            ray.get(actor.shutdown.remote())
            ray.kill(actor)
    assert b == a and not host.lost
    assert ref.read().to_pandas().equals(far.read().to_pandas())  # the restarted episode replayed exactly
    faults = [json.loads(line) for line in (far.root / FAULTS_FILE).read_text().splitlines()]
    assert len(faults) == 1 and faults[0]["device"].endswith(doomed) and faults[0]["then"] == "restarted"


def test_the_critic_stage_on_the_cluster_matches_local_workers(cluster, values_root, tmp_path):
    """A DVC job stage as the pipeline runs it, its params saying ``backend: ray``: the metrics and weights of the
    local backend's two workers."""
    local = critic_root(values_root, tmp_path / "local", {"workers": 2})
    far = critic_root(values_root, tmp_path / "far", {"backend": "ray", "address": cluster[0].address})
    m1, m2 = (run_stage(critic_stage, p, p.root / "params.yaml") for p in (local, far))
    m1.pop("wall_time_s"), m2.pop("wall_time_s")
    assert m2 == m1 and set(m1["by_critic"]) == {"digiq", "digiq_cql"}
    for seed in (0, 1):
        for row in ("digiq", "digiq_cql"):
            a, b = (Critic.load(p.critic(seed, row, "general")).state_dict() for p in (local, far))
            for name, w in a.items():  # float sums may differ in their last bits on other thread counts
                torch.testing.assert_close(b[name], w, atol=1e-5, rtol=1e-5, msg=f"{row} seed {seed} {name}")


def test_bad_cluster_settings_are_named(cluster):
    compute, _ = cluster
    with pytest.raises(ClusterError, match="job_cpus"):
        map_on_cluster(len, ["a"], ComputeConfig(backend="ray", address=compute.address, job_cpus=64), [None])
    with pytest.raises(ClusterError, match="offer 4"):
        with cluster_devices(compute, DeviceConfig(), EnvConfig(width=WIDTH), JudgeConfig(), 5):
            pass
    with pytest.raises(ValueError, match="backend must be one of"):
        ComputeConfig(backend="slurm")
    host = DeviceHost(DeviceConfig(), EnvConfig(width=WIDTH), JudgeConfig(), 2)
    with pytest.raises(ValueError, match=r"devices \[1, 1\] are not distinct devices of this host's 2"):
        host.step_many([1, 1], ["a", "b"])
    with pytest.raises(ValueError, match=r"devices \[0, 2\] are not distinct devices of this host's 2"):
        host.step_many([0, 2], ["a", "b"])
    with pytest.raises(ValueError, match="1 actions for 2 devices"):
        host.step_many([0, 1], ["a"])
    with pytest.raises(ValueError, match="step_on_hosts: 0 actions for 1 devices"):
        step_on_hosts([RemoteEnv(_Host(None, "node", "address"), 0, "phone0")], [])


def _slow_marked(job: tuple[int, str]) -> int:
    """Mark where the job started, work a while, return its number."""
    i, folder = job
    node = ray.get_runtime_context().get_node_id()
    (Path(folder) / f"{i}-{node}-{time.monotonic_ns()}").touch()
    time.sleep(1.5)
    return i * i


def test_a_node_killed_mid_stage_loses_no_job_and_doubles_none(tmp_path):
    """The node that started the first job is removed while it runs: that job runs again on the other node."""
    cluster, workers = start_cluster(nodes=2, devices=1)
    try:
        compute = ComputeConfig(backend="ray", address=cluster.address, retries=2)
        marks = tmp_path / "marks"
        marks.mkdir()
        doomed: list[str] = []

        def kill_where_the_first_job_runs() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not doomed:
                doomed.extend(p.name.split("-")[1] for p in marks.iterdir())
                time.sleep(0.02)
            cluster.remove_node(next(w for w in workers if w.node_id == doomed[0]), allow_graceful=False)

        killer = threading.Thread(target=kill_where_the_first_job_runs)
        killer.start()
        results = map_jobs(_slow_marked, [(i, str(marks)) for i in range(6)], compute)
        killer.join()
        assert results == [i * i for i in range(6)]  # every job once, in job order
        started = [p.name.split("-") for p in marks.iterdir()]
        lost = {int(i) for i, node, _ in started if node == doomed[0]}
        assert lost  # the killed node had started a job ...
        assert all(sum(int(i) == j for i, _, _ in started) >= 2 for j in lost)  # ... which ran again elsewhere
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_a_node_killed_mid_evaluation_loses_no_episode_and_doubles_none(tmp_path):
    """Six phones on three nodes; one node is removed mid-rollout: its episodes under way start again elsewhere."""
    cluster, workers = start_cluster(nodes=3, devices=2)
    try:
        compute = ComputeConfig(backend="ray", address=cluster.address)
        env, judge = EnvConfig(width=WIDTH), JudgeConfig()
        ref, far = TrajectoryStore(tmp_path / "local"), TrajectoryStore(tmp_path / "cluster")
        tasks = TASKS * 2
        with device_pool(DeviceConfig(), env, judge, 6) as make:
            a = rollout(NoiseTaps(), tasks, n_envs=6, seed=5, width=WIDTH, store=ref, env_factory=make)

        def kill(calls: int) -> None:
            if calls == 6:  # a few steps in: every device has an episode under way
                cluster.remove_node(workers[2], allow_graceful=False)  # killed, not shut down

        with device_pool(DeviceConfig(), env, judge, 6, compute) as make:
            b = rollout(NoiseTaps(kill), tasks, n_envs=6, seed=5, width=WIDTH, store=far, env_factory=make)
        assert [r.index for r in b] == list(range(len(tasks)))  # every episode, once
        assert [(r.success, r.steps) for r in b] == [(r.success, r.steps) for r in a]  # replayed from its seed
        assert not any(r.abandoned for r in b)
        ta, tb = ref.read().to_pandas(), far.read().to_pandas()
        assert sorted(tb.traj_id.unique()) == list(range(len(tasks)))
        assert (
            ta.sort_values(["traj_id", "step_id"])
            .reset_index(drop=True)
            .equals(tb.sort_values(["traj_id", "step_id"]).reset_index(drop=True))
        )  # the same steps, none twice
        faults = [json.loads(line) for line in (far.root / FAULTS_FILE).read_text().splitlines()]
        assert len(faults) == 2 and all("node lost" in f["fault"] and f["then"] == "restarted" for f in faults)
    finally:
        ray.shutdown()
        cluster.shutdown()
