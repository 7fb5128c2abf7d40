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

from digiq.config import BACKENDS, DeviceConfig
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
