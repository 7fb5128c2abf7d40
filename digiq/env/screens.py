"""What each screen of the simulated phone shows: state in, widgets out.

Every function here is pure: it reads a :class:`DeviceState` and returns the
widgets of the current screen, with the intent each tap triggers. The device
(``device.py``) carries intents out. Layout is in logical pixels of the
1080x2280 screen; list content starts lower by the state's layout jitter.
"""

from __future__ import annotations

from dataclasses import dataclass

from digiq.env import catalog
from digiq.env.state import DeviceState, Page
from digiq.env.ui import BLACK, BLUE, GREY, LIGHT, SCREEN_H, SCREEN_W, WHITE, Color, Widget

__all__ = ["CONTENT_TOP", "KBD_TOP", "NAV_TOP", "ROW_H", "STATUS_H", "Screen", "is_list_page", "view"]

STATUS_H = 72
CONTENT_TOP = 232  # below the app bar
NAV_TOP = 2160
KBD_TOP = 1480
ROW_H = 200

NOOP = ("noop",)  # absorbs a tap without effect (panels that cover what is below)


@dataclass(frozen=True)
class Screen:
    widgets: tuple[Widget, ...]
    scroll_max: int = 0


Row = tuple[str, str, object]  # (widget id, label, intent)


def _status_bar() -> list[Widget]:
    return [
        Widget("status", "rect", (0, 0, SCREEN_W, STATUS_H), fill=BLACK),
        Widget("status.time", "text", (0, 0, 300, STATUS_H), "12:00", fg=WHITE, size=34),
    ]


def _nav_bar() -> list[Widget]:
    w = SCREEN_W // 3
    return [
        Widget("nav", "rect", (0, NAV_TOP, SCREEN_W, SCREEN_H), fill=BLACK, intent=NOOP),
        Widget("nav.back", "rect", (0, NAV_TOP, w, SCREEN_H), "<", fill=BLACK, fg=WHITE, size=56, intent=("back",)),
        Widget("nav.home", "rect", (w, NAV_TOP, 2 * w, SCREEN_H), "O", fill=BLACK, fg=WHITE, size=56, intent=("home",)),
        Widget(
            "nav.recents",
            "rect",
            (2 * w, NAV_TOP, SCREEN_W, SCREEN_H),
            "[]",
            fill=BLACK,
            fg=WHITE,
            size=48,
            intent=NOOP,
        ),
    ]


def _app_bar(title: str, color: Color, fg: Color = WHITE) -> list[Widget]:
    return [
        Widget("appbar", "rect", (0, STATUS_H, SCREEN_W, CONTENT_TOP), fill=color, intent=NOOP),
        Widget("appbar.title", "text", (20, STATUS_H, 800, CONTENT_TOP), title, fg=fg, size=56),
    ]


def _input(wid: str, kind: str, s: DeviceState, box: tuple[int, int, int, int], shown: str, placeholder: str) -> Widget:
    """A text field; shows what is being typed while it has focus."""
    focused = s.focus == kind
    label = s.text if focused else (shown or placeholder)
    fg = BLACK if (focused or shown) else GREY
    return Widget(wid, "input", box, label, fg=fg, size=44, on=focused, intent=("focus", kind))


def _bottom(s: DeviceState) -> int:
    return KBD_TOP if s.focus else NAV_TOP


def _rows(s: DeviceState, rows: list[Row], top: int, row_h: int = ROW_H, size: int = 44) -> tuple[list[Widget], int]:
    """Lay out a scrollable list; returns its widgets and the largest scroll offset."""
    out: list[Widget] = []
    y = top + s.jitter - s.scroll
    bottom = _bottom(s)
    for wid, label, intent in rows:
        if y >= top and y + row_h <= bottom:
            fill = (255, 248, 225) if wid == "ad" else WHITE
            out.append(Widget(wid, "item", (0, y, SCREEN_W, y + row_h), label, fill=fill, size=size, intent=intent))
        y += row_h
    total = s.jitter + row_h * len(rows)
    return out, max(0, total - (bottom - top))


def _ad_rows(s: DeviceState) -> list[Row]:
    return [("ad", "Ad · Sponsored: Shop the big sale now", ("go", Page("chrome", "ad")))] if s.ad else []


# ---------------------------------------------------------------- home & shade


def _home(s: DeviceState) -> Screen:
    j = s.jitter
    ws = [
        Widget("wallpaper", "rect", (0, STATUS_H, SCREEN_W, NAV_TOP), fill=(24, 62, 92)),
        Widget(
            "home.search",
            "input",
            (60, 150 + j, 1020, 290 + j),
            "Search",
            fg=GREY,
            size=48,
            intent=("go_focus", Page("chrome", "ntp"), "url"),
        ),
    ]
    cols, cell_w, cell_h, top = 5, SCREEN_W // 5, 260, 380 + j
    for i, key in enumerate(s.installed[:30]):
        info = catalog.app_info(key)
        cx, y = (i % cols) * cell_w + cell_w // 2, top + (i // cols) * cell_h
        ws.append(
            Widget(
                f"app:{key}",
                "icon",
                (cx - 75, y, cx + 75, y + 150),
                info.name,
                fill=info.color,
                size=72,
                intent=("open", key),
            )
        )
        ws.append(
            Widget(
                f"app.label:{key}", "text", (cx - 108, y + 155, cx + 108, y + 205), info.name[:10], fg=WHITE, size=30
            )
        )
    return Screen(tuple(ws))


_NOTICES = (
    "Gmail · 3 new emails",
    "Messages · Mom: call me back",
    "Calendar · Team meeting at 3 PM",
    "Play Store · 5 app updates available",
    "Photos · Your memories from last year",
)


def _shade(s: DeviceState) -> Screen:
    ws = [
        Widget("shade.bg", "rect", (0, STATUS_H, SCREEN_W, NAV_TOP), fill=(48, 48, 52), intent=NOOP),
        Widget("shade.title", "text", (20, STATUS_H, 900, CONTENT_TOP), "Notifications", fg=WHITE, size=52),
    ]
    rows, _ = _rows(s, [(f"notice:{i}", t, NOOP) for i, t in enumerate(_NOTICES)], CONTENT_TOP)
    return Screen(tuple(ws + rows))


# ---------------------------------------------------------------- chrome & the web


def _chrome_bar(s: DeviceState, url: str, dark: bool = False) -> list[Widget]:
    bg = (53, 54, 58) if dark else LIGHT
    return [
        Widget("chrome.bar", "rect", (0, STATUS_H, SCREEN_W, CONTENT_TOP), fill=bg, intent=NOOP),
        _input("chrome.url", "url", s, (20, STATUS_H + 24, 900, CONTENT_TOP - 24), url, "Search or type web address"),
        Widget(
            "chrome.menu",
            "button",
            (920, STATUS_H + 24, 1060, CONTENT_TOP - 24),
            ":",
            fill=bg,
            fg=WHITE if dark else BLACK,
            size=56,
            intent=("go", Page("chrome", "menu")),
        ),
    ]


def _site_header(site: str, top: int) -> Widget:
    return Widget(
        "site.header",
        "rect",
        (0, top, SCREEN_W, top + 160),
        site.capitalize(),
        fill=catalog.site_color(site),
        fg=WHITE,
        size=64,
    )


def _shop_head(s: DeviceState) -> tuple[list[Widget], tuple[int, int, int, int]]:
    """A shop's address bar and header, and where its search box sits."""
    site, j = s.page.site, s.jitter
    head = _chrome_bar(s, f"www.{site}.com") + [_site_header(site, CONTENT_TOP)]
    return head, (40, 420 + j, 1040, 540 + j)


def _chrome_incognito(s: DeviceState) -> Screen:
    """A new incognito tab."""
    return Screen(
        tuple(
            _chrome_bar(s, "", dark=True)
            + [
                Widget("incognito.bg", "rect", (0, CONTENT_TOP, SCREEN_W, NAV_TOP), fill=(32, 33, 36)),
                Widget(
                    "incognito.title",
                    "rect",
                    (0, 700, SCREEN_W, 900),
                    "You've gone Incognito",
                    fill=(32, 33, 36),
                    fg=WHITE,
                    size=56,
                ),
            ]
        )
    )


def _chrome_menu(s: DeviceState) -> Screen:
    """Chrome's overflow menu."""
    items = [
        ("menu.new_tab", "New tab", ("new_tab", False)),
        ("menu.incognito", "New incognito tab", ("new_tab", True)),
        ("menu.history", "History", NOOP),
        ("menu.downloads", "Downloads", NOOP),
        ("menu.bookmarks", "Bookmarks", NOOP),
        ("menu.settings", "Settings", NOOP),
    ]
    ws = _chrome_bar(s, "") + [
        Widget(
            "menu.panel",
            "rect",
            (380, STATUS_H, SCREEN_W, STATUS_H + 40 + 150 * len(items)),
            fill=WHITE,
            intent=NOOP,
        )
    ]
    ws += [
        Widget(
            wid,
            "item",
            (380, STATUS_H + 20 + 150 * i, SCREEN_W, STATUS_H + 170 + 150 * i),
            label,
            size=44,
            intent=intent,
        )
        for i, (wid, label, intent) in enumerate(items)
    ]
    return Screen(tuple(ws))


def _chrome_ntp(s: DeviceState) -> Screen:
    """A new tab: Google's search box."""
    j = s.jitter
    return Screen(
        tuple(
            _chrome_bar(s, "")
            + [
                Widget("google.logo", "rect", (0, 480 + j, SCREEN_W, 680 + j), "Google", fill=WHITE, fg=BLUE, size=120),
                _input("google.box", "web", s, (80, 760 + j, 1000, 900 + j), "", "Search Google"),
            ]
        )
    )


def _chrome_results(s: DeviceState) -> Screen:
    """Google's results for the page's query, ads first where the device shows them."""
    p = s.page
    rows = _ad_rows(s) + [
        (
            f"result:{i}",
            f"{title}  ·  {src}",
            ("go", Page("chrome", "site", site=site))
            if site
            else ("go", Page("chrome", "page", query=p.query, index=i)),
        )
        for i, (title, src, site) in enumerate(catalog.search_results(p.query))
    ]
    head = _chrome_bar(s, f"google.com/search?q={p.query}") + [
        _input("google.box", "web", s, (40, 260, 1040, 380), p.query, "Search Google")
    ]
    body, smax = _rows(s, rows, 420)
    return Screen(tuple(head + body), smax)


def _chrome_article(s: DeviceState) -> Screen:
    """An article a result opened."""
    p = s.page
    j = s.jitter
    title = catalog.search_results(p.query)[p.index][0] if p.index >= 0 else p.query
    return Screen(
        tuple(
            _chrome_bar(s, "article")
            + [
                Widget("article.title", "text", (20, 280 + j, 1060, 400 + j), title, size=48),
                Widget("article.image", "image", (40, 440 + j, 1040, 1040 + j), fill=(170, 190, 210)),
                Widget("article.text", "rect", (40, 1100 + j, 1040, 1500 + j), fill=LIGHT),
            ]
        )
    )


def _chrome_ad(s: DeviceState) -> Screen:
    """The page behind a sponsored entry."""
    return Screen(
        tuple(
            _chrome_bar(s, "ads.example.com")
            + [
                Widget(
                    "ad.banner",
                    "image",
                    (0, CONTENT_TOP, SCREEN_W, 1200),
                    "SALE",
                    fill=(255, 193, 7),
                    fg=BLACK,
                    size=120,
                ),
                Widget(
                    "ad.cta",
                    "button",
                    (200, 1300, 880, 1460),
                    "Shop now",
                    fill=(255, 87, 34),
                    fg=WHITE,
                    intent=NOOP,
                ),
            ]
        )
    )


def _chrome_shop_home(s: DeviceState) -> Screen:
    """A shop's home page: its search box and tiles."""
    p = s.page
    j = s.jitter
    site = p.site
    head, box = _shop_head(s)
    ws = head + [_input("site.search", "site", s, box, "", f"Search {site.capitalize()}")]
    for i in range(4):
        x0, y0 = 40 + (i % 2) * 510, 600 + j + (i // 2) * 520
        ws.append(
            Widget(f"site.tile:{i}", "image", (x0, y0, x0 + 490, y0 + 490), fill=catalog.site_color(site + str(i)))
        )
    return Screen(tuple(ws))


def _chrome_shop_results(s: DeviceState) -> Screen:
    """A shop's results for the query."""
    p = s.page
    site = p.site
    head, box = _shop_head(s)
    rows = _ad_rows(s) + [
        (f"product:{i}", f"{t}   {price}", ("go", Page("chrome", "product", p.query, site, i)))
        for i, (t, price) in enumerate(catalog.products(site, p.query))
    ]
    body, smax = _rows(s, rows, 580)
    return Screen(tuple(head + [_input("site.search", "site", s, box, p.query, "Search")] + body), smax)


def _chrome_shop_product(s: DeviceState) -> Screen:
    """A product's page."""
    p = s.page
    j = s.jitter
    site = p.site
    head, _ = _shop_head(s)
    title, price = catalog.products(site, p.query)[p.index]
    return Screen(
        tuple(
            head
            + [
                Widget("product.image", "image", (140, 440 + j, 940, 1240 + j), fill=catalog.site_color(title)),
                Widget("product.title", "text", (20, 1280 + j, 1060, 1380 + j), title, size=48),
                Widget("product.price", "text", (20, 1390 + j, 1060, 1480 + j), price, fg=(177, 39, 4), size=52),
                Widget(
                    "product.cart",
                    "button",
                    (140, 1540 + j, 940, 1680 + j),
                    "Add to cart",
                    fill=(255, 216, 20),
                    intent=NOOP,
                ),
            ]
        )
    )


_CHROME_PAGES = {
    "incognito": _chrome_incognito,
    "menu": _chrome_menu,
    "ntp": _chrome_ntp,
    "results": _chrome_results,
    "page": _chrome_article,
    "ad": _chrome_ad,
    "site": _chrome_shop_home,
    "site_results": _chrome_shop_results,
    "product": _chrome_shop_product,
}


def _chrome(s: DeviceState) -> Screen:
    page = _CHROME_PAGES.get(s.page.name)
    if page is None:
        raise ValueError(f"chrome has no page {s.page.name!r}")
    return page(s)


# ---------------------------------------------------------------- settings


_SECTIONS = (
    "Network & internet",
    "Connected devices",
    "Apps & notifications",
    "Battery",
    "Display",
    "Sound",
    "Storage",
    "Privacy",
    "Location",
    "Security",
    "Accounts",
    "System",
)


def _settings(s: DeviceState) -> Screen:
    p = s.page
    if p.name == "main":
        rows = [
            (f"settings:{i}", sec, ("go", Page("settings", "apps")) if sec == "Apps & notifications" else NOOP)
            for i, sec in enumerate(_SECTIONS)
        ]
        body, smax = _rows(s, rows, CONTENT_TOP, row_h=170)
        return Screen(tuple(_app_bar("Settings", (95, 99, 104)) + body), smax)
    if p.name == "apps":
        apps = sorted(s.installed, key=lambda k: catalog.app_info(k).name.lower())
        rows = [(f"settings.app:{k}", catalog.app_info(k).name, ("go", Page("settings", "app", item=k))) for k in apps]
        body, smax = _rows(s, rows, CONTENT_TOP, row_h=170)
        return Screen(tuple(_app_bar("Apps", (95, 99, 104)) + body), smax)
    info = catalog.app_info(p.item)
    if p.name == "app":
        j = s.jitter
        rows = [
            ("appinfo.notifications", "Notifications", ("go", Page("settings", "notif", item=p.item))),
            ("appinfo.permissions", "Permissions", NOOP),
            ("appinfo.storage", "Storage & cache", NOOP),
            ("appinfo.battery", "Battery", NOOP),
        ]
        body, _ = _rows(s, rows, 720, row_h=170)
        return Screen(
            tuple(
                _app_bar("App info", (95, 99, 104))
                + [
                    Widget("appinfo.icon", "icon", (465, 260 + j, 615, 410 + j), info.name, fill=info.color, size=72),
                    Widget("appinfo.name", "rect", (0, 420 + j, SCREEN_W, 500 + j), info.name, size=52),
                    Widget(
                        "appinfo.open",
                        "button",
                        (60, 540 + j, 520, 660 + j),
                        "Open",
                        fill=LIGHT,
                        fg=BLUE,
                        intent=("open", p.item),
                    ),
                    Widget(
                        "appinfo.stop",
                        "button",
                        (560, 540 + j, 1020, 660 + j),
                        "Force stop",
                        fill=LIGHT,
                        fg=BLUE,
                        intent=NOOP,
                    ),
                ]
                + body
            )
        )
    if p.name == "notif":
        on = s.notifications.get(p.item, True)
        return Screen(
            tuple(
                _app_bar("Notifications", (95, 99, 104))
                + [
                    Widget("notif.app", "text", (20, 260, 1060, 360), info.name, size=48),
                    Widget(
                        "notif.row",
                        "item",
                        (0, 400, SCREEN_W, 570),
                        "Show notifications",
                        size=44,
                        intent=("toggle_notif", p.item),
                    ),
                    Widget("notif.toggle", "toggle", (840, 445, 1000, 525), on=on, intent=("toggle_notif", p.item)),
                ]
            )
        )
    raise ValueError(f"settings has no page {p.name!r}")


# ---------------------------------------------------------------- clock


def alarm_label(hour: int, minute: int) -> str:
    return f"{(hour - 1) % 12 + 1}:{minute:02d} {'PM' if hour >= 12 else 'AM'}"


def _clock(s: DeviceState) -> Screen:
    p = s.page
    bar = _app_bar("Alarm", (32, 33, 36))
    if p.name == "main":
        ws = bar
        for i, (h, m, on) in enumerate(s.alarms[:6]):
            y = CONTENT_TOP + s.jitter + i * 220
            ws = ws + [
                Widget(f"alarm:{i}", "item", (0, y, SCREEN_W, y + 220), alarm_label(h, m), size=72, intent=NOOP),
                Widget(f"alarm.toggle:{i}", "toggle", (840, y + 70, 1000, y + 150), on=on, intent=("toggle_alarm", i)),
            ]
        ws = ws + [
            Widget(
                "clock.add",
                "circle",
                (440, 1900, 640, 2100),
                "+",
                fill=BLUE,
                fg=WHITE,
                size=120,
                intent=("picker_open",),
            )
        ]
        return Screen(tuple(ws))
    if p.name == "picker":
        h, m, pm = s.picker
        ws = bar + [
            Widget(
                "picker.time",
                "rect",
                (0, CONTENT_TOP, SCREEN_W, 460),
                f"{h}:{m:02d} {'PM' if pm else 'AM'}",
                fill=(32, 33, 36),
                fg=WHITE,
                size=120,
            )
        ]
        for i in range(12):
            x0, y0 = 60 + (i % 4) * 240, 500 + (i // 4) * 170
            ws.append(
                Widget(
                    f"picker.hour:{i + 1}",
                    "button",
                    (x0, y0, x0 + 220, y0 + 150),
                    str(i + 1),
                    fill=BLUE if h == i + 1 else LIGHT,
                    fg=WHITE if h == i + 1 else BLACK,
                    size=56,
                    intent=("picker", "hour", i + 1),
                )
            )
        for i in range(12):
            x0, y0 = 60 + (i % 4) * 240, 1040 + (i // 4) * 170
            ws.append(
                Widget(
                    f"picker.min:{5 * i}",
                    "button",
                    (x0, y0, x0 + 220, y0 + 150),
                    f":{5 * i:02d}",
                    fill=BLUE if m == 5 * i else LIGHT,
                    fg=WHITE if m == 5 * i else BLACK,
                    size=56,
                    intent=("picker", "min", 5 * i),
                )
            )
        for i, (name, val) in enumerate((("AM", False), ("PM", True))):
            x0 = 60 + i * 480
            ws.append(
                Widget(
                    f"picker.{name.lower()}",
                    "button",
                    (x0, 1580, x0 + 460, 1720),
                    name,
                    fill=BLUE if pm == val else LIGHT,
                    fg=WHITE if pm == val else BLACK,
                    size=56,
                    intent=("picker", "pm", val),
                )
            )
        ws.append(
            Widget("picker.cancel", "button", (60, 1880, 520, 2020), "Cancel", fill=LIGHT, fg=BLUE, intent=("back",))
        )
        ws.append(
            Widget("picker.ok", "button", (560, 1880, 1020, 2020), "OK", fill=BLUE, fg=WHITE, intent=("alarm_ok",))
        )
        return Screen(tuple(ws))
    raise ValueError(f"clock has no page {p.name!r}")


# ---------------------------------------------------------------- youtube, maps, play store


def _search_app(s: DeviceState, title: str, color: Color, kind: str) -> list[Widget]:
    return _app_bar(title, color) + [
        _input(f"{kind}.box", kind, s, (40, 260, 1040, 380), s.page.query, f"Search {title}")
    ]


def _youtube(s: DeviceState) -> Screen:
    p = s.page
    head = _search_app(s, "YouTube", (255, 0, 0), "youtube")
    if p.name in ("main", "results"):
        query = p.query or "recommended"
        rows = (_ad_rows(s) if p.name == "results" else []) + [
            (f"video:{i}", f"{t}  ·  {ch}", ("go", Page("youtube", "video", query, index=i)))
            for i, (t, ch) in enumerate(catalog.videos(query))
        ]
        body, smax = _rows(s, rows, 420, row_h=260)
        return Screen(tuple(head + body), smax)
    if p.name == "video":
        title, channel = catalog.videos(p.query)[p.index]
        return Screen(
            tuple(
                _app_bar("YouTube", (255, 0, 0))
                + [
                    Widget(
                        "video.player",
                        "rect",
                        (0, CONTENT_TOP, SCREEN_W, 860),
                        "> playing",
                        fill=BLACK,
                        fg=WHITE,
                        size=64,
                    ),
                    Widget("video.title", "text", (20, 900, 1060, 1000), title, size=46),
                    Widget("video.channel", "text", (20, 1010, 1060, 1090), channel, fg=GREY, size=38),
                ]
            )
        )
    raise ValueError(f"youtube has no page {p.name!r}")


def _maps(s: DeviceState) -> Screen:
    p = s.page
    head = _search_app(s, "Maps", (15, 157, 88), "maps")
    mapbg = Widget("map", "image", (0, 400, SCREEN_W, NAV_TOP), fill=(206, 234, 214))
    if p.name == "main":
        return Screen(tuple(head + [mapbg]))
    found = catalog.places(p.query)
    if p.name == "results":
        ws, y = head + [mapbg], 420 + s.jitter
        for i, (name, addr) in enumerate(found):
            if y + ROW_H > _bottom(s):
                break
            ws += [
                Widget(
                    f"place:{i}",
                    "item",
                    (0, y, SCREEN_W, y + ROW_H),
                    f"{name}  {addr}",
                    size=40,
                    intent=("go", Page("maps", "place", p.query, index=i)),
                ),
                Widget(
                    f"directions:{i}",
                    "button",
                    (800, y + 50, 1060, y + 150),
                    "Directions",
                    fill=BLUE,
                    fg=WHITE,
                    size=36,
                    intent=("go", Page("maps", "directions", p.query, index=i)),
                ),
            ]
            y += ROW_H
        return Screen(tuple(ws))
    name, addr = found[p.index]
    if p.name == "place":
        return Screen(
            tuple(
                head
                + [
                    Widget("place.map", "image", (0, 400, SCREEN_W, 1200), fill=(206, 234, 214)),
                    Widget("place.name", "text", (20, 1240, 1060, 1340), name, size=52),
                    Widget("place.addr", "text", (20, 1350, 1060, 1430), addr, fg=GREY, size=40),
                    Widget(
                        "place.directions",
                        "button",
                        (40, 1500, 520, 1640),
                        "Directions",
                        fill=BLUE,
                        fg=WHITE,
                        intent=("go", Page("maps", "directions", p.query, index=p.index)),
                    ),
                ]
            )
        )
    if p.name == "directions":
        return Screen(
            tuple(
                _app_bar(f"To {name}", (15, 157, 88))
                + [
                    Widget(
                        "route.map",
                        "image",
                        (0, CONTENT_TOP, SCREEN_W, 1700),
                        "route",
                        fill=(206, 234, 214),
                        fg=BLUE,
                        size=80,
                    ),
                    Widget("route.eta", "text", (20, 1740, 1060, 1840), f"12 min  ({addr.split(' · ')[0]})", size=52),
                    Widget("route.start", "button", (40, 1900, 520, 2040), "Start", fill=BLUE, fg=WHITE, intent=NOOP),
                ]
            )
        )
    raise ValueError(f"maps has no page {p.name!r}")


_FEATURED = ("Spotify", "Netflix", "Instagram", "TikTok", "Duolingo")


def _playstore(s: DeviceState) -> Screen:
    p = s.page
    head = _search_app(s, "Google Play", (1, 135, 95), "store")
    if p.name in ("main", "results"):
        names = catalog.store_listing(p.query) if p.name == "results" else list(_FEATURED)
        rows = (_ad_rows(s) if p.name == "results" else []) + [
            (f"storeapp:{i}", name, ("go", Page("playstore", "app", item=catalog.app_key(name))))
            for i, name in enumerate(names)
        ]
        body, smax = _rows(s, rows, 420)
        return Screen(tuple(head + body), smax)
    if p.name == "app":
        info = catalog.app_info(p.item)
        installed = p.item in s.installed
        return Screen(
            tuple(
                _app_bar("Google Play", (1, 135, 95))
                + [
                    Widget("store.icon", "icon", (60, 280, 300, 520), info.name, fill=info.color, size=120),
                    Widget("store.name", "text", (320, 300, 1060, 420), info.name, size=56),
                    Widget(
                        "store.install",
                        "button",
                        (60, 600, 1020, 740),
                        "Open" if installed else "Install",
                        fill=(1, 135, 95),
                        fg=WHITE,
                        intent=("open", p.item) if installed else ("install", p.item),
                    ),
                    Widget("store.shots", "image", (60, 800, 1020, 1500), fill=info.color),
                ]
            )
        )
    raise ValueError(f"play store has no page {p.name!r}")


def _generic(s: DeviceState) -> Screen:
    """Apps with nothing to do inside them for AitW tasks: a plausible front page."""
    info = catalog.app_info(s.page.app)
    h = catalog.stable_int("content", info.key)
    rows = [(f"{info.key}.row:{i}", f"{info.name} item {(h >> i) % 97 + 1}", NOOP) for i in range(8)]
    body, smax = _rows(s, rows, CONTENT_TOP)
    return Screen(tuple(_app_bar(info.name, info.color) + body), smax)


# ---------------------------------------------------------------- overlays


def _popup(s: DeviceState) -> list[Widget]:
    pop = s.popup
    assert pop is not None
    if pop.kind == "cookies":
        return [
            Widget("popup", "rect", (0, 1500, SCREEN_W, NAV_TOP), fill=(250, 250, 250), intent=NOOP),
            Widget("popup.text", "text", (20, 1530, 1060, 1650), f"{pop.subject.capitalize()} uses cookies", size=44),
            Widget(
                "popup.reject", "button", (40, 1760, 520, 1900), "Reject all", fill=LIGHT, fg=BLUE, intent=("dismiss",)
            ),
            Widget(
                "popup.accept",
                "button",
                (560, 1760, 1040, 1900),
                "Accept all",
                fill=BLUE,
                fg=WHITE,
                intent=("dismiss",),
            ),
        ]
    name = catalog.app_info(pop.subject).name
    return [
        Widget("popup", "rect", (100, 820, 980, 1400), fill=(250, 250, 250), intent=NOOP),
        Widget("popup.text", "text", (120, 860, 960, 1000), f"Enjoying {name}?", size=52),
        Widget("popup.later", "button", (140, 1200, 520, 1340), "Not now", fill=LIGHT, fg=BLUE, intent=("dismiss",)),
        Widget(
            "popup.rate", "button", (560, 1200, 940, 1340), "Rate", fill=BLUE, fg=WHITE, intent=("rate", pop.subject)
        ),
    ]


def _keyboard() -> list[Widget]:
    # The letter keys are drawn by the renderer as one cached picture and do
    # nothing when tapped (AitW types whole strings with TYPE); only Go submits.
    y = KBD_TOP + 500
    return [
        Widget("kbd", "keyboard", (0, KBD_TOP, SCREEN_W, NAV_TOP), fill=(210, 213, 219), intent=NOOP),
        Widget("kbd.enter", "button", (800, y, 1060, y + 140), "Go", fill=BLUE, fg=WHITE, intent=("submit",)),
    ]


def _loading() -> list[Widget]:
    return [
        Widget("loading.bar", "rect", (0, CONTENT_TOP - 12, SCREEN_W // 3, CONTENT_TOP), fill=BLUE),
        Widget("loading", "rect", (340, 1000, 740, 1120), "Loading...", fill=LIGHT, fg=GREY, size=44),
    ]


_VIEWS = {
    "home": _home,
    "shade": _shade,
    "chrome": _chrome,
    "settings": _settings,
    "clock": _clock,
    "youtube": _youtube,
    "maps": _maps,
    "playstore": _playstore,
}

# Pages whose content is a result list, where sponsored entries may appear.
_LIST_PAGES = {("chrome", "results"), ("chrome", "site_results"), ("youtube", "results"), ("playstore", "results")}


def is_list_page(page: Page) -> bool:
    return (page.app, page.name) in _LIST_PAGES


def view(s: DeviceState) -> Screen:
    """The full screen for state ``s``: app content, then overlays, then system bars."""
    screen = _VIEWS.get(s.page.app, _generic)(s)
    ws = list(screen.widgets)
    if s.focus:
        ws += _keyboard()
    if s.pending is not None:
        ws += _loading()
    if s.popup is not None:
        ws += _popup(s)
    ws = _status_bar() + ws + _nav_bar()
    return Screen(tuple(ws), screen.scroll_max)
