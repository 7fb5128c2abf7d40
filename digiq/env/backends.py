"""Which devices a stage talks to: the in-process simulator, the simulator over adb, or real emulators.

``DeviceConfig.backend`` switches any stage that steps devices (collect, eval):

* ``sim``: :class:`~digiq.env.gym_env.AndroidSimEnv`, in process (the default, fastest).
* ``adb-sim``: :class:`~digiq.env.adb_env.AdbEnv` driving simulated phones through
  the adb protocol (:mod:`digiq.env.adb_server`): the emulator code path, with
  ground-truth success. ``adb_port: 0`` starts the simulator server in process
  (and gives the scripted expert its view); any other port connects to
  ``python -m digiq.env adb-server``.
* ``emulator``: :class:`~digiq.env.adb_env.AdbEnv` on real emulators (see
  env_setup/), reset by snapshot, success judged by an evaluator you pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from digiq.env.adb_env import (
    DEVICE_HINT,
    AdbEnv,
    AdbLink,
    AdbUnavailable,
    Evaluator,
    SimGroundTruth,
    SimStart,
    SnapshotStart,
    list_devices,
)
from digiq.env.adb_server import AdbSimServer
from digiq.env.gym_env import AndroidSimEnv, PhoneEnv
from digiq.env.state import Dynamics

__all__ = ["BACKENDS", "DeviceConfig", "EnvFactory", "make_env"]

BACKENDS = ("sim", "adb-sim", "emulator")


def _help(text: str, default: Any) -> Any:
    return field(default=default, metadata={"help": text})


@dataclass(frozen=True)
class DeviceConfig:
    """The device backend of stages that step devices (collect, eval)."""

    backend: str = _help("sim (in process) | adb-sim (simulator over adb) | emulator (real, see env_setup/)", "sim")
    adb_host: str = _help("adb server host", "127.0.0.1")
    adb_port: int = _help("adb server port; adb-sim: 0 starts an in-process simulator server", 5037)
    serials: tuple[str, ...] = _help("devices to use, in order; empty: every device the server lists", ())
    sim_devices: int = _help("adb-sim with adb_port 0: how many simulated phones the server has", 4)
    snapshot: str = _help("emulator: the snapshot each episode starts from (make_snapshot.sh saves it)", "digiq_aitw")
    console_token_file: str = _help("emulator: the console auth token file", "~/.emulator_console_auth_token")
    timeout_s: float = _help("time-out of one adb call, seconds", 10.0)
    reset_timeout_s: float = _help("emulator: time-out of a snapshot load and boot wait, seconds", 120.0)
    retries: int = _help("retries of a failed adb call, each on a new connection", 2)
    settle_s: float = _help("emulator: pause after each input before the screenshot, seconds", 1.0)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {list(BACKENDS)}, got {self.backend!r}")
        object.__setattr__(self, "serials", tuple(self.serials))  # a YAML list comes in as a list
        if not 0 <= self.adb_port <= 65535 or (self.adb_port == 0 and self.backend == "emulator"):
            raise ValueError(f"adb_port must be in [1, 65535] (0 only for adb-sim), got {self.adb_port}")
        if (
            self.sim_devices < 1
            or self.retries < 0
            or min(self.timeout_s, self.reset_timeout_s) <= 0
            or self.settle_s < 0
        ):
            raise ValueError(
                "need sim_devices >= 1, retries >= 0, time-outs > 0 and settle_s >= 0; got "
                f"{self.sim_devices}, {self.retries}, {self.timeout_s}/{self.reset_timeout_s}, {self.settle_s}"
            )


class EnvFactory:
    """Makes one env per call, each on the next device of the configured backend.

    Checks at construction that the adb server is up (else fails at once
    saying what to start); owns the simulator server it starts for
    ``adb-sim`` with ``adb_port: 0``, which :meth:`close` stops.

    Args:
        cfg: the backend.
        dynamics: simulated phones' disturbance rates (``sim``, and ``adb-sim`` with an in-process server).
        width: screenshot width in pixels.
        evaluator: the success judge; required for ``emulator``, ground truth by default on ``adb-sim``.
    """

    def __init__(
        self, cfg: DeviceConfig, dynamics: Dynamics | None = None, width: int = 216, evaluator: Evaluator | None = None
    ) -> None:
        self.cfg, self.dynamics, self.width = cfg, dynamics, width
        self.server: AdbSimServer | None = None
        self._next = 0
        if cfg.backend == "sim":
            return
        if cfg.backend == "emulator" and evaluator is None:
            raise ValueError(
                "backend 'emulator' needs an evaluator (a success judge, see digiq.env.adb_env.Evaluator): "
                "a real emulator has no ground truth"
            )
        self.evaluator: Evaluator = evaluator if evaluator is not None else SimGroundTruth()
        port = cfg.adb_port
        if cfg.backend == "adb-sim" and port == 0:
            self.server = AdbSimServer(cfg.sim_devices, dynamics=dynamics, width=width, host=cfg.adb_host)
            port = self.server.port
        self.port = port
        self.serials = list(cfg.serials) or list_devices(cfg.adb_host, port, cfg.timeout_s)
        if not self.serials:
            raise AdbUnavailable(f"adb server {cfg.adb_host}:{port} lists no devices: {DEVICE_HINT}")

    def __call__(self) -> PhoneEnv:
        if self.cfg.backend == "sim":
            return AndroidSimEnv(dynamics=self.dynamics, width=self.width)
        cfg = self.cfg
        if self._next >= len(self.serials):
            raise AdbUnavailable(
                f"asked for device {self._next + 1} but adb server {cfg.adb_host}:{self.port} offers "
                f"{len(self.serials)} ({self.serials}): start more devices or use fewer envs"
            )
        serial = self.serials[self._next]
        self._next += 1
        link = AdbLink(cfg.adb_host, self.port, serial, timeout_s=cfg.timeout_s, retries=cfg.retries)
        if cfg.backend == "adb-sim":
            server = self.server
            return AdbEnv(
                link,
                SimStart(),
                self.evaluator,
                width=self.width,
                sim_device=None if server is None else (lambda: server.phone(serial).device),
            )
        start = SnapshotStart(cfg.snapshot, cfg.console_token_file, cfg.reset_timeout_s)
        return AdbEnv(link, start, self.evaluator, width=self.width, settle_s=cfg.settle_s)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    def __enter__(self) -> EnvFactory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_env(
    cfg: DeviceConfig, dynamics: Dynamics | None = None, width: int = 216, evaluator: Evaluator | None = None
) -> PhoneEnv:
    """One env on the first device of ``cfg``'s backend; closing it stops a simulator server it started."""
    factory = EnvFactory(cfg, dynamics, width, evaluator)
    env = factory()
    if isinstance(env, AdbEnv):
        env.on_close = factory.close
    return env
