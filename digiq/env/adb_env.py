"""The emulator backend: an Android device driven through adbutils, with the simulator's env API.

:class:`AdbEnv` takes screenshots with ``screencap -p``, taps and swipes with
``input``, types with ``input text`` (spaces as ``%s``, every argument shell
quoted), presses Back/Home/Enter with ``input keyevent``, and starts episodes
through an :class:`EpisodeStart`: a snapshot load over the emulator console
on a real emulator (:class:`SnapshotStart`), or the simulator's own reset
command on the adb-protocol simulator (:class:`SimStart`, simulator only).
Success comes from an :class:`Evaluator`: the simulator's ground truth
(:class:`SimGroundTruth`, simulator only) or a judge you supply for a real
emulator.

Every adb call has a time-out and is retried a bounded number of times on a
fresh connection; an input that may already have reached the device is not
repeated (a tap must not land twice). When a device stays silent or leaves
the device list, the episode ends with ``info["fault"]`` saying what
happened (or :meth:`AdbEnv.reset` raises :class:`DeviceFault`), so a rollout
can restart the episode on another device.
"""

from __future__ import annotations

import io
import shlex
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import adbutils
import numpy as np
from adbutils import AdbConnection
from adbutils.errors import AdbConnectionError, AdbError, AdbTimeout
from PIL import Image

from digiq.env.actions import Action, ActionType, parse_action
from digiq.env.android import KEYCODES, SIM_COMMAND, TYPEABLE, input_text_args
from digiq.env.device import SimDevice
from digiq.env.gym_env import PhoneEnv
from digiq.env.hierarchy import strip_dump_trailer
from digiq.env.tasks import Task
from digiq.redaction import redact_secrets

__all__ = [
    "AdbEnv",
    "AdbLink",
    "AdbUnavailable",
    "ConsoleRefused",
    "DeviceFault",
    "EpisodeStart",
    "Evaluator",
    "SimGroundTruth",
    "SimStart",
    "SnapshotStart",
    "DEVICE_HINT",
    "check_server",
    "console_command",
    "list_devices",
]

T = TypeVar("T")
SWIPE_MS = 500  # how long a swipe takes: slow enough to scroll, not fling


class AdbUnavailable(RuntimeError):
    """No adb server, or not the device asked for: a set-up problem, reported before any episode."""


class DeviceFault(RuntimeError):
    """A device did not do what was asked, after retries; ``gone`` when it left the device list."""

    def __init__(self, message: str, serial: str, gone: bool = False) -> None:
        super().__init__(message)
        self.serial, self.gone = serial, gone


DEVICE_HINT = (
    "start emulators with env_setup/start_emulators.sh N, or simulated phones with "
    "`python -m digiq.env adb-server --devices N`"
)


def check_server(host: str, port: int, timeout: float = 2.0) -> None:
    """Fail fast, with what to start, when nothing listens at ``host:port``.

    Checked before adbutils connects: on a refused connection adbutils would
    try to start an adb server itself, which takes seconds and is not what a
    simulator user wants.
    """
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        raise AdbUnavailable(
            f"no adb server at {host}:{port} ({e.strerror or e}): start one with `adb start-server` "
            f"(real emulator; env_setup/start_emulators.sh does) or `python -m digiq.env adb-server --port {port}` "
            "(simulator)"
        ) from None


def list_devices(host: str, port: int, timeout_s: float = 10.0) -> list[str]:
    """The serials of the devices ready at the adb server ``host:port`` (state ``device``).

    Raises:
        AdbUnavailable: no server there, or it does not answer.
    """
    check_server(host, port)
    try:
        return [d.serial for d in _Client(host, port, timeout_s).list() if d.state == "device"]
    except AdbError as e:
        raise AdbUnavailable(f"adb server {host}:{port} did not list its devices: {e}") from None


class _Trouble(Exception):
    """A failed adb call worth retrying; ``delivered`` when the device may have run the command."""

    def __init__(self, reason: str, delivered: bool) -> None:
        super().__init__(reason)
        self.reason, self.delivered = reason, delivered


class _Connection(AdbConnection):
    """adbutils' connection, minus starting an adb server when none answers.

    A server that went away mid-run is a fault to report (the simulator's, or
    the user's own); quietly starting adb's default server would not bring the
    devices back, and would leave a process behind.
    """

    def _safe_connect(self) -> socket.socket:
        return self._create_socket()


class _Client(adbutils.AdbClient):
    """adbutils' client with :class:`_Connection`, asking the server's version once, not before every command."""

    _version: int | None = None

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        super().__init__(host, port, socket_timeout=timeout_s)
        self._timeout_s = timeout_s

    def make_connection(self, timeout: float | None = None) -> AdbConnection:
        conn = _Connection(self.host, self.port)
        conn.conn.settimeout(timeout or self._timeout_s)
        return conn

    def server_version(self) -> int:
        if self._version is None:
            self._version = super().server_version()
        return self._version


class AdbLink:
    """One device behind an adb server: shell commands with time-outs, retries and reconnects.

    Args:
        host, port: the adb server.
        serial: the device, as ``adb devices`` lists it.
        timeout_s: time-out of one adb call (connect, request, answer).
        retries: further tries of a failed call, each on a new connection after a pause.
        backoff_s: the first pause; it doubles with each retry.

    Raises:
        AdbUnavailable: no server at ``host:port`` or no device ``serial`` there.
    """

    def __init__(
        self, host: str, port: int, serial: str, *, timeout_s: float = 10.0, retries: int = 2, backoff_s: float = 0.2
    ) -> None:
        if timeout_s <= 0 or retries < 0 or backoff_s < 0:
            raise ValueError(
                f"need timeout_s > 0, retries >= 0, backoff_s >= 0; got {timeout_s}, {retries}, {backoff_s}"
            )
        self.host, self.port, self.serial = host, port, serial
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        listed = list_devices(host, port, timeout_s)
        if serial not in listed:
            raise AdbUnavailable(
                f"no device {serial!r} at adb server {host}:{port} (it lists {listed or 'no devices'}): {DEVICE_HINT}"
            )
        self._client = _Client(host, port, timeout_s)
        self._size: tuple[int, int] | None = None

    @property
    def where(self) -> str:
        return f"device {self.serial} at adb server {self.host}:{self.port}"

    def shell(
        self,
        cmd: Sequence[str],
        *,
        timeout: float | None = None,
        idempotent: bool = True,
        parse: Callable[[bytes], T] | None = None,
    ) -> Any:
        """Run ``cmd`` (arguments, each shell-quoted) on the device; return its output, or ``parse(output)``.

        A failed call is retried on a new connection unless it is not
        ``idempotent`` and may have reached the device; ``parse`` raising
        ``ValueError`` or ``OSError`` (a truncated PNG, say) counts as a failure.

        Raises:
            DeviceFault: the device is gone, or failed every try, or adb refused the request.
        """
        line = " ".join(shlex.quote(a) for a in cmd)
        timeout = self.timeout_s if timeout is None else timeout
        last: _Trouble | None = None
        for attempt in range(self.retries + 1):
            if last is not None:
                self._still_there(last.reason)
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                out = self._once(line, timeout)
                return parse(out) if parse is not None else out
            except _Trouble as t:
                last = t
            except (ValueError, OSError) as e:
                last = _Trouble(f"unreadable answer ({e})", delivered=True)
            if last.delivered and not idempotent:
                raise DeviceFault(
                    f"{self.where}: `{line}` failed after reaching the device ({last.reason}); "
                    "not repeated, as it may have taken effect",
                    self.serial,
                )
        assert last is not None
        raise DeviceFault(f"{self.where}: `{line}` failed {self.retries + 1} times; last: {last.reason}", self.serial)

    def _once(self, line: str, timeout: float) -> bytes:
        delivered = False
        try:
            conn = self._client.device(self.serial).open_transport(timeout=timeout)
            try:
                conn.send_command("shell:" + line)
                conn.check_okay()
                delivered = True
                out = conn.read_until_close(encoding=None)
            except BaseException:
                conn.close()
                raise
            # The device closed the stream: nothing is left to flush, so skip close()'s
            # 10 ms grace for a half-close, which would be most of a simulated step.
            conn.conn.close()
            return out
        except AdbTimeout:
            raise _Trouble(f"no answer within {timeout:g}s", delivered) from None
        except AdbConnectionError as e:
            raise _Trouble(f"cannot connect ({e})", delivered) from None
        except AdbError as e:
            msg = str(e)
            if msg.startswith("Unknown data") or msg == "connection closed":
                raise _Trouble("the connection was dropped", delivered) from None
            if "not found" in msg or "offline" in msg:
                raise DeviceFault(f"{self.where}: gone (adb says: {msg})", self.serial, gone=True) from None
            raise DeviceFault(f"{self.where}: adb refused `{line}`: {msg}", self.serial) from None
        except (OSError, EOFError) as e:
            raise _Trouble(f"connection error ({e})", delivered) from None

    def _still_there(self, reason: str) -> None:
        """Before a retry: is the server up and the device listed? Else the device is gone."""
        try:
            check_server(self.host, self.port)
        except AdbUnavailable as e:
            raise DeviceFault(
                f"{self.where}: the adb server went away after {reason}: {e}", self.serial, True
            ) from None
        self._client._version = None  # the server may have restarted
        try:
            listed = list_devices(self.host, self.port, self.timeout_s)
        except AdbUnavailable as e:
            raise DeviceFault(f"{self.where}: {e}", self.serial) from None
        if self.serial not in listed:
            raise DeviceFault(f"{self.where}: vanished from the device list after {reason}", self.serial, gone=True)

    def screen_size(self) -> tuple[int, int]:
        """The screen's (width, height) in pixels, from ``wm size`` (asked once)."""
        if self._size is None:
            self._size = self.shell(["wm", "size"], parse=_parse_wm_size)
        return self._size

    def screenshot(self) -> Image.Image:
        """The screen as a PIL image, from ``screencap -p``."""
        return self.shell(["screencap", "-p"], parse=_decode_png)

    def view_hierarchy(self) -> str:
        """The screen's accessibility hierarchy (XML), from ``uiautomator dump``."""
        return self.shell(["uiautomator", "dump", "/dev/tty"], parse=lambda out: strip_dump_trailer(out.decode()))


def _parse_wm_size(out: bytes) -> tuple[int, int]:
    text = out.decode("utf-8", errors="replace")
    for label in ("Override size:", "Physical size:"):
        if label in text:
            w, _, h = text.split(label, 1)[1].split()[0].partition("x")
            return int(w), int(h)
    raise ValueError(f"unexpected `wm size` output {text!r}")


def _decode_png(out: bytes) -> Image.Image:
    if not out.startswith(b"\x89PNG"):
        raise ValueError(f"`screencap -p` gave no PNG: {out[:80]!r}")
    with Image.open(io.BytesIO(out)) as im:
        return im.convert("RGB")


# ---------------------------------------------------------------- episode starts


class EpisodeStart(Protocol):
    """How a device gets to the start of an episode, and what an action without input does."""

    def start(self, link: AdbLink, task: Task, seed: int) -> None: ...

    def idle(self, link: AdbLink) -> None: ...


class SimStart:
    """Simulator only: the phone resets itself to ``task``'s start for ``seed`` (``digiq-sim reset``).

    ``idle`` lets one step pass on the phone (``digiq-sim wait``), as an
    in-process step with no input does: a late page load shows, and episodes
    stay identical to the in-process simulator's.
    """

    def start(self, link: AdbLink, task: Task, seed: int) -> None:
        link.shell([SIM_COMMAND, "reset", str(seed), task.task_set, task.instruction])

    def idle(self, link: AdbLink) -> None:
        link.shell([SIM_COMMAND, "wait"], idempotent=False)


class SnapshotStart:
    """A real emulator: load snapshot ``name`` over the emulator console, then wait until Android answers.

    AitW tasks start from the home screen the snapshot holds, so the task and
    seed are not used. An action without input sends nothing: time passes anyway.

    Args:
        name: the snapshot (env_setup/make_snapshot.sh saves ``digiq_aitw``).
        token_file: the console's auth token file (the emulator writes it on first start).
        timeout_s: how long the load and the wait for ``sys.boot_completed`` may take.
    """

    def __init__(self, name: str, token_file: str = "~/.emulator_console_auth_token", timeout_s: float = 120.0) -> None:
        self.name, self.token_file, self.timeout_s = name, token_file, timeout_s

    def start(self, link: AdbLink, task: Task, seed: int) -> None:
        prefix, _, port = link.serial.partition("-")
        if prefix != "emulator" or not port.isdigit():
            raise AdbUnavailable(
                f"snapshot reset needs an emulator (serial emulator-PORT, PORT its console), got {link.serial!r}"
            )
        try:
            console_command(link.host, int(port), f"avd snapshot load {self.name}", self.token_file, self.timeout_s)
        except OSError as e:
            raise DeviceFault(f"{link.where}: emulator console unreachable ({e})", link.serial, gone=True) from None
        except ConsoleRefused as e:  # a refused token or an unknown snapshot: retrying this device cannot help
            raise DeviceFault(f"{link.where}: {e}", link.serial, gone=True) from None
        deadline = time.monotonic() + self.timeout_s
        while link.shell(["getprop", "sys.boot_completed"]).strip() != b"1":
            if time.monotonic() > deadline:
                raise DeviceFault(f"{link.where}: not booted {self.timeout_s:g}s after the snapshot load", link.serial)
            time.sleep(0.5)

    def idle(self, link: AdbLink) -> None:
        return None


class ConsoleRefused(RuntimeError):
    """The emulator console answered ``KO``: a refused token, an unknown snapshot, an unknown command."""


def console_command(host: str, port: int, command: str, token_file: str, timeout: float = 30.0) -> str:
    """Run one emulator console command (what ``adb emu COMMAND`` does); return its answer.

    The console is a line protocol on the emulator's own port (the number in
    ``emulator-5554``): a banner, ``auth TOKEN`` when it asks for
    authentication (the token is in ``token_file``), then the command; each
    answer ends with ``OK`` or ``KO: reason``. The token is in no message
    this raises, whatever the console echoes (:func:`~digiq.redaction.redact_secrets`).

    Raises:
        AdbUnavailable: the console wants a token and ``token_file`` cannot be read.
        ConsoleRefused: the console answered ``KO``.
        OSError: the console is unreachable or silent.
    """
    token = ""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock, sock.makefile("rwb") as f:

            def ask(line: str | None) -> str:
                if line is not None:
                    f.write(line.encode() + b"\r\n")
                    f.flush()
                lines = []
                while True:
                    raw = f.readline()
                    if not raw:
                        raise ConnectionError(f"emulator console {host}:{port} closed the connection")
                    text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                    if text == "OK":
                        return "\n".join(lines)
                    if text.startswith("KO"):
                        raise ConsoleRefused(f"emulator console {host}:{port}: `{line}` failed: {text}")
                    lines.append(text)

            if "Authentication required" in ask(None):
                path = Path(token_file).expanduser()
                try:
                    token = path.read_text(encoding="utf-8").strip()
                except OSError as e:
                    raise AdbUnavailable(
                        f"emulator console {host}:{port} wants its auth token, but {path} cannot be read "
                        f"({e.strerror}); the emulator writes it on first start"
                    ) from None
                ask(f"auth {token}")
            return ask(command)
    except (ConsoleRefused, OSError) as e:  # the token is in the `auth` line and in whatever the console echoes
        if token:
            e.args = tuple(redact_secrets(a, (token,)) if isinstance(a, str) else a for a in e.args)
        raise


# ---------------------------------------------------------------- success


# What `pgrep -f` matches for a running `input` command: `app_process ... com.android.commands.input.Input tap`,
# or `cmd input tap` on newer Android.
LINGERING_INPUT = "[Ii]nput (tap|swipe|text|keyevent)"


class VerdictError(RuntimeError):
    """An evaluator could not judge this step (a reply that is no verdict): a fault of the episode alone.

    ``count_failed``: the episode ends there and counts as failed; otherwise it
    is started again, as after a device fault.
    """

    def __init__(self, message: str, count_failed: bool) -> None:
        super().__init__(message)
        self.count_failed = count_failed


class Evaluator(Protocol):
    """Judges whether ``task`` is done, from the device and its current screen (or raises :class:`VerdictError`)."""

    def __call__(self, link: AdbLink, task: Task, screenshot: np.ndarray) -> bool: ...


class SimGroundTruth:
    """Simulator only: the task's success condition read from the simulated phone's state (``digiq-sim check``)."""

    def __call__(self, link: AdbLink, task: Task, screenshot: np.ndarray) -> bool:
        return link.shell([SIM_COMMAND, "check"], parse=_parse_bit)


def _parse_bit(out: bytes) -> bool:
    if out.strip() not in (b"0", b"1"):
        raise ValueError(f"`{SIM_COMMAND} check` answered {out[:200]!r}, not 0 or 1")
    return out.strip() == b"1"


# ---------------------------------------------------------------- the env


class AdbEnv(PhoneEnv):
    """One Android device over adb working on one task per episode: :class:`AndroidSimEnv`'s API.

    Screenshots are resized to ``width`` (box filter) unless the device sends
    that size already; input coordinates come from ``wm size``, so they are
    right whatever size the screenshots are. A text holding a literal ``%s``
    is typed in two ``input text`` calls (see :func:`input_text_args`), which
    the simulator counts as two device steps. Info gains ``fault`` ("" unless a
    device fault ended the episode) and ``untyped`` (characters of a TYPE
    action that ``input text`` cannot type, which are skipped).

    Args:
        link: the device.
        start: how episodes start (:class:`SimStart` or :class:`SnapshotStart`).
        evaluator: the success judge.
        tasks, width, max_steps: as for :class:`~digiq.env.gym_env.AndroidSimEnv`.
        settle_s: pause after each input before the screenshot, for a real device's animations.
        drain_s: after a faulted step, how long the next reset waits for inputs still running on the device.
        sim_device: privileged access to the simulated phone behind ``link`` (the scripted expert's view).
        on_close: called by :meth:`close` (to stop a simulator server the env owns).
    """

    parallel_steps = True

    def __init__(
        self,
        link: AdbLink,
        start: EpisodeStart,
        evaluator: Evaluator,
        *,
        tasks: Sequence[Task | str] = (),
        width: int = 216,
        max_steps: int | None = None,
        settle_s: float = 0.0,
        drain_s: float = 60.0,
        sim_device: Callable[[], SimDevice] | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(tasks, width, max_steps)
        self.link, self.start, self.evaluator, self.settle_s = link, start, evaluator, settle_s
        self.drain_s = drain_s
        self._sim_device, self.on_close = sim_device, on_close
        self._frame = np.zeros((self.height, self.width, 3), np.uint8)
        self._untyped = ""
        self._inputs_may_linger = False  # a step faulted: an input it sent may still be running on the device
        self._verdict_fault = ""  # why this step's evaluator gave no verdict, when that counts as failure

    @property
    def serial(self) -> str:
        return self.link.serial

    @property
    def device(self) -> SimDevice:
        """The simulated phone's device (privileged: the scripted expert reads it)."""
        if self._sim_device is None:
            raise RuntimeError(
                f"{self.link.where} gives no view of its device state: the scripted expert works on the "
                "adb-sim backend with an in-process simulator server only (DeviceConfig.adb_port: 0)"
            )
        return self._sim_device()

    def _screenshot(self) -> np.ndarray:
        im = self.link.screenshot()
        if im.size != (self.width, self.height):
            im = im.resize((self.width, self.height), Image.Resampling.BOX)
        frame = np.asarray(im, dtype=np.uint8)
        frame.setflags(write=False)
        return frame

    def _start(self, seed: int, task: Task) -> None:
        if task.start_app:
            raise ValueError(
                f"task {task.instruction!r} starts in app {task.start_app!r}: only the in-process simulator "
                "starts episodes in an app (stage 00's demonstrations); devices over adb start on the launcher"
            )
        if self._inputs_may_linger:
            self._drain_inputs()
        self.start.start(self.link, task, seed)
        self._frame = self._screenshot()

    def _drain_inputs(self) -> None:
        """Wait until no ``input`` command runs on the device, so none lands in the episode about to start.

        After a step timed out, the input it sent may still run (a busy
        device, a late connection) and would tap the next episode's screen;
        ``pgrep`` lists those still running (``input tap``, or ``cmd input
        tap`` on newer Android).

        Raises:
            DeviceFault: inputs still run after ``drain_s``.
        """
        deadline = time.monotonic() + self.drain_s
        while self.link.shell(["pgrep", "-f", LINGERING_INPUT]).strip():
            if time.monotonic() > deadline:
                raise DeviceFault(f"{self.link.where}: input commands still running {self.drain_s:g}s after a fault",
                                  self.serial)  # fmt: skip
            time.sleep(0.1)
        self._inputs_may_linger = False

    def _act(self, action: Action) -> bool:
        before = self._frame
        self._untyped = ""
        self._send(action)
        if self.settle_s:
            time.sleep(self.settle_s)
        self._frame = self._screenshot()
        return not np.array_equal(before, self._frame)

    def _send(self, a: Action) -> None:
        if a.type is ActionType.DUAL_POINT:
            w, h = self.link.screen_size()
            (ty, tx), (ly, lx) = a.touch, a.lift
            # Float pixels: Android's `input` parses floats, and exact positions keep episodes identical
            # to the in-process simulator's.
            if a.is_tap:
                cmd = ["input", "tap", repr(tx * w), repr(ty * h)]
            else:
                cmd = ["input", "swipe", repr(tx * w), repr(ty * h), repr(lx * w), repr(ly * h), str(SWIPE_MS)]
            self.link.shell(cmd, idempotent=False)
        elif a.type is ActionType.TYPE:
            typeable = "".join(c for c in a.text if c in TYPEABLE)
            self._untyped = "".join(c for c in a.text if c not in TYPEABLE)
            args = input_text_args(typeable)
            for arg in args:
                self.link.shell(["input", "text", arg], idempotent=False)
            if not args:
                self.start.idle(self.link)
        elif a.type in KEYCODES:
            self.link.shell(["input", "keyevent", str(KEYCODES[a.type])], idempotent=False)
        else:  # STATUS_* and INVALID: nothing to send, but a step passes
            self.start.idle(self.link)

    def _succeeded(self) -> bool:
        assert self.task is not None
        try:
            return self.evaluator(self.link, self.task, self._frame)
        except VerdictError as e:
            if not e.count_failed:
                raise DeviceFault(f"judge: {e}", self.serial) from e
            self._verdict_fault = f"judge: {e}"
            return False

    def render(self) -> np.ndarray:
        return self._frame

    def view_hierarchy(self) -> str:
        return self.link.view_hierarchy()

    def screen_size(self) -> tuple[int, int]:
        return self.link.screen_size()

    def _info(self, action: Action, success: bool, changed: bool) -> dict[str, Any]:
        return {**super()._info(action, success, changed), "fault": "", "untyped": self._untyped}

    def step(self, action: str | Action) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """As :meth:`PhoneEnv.step`; a device fault truncates the episode with ``info["fault"]`` set.

        A step the evaluator could not judge, with ``count_failed``, ends the
        episode as failed with ``info["verdict_fault"]`` saying why.
        """
        self._verdict_fault = ""
        try:
            obs, reward, terminated, truncated, info = super().step(action)
            if self._verdict_fault:
                return obs, 0.0, False, True, {**info, "verdict_fault": self._verdict_fault}
            return obs, reward, terminated, truncated, info
        except DeviceFault as e:
            self._inputs_may_linger = True
            parsed = action if isinstance(action, Action) else parse_action(action)
            info = {**self._info(parsed, False, False), "fault": str(e), "gone": e.gone}
            return self._obs(), 0.0, False, True, info

    def close(self) -> None:
        if self.on_close is not None:
            self.on_close()
            self.on_close = None
        super().close()
