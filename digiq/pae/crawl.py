"""What a fresh device offers, read off its screens: the context a task proposer writes tasks from.

PAE's proposer is told what each website is before it writes tasks for it. On
a phone the same context is the device itself: its apps, their screens, and
what each screen holds. :func:`crawl` gathers it the way any agent could on
any backend (the simulator, the simulator over adb, a real emulator): it only
reads view hierarchies (``uiautomator dump``, :meth:`PhoneEnv.view_hierarchy`)
and taps, breadth first, from the home screen, at most ``depth`` taps deep.
It never types, so it never searches and never leaves what the device shows
on its own; every screen is reached again from a fresh device by replaying
the taps that led to it, so one screen's exploration cannot leak into
another's.

Per app (the home-screen icon the path starts with) it records each distinct
screen: the labels of its buttons, its text fields and its switches (with
their states). A dialog that shows on the way is a screen like any other;
its buttons are explored too, so what lies behind it is still reached.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable

from digiq.env.actions import tap
from digiq.env.gym_env import PhoneEnv
from digiq.env.hierarchy import Element, screen_elements
from digiq.env.tasks import Task, unchecked_task
from digiq.pae.context import HOME, DeviceContext, ScreenRecord

__all__ = ["EXPLORE", "crawl", "nothing_done"]

# The task a crawl's device is reset with: no goal, so nothing the crawl does ends an episode but the step limit.
EXPLORE: Task = unchecked_task("Explore the device")


def nothing_done(link: object, task: Task, screenshot: object) -> bool:
    """The success judge of a crawl's device (an emulator needs one): exploring has no goal to reach."""
    return False


def _record(path: tuple[str, ...], elements: Iterable[Element]) -> ScreenRecord:
    by_kind: dict[str, list[str]] = {"button": [], "input": [], "switch": []}
    for e in elements:
        by_kind[e.kind].append(e.label)
    return ScreenRecord(path, tuple(by_kind["button"]), tuple(by_kind["input"]), tuple(by_kind["switch"]))


def _signature(elements: Iterable[Element]) -> frozenset[tuple[str, str]]:
    """What tells two screens apart: the kinds and labels of their elements, not where content was drawn."""
    return frozenset((e.kind, e.label) for e in elements)


def _target(label: str) -> str:
    """A switch is tapped by its name, whichever state it shows now."""
    for state in (" on", " off"):
        if label.endswith(state):
            return label[: -len(state)]
    return label


class _Replayer:
    """Reaches a screen from a fresh device by tapping the labels of its path in turn."""

    def __init__(self, env: PhoneEnv, seed: int) -> None:
        self.env, self.seed, self.taps = env, seed, 0

    def elements(self) -> list[Element]:
        return screen_elements(self.env.view_hierarchy(), self.env.screen_size())

    def reach(self, path: tuple[str, ...]) -> list[Element] | None:
        """The elements of the screen at the end of ``path``, or None when a label on the way is not on screen.

        Every path into one app starts the device alike (a seed of the crawl's and the app's), so a replay
        meets the same dialogs as the path's first visit; another app meets other ones, as a device used at
        another moment would.
        """
        app_seed = zlib.crc32(f"{self.seed}/{path[0] if path else HOME}".encode())
        self.env.reset(seed=app_seed, options={"task": EXPLORE})
        elements = self.elements()
        for label in path:
            hit = next((e for e in elements if _target(e.label) == label), None)
            if hit is None:
                return None
            self.env.step(tap(*hit.center))
            self.taps += 1
            elements = self.elements()
        return elements


def crawl(make_env: Callable[[], PhoneEnv], depth: int = 4, max_screens_per_app: int = 30,
          seed: int = 0) -> DeviceContext:  # fmt: skip
    """Explore a fresh device breadth first, at most ``depth`` taps from the home screen.

    Each app keeps its first ``max_screens_per_app`` distinct screens (the home screen is one screen of its own).
    ``seed`` makes the replays of a simulated device repeatable (:meth:`_Replayer.reach`), so a path reaches the
    same screen each time; a real device that shows something else on a replay (a label on the way is gone) just
    loses that branch.

    Raises:
        ValueError: ``depth`` is below 1 or ``max_screens_per_app`` below 1.
    """
    if depth < 1 or max_screens_per_app < 1:
        raise ValueError(f"crawl needs depth >= 1 and max_screens_per_app >= 1, got {depth} and {max_screens_per_app}")
    env = make_env()
    try:
        player = _Replayer(env, seed)
        home = player.reach(())
        assert home is not None  # the empty path has no label to miss
        context = DeviceContext({HOME: [_record((), home)]}, depth)
        seen: dict[str, set[frozenset[tuple[str, str]]]] = {HOME: {_signature(home)}}
        frontier: list[tuple[tuple[str, ...], list[Element]]] = [((), home)]
        for _ in range(depth):
            next_frontier = []
            for path, elements in frontier:
                for label in dict.fromkeys(_target(e.label) for e in elements):  # each label once, in screen order
                    child = path + (label,)
                    app = child[0]
                    screens = context.apps.setdefault(app, [])
                    if len(screens) >= max_screens_per_app:
                        continue
                    reached = player.reach(child)
                    if reached is None or not reached:
                        continue
                    signature = _signature(reached)
                    known = seen.setdefault(app, set())
                    if signature in known or signature in seen[HOME]:  # nothing new, or back on the home screen
                        continue
                    known.add(signature)
                    screens.append(_record(child, reached))
                    next_frontier.append((child, reached))
            frontier = next_frontier
        context.apps = {app: screens for app, screens in context.apps.items() if screens}
        context.taps = player.taps
        return context
    finally:
        env.close()
