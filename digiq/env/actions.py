"""The AitW action space and AutoUI's text format.

AutoUI (and so Digi-Q and DigiRL) read and write actions as text:

    Action Plan: [DUAL_POINT,TYPE] ; Action Decision: "action_type": "DUAL_POINT",
    "touch_point": "[0.5200, 0.3100]", "lift_point": "[0.5200, 0.3100]", "typed_text": ""

Points are normalized to [0, 1] and written **(y, x)**. Non-touch actions carry
``[-1.0, -1.0]`` points. We keep exactly this format so that a real AutoUI
checkpoint works unchanged, and we never raise on model output: text that is
not a well-formed action becomes an explicit ``INVALID`` action which the
environment treats as a no-op and the data marks.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "TAP_DISTANCE_THRESHOLD",
    "Action",
    "ActionType",
    "format_action",
    "parse_action",
    "press_back",
    "press_enter",
    "press_home",
    "swipe",
    "tap",
    "task_complete",
    "type_text",
]

# AitW's own rule: a DUAL_POINT whose touch and lift points are closer than this
# (in normalized units) is a tap, otherwise a swipe.
TAP_DISTANCE_THRESHOLD = 0.04


class ActionType(str, Enum):
    """AitW action types, spelled as AutoUI writes them."""

    DUAL_POINT = "DUAL_POINT"
    TYPE = "TYPE"
    PRESS_BACK = "PRESS_BACK"
    PRESS_HOME = "PRESS_HOME"
    PRESS_ENTER = "PRESS_ENTER"
    STATUS_TASK_COMPLETE = "STATUS_TASK_COMPLETE"
    STATUS_TASK_IMPOSSIBLE = "TASK_IMPOSSIBLE"
    INVALID = "INVALID"


_NO_POINT = (-1.0, -1.0)


@dataclass(frozen=True)
class Action:
    """One parsed action.

    ``touch`` and ``lift`` are (y, x) in [0, 1] for DUAL_POINT, ``(-1, -1)``
    otherwise. ``error`` says why an ``INVALID`` action was rejected, so that
    data and logs can show what the model actually wrote.
    """

    type: ActionType
    touch: tuple[float, float] = _NO_POINT
    lift: tuple[float, float] = _NO_POINT
    text: str = ""
    error: str = ""

    @property
    def is_valid(self) -> bool:
        return self.type is not ActionType.INVALID

    @property
    def is_tap(self) -> bool:
        return self.type is ActionType.DUAL_POINT and _distance(self.touch, self.lift) <= TAP_DISTANCE_THRESHOLD

    @property
    def is_swipe(self) -> bool:
        return self.type is ActionType.DUAL_POINT and not self.is_tap


def _distance(a: tuple[float, float], b: tuple[float, float]) -> float:
    return math.hypot(a[0] - b[0], a[1] - b[1])


def _point(y: float, x: float) -> tuple[float, float]:
    # Four decimals is what AutoUI writes; rounding here makes format/parse exact inverses.
    return (round(float(y), 4), round(float(x), 4))


def tap(y: float, x: float) -> Action:
    """A tap at normalized (y, x)."""
    p = _point(y, x)
    return Action(ActionType.DUAL_POINT, p, p)


def swipe(touch: tuple[float, float], lift: tuple[float, float]) -> Action:
    """A swipe from ``touch`` to ``lift``, both normalized (y, x)."""
    return Action(ActionType.DUAL_POINT, _point(*touch), _point(*lift))


def type_text(text: str) -> Action:
    return Action(ActionType.TYPE, text=text)


def press_back() -> Action:
    return Action(ActionType.PRESS_BACK)


def press_home() -> Action:
    return Action(ActionType.PRESS_HOME)


def press_enter() -> Action:
    return Action(ActionType.PRESS_ENTER)


def task_complete() -> Action:
    return Action(ActionType.STATUS_TASK_COMPLETE)


def _invalid(why: str) -> Action:
    return Action(ActionType.INVALID, error=why)


def _fmt_point(p: tuple[float, float]) -> str:
    if p == _NO_POINT:
        return "[-1.0, -1.0]"
    return f"[{p[0]:.4f}, {p[1]:.4f}]"


def format_action(action: Action, plan: list[ActionType] | None = None) -> str:
    """Write ``action`` in AutoUI's text format.

    ``plan`` is AutoUI's "Action Plan": the action types still to come,
    starting with this one. Without it the plan is just this action's type.
    An INVALID action cannot be formatted: it has no meaning to write.
    """
    if not action.is_valid:
        raise ValueError(f"cannot format an invalid action ({action.error})")
    types = plan if plan else [action.type]
    plan_text = ",".join(t.value for t in types)
    text = action.text if action.type is ActionType.TYPE else ""
    return (
        f"Action Plan: [{plan_text}] ; Action Decision: "
        f'"action_type": "{action.type.value}", '
        f'"touch_point": "{_fmt_point(action.touch)}", '
        f'"lift_point": "{_fmt_point(action.lift)}", '
        f'"typed_text": "{text}"'
    )


_TYPE_RE = re.compile(r'"action_type"\s*:\s*"([A-Za-z_]+)"')
_TOUCH_RE = re.compile(r'"touch_point"\s*:\s*"\[([^\]]*)\]"')
_LIFT_RE = re.compile(r'"lift_point"\s*:\s*"\[([^\]]*)\]"')
# typed_text is the last field and may itself contain quotes: take everything up
# to the final quote of the string.
_TEXT_RE = re.compile(r'"typed_text"\s*:\s*"(.*)"\s*$', re.DOTALL)
_BY_NAME = {t.value: t for t in ActionType if t is not ActionType.INVALID}


def _parse_point(raw: str | None, field: str) -> tuple[float, float] | str:
    """Return a (y, x) point, or an error string saying what is wrong."""
    if raw is None:
        return f"missing {field}"
    parts = raw.split(",")
    if len(parts) != 2:
        return f"{field} needs two numbers, got {raw!r}"
    try:
        y, x = float(parts[0]), float(parts[1])
    except ValueError:
        return f"{field} is not numeric: {raw!r}"
    if not (0.0 <= y <= 1.0 and 0.0 <= x <= 1.0):
        return f"{field} outside [0, 1]: {raw!r}"
    return _point(y, x)


def parse_action(text: object) -> Action:
    """Parse AutoUI output into an :class:`Action`. Never raises.

    Only the "Action Decision" part is read; the plan is advisory. Anything
    malformed (missing fields, unknown types, non-numeric or out-of-range
    points, non-string input) becomes ``INVALID`` with the reason in ``error``.
    """
    if not isinstance(text, str):
        return _invalid(f"expected a string, got {type(text).__name__}")
    decision = text.split("Action Decision:", 1)[-1]
    m = _TYPE_RE.search(decision)
    if m is None:
        return _invalid("no action_type field")
    kind = _BY_NAME.get(m.group(1).upper())
    if kind is None:
        return _invalid(f"unknown action_type {m.group(1)!r}")
    if kind is ActionType.DUAL_POINT:
        touch_m, lift_m = _TOUCH_RE.search(decision), _LIFT_RE.search(decision)
        touch = _parse_point(touch_m.group(1) if touch_m else None, "touch_point")
        lift = _parse_point(lift_m.group(1) if lift_m else None, "lift_point")
        if isinstance(touch, str):
            return _invalid(touch)
        if isinstance(lift, str):
            return _invalid(lift)
        return Action(kind, touch, lift)
    if kind is ActionType.TYPE:
        t = _TEXT_RE.search(decision)
        if t is None:
            return _invalid("TYPE without typed_text")
        if t.group(1) == "":
            return _invalid("TYPE with empty typed_text")
        return Action(kind, text=t.group(1))
    return Action(kind)
