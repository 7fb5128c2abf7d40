"""What both ends of adb agree on: Android's ``input`` command, keycodes, screen facts.

The emulator backend (host side) writes shell commands with these rules and
the adb-protocol simulator (device side) reads them back with Android's own
rules, so one module keeps the two in step. Facts are those of the AitW
emulator: a Pixel at API 28, 1080x2280, 440 dpi.
"""

from __future__ import annotations

from digiq.env.actions import ActionType

__all__ = [
    "DENSITY",
    "KEYCODES",
    "SIM_COMMAND",
    "TYPEABLE",
    "decode_input_text",
    "input_text_args",
]

DENSITY = 440
# Keycodes of android.view.KeyEvent for the AitW key actions.
KEYCODES: dict[ActionType, int] = {
    ActionType.PRESS_HOME: 3,
    ActionType.PRESS_BACK: 4,
    ActionType.PRESS_ENTER: 66,
}
# `input text` goes through the virtual keyboard's key map, which has keys for
# printable ASCII only; other characters cannot be typed this way.
TYPEABLE = frozenset(chr(c) for c in range(0x20, 0x7F))
# The simulator's own shell command (reset to a task and seed, let time pass,
# read the ground truth). It exists only on the adb-protocol simulator.
SIM_COMMAND = "digiq-sim"


def input_text_args(text: str) -> list[str]:
    """The arguments of the successive ``input text`` calls that type ``text`` exactly.

    Android's ``input text`` turns ``%s`` into a space (a shell-safe way to
    pass spaces), so spaces are written as ``%s``; a literal ``%`` followed by
    ``s`` would be read the same way, so the text is split between the two and
    typed in two calls. Shell quoting of each argument is the caller's job
    (adbutils quotes list arguments with :func:`shlex.quote`).

    Raises:
        ValueError: ``text`` holds characters ``input text`` cannot type (see :data:`TYPEABLE`).
    """
    bad = sorted({c for c in text if c not in TYPEABLE})
    if bad:
        raise ValueError(f"input text cannot type {bad!r} (printable ASCII only)")
    chunks, start = [], 0
    for i in range(1, len(text)):
        if text[i - 1] == "%" and text[i] == "s":
            chunks.append(text[start:i])
            start = i
    chunks.append(text[start:])
    return [c.replace(" ", "%s") for c in chunks if c]


def decode_input_text(arg: str) -> str:
    """What ``input text ARG`` types on Android: every ``%s`` becomes a space, left to right.

    This is the rule of Android's ``Input.sendText``: a ``%`` arms the escape,
    and an ``s`` right after an armed ``%`` replaces the pair with a space.
    """
    out: list[str] = []
    armed = False
    for ch in arg:
        if armed and ch == "s":
            out[-1] = " "
            armed = False
            continue
        out.append(ch)
        armed = ch == "%"
    return "".join(out)
