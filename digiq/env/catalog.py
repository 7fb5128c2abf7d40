"""What the simulated phone holds: apps, web sites, and generated content.

Content (search results, products, videos, places, store listings) is
generated from the query text with a stable hash, so any query a policy types
gets a plausible, deterministic page, and the same query always gives the
same page on every machine (Python's ``hash`` is salted per process; crc32
is not).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from digiq.env.ui import Color

__all__ = [
    "DEFAULT_APPS",
    "SHOP_SITES",
    "AppInfo",
    "app_info",
    "app_key",
    "places",
    "products",
    "search_results",
    "site_color",
    "stable_int",
    "store_listing",
    "videos",
    "words",
]


@dataclass(frozen=True)
class AppInfo:
    key: str
    name: str
    color: Color


# The launcher's apps on a fresh device, in home-screen order. The Pixel image
# used by AitW ships these (or their equivalents).
DEFAULT_APPS: tuple[AppInfo, ...] = (
    AppInfo("phone", "Phone", (52, 168, 83)),
    AppInfo("messages", "Messages", (26, 115, 232)),
    AppInfo("chrome", "Chrome", (219, 68, 55)),
    AppInfo("gmail", "Gmail", (234, 67, 53)),
    AppInfo("maps", "Maps", (15, 157, 88)),
    AppInfo("youtube", "YouTube", (255, 0, 0)),
    AppInfo("playstore", "Play Store", (1, 135, 95)),
    AppInfo("settings", "Settings", (95, 99, 104)),
    AppInfo("clock", "Clock", (66, 133, 244)),
    AppInfo("calendar", "Calendar", (66, 133, 244)),
    AppInfo("contacts", "Contacts", (25, 103, 210)),
    AppInfo("calculator", "Calculator", (60, 64, 67)),
    AppInfo("camera", "Camera", (32, 33, 36)),
    AppInfo("gallery", "Gallery", (251, 188, 4)),
    AppInfo("music", "Play Music", (239, 108, 0)),
    AppInfo("files", "Files", (26, 115, 232)),
    AppInfo("google", "Google", (66, 133, 244)),
)
_BY_KEY = {a.key: a for a in DEFAULT_APPS}

# Names people use for the default apps (AitW instructions say "Google Play
# Music app", "SMS app", "the downloads"...).
_ALIASES: dict[str, str] = {
    "chrome": "chrome",
    "google chrome": "chrome",
    "browser": "chrome",
    "the browser": "chrome",
    "gmail": "gmail",
    "email": "gmail",
    "mail": "gmail",
    "google mail": "gmail",
    "inbox": "gmail",
    "maps": "maps",
    "google maps": "maps",
    "youtube": "youtube",
    "play store": "playstore",
    "google play store": "playstore",
    "google play": "playstore",
    "playstore": "playstore",
    "store": "playstore",
    "app store": "playstore",
    "settings": "settings",
    "system settings": "settings",
    "clock": "clock",
    "alarm": "clock",
    "alarms": "clock",
    "calendar": "calendar",
    "google calendar": "calendar",
    "contacts": "contacts",
    "google contacts": "contacts",
    "calculator": "calculator",
    "camera": "camera",
    "gallery": "gallery",
    "photos": "gallery",
    "google photos": "gallery",
    "photo gallery": "gallery",
    "music": "music",
    "play music": "music",
    "google play music": "music",
    "music player": "music",
    "files": "files",
    "downloads": "files",
    "file manager": "files",
    "my files": "files",
    "google": "google",
    "google search": "google",
    "sms": "messages",
    "messages": "messages",
    "messaging": "messages",
    "text messages": "messages",
    "phone": "phone",
    "dialer": "phone",
}

SHOP_SITES: dict[str, Color] = {
    "ebay": (229, 50, 56),
    "costco": (0, 93, 170),
    "walmart": (0, 113, 206),
    "bestbuy": (0, 70, 190),
    "newegg": (247, 142, 30),
}


def words(text: str) -> list[str]:
    """Lower-case alphanumeric tokens; apostrophes are dropped, not split on."""
    return re.findall(r"[a-z0-9]+", text.lower().replace("'", "").replace("\u2019", ""))


def stable_int(*parts: object) -> int:
    """A process-independent hash of ``parts``."""
    return zlib.crc32("\x1f".join(map(str, parts)).encode())


def app_key(name: str) -> str:
    """Map an app name as people write it to the device's app key.

    Unknown names (third-party apps such as "Spotify") get a key made of their
    words, so any app can be installed, listed in Settings, and opened.
    """
    norm = " ".join(words(name))
    norm = norm.removesuffix(" app")
    if norm in _ALIASES:
        return _ALIASES[norm]
    if not norm:
        raise ValueError(f"app name {name!r} has no letters or digits")
    return norm.replace(" ", "_")


def app_info(key: str) -> AppInfo:
    """Display name and icon colour for an app key (default or third-party)."""
    if key in _BY_KEY:
        return _BY_KEY[key]
    name = " ".join(w if w.isupper() else w.capitalize() for w in key.split("_"))
    h = stable_int("app", key)
    return AppInfo(key, name, (40 + h % 180, 40 + (h >> 8) % 180, 40 + (h >> 16) % 180))


def site_color(site: str) -> Color:
    if site in SHOP_SITES:
        return SHOP_SITES[site]
    h = stable_int("site", site)
    return (30 + h % 160, 30 + (h >> 8) % 160, 30 + (h >> 16) % 160)


def _title(query: str) -> str:
    return " ".join(w.capitalize() for w in query.split()) or "Untitled"


_SOURCES = ("Wikipedia", "BBC", "CNN", "Reuters", "NY Times", "Guardian", "Yelp", "TripAdvisor", "Forbes")


def search_results(query: str, n: int = 6) -> list[tuple[str, str, str]]:
    """Google results as (title, source, target site or "") for ``query``.

    A query that names a web site (``"ebay"``, ``"reddit"``) gets that site
    as the first result, linked, as on a real results page.
    """
    toks = words(query)
    out: list[tuple[str, str, str]] = []
    site = toks[0] if len(toks) == 1 else ""
    if site:
        out.append((f"{_title(site)} - Official Site", f"www.{site}.com", site))
    h = stable_int("web", query)
    for i in range(n - len(out)):
        src = _SOURCES[(h + i * 7) % len(_SOURCES)]
        out.append((f"{_title(query)} - {src}", f"www.{src.lower().replace(' ', '')}.com", ""))
    return out


def products(site: str, query: str, n: int = 8) -> list[tuple[str, str]]:
    """A shop's results for ``query`` as (title, price)."""
    h = stable_int("shop", site, query)
    brands = ("Pro", "Plus", "Max", "Lite", "Classic", "Ultra", "Mini", "Deluxe")
    return [
        (f"{_title(query)} {brands[(h + i) % len(brands)]}", f"${(h >> (i % 16)) % 900 + 9}.{(h + i) % 100:02d}")
        for i in range(n)
    ]


def videos(query: str, n: int = 6) -> list[tuple[str, str]]:
    """YouTube results for ``query`` as (title, channel)."""
    h = stable_int("yt", query)
    kinds = ("Official Video", "Live", "Highlights", "Full Episode", "Trailer", "Review")
    return [(f"{_title(query)} - {kinds[(h + i) % len(kinds)]}", f"{_title(query)} Channel") for i in range(n)]


def places(query: str, n: int = 5) -> list[tuple[str, str]]:
    """Maps results for ``query`` as (name, "distance · address")."""
    h = stable_int("maps", query)
    streets = ("Main St", "Oak Ave", "Pine St", "Market St", "Broadway", "Elm St")
    return [
        (f"{_title(query)} #{i + 1}", f"{(h >> i) % 9 + 1}.{i} mi · {(h + i) % 900 + 100} {streets[(h + i) % 6]}")
        for i in range(n)
    ]


def store_listing(query: str, n: int = 5) -> list[str]:
    """Play Store results for ``query``: the app named by the query first.

    A query without letters or digits (a policy typed "\ufffd" in a pipeline run) names no app: no results.
    """
    if not words(query):
        return []
    base = _title(query)
    extra = ("Lite", "Pro", "Widget", "Guide", "Tools")
    return [base] + [f"{base} {extra[i]}" for i in range(n - 1)]
