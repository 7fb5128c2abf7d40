"""The emulator backend (AdbEnv through adbutils) against the adb-protocol simulator, over loopback TCP."""

import json
import socket
import time
from dataclasses import replace

import numpy as np
import pytest

from digiq.config import ConfigError, load_settings
from digiq.data import TrajectoryStore
from digiq.env import AndroidSimEnv, Dynamics, Expert, generate_tasks, parse_task
from digiq.env import actions as A
from digiq.env.adb_env import AdbEnv, AdbLink, AdbUnavailable, DeviceFault, SimGroundTruth, SimStart
from digiq.env.adb_server import AdbSimServer, Fault
from digiq.env.backends import DeviceConfig, EnvFactory, make_env
from digiq.rollout import FAULTS_FILE, ExpertPolicy, rollout

WIDTH = 108
TASKS = [parse_task(t, "general") for t in generate_tasks("general", "train", 4, seed=5)] + [
    parse_task(t, "webshop") for t in generate_tasks("webshop", "train", 2, seed=5)
]


def adb_sim(**kw) -> DeviceConfig:
    return DeviceConfig(backend="adb-sim", adb_port=0, **kw)


def episode(env, task, seed, noise=0.3):
    """Run the (noisy) expert; return everything an episode shows."""
    obs, _ = env.reset(seed=seed, options={"task": task})
    expert, shots, out = Expert(noise, seed), [obs["screenshot"]], []
    while True:
        action = expert.act(env.device, task)
        obs, reward, term, trunc, info = env.step(action)
        shots.append(obs["screenshot"])
        out.append((action, reward, term, trunc, info["success"], info["screen_changed"]))
        if term or trunc:
            return shots, out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_expert_episodes_are_identical_through_adb():
    dyn = Dynamics()  # every disturbance on: dialogs, late loads, jitter, ads
    sim = AndroidSimEnv(dynamics=dyn, width=WIDTH)
    with make_env(adb_sim(sim_devices=1), dyn, WIDTH) as env:
        assert isinstance(env, AdbEnv)
        rewards = []
        for i, task in enumerate(TASKS):
            shots_sim, steps_sim = episode(sim, task, 100 + i)
            shots_adb, steps_adb = episode(env, task, 100 + i)
            assert steps_adb == steps_sim, task.instruction
            assert len(shots_adb) == len(shots_sim)
            assert all(np.array_equal(a, b) for a, b in zip(shots_adb, shots_sim))
            rewards += [r for _, r, *_ in steps_adb]
        assert 1.0 in rewards


def test_every_action_type_goes_through():
    task = parse_task("Search for hotels in Paris")
    sim = AndroidSimEnv(dynamics=Dynamics.calm(), width=WIDTH)
    with make_env(adb_sim(sim_devices=1), Dynamics.calm(), WIDTH) as env:
        o1, _ = sim.reset(seed=3, options={"task": task})
        o2, _ = env.reset(seed=3, options={"task": task})
        x, y = sim.device.find("app:chrome").center
        actions = [
            A.swipe((0.01, 0.5), (0.6, 0.5)),
            A.press_back(),
            A.tap(y / 2280, x / 1080),
            "garbage",
            A.press_home(),
            A.press_back(),
            A.type_text("it's 5% off; %s $HOME"),
            A.press_enter(),
            A.task_complete(),
        ]
        for a in actions:
            o1, r1, t1, u1, i1 = sim.step(a)
            o2, r2, t2, u2, i2 = env.step(a)
            assert np.array_equal(o1["screenshot"], o2["screenshot"])
            assert (r1, t1, u1, i1["valid"], i1["error"], i1["screen_changed"]) == (
                r2,
                t2,
                u2,
                i2["valid"],
                i2["error"],
                i2["screen_changed"],
            )
            assert i2["fault"] == "" and i2["untyped"] == ""
        assert i2["step"] == len(actions) and t2


def test_typing_skips_what_input_text_cannot_type():
    with make_env(adb_sim(sim_devices=1), Dynamics.calm(), WIDTH) as env:
        env.reset(seed=0, options={"task": parse_task("Search for hotels in Paris")})
        env.device.state.focus = "web"
        _, _, _, _, info = env.step(A.type_text("caf\u00e9 %s 100%"))
        assert env.device.state.text == "caf %s 100%" and info["untyped"] == "\u00e9"


def test_rollout_through_a_device_pool_equals_the_in_process_rollout(tmp_path):
    ref, pool = TrajectoryStore(tmp_path / "sim"), TrajectoryStore(tmp_path / "adb")
    a = rollout(ExpertPolicy(0.2, seed=3), TASKS, n_envs=3, width=WIDTH, store=ref, seed=9)
    with EnvFactory(adb_sim(sim_devices=3), None, WIDTH) as factory:
        b = rollout(ExpertPolicy(0.2, seed=3), TASKS, n_envs=3, width=WIDTH, store=pool, seed=9, env_factory=factory)
    assert a == b
    ta, tb = ref.read().to_pandas(), pool.read().to_pandas()
    assert ta.equals(tb)
    assert all((ref.root / p).read_bytes() == (pool.root / p).read_bytes() for p in ta.image_path)
    assert not (pool.root / FAULTS_FILE).exists()


def test_the_screen_read_through_uiautomator_is_the_simulators(tmp_path):
    """A policy that reads the screen gets the same prompts from a device's view hierarchy as in process."""
    ref, pool = TrajectoryStore(tmp_path / "sim"), TrajectoryStore(tmp_path / "adb")
    rollout(ExpertPolicy(0.2, seed=3), TASKS[:3], n_envs=3, width=WIDTH, store=ref, seed=9, screen_text=True)
    with EnvFactory(adb_sim(sim_devices=3), None, WIDTH) as factory:
        rollout(ExpertPolicy(0.2, seed=3), TASKS[:3], n_envs=3, width=WIDTH, store=pool, seed=9, env_factory=factory,
                screen_text=True)  # fmt: skip
    ta, tb = ref.read().to_pandas(), pool.read().to_pandas()
    assert ta.equals(tb) and ta.observation.str.contains(" Screen: ").all()


def test_a_vanished_device_is_survived_and_nothing_is_lost(tmp_path):
    ref, pool = TrajectoryStore(tmp_path / "sim"), TrajectoryStore(tmp_path / "adb")
    tasks = TASKS * 2
    rollout(ExpertPolicy(), tasks, n_envs=3, width=WIDTH, store=ref)
    with EnvFactory(adb_sim(sim_devices=3, timeout_s=1.0), None, WIDTH) as factory:
        doomed = factory.serials[1]
        factory.server.inject(doomed, Fault("vanish", after=12))  # mid-episode
        results = rollout(ExpertPolicy(), tasks, n_envs=3, width=WIDTH, store=pool, env_factory=factory, part_size=2)
    assert [r.index for r in results] == list(range(len(tasks))) and all(r.success for r in results)
    assert ref.read().to_pandas().equals(pool.read().to_pandas())  # restarted episodes replay exactly
    faults = [json.loads(line) for line in (pool.root / FAULTS_FILE).read_text().splitlines()]
    assert len(faults) == 1 and faults[0]["device"] == doomed and faults[0]["then"] == "restarted"
    assert "vanished from the device list" in faults[0]["fault"] or "not found" in faults[0]["fault"]


def test_all_devices_failing_keeps_what_finished(tmp_path):
    store = TrajectoryStore(tmp_path)
    with EnvFactory(adb_sim(sim_devices=1, timeout_s=1.0), None, WIDTH) as factory:
        factory.server.inject(factory.serials[0], Fault("vanish", after=40))
        with pytest.raises(RuntimeError, match="every device failed"):
            rollout(ExpertPolicy(), TASKS, n_envs=1, width=WIDTH, store=store, env_factory=factory, part_size=1)
    done = store.read().to_pandas().traj_id.unique()
    assert len(done) >= 1 and (tmp_path / FAULTS_FILE).exists()


@pytest.fixture
def one_phone():
    with AdbSimServer(1, dynamics=Dynamics.calm(), width=WIDTH) as srv:
        yield srv, srv.serials[0]


def sim_env(srv, serial, **kw):
    link = AdbLink("127.0.0.1", srv.port, serial, timeout_s=0.5, backoff_s=0.01, **kw)
    return AdbEnv(link, SimStart(), SimGroundTruth(), width=WIDTH, sim_device=lambda: srv.phone(serial).device)


def test_dropped_connections_and_a_slow_screencap_are_retried(one_phone):
    srv, serial = one_phone
    env, ref = sim_env(srv, serial), AndroidSimEnv(dynamics=Dynamics.calm(), width=WIDTH)
    srv.inject(serial, Fault("drop", after=3, times=2))
    srv.inject(serial, Fault("slow_screencap", after=2, times=1, seconds=2.0))
    srv.inject(serial, Fault("hang", after=9, times=1, seconds=2.0))
    assert episode(env, TASKS[1], 4)[1] == episode(ref, TASKS[1], 4)[1]
    assert all(armed.left == 0 for armed in srv.phone(serial).faults)  # every fault struck


def test_a_screencap_that_always_times_out_ends_the_episode_as_a_fault(one_phone):
    srv, serial = one_phone
    env = sim_env(srv, serial, retries=1)
    env.reset(seed=0, options={"task": TASKS[0]})
    srv.inject(serial, Fault("slow_screencap", times=None, seconds=3.0))
    t0 = time.monotonic()
    obs, reward, term, trunc, info = env.step(A.press_home())
    assert time.monotonic() - t0 < 2.5
    assert trunc and not term and reward == 0.0 and not info["gone"]
    assert "screencap -p" in info["fault"] and "no answer within 0.5s" in info["fault"] and serial in info["fault"]
    assert obs["screenshot"].shape == (228, WIDTH, 3)


def test_an_input_still_running_after_a_fault_does_not_land_in_the_next_episode(one_phone):
    """A tap times out (the phone is slow) but still runs 1.5 s later: the next reset waits for it, then resets."""
    srv, serial = one_phone
    ref = AndroidSimEnv(dynamics=Dynamics.calm(), width=WIDTH)
    start, _ = ref.reset(seed=0, options={"task": TASKS[0]})
    first = start["screenshot"]
    # A tap that changes the start screen (an app icon), found on the in-process simulator.
    tap = next(a for a in (A.tap(y / 10, x / 4) for y in range(2, 10) for x in range(1, 4))
               if ref.reset(seed=0, options={"task": TASKS[0]}) and ref.step(a)[4]["screen_changed"])  # fmt: skip
    env = sim_env(srv, serial)
    env.reset(seed=0, options={"task": TASKS[0]})
    srv.inject(serial, Fault("slow_input", times=1, seconds=1.5))
    assert "may have taken effect" in env.step(tap)[4]["fault"]
    obs, _ = env.reset(seed=0, options={"task": TASKS[0]})
    time.sleep(1.8)  # past the moment the late tap would land
    assert np.array_equal(obs["screenshot"], first) and np.array_equal(env._screenshot(), first)


def test_a_vanished_device_fails_reset_with_a_clear_message(one_phone):
    srv, serial = one_phone
    env = sim_env(srv, serial)
    srv.inject(serial, Fault("vanish"))
    with pytest.raises(DeviceFault, match=f"device '{serial}' not found|vanished") as e:
        env.reset(seed=0, options={"task": TASKS[0]})
    assert e.value.gone and e.value.serial == serial


def test_no_adb_server_fails_fast_saying_what_to_start():
    port = free_port()
    t0 = time.monotonic()
    for make in (
        lambda: EnvFactory(DeviceConfig(backend="adb-sim", adb_port=port)),
        lambda: EnvFactory(DeviceConfig(backend="emulator", adb_port=port), evaluator=SimGroundTruth()),
    ):
        with pytest.raises(AdbUnavailable) as e:
            make()
        msg = str(e.value)
        assert f"no adb server at 127.0.0.1:{port}" in msg
        assert "adb start-server" in msg and "python -m digiq.env adb-server" in msg
    assert time.monotonic() - t0 < 5


def test_unknown_devices_are_named(one_phone):
    srv, serial = one_phone
    with pytest.raises(AdbUnavailable, match=rf"no device 'emulator-1'.*lists \['{serial}'\].*start_emulators"):
        AdbLink("127.0.0.1", srv.port, "emulator-1")
    factory = EnvFactory(DeviceConfig(backend="adb-sim", adb_port=srv.port))
    factory()
    with pytest.raises(AdbUnavailable, match="asked for device 2 .* offers 1"):
        factory()


def test_an_external_simulator_has_no_privileged_view(one_phone):
    srv, _ = one_phone
    env = EnvFactory(DeviceConfig(backend="adb-sim", adb_port=srv.port))()
    env.reset(seed=0, options={"task": TASKS[0]})
    assert env.step(A.press_home())[4]["fault"] == ""
    with pytest.raises(RuntimeError, match="scripted expert works on the adb-sim backend with an in-process"):
        _ = env.device


def test_emulator_backend_resets_by_snapshot_over_the_console(tmp_path):
    token = tmp_path / "token"
    token.write_text("tok\n")
    judged = []

    def judge(link, task, screenshot):
        judged.append(screenshot.shape)
        return False

    with AdbSimServer(1, width=WIDTH, console_token="tok") as srv:
        cfg = DeviceConfig(backend="emulator", adb_port=srv.port, settle_s=0.0, console_token_file=str(token))
        with pytest.raises(ValueError, match="needs an evaluator"):
            EnvFactory(cfg)
        env = EnvFactory(cfg, width=WIDTH, evaluator=judge)()
        home = srv.phone(env.serial).device.screenshot().copy()
        obs, _ = env.reset(seed=0, options={"task": TASKS[0]})
        env.step(A.press_back())
        env.step(A.swipe((0.01, 0.5), (0.6, 0.5)))
        assert srv.phone(env.serial).device.state.page.app == "shade"
        obs, _ = env.reset(seed=1, options={"task": TASKS[1]})  # the snapshot again: the home screen
        assert np.array_equal(obs["screenshot"], home) and judged == [(228, WIDTH, 3)] * 2
        cfg = DeviceConfig(backend="emulator", adb_port=srv.port, snapshot="nope", console_token_file=str(token))
        with pytest.raises(RuntimeError, match="snapshot 'nope' not found"):
            EnvFactory(cfg, evaluator=judge)().reset(seed=0, options={"task": TASKS[0]})


def test_device_config_checks_and_loads_from_params():
    cfg = load_settings(params={"devices": {"backend": "emulator", "serials": ["emulator-5554"]}}).devices
    assert cfg.serials == ["emulator-5554"]
    with pytest.raises(ConfigError, match="backend must be one of"):
        load_settings(params={"devices": {"backend": "phone"}})
    with pytest.raises(ValueError, match="0 only for adb-sim"):
        DeviceConfig(backend="emulator", adb_port=0)
    assert isinstance(EnvFactory(DeviceConfig())(), AndroidSimEnv)


def test_a_server_that_goes_away_is_a_fault_not_a_new_server():
    srv = AdbSimServer(1, width=WIDTH)
    env = sim_env(srv, srv.serials[0])
    env.reset(seed=0, options={"task": TASKS[0]})
    srv.close()
    t0 = time.monotonic()
    _, _, _, trunc, info = env.step(A.press_home())
    assert time.monotonic() - t0 < 3  # adbutils alone would first try to start an adb server
    assert trunc and info["gone"] and f"no adb server at 127.0.0.1:{srv.port}" in info["fault"]


def test_an_input_that_may_have_landed_is_not_repeated(one_phone):
    srv, serial = one_phone
    env = sim_env(srv, serial)
    env.reset(seed=0, options={"task": TASKS[0]})
    srv.inject(serial, Fault("slow_input", seconds=1.0))
    before = srv.phone(serial).device.state.steps
    _, _, _, trunc, info = env.step(A.press_home())
    assert trunc and "not repeated, as it may have taken effect" in info["fault"]
    time.sleep(1.2)  # the slow input lands after all: once
    assert srv.phone(serial).device.state.steps == before + 1


def test_a_task_that_starts_in_an_app_is_refused_over_adb(one_phone):
    srv, serial = one_phone
    with pytest.raises(ValueError, match="starts in app 'maps'.*launcher"):
        sim_env(srv, serial).reset(seed=0, options={"task": replace(TASKS[0], start_app="maps")})
