"""The simulated Android device: carries out AitW actions on :class:`DeviceState`.

It stands in for the Android emulator: same logical screen (1080x2280), same
actions (taps and swipes in normalized (y, x), typing, Back/Home/Enter), and
screenshots rendered at a model-friendly size. Seeded in-the-wild dynamics
(dialogs, layout jitter, late page loads, ads) make some actions ineffective,
which is what gives a critic something to learn. Same seed and same actions
give the same episode, byte for byte.
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Callable

import numpy as np

from digiq.env import catalog
from digiq.env.actions import Action, ActionType
from digiq.env.screens import Screen, is_list_page, view
from digiq.env.state import HOME, DeviceState, Dynamics, Page, Popup
from digiq.env.ui import ABOVE_DIALOG, SCREEN_H, SCREEN_W, Renderer, Widget

__all__ = ["SimDevice"]

# Apps whose screens beyond their front page come over the network, so they may load late.
_NETWORK_APPS = frozenset({"chrome", "youtube", "maps", "playstore"})
_LOCAL_PAGES = frozenset({"main", "ntp", "incognito", "menu"})
_URL_RE = re.compile(r"^(?:https?://)?(?:www\.)?([a-z0-9-]+)\.[a-z]{2,}(?:[./].*)?$")
_RENDERERS: dict[int, Renderer] = {}


def _renderer(width: int) -> Renderer:
    # One frame cache per size, shared by all devices in the process: screens
    # recur across episodes and devices (home, app front pages).
    if width not in _RENDERERS:
        _RENDERERS[width] = Renderer(width)
    return _RENDERERS[width]


class SimDevice:
    """A simulated phone.

    Args:
        dynamics: rates of the in-the-wild disturbances.
        width: screenshot width in pixels; height keeps the 1080x2280 aspect.
    """

    def __init__(self, dynamics: Dynamics | None = None, width: int = 216) -> None:
        self.dynamics = dynamics if dynamics is not None else Dynamics()
        self.renderer = _renderer(width)
        self.state = DeviceState()
        self._rng = random.Random(0)
        self._screen: Screen | None = None

    # ------------------------------------------------------------ public API

    def reset(
        self, seed: int, setup: Callable[[DeviceState, random.Random], None] | None = None, start_app: str = ""
    ) -> None:
        """Fresh device: home screen, default apps, a few alarms; then ``setup`` (a task's preconditions).

        With ``start_app`` (a default app's key) the device then launches that app from the launcher:
        its front page, perhaps its rating dialog, and Back or Home lead out as after a tap on its icon.
        An app that ``setup`` uninstalled (an install task's) cannot be open: the launcher stays.
        """
        defaults = [a.key for a in catalog.DEFAULT_APPS]
        if start_app and start_app not in defaults:
            raise ValueError(f"start_app {start_app!r} is not a default app of the simulator ({', '.join(defaults)})")
        self._rng = random.Random(seed)
        rng = self._rng
        s = DeviceState(installed=defaults)
        s.notifications = {k: True for k in s.installed}
        s.alarms = sorted(
            {(rng.choice((5, 6, 7, 8)), rng.choice((0, 15, 30, 45)), rng.random() < 0.5) for _ in range(2)}
        )
        if setup is not None:
            setup(s, rng)
        self.state = s
        self._load(HOME, fresh=False)
        if start_app:
            self._open(start_app)
        self._screen = None

    def clone(self, dynamics: Dynamics | None = None, seed: int | None = None) -> SimDevice:
        """An independent copy to branch an episode from.

        It continues this device's random stream, or a fresh one from ``seed``
        (so that several branches from one state see different pop-ups and delays).
        """
        other = SimDevice(self.dynamics if dynamics is None else dynamics, self.renderer.width)
        other.state = copy.deepcopy(self.state)
        if seed is None:
            other._rng.setstate(self._rng.getstate())
        else:
            other._rng.seed(seed)
        return other

    def screen(self) -> Screen:
        """The widgets on screen now (what the expert and the tests read)."""
        if self._screen is None:
            self._screen = view(self.state)
        return self._screen

    def screenshot(self) -> np.ndarray:
        """The screen as an (H, W, 3) uint8 array (read-only; copy before writing)."""
        return self.renderer.render(self.screen().widgets)

    def find(self, widget_id: str) -> Widget | None:
        for w in self.screen().widgets:
            if w.id == widget_id:
                return w
        return None

    def step(self, action: Action) -> bool:
        """Carry out ``action``; return whether the screen changed."""
        before = self.screen().widgets
        s = self.state
        s.steps += 1
        if s.pending is not None:
            # The device is still busy with a page load: this action is lost, and the page appears.
            page, s.pending = s.pending, None
            self._load(page)
        elif action.type is ActionType.DUAL_POINT:
            if action.is_tap:
                self._tap(action.touch[1] * SCREEN_W, action.touch[0] * SCREEN_H)
            else:
                self._swipe(action)
        elif action.type is ActionType.TYPE:
            if s.focus and s.popup is None:
                s.text += action.text
        elif action.type is ActionType.PRESS_ENTER:
            if s.focus and s.popup is None:
                self._submit()
        elif action.type is ActionType.PRESS_BACK:
            self._back()
        elif action.type is ActionType.PRESS_HOME:
            self._home()
        # STATUS_* and INVALID change nothing on the device.
        self._screen = None
        return self.screen().widgets != before

    # ------------------------------------------------------------ navigation

    def _load(self, page: Page, fresh: bool = True) -> None:
        """Show ``page``, drawing its layout jitter, ad and (when freshly opened) dialog."""
        s, d, rng = self.state, self.dynamics, self._rng
        s.page, s.scroll, s.focus, s.text = page, 0, "", ""
        s.jitter = rng.randint(0, d.jitter_px) if d.jitter_px else 0
        s.ad = is_list_page(page) and rng.random() < d.ad_rate
        if fresh and page.app == "chrome" and page.name == "site" and rng.random() < d.popup_rate:
            s.popup = Popup("cookies", page.site)

    def _go(self, page: Page) -> None:
        s = self.state
        s.back_stack.append(s.page)
        s.focus, s.text = "", ""
        if (
            page.app in _NETWORK_APPS
            and page.name not in _LOCAL_PAGES
            and self._rng.random() < self.dynamics.delay_rate
        ):
            s.pending = page
            return
        self._load(page)

    def _open(self, key: str) -> None:
        """Launch an app from its icon (or an Open button)."""
        s = self.state
        if key not in s.installed:
            return
        s.back_stack = [HOME]  # Back from an app's front page returns to the launcher
        self._load(Page(key, "ntp" if key == "chrome" else "main"))
        if key != "settings" and self._rng.random() < self.dynamics.popup_rate:
            s.popup = Popup("rate", key)

    def _home(self) -> None:
        s = self.state
        s.back_stack, s.popup, s.pending = [], None, None
        self._load(HOME, fresh=False)

    def _back(self) -> None:
        s = self.state
        if s.popup is not None:
            s.popup = None
        elif s.focus:
            s.focus, s.text = "", ""
        elif s.back_stack:
            self._load(s.back_stack.pop(), fresh=False)
        elif s.page != HOME:
            self._home()

    # ------------------------------------------------------------ input

    def _tap(self, x: float, y: float) -> None:
        blocked = self.state.popup is not None  # a dialog takes every tap but the system bars'
        for w in reversed(self.screen().widgets):
            if blocked and not w.id.startswith(ABOVE_DIALOG):
                continue
            if w.intent is not None and w.contains(x, y):
                self._apply(w.intent)
                return

    def _swipe(self, action: Action) -> None:
        s = self.state
        if s.popup is not None:
            return
        (ty, tx), (ly, lx) = action.touch, action.lift
        dy, dx = (ly - ty) * SCREEN_H, (lx - tx) * SCREEN_W
        if abs(dy) < abs(dx):
            return  # horizontal swipes do nothing on these screens
        if ty < 0.06 and dy > 0 and s.page.app != "shade":
            self._go(Page("shade"))  # pull down the notification shade from the status bar
        elif s.page.app == "shade" and dy < 0:
            self._back()
        else:
            # Finger moves up (dy < 0) -> content scrolls down.
            s.scroll = int(min(max(s.scroll - dy, 0), self.screen().scroll_max))

    def _submit(self) -> None:
        s = self.state
        text = " ".join(s.text.split())
        kind, site = s.focus, s.page.site
        if not text:
            return
        if kind == "url":
            m = _URL_RE.match(text.lower())
            self._go(Page("chrome", "site", site=m.group(1)) if m else Page("chrome", "results", query=text))
        elif kind == "web":
            self._go(Page("chrome", "results", query=text))
        elif kind == "site":
            self._go(Page("chrome", "site_results", query=text, site=site))
        elif kind == "youtube":
            self._go(Page("youtube", "results", query=text))
        elif kind == "maps":
            self._go(Page("maps", "results", query=text))
        elif kind == "store":
            self._go(Page("playstore", "results", query=text))
        else:
            raise ValueError(f"no submit rule for text field {kind!r}")

    def _apply(self, intent: tuple) -> None:
        """Carry out what a tapped widget does."""
        s = self.state
        op = intent[0]
        if op == "noop":
            return
        if op == "go":
            self._go(intent[1])
        elif op == "open":
            self._open(intent[1])
        elif op == "go_focus":
            self._go(intent[1])
            s.focus, s.text = intent[2], ""
        elif op == "focus":
            s.focus, s.text = intent[1], ""
        elif op == "submit":
            self._submit()
        elif op == "back":
            self._back()
        elif op == "home":
            self._home()
        elif op == "dismiss":
            s.popup = None
        elif op == "rate":  # the wrong button of a rating dialog: a detour to the store
            s.popup = None
            self._go(Page("playstore", "app", item=intent[1]))
        elif op == "new_tab":
            if intent[1]:
                s.incognito_opened += 1
            else:
                s.tabs_opened += 1
            self._go(Page("chrome", "incognito" if intent[1] else "ntp"))
        elif op == "toggle_notif":
            s.notifications[intent[1]] = not s.notifications.get(intent[1], True)
        elif op == "toggle_alarm":
            h, m, on = s.alarms[intent[1]]
            s.alarms[intent[1]] = (h, m, not on)
        elif op == "picker_open":
            s.picker = (9, 0, False)
            self._go(Page("clock", "picker"))
        elif op == "picker":
            h, m, pm = s.picker
            field, value = intent[1], intent[2]
            s.picker = (value, m, pm) if field == "hour" else (h, value, pm) if field == "min" else (h, m, value)
        elif op == "alarm_ok":
            h, m, pm = s.picker
            s.alarms.append((h % 12 + (12 if pm else 0), m, True))
            self._back()
        elif op == "install":
            if intent[1] not in s.installed:
                s.installed.append(intent[1])
                s.notifications.setdefault(intent[1], True)
        else:
            raise ValueError(f"unknown intent {intent!r}")
