"""A scripted demonstrator: the source of (imperfect) demonstrations.

The expert is closed-loop: each step it reads the widgets on screen (a
privileged view a model does not get), so it copes with dialogs, layout
jitter, late page loads and its own mistakes. ``noise`` makes it imperfect
on purpose (wrong taps, typos, detours), the way human demonstrations in AitW
are.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from digiq.env import actions as A
from digiq.env.actions import Action, ActionType
from digiq.env.device import SimDevice
from digiq.env.state import Dynamics
from digiq.env.tasks import (
    Alarm,
    AnyOf,
    AppOpen,
    Goal,
    Install,
    MapsSearch,
    NewTab,
    Notifications,
    OnSite,
    SettingsPage,
    Shade,
    Task,
    Video,
    WebSearch,
    has_keywords,
)
from digiq.env.ui import SCREEN_H, SCREEN_W, Widget

if TYPE_CHECKING:
    from digiq.env.gym_env import AndroidSimEnv

__all__ = ["Expert", "next_action", "run_episode"]

_SCROLL = A.swipe((0.75, 0.5), (0.45, 0.5))  # finger up: reveals entries further down a list
_SCROLL_BACK = A.swipe((0.45, 0.5), (0.75, 0.5))  # finger down: back towards the top of a list
_PULL_SHADE = A.swipe((0.01, 0.5), (0.6, 0.5))


class _OffScreen(Exception):
    """The widget a route wants to tap is not on screen.

    Routes are written for the screens the expert itself reaches; a state
    another policy left behind (a list scrolled past its first entry) can hide
    the widget. :func:`next_action` then recovers instead of failing.
    """


def _tap(w: Widget | None) -> Action:
    if w is None:
        raise _OffScreen
    x, y = w.center
    return A.tap(y / SCREEN_H, x / SCREEN_W)


def _typo(text: str, rng: random.Random) -> str:
    if len(text) < 2:
        return text + "x"
    i = rng.randrange(len(text) - 1)
    return text[:i] + text[i + 1] + text[i] + text[i + 2 :] if rng.random() < 0.5 else text[:i] + text[i + 1 :]


class Expert:
    """Solves every task :func:`~digiq.env.tasks.parse_task` accepts.

    Args:
        noise: probability that a step is replaced by a mistake.
        seed: seed of the mistakes.
    """

    def __init__(self, noise: float = 0.0, seed: int = 0) -> None:
        if not 0.0 <= noise <= 1.0:
            raise ValueError(f"expert noise must be in [0, 1], got {noise}")
        self.noise = noise
        self._rng = random.Random(seed)

    def act(self, dev: SimDevice, task: Task) -> Action:
        """The next action for ``task`` on ``dev``'s current screen."""
        action = next_action(dev, task)
        if self.noise and self._rng.random() < self.noise:
            return self._mistake(action)
        return action

    def _mistake(self, action: Action) -> Action:
        rng = self._rng
        r = rng.random()
        if action.type is ActionType.TYPE and r < 0.6:
            return A.type_text(_typo(action.text, rng))
        if r < 0.7:
            return A.tap(rng.uniform(0.05, 0.92), rng.uniform(0.05, 0.95))
        return A.press_back()

    def plan(self, dev: SimDevice, task: Task, horizon: int = 20) -> list[ActionType]:
        """AutoUI's "Action Plan": the action types the noiseless expert would still take.

        Found by rolling the expert forward on a calm copy of the device.
        """
        sim = dev.clone(Dynamics.calm())
        types: list[ActionType] = []
        for _ in range(horizon):
            if task.goal.check(sim.state):
                break
            a = next_action(sim, task)
            types.append(a.type)
            sim.step(a)
        return types + [ActionType.STATUS_TASK_COMPLETE]


# ---------------------------------------------------------------- the noiseless policy


def next_action(dev: SimDevice, task: Task) -> Action:
    """What a careful user does next; depends only on the screen and the task."""
    s = dev.state
    if s.pending is not None:
        return _tap(dev.find("loading"))  # the page is still loading: this tap is lost either way
    if s.popup is not None:
        return _tap(dev.find("popup.accept") or dev.find("popup.later"))
    if task.goal.check(s):
        return A.task_complete()
    goal = task.goal.goals[0] if isinstance(task.goal, AnyOf) else task.goal
    try:
        return _ROUTES[type(goal)](dev, goal, task)
    except _OffScreen:
        return _SCROLL_BACK if s.scroll > 0 else A.press_back()


def _launch(dev: SimDevice, app: str) -> Action:
    """From anywhere: go home, then tap the app's icon."""
    if dev.state.page.app != "home":
        return A.press_home()
    return _tap(dev.find(f"app:{app}"))


def _search(dev: SimDevice, box_id: str, kind: str, query: str) -> Action:
    """Type ``query`` into the field ``box_id`` and submit it."""
    s = dev.state
    if s.focus == kind:
        if s.text == query:
            return A.press_enter()
        if s.text == "":
            return A.type_text(query)
    return _tap(dev.find(box_id))  # focusing a field clears it, which also undoes a typo


def _in_list(dev: SimDevice, widget_id: str) -> Action:
    w = dev.find(widget_id)
    if w is not None:
        return _tap(w)
    if dev.state.scroll >= dev.screen().scroll_max:
        return A.press_back()  # not in this list at all: go back and try again
    return _SCROLL


def _web_search(dev: SimDevice, goal: WebSearch, task: Task) -> Action:
    s = dev.state
    if s.page.app == "chrome":
        if s.focus in ("web", "url"):
            return _search(dev, "chrome.url", s.focus, task.query)
        return _tap(dev.find("google.box") or dev.find("chrome.url"))
    if s.page.app == "home":
        return _tap(dev.find("home.search"))
    return A.press_home()


def _on_site(dev: SimDevice, goal: OnSite, task: Task) -> Action:
    s, p = dev.state, dev.state.page
    if p.app == "chrome" and p.site == goal.site:
        if p.name == "product":
            return A.press_back()
        if goal.first_entry and p.name == "site_results" and s.focus != "site" and has_keywords(p.query, goal.keywords):
            return _tap(dev.find("product:0"))
        return _search(dev, "site.search", "site", task.query)
    url = f"{goal.site}.com"
    if p.app == "chrome":
        return _search(dev, "chrome.url", "url", url)
    if p.app == "home":
        if s.focus == "url":
            return _search(dev, "chrome.url", "url", url)
        return _tap(dev.find("home.search"))
    return A.press_home()


def _settings(dev: SimDevice, goal: SettingsPage | Notifications, task: Task) -> Action:
    p = dev.state.page
    if p.app != "settings":
        return _launch(dev, "settings")
    if p.name == "notif" and p.item == goal.app and isinstance(goal, Notifications):
        return _tap(dev.find("notif.toggle"))
    if p.name == "app" and p.item == goal.app:
        return _tap(dev.find("appinfo.notifications"))
    if p.name == "apps":
        return _in_list(dev, f"settings.app:{goal.app}")
    if p.name == "main":
        return _tap(next(w for w in dev.screen().widgets if w.label == "Apps & notifications"))
    return A.press_back()


def _alarm(dev: SimDevice, goal: Alarm, task: Task) -> Action:
    p = dev.state.page
    if p.app != "clock":
        return _launch(dev, "clock")
    if p.name == "main":
        return _tap(dev.find("clock.add"))
    hour, minute, pm = dev.state.picker
    want = ((goal.hour - 1) % 12 + 1, goal.minute, goal.hour >= 12)
    if hour != want[0]:
        return _tap(dev.find(f"picker.hour:{want[0]}"))
    if minute != want[1]:
        return _tap(dev.find(f"picker.min:{want[1]}"))
    if pm != want[2]:
        return _tap(dev.find("picker.pm" if want[2] else "picker.am"))
    return _tap(dev.find("picker.ok"))


def _install(dev: SimDevice, goal: Install, task: Task) -> Action:
    s, p = dev.state, dev.state.page
    if p.app != "playstore":
        return _launch(dev, "playstore")
    if p.name == "app":
        return _tap(dev.find("store.install")) if p.item == goal.app else A.press_back()
    if p.name == "results" and s.focus != "store" and p.query == task.query:
        return _in_list(dev, "storeapp:0")
    return _search(dev, "store.box", "store", task.query)


def _results_flow(app: str, kind: str, item: str) -> Callable[[SimDevice, Goal, Task], Action]:
    """Search in ``app`` and tap the first entry's ``item`` (YouTube videos, Maps directions)."""

    def route(dev: SimDevice, goal: Goal, task: Task) -> Action:
        s, p = dev.state, dev.state.page
        if p.app != app:
            return _launch(dev, app)
        if p.name == "results" and s.focus != kind and p.query == task.query:
            return _tap(dev.find(f"{item}:0"))
        if p.name == "place" and p.query == task.query:
            return _tap(dev.find("place.directions"))
        if p.name not in ("main", "results"):
            return A.press_back()
        return _search(dev, f"{kind}.box", kind, task.query)

    return route


def _new_tab(dev: SimDevice, goal: NewTab, task: Task) -> Action:
    p = dev.state.page
    if p.app != "chrome":
        return _launch(dev, "chrome")
    if p.name == "menu":
        return _tap(dev.find("menu.incognito" if goal.incognito else "menu.new_tab"))
    return _tap(dev.find("chrome.menu"))


def _shade(dev: SimDevice, goal: Shade, task: Task) -> Action:
    return _PULL_SHADE


def _app_open(dev: SimDevice, goal: AppOpen, task: Task) -> Action:
    return _launch(dev, goal.app)


_ROUTES: dict[type, Callable[..., Action]] = {
    WebSearch: _web_search,
    OnSite: _on_site,
    SettingsPage: _settings,
    Notifications: _settings,
    Alarm: _alarm,
    Install: _install,
    Video: _results_flow("youtube", "youtube", "video"),
    MapsSearch: _results_flow("maps", "maps", "directions"),
    NewTab: _new_tab,
    Shade: _shade,
    AppOpen: _app_open,
}


def run_episode(
    env: AndroidSimEnv,
    task: Task,
    seed: int,
    expert: Expert,
    on_step: Callable[[np.ndarray, Action], None] | None = None,
) -> tuple[bool, int]:
    """Roll ``expert`` out on ``task``; returns (success, steps taken).

    ``on_step`` sees each screenshot together with the action taken on it.
    """
    obs, _ = env.reset(seed=seed, options={"task": task})
    for _ in range(env.step_limit):
        action = expert.act(env.device, task)
        if on_step is not None:
            on_step(obs["screenshot"], action)
        obs, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return bool(reward), info["step"]
    return False, env.step_limit
