"""Simulated phones behind adb's host protocol, on a loopback port.

:class:`AdbSimServer` answers the smart-socket requests an adb client sends
to an adb server (``host:version``, ``host:devices[-l]``, transport selection
by serial, ``shell:``/``shell,v2:``/``exec:`` services, a few ``host-serial:``
queries) and runs the shell commands the emulator backend and common adb
tools use (``screencap -p``, ``input tap|swipe|text|keyevent``, ``wm size``,
``dumpsys display``, ``getprop``, ``echo``, ``uiautomator dump /dev/tty``) on
:class:`~digiq.env.device.SimDevice` s. Each phone also has an emulator
console on its own port (its serial is ``emulator-<console port>``, as for
real emulators), which loads and saves
snapshots. So the emulator backend, unchanged, drives simulated phones, and
so does any adb-based tool pointed at the port.

Simulator only:

* the ``digiq-sim`` shell command: ``reset SEED TASK_SET INSTRUCTION`` (a
  task's start, as :class:`~digiq.env.gym_env.AndroidSimEnv` makes it),
  ``wait`` (a step passes with no input) and ``check`` (the task's ground
  truth, ``1`` or ``0``; always ``0`` for an instruction the task parser
  cannot map, which a phone still takes: a proposed task, say);
* fault injection (:meth:`AdbSimServer.inject`): dropped connections, hangs,
  slow screenshots or inputs and phones that vanish, to test what the backend survives;
* privileged access to each phone's :class:`SimDevice` (:meth:`AdbSimServer.phone`)
  for the scripted expert.

Protocol facts: a request is 4 hex digits of length then the request; the
answer is ``OKAY`` (then any payload) or ``FAIL`` + 4 hex digits of length +
message. Strings in answers ("blocks") are length-prefixed the same way.
``host:tport:serial:S`` answers ``OKAY`` plus the transport id as 8 bytes
little-endian. ``shell,v2`` output is framed as (id, uint32 length, data):
1 stdout, 2 stderr, 3 exit code.
"""

from __future__ import annotations

import io
import socket
import socketserver
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from PIL import Image

from digiq.env import actions as A
from digiq.env.actions import Action, ActionType
from digiq.env.android import DENSITY, KEYCODES, SIM_COMMAND, decode_input_text
from digiq.env.device import SimDevice
from digiq.env.hierarchy import DUMP_TRAILER, hierarchy_xml
from digiq.env.state import Dynamics
from digiq.env.tasks import TASK_SETS, Task, UnsupportedInstruction, parse_task, unchecked_task
from digiq.env.ui import SCREEN_H, SCREEN_W

__all__ = ["SERVER_VERSION", "IDLE_TIMEOUT_S", "AdbSimServer", "Fault", "SimPhone", "BOOT_SNAPSHOTS"]

SERVER_VERSION = 41  # adb 1.0.41: clients select transports with host:tport
IDLE_TIMEOUT_S = 60.0  # AdbSimServer's default: far beyond any pause of a client mid-request
# Snapshots every simulated phone has from the start: the emulator's quick-boot one, and the one
# env_setup/make_snapshot.sh saves (DeviceConfig.snapshot's default).
BOOT_SNAPSHOTS = ("default_boot", "digiq_aitw")
_KEYS_BY_CODE = {code: t for t, code in KEYCODES.items()}
_KEY_NAMES = {"KEYCODE_HOME": 3, "HOME": 3, "KEYCODE_BACK": 4, "BACK": 4, "KEYCODE_ENTER": 66, "ENTER": 66}
_PROPS = {
    "sys.boot_completed": "1",
    "ro.build.version.sdk": "28",
    "ro.build.version.release": "9",
    "ro.product.model": "Pixel (digiq simulator)",
    "ro.kernel.qemu": "1",
}
_FEATURES = "shell_v2,cmd,stat_v2"
_IDLE = Action(ActionType.INVALID, error="time passes with no input")


@dataclass(frozen=True)
class Fault:
    """A misbehaviour to inject into one simulated phone.

    ``kind``: ``drop`` closes the connection without answering; ``hang`` keeps
    it open without answering for ``seconds``; ``slow_screencap`` and
    ``slow_input`` accept a ``screencap`` or ``input`` command and run it
    ``seconds`` later; ``vanish`` takes the phone off the device list for good
    (as an emulator that crashed). The fault starts after ``after`` device
    requests were served normally (counting only the slowed command for the
    ``slow_*`` kinds) and affects ``times`` requests (``None``: all).
    """

    kind: Literal["drop", "hang", "slow_screencap", "slow_input", "vanish"]
    after: int = 0
    times: int | None = 1
    seconds: float = 5.0

    def __post_init__(self) -> None:
        if self.kind not in ("drop", "hang", "slow_screencap", "slow_input", "vanish"):
            raise ValueError(f"unknown fault kind {self.kind!r}")
        if self.after < 0 or (self.times is not None and self.times < 1) or self.seconds < 0:
            raise ValueError(f"fault counts and seconds must be non-negative (times >= 1): {self}")


class _Armed:
    """A fault's countdown on one phone."""

    def __init__(self, fault: Fault) -> None:
        self.fault, self.wait, self.left = fault, fault.after, fault.times

    def fires(self, program: str) -> bool:
        kind = self.fault.kind
        if kind.startswith("slow_") and program != kind.removeprefix("slow_"):
            return False
        if self.wait > 0:
            self.wait -= 1
            return False
        if self.left is None:
            return True
        if self.left > 0:
            self.left -= 1
            return True
        return False


class SimPhone:
    """One simulated phone: its device, current task, snapshots, injected faults and console."""

    def __init__(self, transport_id: int, device: SimDevice) -> None:
        self.transport_id = transport_id
        self.device = device
        self.task: Task | None = None
        self.online = True
        self.lock = threading.Lock()  # one command at a time, as a device serialises input
        self.inputs_running = 0  # `input` commands accepted and not yet done: what `pgrep` lists
        self.counter = threading.Lock()
        self.faults: list[_Armed] = []
        self.snapshots: dict[str, SimDevice] = {}
        self.console: socketserver.ThreadingTCPServer | None = None
        self.serial = ""

    def save(self, name: str) -> None:
        self.snapshots[name] = self.device.clone()

    def load(self, name: str) -> bool:
        snap = self.snapshots.get(name)
        if snap is None:
            return False
        self.device = snap.clone()
        self.task = None  # a snapshot carries no task: success is for an evaluator to judge
        return True

    def next_fault(self, program: str) -> Fault | None:
        """The fault that strikes the device request (running ``program``) being served now, if any."""
        with self.lock:
            for armed in self.faults:
                if armed.fires(program):
                    if armed.fault.kind == "vanish":
                        self.online = False
                    return armed.fault
        return None


class _Server(socketserver.ThreadingTCPServer):
    """A thread per connection while one of ``slots`` is free; past them, ``refusal`` and the connection closed.

    The slots are shared by an :class:`AdbSimServer`'s adb port and every
    console port: each served connection holds a thread until it ends, so
    they bound the server's threads however many clients connect.
    """

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # a rollout's envs connect at once; the default 5 drops SYNs, each a 1 s retry

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[socketserver.BaseRequestHandler],
        slots: threading.BoundedSemaphore,
        refusal: bytes,
    ) -> None:
        self.slots, self.refusal = slots, refusal
        super().__init__(address, handler)

    def process_request(self, request: socket.socket, client_address: tuple[str, int]) -> None:
        if not self.slots.acquire(blocking=False):
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: its slot is free again
            self.slots.release()
            raise

    def process_request_thread(self, request: socket.socket, client_address: tuple[str, int]) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def _refuse(self, request: socket.socket) -> None:
        """Answer and close from the accepting thread itself, never waiting on the client (a few bytes into an
        empty send buffer)."""
        request.setblocking(False)
        try:
            request.send(self.refusal)
        except OSError:
            pass  # the client is gone already
        self.shutdown_request(request)


def _serve(
    host: str,
    port: int,
    handle: Callable[[socket.socket], None],
    slots: threading.BoundedSemaphore,
    idle_timeout_s: float,
    refusal: bytes,
) -> _Server:
    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            # Answers go out in pieces (OKAY, then output): without this, Nagle's algorithm holds
            # the second piece until the client's delayed ACK, some 40 ms per request.
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.request.settimeout(idle_timeout_s)  # a client silent this long gives its thread back
            try:
                handle(self.request)
            except (ConnectionError, TimeoutError, OSError):
                pass  # the client went away or fell silent: nothing to answer

    srv = _Server((host, port), Handler, slots, refusal)
    threading.Thread(target=srv.serve_forever, name=f"adbsim-{srv.server_address[1]}", daemon=True).start()
    return srv


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _block(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return f"{len(data):04x}".encode() + data


def _fail(sock: socket.socket, message: str) -> None:
    sock.sendall(b"FAIL" + _block(message))


class AdbSimServer:
    """An adb server on ``host:port`` (port 0: a free one) backed by ``n_devices`` simulated phones.

    Args:
        n_devices: how many phones.
        dynamics: their in-the-wild disturbance rates.
        width: width of the PNGs ``screencap -p`` returns (``wm size`` still says
            1080x2280): rendering full-size PNGs is slow and a model wants small
            screenshots anyway.
        console_token: the emulator console's auth token (``None``: no auth, as
            an emulator with an empty token file).
        idle_timeout_s: a connection whose client sends nothing (or reads
            nothing) for this long is closed, and its thread freed. The
            package's clients never pause mid-request (each adb command and
            console command is one connection, written at once), so only a
            stalled or abandoned client meets it; an injected ``hang`` or
            ``slow_*`` fault waits on the server's side and is not cut short.
        max_connections: connections served at once, over the adb port and
            every console port together (default ``16 + 4 * n_devices``: per
            phone a command, its console and the connections of retries still
            held by a hung request; the rest for device lists and tools). Each
            holds a thread; one more is answered at once and closed, on the
            adb port with ``FAIL`` naming the cap, on a console with ``KO:``.

    Use as a context manager, or :meth:`close` it.
    """

    def __init__(
        self,
        n_devices: int = 1,
        *,
        dynamics: Dynamics | None = None,
        width: int = 216,
        host: str = "127.0.0.1",
        port: int = 0,
        console_token: str | None = None,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        max_connections: int | None = None,
    ) -> None:
        if n_devices < 1:
            raise ValueError(f"AdbSimServer needs at least one device, got {n_devices}")
        if not idle_timeout_s > 0:
            raise ValueError(f"AdbSimServer needs idle_timeout_s > 0, got {idle_timeout_s}")
        if max_connections is None:
            max_connections = 16 + 4 * n_devices
        if max_connections < 1:
            raise ValueError(f"AdbSimServer needs max_connections >= 1, got {max_connections}")
        self.host, self.console_token = host, console_token
        self.idle_timeout_s, self.max_connections = idle_timeout_s, max_connections
        slots = threading.BoundedSemaphore(max_connections)
        busy = f"all {max_connections} connections of the digiq adb simulator are in use (max_connections); try again"
        self._stopped = threading.Event()  # releases hung requests
        self._closed = threading.Event()
        self._phones: dict[str, SimPhone] = {}
        for i in range(n_devices):
            phone = SimPhone(i + 1, SimDevice(dynamics, width))
            phone.device.reset(0)
            for name in BOOT_SNAPSHOTS:
                phone.save(name)
            phone.console = _serve(host, 0, lambda sock, p=phone: self._console(sock, p), slots, idle_timeout_s,
                                   f"KO: {busy}\r\n".encode())  # fmt: skip
            phone.serial = f"emulator-{phone.console.server_address[1]}"
            self._phones[phone.serial] = phone
        self._adb = _serve(host, port, self._handle, slots, idle_timeout_s, b"FAIL" + _block(busy))
        self.port: int = self._adb.server_address[1]

    # ------------------------------------------------------------ public API

    @property
    def serials(self) -> list[str]:
        """The phones on the device list now (a vanished phone is not)."""
        return [s for s, p in self._phones.items() if p.online]

    def phone(self, serial: str) -> SimPhone:
        """A phone by serial, online or not (privileged: tests, demos and the scripted expert)."""
        try:
            return self._phones[serial]
        except KeyError:
            raise KeyError(f"no simulated phone {serial!r}; phones: {sorted(self._phones)}") from None

    def inject(self, serial: str, fault: Fault) -> None:
        """Arm ``fault`` on phone ``serial``."""
        phone = self.phone(serial)
        with phone.lock:
            phone.faults.append(_Armed(fault))

    def close(self) -> None:
        """Stop answering (hung requests are released) and free the ports."""
        self._stopped.set()
        if self._closed.is_set():
            return
        for srv in [self._adb, *(p.console for p in self._phones.values() if p.console is not None)]:
            srv.shutdown()
            srv.server_close()
        self._closed.set()

    def wait_closed(self) -> None:
        """Block until :meth:`close` (or an adb client's ``host:kill``) has freed the ports."""
        while not self._closed.wait(0.5):  # a timed wait lets Ctrl-C through
            pass

    def __enter__(self) -> AdbSimServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ host protocol

    def _handle(self, sock: socket.socket) -> None:
        phone: SimPhone | None = None
        while True:
            head = _recv_exact(sock, 4)
            if head is None:
                return
            try:
                size = int(head, 16)
            except ValueError:
                _fail(sock, f"bad request length {head!r}")
                return
            raw = _recv_exact(sock, size)
            if raw is None:
                return
            request = raw.decode("utf-8", errors="replace")
            if phone is not None:
                self._service(sock, phone, request)
                return
            phone, keep_open = self._host(sock, request)
            if not keep_open:
                return

    def _host(self, sock: socket.socket, request: str) -> tuple[SimPhone | None, bool]:
        """Answer a host request; return (selected phone, whether the connection goes on)."""
        if request == "host:version":
            sock.sendall(b"OKAY" + _block(f"{SERVER_VERSION:04x}"))
        elif request in ("host:devices", "host:devices-l"):
            if request.endswith("-l"):
                lines = [
                    f"{s:<22}device product:sdk_gphone_x86 model:Pixel device:generic_x86 "
                    f"transport_id:{self._phones[s].transport_id}\n"
                    for s in self.serials
                ]
            else:
                lines = [f"{s}\tdevice\n" for s in self.serials]
            sock.sendall(b"OKAY" + _block("".join(lines)))
        elif request == "host:kill":
            sock.sendall(b"OKAY")
            threading.Thread(target=self.close, daemon=True).start()
        elif request.startswith(("host:transport", "host:tport:")):
            phone = self._select(sock, request)
            return phone, phone is not None
        elif request.startswith(("host-serial:", "host-transport-id:")) or request == "host:features":
            self._device_query(sock, request)
        else:
            _fail(sock, f"unknown host service {request!r} (digiq adb simulator)")
        return None, False

    def _find(self, how: str, key: str) -> SimPhone | str:
        """A phone by serial, transport id or 'any'; else the error a real adb server gives."""
        online = [p for p in self._phones.values() if p.online]
        if how == "serial":
            p = self._phones.get(key)
            return p if p is not None and p.online else f"device '{key}' not found"
        if how == "id":
            found = [p for p in online if str(p.transport_id) == key]
            return found[0] if found else f"no device with transport id '{key}'"
        if not online:
            return "no devices/emulators found"
        if len(online) > 1:
            return "more than one device/emulator"
        return online[0]

    def _select(self, sock: socket.socket, request: str) -> SimPhone | None:
        tport = request.startswith("host:tport:")
        rest = request.removeprefix("host:tport:") if tport else request.removeprefix("host:")
        if rest.startswith("serial:"):
            found = self._find("serial", rest.removeprefix("serial:"))
        elif rest.startswith("transport:"):
            found = self._find("serial", rest.removeprefix("transport:"))
        elif rest.startswith("transport-id:"):
            found = self._find("id", rest.removeprefix("transport-id:"))
        elif rest in ("any", "transport-any", "local", "transport-local", "emulator"):
            found = self._find("any", "")
        else:
            _fail(sock, f"unknown host service {request!r} (digiq adb simulator)")
            return None
        if isinstance(found, str):
            _fail(sock, found)
            return None
        sock.sendall(b"OKAY" + (found.transport_id.to_bytes(8, "little") if tport else b""))
        return found

    def _device_query(self, sock: socket.socket, request: str) -> None:
        prefix, _, rest = request.partition(":")
        key, _, query = rest.rpartition(":")
        found = self._find({"host-serial": "serial", "host-transport-id": "id"}.get(prefix, "any"), key)
        if isinstance(found, str):
            _fail(sock, found)
            return
        answers = {
            "get-state": "device",
            "get-serialno": found.serial,
            "get-devpath": "unknown",
            "features": _FEATURES,
        }
        if query not in answers:
            _fail(sock, f"unknown host service {request!r} (digiq adb simulator)")
            return
        sock.sendall(b"OKAY" + _block(answers[query]))

    # ------------------------------------------------------------ device services

    def _service(self, sock: socket.socket, phone: SimPhone, request: str) -> None:
        if request.startswith("shell,v2"):
            framed, cmd = True, request.partition(":")[2]
        elif request.startswith(("shell:", "exec:")):
            framed, cmd = False, request.partition(":")[2]
        else:
            _fail(sock, f"unsupported service {request!r} (digiq adb simulator: shell and exec only)")
            return
        if not cmd.strip():
            _fail(sock, "interactive shells are not supported by the digiq adb simulator; give a command")
            return
        fault = phone.next_fault(program=cmd.split(maxsplit=1)[0])
        kind = fault.kind if fault is not None else None
        if kind in ("drop", "vanish"):
            return  # the connection closes with no answer
        if fault is not None and kind == "hang":
            self._stopped.wait(fault.seconds)
            return
        sock.sendall(b"OKAY")
        is_input = cmd.split(maxsplit=1)[0] == "input"
        if is_input:  # from here until it is done, the input runs on the phone whatever the client does
            with phone.counter:
                phone.inputs_running += 1
        try:
            if fault is not None and kind in ("slow_screencap", "slow_input"):
                self._stopped.wait(fault.seconds)
            with phone.lock:
                pieces, code = _Shell(phone).run(cmd)
        finally:
            if is_input:
                with phone.counter:
                    phone.inputs_running -= 1
        if framed:
            frames = [bytes([i]) + len(data).to_bytes(4, "little") + data for i, data in pieces]
            sock.sendall(b"".join(frames) + b"\x03\x01\x00\x00\x00" + bytes([code & 0xFF]))
        else:
            sock.sendall(b"".join(data for _, data in pieces))  # a v1 shell merges the streams, as its pty does

    # ------------------------------------------------------------ emulator console

    def _console(self, sock: socket.socket, phone: SimPhone) -> None:
        f = sock.makefile("rwb", buffering=0)

        def say(*lines: str) -> None:
            f.write("".join(line + "\r\n" for line in lines).encode())

        authed = self.console_token is None
        if authed:
            say("Android Console: type 'help' for a list of commands", "OK")
        else:
            say(
                "Android Console: Authentication required",
                "Android Console: type 'auth <auth_token>' to authenticate",
                "Android Console: you can find your <auth_token> in the token file",
                "OK",
            )
        for raw in f:
            words = raw.decode("utf-8", errors="replace").split()
            if not words:
                continue
            if words[0] in ("quit", "exit"):
                say("OK")
                return
            if words[0] == "auth":
                authed = len(words) == 2 and words[1] == self.console_token
                if authed:
                    say("Android Console: type 'help' for a list of commands", "OK")
                else:
                    say("KO: authentication token does not match")
            elif not authed:
                say("KO: unknown command, try 'help'")
            elif words[:2] == ["avd", "snapshot"] and len(words) == 4 and words[2] in ("load", "save"):
                with phone.lock:
                    if words[2] == "save":
                        phone.save(words[3])
                        ok = True
                    else:
                        ok = phone.load(words[3])
                say("OK" if ok else f"KO: snapshot '{words[3]}' not found")
            elif words[:3] == ["avd", "snapshot", "list"]:
                say(*sorted(phone.snapshots), "OK")
            elif words[0] == "help":
                say("avd snapshot load|save NAME, avd snapshot list, auth TOKEN, quit (digiq simulator)", "OK")
            else:
                say("KO: unknown command, try 'help'")


class _Shell:
    """The few shell commands a simulated phone runs; anything else is "not found", as in Android's sh."""

    def __init__(self, phone: SimPhone) -> None:
        self.phone = phone
        self.status = 0

    def run(self, line: str) -> tuple[list[tuple[int, bytes]], int]:
        """Run ``line`` (commands separated by ``;``); return the output in order as
        (1 stdout | 2 stderr, bytes) pieces, and the last exit status."""
        try:
            tokens = _split(line)
        except ValueError as e:
            return [(2, f"/system/bin/sh: syntax error: {e}\n".encode())], 2
        pieces: list[tuple[int, bytes]] = []
        command: list[str] = []
        for tok in [*tokens, _Op(";")]:
            if isinstance(tok, _Op) and tok == ";":
                if command:
                    out, err, self.status = self._one([a.replace(_STATUS, str(self.status)) for a in command])
                    pieces += [(1, out), (2, err)]
                    command = []
            elif isinstance(tok, _Op):
                pieces.append((2, f"/system/bin/sh: '{tok}' is not supported by the digiq simulator\n".encode()))
                return [p for p in pieces if p[1]], 2
            else:
                command.append(tok)
        return [p for p in pieces if p[1]], self.status

    def _one(self, argv: list[str]) -> tuple[bytes, bytes, int]:
        name, args = argv[0], argv[1:]
        handler = {
            "screencap": self._screencap,
            "input": self._input,
            "wm": self._wm,
            "getprop": self._getprop,
            "dumpsys": self._dumpsys,
            "echo": self._echo,
            "pgrep": self._pgrep,
            "uiautomator": self._uiautomator,
            SIM_COMMAND: self._sim,
        }.get(name)
        if handler is None:
            return b"", f"/system/bin/sh: {name}: not found\n".encode(), 127
        try:
            return handler(args)
        except _Usage as e:
            return b"", f"{name}: {e}\n".encode(), 1

    def _screencap(self, args: list[str]) -> tuple[bytes, bytes, int]:
        if args != ["-p"]:
            raise _Usage("the digiq simulator supports only `screencap -p` (PNG to stdout)")
        buf = io.BytesIO()
        Image.fromarray(self.phone.device.screenshot()).save(buf, format="PNG", compress_level=1)
        return buf.getvalue(), b"", 0

    def _step(self, action: Action) -> tuple[bytes, bytes, int]:
        self.phone.device.step(action)
        return b"", b"", 0

    def _input(self, args: list[str]) -> tuple[bytes, bytes, int]:
        verb, rest = (args[0], args[1:]) if args else ("", [])
        try:
            if verb == "tap" and len(rest) == 2:
                x, y = map(float, rest)
                return self._step(A.Action(ActionType.DUAL_POINT, _norm(x, y), _norm(x, y)))
            if verb == "swipe" and len(rest) in (4, 5):
                x1, y1, x2, y2 = map(float, rest[:4])
                return self._step(A.Action(ActionType.DUAL_POINT, _norm(x1, y1), _norm(x2, y2)))
        except ValueError:
            raise _Usage(f"coordinates must be numbers, got {rest}") from None
        if verb == "text" and len(rest) == 1:
            return self._step(A.type_text(decode_input_text(rest[0])))
        if verb == "keyevent" and rest:
            for key in rest:
                code = _KEY_NAMES.get(key.upper(), int(key) if key.isdigit() else None)
                if code is None:
                    raise _Usage(f"unknown keycode {key!r}")
                self._step(A.Action(_KEYS_BY_CODE[code]) if code in _KEYS_BY_CODE else _IDLE)
            return b"", b"", 0
        raise _Usage("usage: input tap X Y | swipe X1 Y1 X2 Y2 [MS] | text TEXT | keyevent KEY...")

    def _uiautomator(self, args: list[str]) -> tuple[bytes, bytes, int]:
        if args != ["dump", "/dev/tty"]:
            raise _Usage("the digiq simulator supports only `uiautomator dump /dev/tty` (the hierarchy to stdout)")
        xml = hierarchy_xml(self.phone.device.screen().widgets)
        return f"{xml}{DUMP_TRAILER}\n".encode(), b"", 0

    def _wm(self, args: list[str]) -> tuple[bytes, bytes, int]:
        if args == ["size"]:
            return f"Physical size: {SCREEN_W}x{SCREEN_H}\n".encode(), b"", 0
        if args == ["density"]:
            return f"Physical density: {DENSITY}\n".encode(), b"", 0
        raise _Usage("the digiq simulator supports `wm size` and `wm density`")

    def _dumpsys(self, args: list[str]) -> tuple[bytes, bytes, int]:
        if args != ["display"]:
            raise _Usage("the digiq simulator supports only `dumpsys display`")
        viewport = f"DisplayViewport{{valid=true, orientation=0, deviceWidth={SCREEN_W}, deviceHeight={SCREEN_H}}}"
        return f"  mViewports=[{viewport}]\n".encode(), b"", 0

    def _getprop(self, args: list[str]) -> tuple[bytes, bytes, int]:
        if not args:
            return "".join(f"[{k}]: [{v}]\n" for k, v in _PROPS.items()).encode(), b"", 0
        return (_PROPS.get(args[0], "") + "\n").encode(), b"", 0

    def _echo(self, args: list[str]) -> tuple[bytes, bytes, int]:
        return (" ".join(args) + "\n").encode(), b"", 0

    def _pgrep(self, args: list[str]) -> tuple[bytes, bytes, int]:
        """``pgrep -f PATTERN`` for the phone's running ``input`` commands only: one made-up pid each."""
        if len(args) != 2 or args[0] != "-f":
            raise _Usage("the digiq simulator supports only `pgrep -f PATTERN` (it lists running input commands)")
        with self.phone.counter:
            n = self.phone.inputs_running
        return "".join(f"{4000 + i}\n" for i in range(n)).encode(), b"", 0 if n else 1

    def _sim(self, args: list[str]) -> tuple[bytes, bytes, int]:
        phone = self.phone
        if len(args) == 4 and args[0] == "reset":
            try:
                seed = int(args[1])
                if args[2] not in TASK_SETS:
                    raise ValueError(f"task set must be one of {list(TASK_SETS)}, got {args[2]!r}")
                try:
                    task = parse_task(args[3], args[2])
                except UnsupportedInstruction:  # a phone takes any instruction; its check of this one never passes
                    task = unchecked_task(args[3], args[2])
            except ValueError as e:
                raise _Usage(f"reset: {e}") from None
            phone.device.reset(seed, task.goal.setup)
            phone.task = task
            return b"ok\n", b"", 0
        if args == ["wait"]:
            return self._step(_IDLE)
        if args == ["check"]:
            if phone.task is None:
                raise _Usage(f"check: no task on this phone; run `{SIM_COMMAND} reset SEED TASK_SET INSTRUCTION`")
            return (b"1\n" if phone.task.goal.check(phone.device.state) else b"0\n"), b"", 0
        raise _Usage("usage: digiq-sim reset SEED TASK_SET INSTRUCTION | wait | check")


class _Op(str):
    """An unquoted shell operator character (``;``, ``&``, ``|``, ``<``, ``>``, ``(``, ``)``)."""


_STATUS = "\x00"  # stands for an unquoted or double-quoted ``$?`` until the command runs


def _split(line: str) -> list[str]:
    """Split a shell line into words and :class:`_Op` s with POSIX quoting (single, double, backslash).

    Quoting is what matters here: ``input text`` arguments arrive quoted by
    :func:`shlex.quote`, and a quoted ``;`` or ``)`` is text, not an operator.
    """
    tokens: list[str] = []
    word: list[str] = []
    started = False  # a word has begun (possibly as an empty quoted string)
    quote = ""
    i = 0
    while i < len(line):
        c = line[i]
        if quote == "'":
            if c == "'":
                quote = ""
            else:
                word.append(c)
        elif c == "$" and line[i + 1 : i + 2] == "?":
            word.append(_STATUS)
            started, i = True, i + 1
        elif quote == '"':
            if c == '"':
                quote = ""
            elif c == "\\" and line[i + 1 : i + 2] in ("$", "`", '"', "\\"):
                word.append(line[i + 1])
                i += 1
            else:
                word.append(c)
        elif c in "'\"":
            quote, started = c, True
        elif c == "\\" and i + 1 < len(line):
            word.append(line[i + 1])
            started, i = True, i + 1
        elif c.isspace() or c in ";&|<>()":
            if started:
                tokens.append("".join(word))
                word, started = [], False
            if not c.isspace():
                tokens.append(_Op(c))
        else:
            word.append(c)
            started = True
        i += 1
    if quote:
        raise ValueError(f"unterminated {quote} quote")
    if started:
        tokens.append("".join(word))
    return tokens


class _Usage(Exception):
    """A shell command used wrongly: its message goes to stderr, exit status 1."""


def _norm(x: float, y: float) -> tuple[float, float]:
    """Screen pixels (x, y) -> normalized (y, x), as the AitW action space writes points."""
    return (y / SCREEN_H, x / SCREEN_W)
