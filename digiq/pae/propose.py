"""The built-in proposer: tasks written from what a crawl of the device saw and what the lexicon knows.

PAE asks an LLM, once before training, for tasks a likely user would give each
website. With no LLM on a laptop CPU, this proposer plays its part from two
sources only, and records which one each word came from:

- the crawl (:class:`~digiq.pae.context.DeviceContext`): which apps the home
  screen shows, which of them have a text field, which apps another app lists,
  which "New ..." entries a menu offers;
- the lexicon (:mod:`digiq.pae.lexicon`): what an app is for, and places,
  dishes, gadgets, musicians, times... that a model would know.

Its sentences are its own (:data:`FRAMES`), grouped by what a task needs from
the device: a group is proposed only when the crawl saw what it needs (a web
search needs an app that is for the web and has a text field). Each group
gets up to ``per_group`` tasks, drawn over its frames in turn so that every
phrasing is used.

It imports nothing of the device, the task lists' generator, the task parser
or the scripted expert, and reads no file but the crawl and the lexicon.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

from digiq.pae.context import HOME, DeviceContext, ScreenRecord
from digiq.pae.lexicon import Lexicon
from digiq.pae.proposals import Proposal, Slot

__all__ = ["FRAMES", "GROUPS", "Group", "propose"]

PROPOSER = "builtin"


@dataclass(frozen=True)
class Group:
    """Tasks of one kind: the app purpose they need (none: any device), what its screens must show, the step limit.

    ``needs``: "input" (a screen of the app has a text field), "app list" (its screens name other apps),
    "screen" (the crawl reached a screen of it), "new entries" (a menu of it offers "New ..." entries).
    """

    purpose: str
    needs: str
    task_set: str = "general"


GROUPS: dict[str, Group] = {
    "web": Group("web", "input"),
    "places": Group("places", "input"),
    "videos": Group("videos", "input"),
    "apps": Group("apps", "input"),
    "app settings": Group("app settings", "app list"),
    "alarms": Group("alarms", "screen"),
    "launch": Group("", "home"),
    "browser tabs": Group("web", "new entries"),
    "shopping": Group("web", "input", task_set="webshop"),
}

# The proposer's own sentences. A slot is a lexicon kind (spaces written as _; a trailing 2 is a second, different
# value of the kind), or one the crawl fills: {icon} (an app on the home screen), {app} (an app the group's app
# lists, or one of the lexicon's), {new_entry} (a "New ..." entry of a menu).
FRAMES: dict[str, tuple[str, ...]] = {
    "web": (
        "How tall is the {landmark}?",
        "When was the {landmark} built?",
        "Look up the population of {place}",
        "Find a recipe for {dish}",
        "Who invented the {invention}?",
        "Search for a simple explanation of {topic}",
        "What are the best things to do in {place}?",
        "Search for reviews of the {gadget}",
        "How far is {place} from {place2}?",
    ),
    "places": (
        "Where is the nearest {store}?",
        "Navigate to the {landmark}",
        "Look for {place_kind} on Google Maps",
        "Show me {place_kind} in {place} on Maps",
    ),
    "videos": (
        "Watch {video_subject} on YouTube",
        "Play a song by {musician} on YouTube",
        "Find a {musician} concert on YouTube",
    ),
    "apps": ("Download {app}", "Get {app} from the Play Store"),
    "app settings": (
        "Mute notifications from {app}",
        "Enable notifications for {app}",
        "Show me the settings of the {app} app",
    ),
    "alarms": ("Set an alarm at {time}", "Wake me up at {time}"),
    "launch": ("Launch {icon}", "Start the {icon} app"),
    "browser tabs": ("Open a {new_entry}",),
    "shopping": (
        "Visit {site}.com",
        "Search {site}.com for a {gadget}",
        "On {site}.com, find a {gadget} and open the first result",
    ),
}

_SLOT = re.compile(r"\{(\w+?)\}")
_NEW = "New "  # a menu entry that makes something: "New tab", "New incognito tab"


@dataclass(frozen=True)
class _Value:
    text: str
    slot: Slot


def _where(record: ScreenRecord) -> str:
    return " > ".join(record.path) or HOME


class _Sources:
    """What one group's slots can be filled with, from the crawl and the lexicon, and the screens that showed it."""

    def __init__(self, context: DeviceContext, lexicon: Lexicon, app: str) -> None:
        self.lexicon, self.app = lexicon, app
        home = context.apps.get(HOME, [])
        self.home = home[0] if home else None
        self.icons = set(self.home.buttons) if self.home else set()
        self.screens = context.apps.get(app, [])
        self.by_path = {s.path: s for s in context.screens()}

    def lexicon_values(self, kind: str) -> list[_Value]:
        return [_Value(e.value, Slot(kind, e.value, "lexicon", f"{self.lexicon.path}:{e.line}"))
                for e in self.lexicon[kind]]  # fmt: skip

    def shown_apps(self) -> list[_Value]:
        """Apps the group's app names on its screens: an entry that is a home-screen icon, or whose own screen
        offers to install it."""
        out: dict[str, _Value] = {}
        for record in self.screens:
            for label in record.buttons:
                child = self.by_path.get(record.path + (label,))
                if label in self.icons or (child is not None and "Install" in child.buttons):
                    out.setdefault(label, _Value(label, Slot("app", label, "screen", _where(record))))
        return list(out.values())

    def values(self, name: str) -> list[_Value]:
        if name == "icon":
            if self.home is None:
                return []
            return [_Value(label, Slot("icon", label, "screen", HOME)) for label in self.home.buttons]
        if name == "app":
            return self.shown_apps() + self.lexicon_values("app")
        if name == "new_entry":  # each entry once, cited to the first screen that offers it
            entries: dict[str, _Value] = {}
            for record in self.screens:
                for label in record.buttons:
                    if label.startswith(_NEW) and len(label) > len(_NEW):
                        text = label.lower()
                        entries.setdefault(text, _Value(text, Slot("new_entry", text, "screen", _where(record))))
            return list(entries.values())
        return self.lexicon_values(name.rstrip("2").replace("_", " "))

    def evidence(self, needs: str) -> tuple[str, ...]:
        """The screens that show what a group needs; empty when the crawl did not see it."""
        if needs == "home":
            return (HOME,) if self.home is not None and self.home.buttons else ()
        if needs == "input":
            found = [s for s in self.screens if s.inputs]
        elif needs == "app list":
            found = [s for s in self.screens if any(label in self.icons for label in s.buttons)]
        elif needs == "new entries":
            found = [s for s in self.screens if any(label.startswith(_NEW) for label in s.buttons)]
        elif needs == "screen":
            found = list(self.screens)
        else:
            raise ValueError(f"unknown need {needs!r}")
        return tuple(_where(s) for s in found[:1])


def _fillings(frame: str, sources: _Sources) -> Iterator[tuple[str, tuple[Slot, ...]]]:
    """Every instruction ``frame`` makes from the sources, with its slots; a second value of a kind differs."""
    names = list(dict.fromkeys(_SLOT.findall(frame)))
    choices = [sources.values(name) for name in names]
    for combo in itertools.product(*choices):
        texts = dict(zip(names, (v.text for v in combo)))
        if any(name.endswith("2") and texts[name] == texts.get(name[:-1]) for name in names):
            continue
        slots = tuple(replace(v.slot, name=name) for name, v in zip(names, combo))  # "place2", not "place"
        yield _SLOT.sub(lambda m, t=texts: t[m.group(1)], frame), slots


def _apps_for(purpose: str, context: DeviceContext, lexicon: Lexicon) -> list[str]:
    """The apps on the device that the lexicon says are for ``purpose``, in home-screen order."""
    purposes = lexicon.purposes()
    return [app for app in context.apps if app != HOME and purposes.get(app, ("",))[0] == purpose]


def propose(context: DeviceContext, lexicon: Lexicon, per_group: int = 25, seed: int = 0) -> list[Proposal]:
    """Up to ``per_group`` distinct tasks for each group the crawl supports, in :data:`GROUPS` order.

    Within a group the frames take turns (in a shuffled order each round), each giving one of its unused
    instructions drawn at random, until the group has ``per_group`` or none is left.

    Raises:
        ValueError: ``per_group`` is below 1.
    """
    if per_group < 1:
        raise ValueError(f"per_group must be >= 1, got {per_group}")
    rng = random.Random(seed)
    out: list[Proposal] = []
    seen: set[str] = set()
    for name, group in GROUPS.items():
        apps = [HOME] if not group.purpose else _apps_for(group.purpose, context, lexicon)
        # The group's tasks are written for the first app that shows what they need (Chrome or Google for the web).
        found = next(((s, e) for s in (_Sources(context, lexicon, app) for app in apps)
                      if (e := s.evidence(group.needs))), None)  # fmt: skip
        if found is None:
            continue
        sources, evidence = found
        pools = [list(_fillings(frame, sources)) for frame in FRAMES[name]]
        for pool in pools:
            rng.shuffle(pool)
        taken = 0
        while taken < per_group and any(pools):
            for k in rng.sample(range(len(pools)), len(pools)):
                while pools[k] and taken < per_group:
                    instruction, slots = pools[k].pop()
                    if instruction.lower() in seen:
                        continue
                    seen.add(instruction.lower())
                    screens = tuple(dict.fromkeys(evidence + tuple(s.where for s in slots if s.source == "screen")))
                    out.append(Proposal(instruction, group.task_set, sources.app, PROPOSER, screens,
                                        FRAMES[name][k], slots))  # fmt: skip
                    taken += 1
                    break
    return out
