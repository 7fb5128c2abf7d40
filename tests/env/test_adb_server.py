"""The adb-protocol simulator, driven by the real adbutils client over loopback TCP."""

import socket
import threading
import time

import adbutils
import numpy as np
import pytest
from adbutils.errors import AdbError
from hypothesis import given, settings
from hypothesis import strategies as st

from digiq.env import Dynamics
from digiq.env.adb_env import console_command
from digiq.env.adb_server import SERVER_VERSION, AdbSimServer, Fault
from digiq.env.android import TYPEABLE, decode_input_text, input_text_args
from digiq.env.hierarchy import DUMP_TRAILER, hierarchy_xml
from digiq.env.state import HOME

PRINTABLE = st.text(alphabet=sorted(TYPEABLE), max_size=40)


@pytest.fixture(scope="module")
def server():
    with AdbSimServer(2, dynamics=Dynamics.calm(), width=108, console_token="s3cret") as srv:
        yield srv


@pytest.fixture
def client(server):
    return adbutils.AdbClient("127.0.0.1", server.port, socket_timeout=5)


@pytest.fixture
def phone(server, client):
    serial = server.serials[0]
    p = server.phone(serial)
    p.device.reset(0)
    return p, client.device(serial)


def test_host_requests(server, client):
    assert client.server_version() == SERVER_VERSION
    assert [d.serial for d in client.device_list()] == server.serials
    assert all(s.startswith("emulator-") for s in server.serials)
    tags = client.list(extended=True)[1].tags
    assert tags["model"] == "Pixel" and tags["transport_id"] == "2"
    d = client.device(server.serials[0])
    assert d.get_state() == "device" and d.get_serialno() == server.serials[0]


def test_shell_answers_like_android(phone):
    _, d = phone
    assert d.window_size() == (1080, 2280)
    assert d.getprop("ro.build.version.sdk") == "28" and d.getprop("sys.boot_completed") == "1"
    assert d.shell("foo bar") == "/system/bin/sh: foo: not found"
    assert d.shell2("foo").returncode == 127 and d.shell2("echo hi").returncode == 0
    r = d.shell2("echo hi; foo", v2=True)
    assert (r.stdout, r.stderr, r.returncode) == ("hi\n", "/system/bin/sh: foo: not found\n", 127)
    assert "not supported" in d.shell("ls | grep x")


def test_screencap_is_the_device_screen_as_png(phone):
    p, d = phone
    png = d.shell("screencap -p", encoding=None)
    assert png.startswith(b"\x89PNG")
    assert np.array_equal(np.asarray(d.screenshot()), p.device.screenshot())


def test_uiautomator_dump_is_the_screens_hierarchy(phone):
    p, d = phone
    out = d.shell("uiautomator dump /dev/tty")
    assert out == hierarchy_xml(p.device.screen().widgets) + DUMP_TRAILER
    assert "uiautomator dump /dev/tty" in d.shell("uiautomator dump /sdcard/x.xml")


def test_adbutils_input_helpers_drive_the_device(phone):
    p, d = phone
    clock = p.device.find("app:clock")
    x, y = clock.center
    d.click(int(x), int(y))
    assert p.device.state.page.app == "clock"
    d.keyevent(3)  # HOME
    assert p.device.state.page == HOME
    d.swipe(540, 10, 540, 1400, 0.2)  # pull down the notification shade
    assert p.device.state.page.app == "shade"
    d.keyevent(4)  # BACK
    assert p.device.state.page == HOME
    p.device.state.focus = "web"
    d.send_keys("it's 5% off; $HOME & `ls`")  # adbutils quotes; no %s here, so it types as is
    assert p.device.state.text == "it's 5% off; $HOME & `ls`"


@given(PRINTABLE)
def test_input_text_escaping_round_trips(text):
    assert "".join(decode_input_text(a) for a in input_text_args(text)) == text
    assert all(" " not in a for a in input_text_args(text))


def test_untypeable_text_is_refused():
    with pytest.raises(ValueError, match="printable ASCII"):
        input_text_args("caf\u00e9")


@settings(max_examples=40, deadline=None)
@given(PRINTABLE.filter(bool))
def test_typed_text_round_trips_through_adb(server, text):
    serial = server.serials[1]
    d = adbutils.AdbClient("127.0.0.1", server.port, socket_timeout=5).device(serial)
    state = server.phone(serial).device.state
    state.focus, state.text, state.popup, state.pending = "web", "", None, None
    for arg in input_text_args(text):
        d.shell(["input", "text", arg])
    assert state.text == text


def test_sim_command(phone):
    p, d = phone
    assert d.shell(["digiq-sim", "reset", "7", "general", "Open the clock app"]) == "ok"
    assert p.task is not None and p.task.instruction == "Open the clock app"
    assert d.shell("digiq-sim check") == "0"
    x, y = p.device.find("app:clock").center
    d.click(x, y)
    assert d.shell("digiq-sim check") == "1"
    # An instruction no family matches still starts (a proposed task); the phone's check never passes.
    assert d.shell(["digiq-sim", "reset", "1", "general", "Fly me to the moon"]) == "ok"
    assert p.task is not None and p.task.family == "unchecked" and d.shell("digiq-sim check") == "0"
    assert "reset:" in d.shell(["digiq-sim", "reset", "one", "general", "Open the clock app"])
    assert "reset:" in d.shell(["digiq-sim", "reset", "1", "weekly", "Open the clock app"])


def test_errors_reach_the_client(server, client):
    with pytest.raises(AdbError, match="device 'emulator-1' not found"):
        client.device("emulator-1").shell("ls")
    with pytest.raises(AdbError, match="more than one device"):
        with client.make_connection() as c:
            c.send_command("host:transport-any")
            c.check_okay()
    with pytest.raises(AdbError, match="unknown host service"):
        with client.make_connection() as c:
            c.send_command("host:frobnicate")
            c.check_okay()


def test_console_snapshots_with_auth(server, tmp_path, phone):
    p, d = phone
    port = int(p.serial.split("-")[1])
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    x, y = p.device.find("app:clock").center
    d.click(x, y)
    assert console_command("127.0.0.1", port, "avd snapshot save clock", str(token)) == ""
    d.keyevent(3)
    assert "clock" in console_command("127.0.0.1", port, "avd snapshot list", str(token))
    console_command("127.0.0.1", port, "avd snapshot load clock", str(token))
    assert server.phone(p.serial).device.state.page.app == "clock"
    with pytest.raises(RuntimeError, match="snapshot 'nope' not found"):
        console_command("127.0.0.1", port, "avd snapshot load nope", str(token))
    token.write_text("wrong")
    with pytest.raises(RuntimeError, match="authentication token does not match"):
        console_command("127.0.0.1", port, "avd snapshot list", str(token))


def test_faults_are_injected_per_device(server, client):
    a, b = server.serials
    server.inject(a, Fault("drop", times=1))
    with pytest.raises(AdbError):
        client.device(a).shell("echo hi")
    assert client.device(a).shell("echo hi") == "hi"  # one drop only
    assert client.device(b).shell("echo hi") == "hi"
    with pytest.raises(ValueError, match="unknown fault"):
        Fault("explode")


def test_host_kill_stops_the_server():
    srv = AdbSimServer(1)
    adbutils.AdbClient("127.0.0.1", srv.port).server_kill()
    srv.wait_closed()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", srv.port), timeout=1).close()


def _threads_settle(at_most: int, within_s: float) -> int:
    """The live thread count once it is ``at_most`` or ``within_s`` has passed."""
    deadline = time.monotonic() + within_s
    while threading.active_count() > at_most and time.monotonic() < deadline:
        time.sleep(0.05)
    return threading.active_count()


def test_idle_connections_hold_bounded_threads_freed_after_the_timeout():
    """200 clients connect and say nothing: at most the cap's threads, each freed after the idle timeout."""
    cap, timeout = 32, 0.5
    with AdbSimServer(2, idle_timeout_s=timeout, max_connections=cap) as srv:
        baseline = threading.active_count()
        idle = [socket.create_connection(("127.0.0.1", srv.port), timeout=5) for _ in range(200)]
        try:
            time.sleep(0.2)  # the server has taken every connection in
            assert threading.active_count() <= baseline + cap + 2
            assert _threads_settle(baseline, within_s=timeout + 5) <= baseline
            # Each connection was served until its time-out (then closed: no bytes) or refused at once, in adb's words.
            replies = [sock.recv(1024) for sock in idle]
        finally:
            for sock in idle:
                sock.close()
        refusal = f"all {cap} connections of the digiq adb simulator are in use (max_connections); try again"
        refused = [r for r in replies if r]
        assert refused and set(refused) == {b"FAIL" + f"{len(refusal):04x}{refusal}".encode()}
        assert len(replies) - len(refused) >= cap
        client = adbutils.AdbClient("127.0.0.1", srv.port, socket_timeout=5)
        assert client.server_version() == SERVER_VERSION  # the freed slots serve again
        assert client.device(srv.serials[0]).shell("echo hi") == "hi"


def test_the_cap_is_shared_by_the_consoles_and_answered_in_their_words(tmp_path):
    with AdbSimServer(1, idle_timeout_s=5, max_connections=1) as srv:
        console = int(srv.serials[0].split("-")[1])
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5):  # the one slot, held
            time.sleep(0.1)
            with pytest.raises(RuntimeError, match="KO: all 1 connections .* in use"):
                console_command("127.0.0.1", console, "avd snapshot list", str(tmp_path / "no_token"))
            with pytest.raises(AdbError, match="all 1 connections .* in use"):
                adbutils.AdbClient("127.0.0.1", srv.port, socket_timeout=5).server_version()
        time.sleep(0.1)
        assert "default_boot" in console_command("127.0.0.1", console, "avd snapshot list", "")


def test_a_hang_outlasts_the_idle_timeout():
    """An injected hang waits on the server's side: the idle timeout does not answer for it."""
    with AdbSimServer(1, idle_timeout_s=0.3) as srv:
        serial = srv.serials[0]
        srv.inject(serial, Fault("hang", seconds=1.0))
        d = adbutils.AdbClient("127.0.0.1", srv.port, socket_timeout=5).device(serial)
        start = time.monotonic()
        with pytest.raises(AdbError):
            d.shell("echo hi")
        assert time.monotonic() - start >= 1.0
        assert d.shell("echo hi") == "hi"


@pytest.mark.parametrize("kwargs", [{"idle_timeout_s": 0}, {"max_connections": 0}])
def test_bad_limits_are_named(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        AdbSimServer(1, **kwargs)
