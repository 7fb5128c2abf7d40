"""Tasks: an instruction plus a success condition checked on the device's state.

:func:`parse_task` maps AitW-style instructions ("What's the news in Chile?",
"Go to ebay.com, search for \"dell xps\", and select the first entry") to a
:class:`Task`. It works by the *shape* of the sentence, not by a list of
known lines, so unseen cities, products, queries and apps parse too. Anything
it cannot map raises :class:`UnsupportedInstruction` naming the instruction.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from digiq.env import catalog
from digiq.env.state import DeviceState

__all__ = [
    "GENERAL_FAMILIES",
    "MAX_INSTRUCTION_CHARS",
    "MAX_STEPS",
    "TASK_SETS",
    "WEBSHOP_FAMILIES",
    "Alarm",
    "AnyOf",
    "AppOpen",
    "Goal",
    "Install",
    "MapsSearch",
    "NewTab",
    "Notifications",
    "OnSite",
    "SettingsPage",
    "Shade",
    "Task",
    "Unchecked",
    "UnsupportedInstruction",
    "Video",
    "WebSearch",
    "has_keywords",
    "keywords",
    "parse_task",
    "unchecked_task",
]

MAX_STEPS = {"general": 10, "webshop": 20}
# AitW's instructions and the generated lists' are at most 82 characters; a longer line is not a task but a
# pasted document, which every step of an episode would tokenize again.
MAX_INSTRUCTION_CHARS = 1000
TASK_SETS = tuple(MAX_STEPS)  # AitW's General and Web Shopping
GENERAL_FAMILIES = (
    "search",
    "maps",
    "youtube",
    "app_settings",
    "notifications",
    "alarm",
    "open_app",
    "install_app",
    "chrome_tab",
)
WEBSHOP_FAMILIES = ("go_to_site", "site_search", "select_first")


class UnsupportedInstruction(ValueError):
    """The instruction matches no task family the simulator can check."""


# Words that carry no search intent; everything else must appear in the query.
_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "of",
        "in",
        "on",
        "at",
        "to",
        "for",
        "from",
        "is",
        "are",
        "was",
        "be",
        "it",
        "its",
        "whats",
        "what",
        "how",
        "much",
        "does",
        "do",
        "did",
        "i",
        "me",
        "my",
        "some",
        "s",
        "who",
        "where",
        "when",
        "which",
        "can",
        "could",
        "please",
        "tell",
        "show",
        "find",
        "google",
        "search",
        "look",
        "up",
        "about",
        "like",
        "with",
        "by",
        "and",
        "this",
        "that",
        "there",
    ]
)


def keywords(text: str) -> tuple[str, ...]:
    """Content words of ``text``, in order, without repeats."""
    seen: dict[str, None] = {}
    for w in catalog.words(text):
        if w not in _STOP:
            seen.setdefault(w, None)
    return tuple(seen)


def has_keywords(query: str, kws: tuple[str, ...]) -> bool:
    """Whether ``query`` contains every one of ``kws`` (as words, any order)."""
    return set(kws) <= set(catalog.words(query))


# ---------------------------------------------------------------- goals


class Goal:
    """A success condition. ``setup`` makes sure it does not already hold at reset."""

    def check(self, s: DeviceState) -> bool:
        raise NotImplementedError

    def setup(self, s: DeviceState, rng: random.Random) -> None:
        return None


@dataclass(frozen=True)
class WebSearch(Goal):
    """Google results for a query holding all ``keywords`` are on screen."""

    keywords: tuple[str, ...]

    def check(self, s: DeviceState) -> bool:
        p = s.page
        return p.app == "chrome" and p.name == "results" and has_keywords(p.query, self.keywords)


@dataclass(frozen=True)
class OnSite(Goal):
    """On ``site``; with keywords, its results for them; with ``first_entry``, the first product."""

    site: str
    keywords: tuple[str, ...] = ()
    first_entry: bool = False

    def check(self, s: DeviceState) -> bool:
        p = s.page
        if p.app != "chrome" or p.site != self.site:
            return False
        if self.first_entry:
            return p.name == "product" and p.index == 0 and has_keywords(p.query, self.keywords)
        if self.keywords:
            return p.name == "site_results" and has_keywords(p.query, self.keywords)
        return True


@dataclass(frozen=True)
class AppOpen(Goal):
    app: str

    def check(self, s: DeviceState) -> bool:
        return s.page.app == self.app

    def setup(self, s: DeviceState, rng: random.Random) -> None:
        _ensure_installed(s, self.app)


@dataclass(frozen=True)
class SettingsPage(Goal):
    """The app's "App info" page in Settings."""

    app: str

    def check(self, s: DeviceState) -> bool:
        return s.page.app == "settings" and s.page.name == "app" and s.page.item == self.app

    def setup(self, s: DeviceState, rng: random.Random) -> None:
        _ensure_installed(s, self.app)


@dataclass(frozen=True)
class Notifications(Goal):
    """The app's notifications are ``on`` (True/False), or flipped (None: "toggle")."""

    app: str
    on: bool | None

    def _target(self, s: DeviceState) -> bool:
        return self.on if self.on is not None else not s.initial_notifications[self.app]

    def check(self, s: DeviceState) -> bool:
        return s.notifications.get(self.app, True) == self._target(s)

    def setup(self, s: DeviceState, rng: random.Random) -> None:
        _ensure_installed(s, self.app)
        start = (not self.on) if self.on is not None else rng.random() < 0.5
        s.notifications[self.app] = start
        s.initial_notifications[self.app] = start


@dataclass(frozen=True)
class Alarm(Goal):
    hour: int  # 0-23
    minute: int

    def check(self, s: DeviceState) -> bool:
        return (self.hour, self.minute, True) in s.alarms

    def setup(self, s: DeviceState, rng: random.Random) -> None:
        s.alarms = [a for a in s.alarms if a[:2] != (self.hour, self.minute)]


@dataclass(frozen=True)
class Install(Goal):
    app: str

    def check(self, s: DeviceState) -> bool:
        return self.app in s.installed

    def setup(self, s: DeviceState, rng: random.Random) -> None:
        if self.app in s.installed:
            s.installed.remove(self.app)


@dataclass(frozen=True)
class Video(Goal):
    """A YouTube video found by a query holding all ``keywords`` is playing."""

    keywords: tuple[str, ...]

    def check(self, s: DeviceState) -> bool:
        p = s.page
        return p.app == "youtube" and p.name == "video" and has_keywords(p.query, self.keywords)


@dataclass(frozen=True)
class MapsSearch(Goal):
    """Maps shows places for the keywords; with ``directions``, the route to one."""

    keywords: tuple[str, ...]
    directions: bool = False

    def check(self, s: DeviceState) -> bool:
        p = s.page
        if p.app != "maps" or not has_keywords(p.query, self.keywords):
            return False
        return p.name == "directions" if self.directions else p.name in ("results", "place", "directions")


@dataclass(frozen=True)
class NewTab(Goal):
    incognito: bool

    def check(self, s: DeviceState) -> bool:
        if self.incognito:
            return s.page.app == "chrome" and s.page.name == "incognito" and s.incognito_opened > 0
        return s.page.app == "chrome" and s.page.name == "ntp" and s.tabs_opened > 0


@dataclass(frozen=True)
class Shade(Goal):
    def check(self, s: DeviceState) -> bool:
        return s.page.app == "shade"


@dataclass(frozen=True)
class AnyOf(Goal):
    """Any of several ways counts; the expert takes the first."""

    goals: tuple[Goal, ...]

    def check(self, s: DeviceState) -> bool:
        return any(g.check(s) for g in self.goals)

    def setup(self, s: DeviceState, rng: random.Random) -> None:
        for g in self.goals:
            g.setup(s, rng)


@dataclass(frozen=True)
class Unchecked(Goal):
    """No condition the device can check: free exploration, or an instruction :func:`parse_task` cannot map (a
    proposed task). It never holds, so an episode on it ends only by the agent's own ending action, the step limit or
    an evaluator's verdict."""

    def check(self, s: DeviceState) -> bool:
        return False


def _ensure_installed(s: DeviceState, app: str) -> None:
    if app not in s.installed:
        s.installed.append(app)
    s.notifications.setdefault(app, True)


# ---------------------------------------------------------------- tasks


@dataclass(frozen=True)
class Task:
    """An instruction, its family, and its success condition.

    ``query`` is the text a sensible user would type for it (empty when the
    task needs no typing); the expert types exactly this. ``start_app`` is
    the app a simulated episode opens on instead of the launcher, as a phone
    found in use shows whatever a previous task left open. The pipeline's
    episodes start on the launcher, as AitW's do.
    """

    instruction: str
    task_set: str  # "general" or "webshop"
    family: str
    goal: Goal
    query: str = ""
    start_app: str = ""  # an app key (digiq.env.catalog); "" = the launcher

    @property
    def max_steps(self) -> int:
        return MAX_STEPS[self.task_set]

    @property
    def checkable(self) -> bool:
        """Whether the device can tell the task is done (its ground truth); an :class:`Unchecked` task's cannot."""
        return not isinstance(self.goal, Unchecked)


def unchecked_task(instruction: str, task_set: str = "general") -> Task:
    """A task with no ground truth: its instruction is shown to the agent; nothing on the device says it is done."""
    if task_set not in MAX_STEPS:
        raise ValueError(f"task_set must be one of {list(TASK_SETS)}, got {task_set!r}")
    return Task(instruction, task_set, "unchecked", Unchecked())


def _clean(text: str) -> str:
    return " ".join(text.strip().split())


def _strip_q(text: str) -> str:
    return text.strip().strip("\"'\u201c\u201d\u2018\u2019").strip()


_TIME_RE = re.compile(r"^(\d{1,2})(?:[:.](\d{2}))?\s*(am|pm|a\.m\.?|p\.m\.?)?$")


def _parse_time(text: str, instruction: str) -> tuple[int, int]:
    t = text.lower().strip().rstrip(".!?")
    if t in ("noon", "midday"):
        return 12, 0
    if t == "midnight":
        return 0, 0
    m = _TIME_RE.match(t)
    if not m:
        raise UnsupportedInstruction(f"cannot read the alarm time {text!r} in {instruction!r}")
    h, mnt, suffix = int(m.group(1)), int(m.group(2) or 0), (m.group(3) or "")[:1]
    if suffix and not 1 <= h <= 12 or not 0 <= h <= 23 or not 0 <= mnt <= 59:
        raise UnsupportedInstruction(f"alarm time {text!r} out of range in {instruction!r}")
    if mnt % 5:
        raise UnsupportedInstruction(f"alarm minutes must be a multiple of 5 on this device: {instruction!r}")
    if suffix == "p":
        h = h % 12 + 12
    elif suffix == "a":
        h = h % 12
    return h, mnt


_SITE_RE = re.compile(
    r"^go\s*to\s+(?:https?://)?(?:www\.)?(?P<site>[a-z0-9-]+)(?:\.[a-z.]+)?"
    r"(?:\s*,\s*search\s*for\s+(?P<q>.+?))?(?P<first>\s*,?\s*and\s+select\s+the\s+first\s+(?:entry|result|item))?\s*\.?$",
    re.IGNORECASE,
)
# The same three shopping families in the words people use besides AitW's ("Visit walmart.com", "Search ebay.com
# for a drone", "On bestbuy.com, find a router and open the first result"). The site must carry its domain here:
# "Visit the Louvre" or "Open the clock" is no site.
_FIRST = r"(?P<first>\s*,?\s*and\s+(?:select|open|click|tap)\s+(?:on\s+)?the\s+first\s+(?:entry|result|item|one))?"
_DOMAIN = r"(?:https?://)?(?:www\.)?(?P<site>[a-z0-9-]+)\.[a-z]{2,3}(?:\.[a-z]{2})?"
_SITE_PHRASES = [
    re.compile(rx, re.IGNORECASE)
    for rx in (
        r"^(?:visit|open|navigate\s*to|browse\s*to)\s+" + _DOMAIN + r"\s*[.!]?$",
        r"^search\s+" + _DOMAIN + r"\s+for\s+(?P<q>.+?)" + _FIRST + r"\s*[.!]?$",
        r"^(?:on|at)\s+"
        + _DOMAIN
        + r"\s*,?\s*(?:search\s*for|find|look\s*for|look\s*up)\s+(?P<q>.+?)"
        + _FIRST
        + r"\s*[.!]?$",
    )
]
_APP = r"(?:the\s+)?(?P<app>.+?)(?:\s+app(?:lication)?)?"
_G: list[tuple[str, re.Pattern[str]]] = [
    (name, re.compile(rx, re.IGNORECASE))
    for name, rx in [
        ("alarm", r"^(?:set\s*an?\s*alarm\s*(?:for|at)|wake\s*me\s*(?:up\s*)?at)\s*(?P<time>.+?)[.!?]?$"),
        (
            "notifications",
            r"^(?P<verb>turn\s*on|turn\s*off|toggle|enable|disable|mute|unmute)\s*(?:the\s+)?"
            r"notifications?\s*(?:for|of|on|from)\s+" + _APP + r"[.!?]?$",
        ),
        ("app_settings", r"^(?:check|open|show\s*me)\s*the\s*settings\s*(?:for|of)\s+" + _APP + r"[.!?]?$"),
        ("install_app", r"^(?:install|download)\s+" + _APP + r"[.!?]?$"),
        (
            "install_app",
            r"^(?:install|download|get)\s+" + _APP + r"\s+from\s+(?:the\s+)?(?:google\s+)?play\s*store[.!?]?$",
        ),
        (
            "chrome_tab",
            r"^open\s+a\s+new\s+(?:chrome\s+)?(?:(?P<mode>incognito|private)\s+)?(?:tab|window)"
            r"(?:\s+in\s+(?:the\s+)?chrome(?:\s+app)?)?[.!?]?$",
        ),
        ("shade", r"^(?:show\s*me|open|check)\s*(?:my|the)\s*notifications?(?:\s*(?:shade|panel))?[.!?]?$"),
        ("reddit", r"^(?:(?:open|go\s*to)\s+reddit(?:\.com)?|what'?s\s+(?:the\s+top\s+post\s+)?on\s+reddit\b.*)$"),
        ("yt_artist", r"^play\s+the\s+(?:new|latest)\s+(?P<q>.+?)\s+video\s+on\s+youtube[.!?]?$"),
        ("yt_channel", r"^(?:play|what'?s|show\s*me)\s+the\s+latest\s+video\s+from\s+(?:the\s+)?(?P<q>.+?)[.!?]?$"),
        (
            "yt_any",
            r"^(?:play|search\s*for|find|show\s*me|watch)\s+(?:some\s+)?(?P<q>.+?)\s+(?:on|in)\s+youtube[.!?]?$",
        ),
        (
            "maps_route",
            r"^(?:how\s*do\s*i\s*get\s*to|directions\s*to|navigate\s*to|take\s*me\s*to)\s+(?:the\s+)?"
            r"(?P<q>.+?)[.!?]?$",
        ),
        ("maps_near", r"^(?:find|show\s*me|where\s*is)\s+the\s+nearest\s+(?P<q>.+?)[.!?]?$"),
        ("maps_on", r"^(?:search\s*for|find|show\s*me|look\s*for)\s+(?P<q>.+?)\s+on\s+(?:google\s+)?maps[.!?]?$"),
        ("calendar", r"^what'?s\s+on\s+my\s+calendar\b.*$"),
        ("email", r"^check\s*my\s*(?:e-?mail|gmail|mail|inbox)(?:\s+inbox)?[.!?]?$"),
        ("open_app", r"^(?:open|launch|start)\s+" + _APP + r"(?:\s+and\s+.*)?[.!?]?$"),
    ]
]
_SEARCH_VERB = re.compile(r"^(?:google|search\s*for|search|look\s*up|find|show\s*me)\b", re.IGNORECASE)
_QUESTION = re.compile(r"^(?:what|what's|whats|how|where|who|when|which|why|is|are|can|does|do)\b", re.IGNORECASE)
_SHOP_AT = re.compile(r"\b(?:on|at)\s+(ebay|costco|walmart|bestbuy|best\s+buy|newegg)\b", re.IGNORECASE)


def _query(text: str) -> str:
    # Case is kept: a policy then copies the instruction's own words (matching ignores case).
    return text.strip().rstrip(".!?").strip()


def _need_keywords(q: str, instruction: str) -> tuple[str, ...]:
    kws = keywords(q)
    if not kws:
        raise UnsupportedInstruction(f"instruction {instruction!r} names nothing to look for")
    return kws


def parse_task(instruction: str, task_set: str | None = None) -> Task:
    """Map an AitW-style instruction to a :class:`Task`.

    ``task_set`` ("general"/"webshop") fixes the step limit; by default it is
    "webshop" for "Go to SITE..." shopping instructions and "general" otherwise.
    Raises :class:`UnsupportedInstruction` naming the instruction when no
    family matches, or giving its length when it is longer than
    :data:`MAX_INSTRUCTION_CHARS`.
    """
    if not isinstance(instruction, str) or not instruction.strip():
        raise UnsupportedInstruction(f"empty or non-text instruction: {instruction!r}")
    if len(instruction) > MAX_INSTRUCTION_CHARS:
        raise UnsupportedInstruction(
            f"an instruction of {len(instruction)} characters, longer than the {MAX_INSTRUCTION_CHARS} a task may have"
        )
    text = _clean(instruction)
    m = _SITE_RE.match(text) or next((m for rx in _SITE_PHRASES if (m := rx.match(text))), None)
    if m and m.group("site").lower() != "reddit":
        site = m.group("site").lower()
        q = _strip_q(m.groupdict().get("q") or "")
        if m.groupdict().get("first") and not q:
            raise UnsupportedInstruction(f"'select the first entry' needs a search in {instruction!r}")
        first = bool(m.groupdict().get("first"))
        fam = "select_first" if first else "site_search" if q else "go_to_site"
        goal = OnSite(site, _need_keywords(q, instruction) if q else (), first)
        return Task(instruction, task_set or "webshop", fam, goal, q)
    ts = task_set or "general"
    for name, rx in _G:
        m = rx.match(text)
        if not m:
            continue
        g = m.groupdict()
        if name == "alarm":
            h, mnt = _parse_time(g["time"], instruction)
            return Task(instruction, ts, "alarm", Alarm(h, mnt))
        if name in ("notifications", "app_settings", "install_app", "open_app"):
            try:
                app = catalog.app_key(_strip_q(g["app"]))
            except ValueError as e:
                raise UnsupportedInstruction(f"{e} in {instruction!r}") from None
            if name == "notifications":
                verb = " ".join(g["verb"].lower().split())
                on = None if verb == "toggle" else verb in ("turn on", "enable", "unmute")
                return Task(instruction, ts, name, Notifications(app, on))
            if name == "app_settings":
                return Task(instruction, ts, name, SettingsPage(app))
            if name == "install_app":
                return Task(instruction, ts, name, Install(app), _strip_q(g["app"]))
            if app == "reddit":
                return Task(instruction, ts, "open_app", AnyOf((OnSite("reddit"), AppOpen("reddit"))), "reddit.com")
            return Task(instruction, ts, name, AppOpen(app))
        if name == "chrome_tab":
            return Task(instruction, ts, name, NewTab(bool(g["mode"])))
        if name == "shade":
            return Task(instruction, ts, "open_app", Shade())
        if name == "reddit":
            return Task(instruction, ts, "open_app", AnyOf((OnSite("reddit"), AppOpen("reddit"))), "reddit.com")
        if name == "calendar":
            return Task(instruction, ts, "open_app", AppOpen("calendar"))
        if name == "email":
            return Task(instruction, ts, "open_app", AppOpen("gmail"))
        if name.startswith("yt_"):
            q = _query(g["q"])
            return Task(instruction, ts, "youtube", Video(_need_keywords(q, instruction)), q)
        if name.startswith("maps_"):
            q = _query(g["q"])
            return Task(instruction, ts, "maps", MapsSearch(_need_keywords(q, instruction), name == "maps_route"), q)
    # The general web search: questions and "search for / google / find ..." requests.
    if _QUESTION.match(text) or _SEARCH_VERB.match(text):
        q = _query(_SEARCH_VERB.sub("", text, count=1))
        kws = _need_keywords(q, instruction)
        goal: Goal = WebSearch(kws)
        shop = _SHOP_AT.search(text)
        if shop:  # "the price of X on eBay": Google it, or search the shop itself
            site = shop.group(1).lower().replace(" ", "")
            rest = tuple(k for k in kws if k not in catalog.words(shop.group(1)))
            if rest:
                goal = AnyOf((goal, OnSite(site, rest)))
        return Task(instruction, ts, "search", goal, q)
    raise UnsupportedInstruction(
        f"unsupported instruction {instruction!r}: it matches no task family "
        f"({', '.join(GENERAL_FAMILIES + WEBSHOP_FAMILIES)})"
    )
