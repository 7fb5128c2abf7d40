"""The emulator console's auth token stays out of every error, and a refusing console is a device fault."""

import socket
import threading

import pytest

from digiq.config import DeviceConfig
from digiq.env import parse_task
from digiq.env.adb_env import ConsoleRefused, DeviceFault, console_command
from digiq.env.adb_server import AdbSimServer
from digiq.env.backends import EnvFactory

TOKEN = "Zq7PcK2vLw9XhR4m"  # the shape of an emulator's token: 16 base64 characters


def _runs_of(token: str, text: str) -> list[str]:
    low = text.lower()
    return [token[i : i + 8] for i in range(len(token) - 7) if token[i : i + 8].lower() in low]


class EchoingConsole:
    """A console that asks for a token and refuses it, echoing what it was sent (upper-cased, or as it came)."""

    def __init__(self, upper: bool) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port, self.upper = self.sock.getsockname()[1], upper
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn, conn.makefile("rwb", buffering=0) as f:
            f.write(b"Android Console: Authentication required\r\nOK\r\n")
            line = f.readline().decode().strip()
            f.write(f"KO: bad token in '{line.upper() if self.upper else line}'\r\n".encode())


@pytest.mark.parametrize("upper", [False, True])
def test_a_refused_token_is_in_no_message(tmp_path, upper):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    console = EchoingConsole(upper)
    with pytest.raises(ConsoleRefused, match="bad token") as caught:
        console_command("127.0.0.1", console.port, "avd snapshot list", str(token_file), timeout=5)
    assert "[redacted]" in str(caught.value) and _runs_of(TOKEN, str(caught.value)) == []


def test_a_console_that_refuses_the_token_is_a_device_fault_naming_no_token(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with AdbSimServer(1, width=108, console_token="the-right-token-0000") as srv:
        cfg = DeviceConfig(backend="emulator", adb_port=srv.port, settle_s=0.0, console_token_file=str(token_file))
        env = EnvFactory(cfg, width=108, evaluator=lambda link, task, shot: False)()
        with pytest.raises(DeviceFault, match="authentication token does not match") as caught:
            env.reset(seed=0, options={"task": parse_task("Open the settings", "general")})
    assert _runs_of(TOKEN, str(caught.value)) == [] and "auth [redacted]" in str(caught.value)
