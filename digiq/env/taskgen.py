"""Generate AitW-style train and test task lists with disjoint entities.

Each family has sentence templates in AitW's own style and pools of entities
(cities, countries, products, queries, apps...). Every entity belongs to
exactly one split, decided by a stable hash of (pool, entity, split_seed), so
a test task never mentions a city, product, query or app seen in training:
test tasks are truly unseen. Which tasks are drawn is decided by ``seed``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from digiq.env.catalog import SHOP_SITES, stable_int

__all__ = ["FAMILY_WEIGHTS", "POOLS", "TEMPLATES", "generate_tasks", "split_pool"]

POOLS: dict[str, tuple[str, ...]] = {
    "country": (
        "Chile",
        "Brazil",
        "Nepal",
        "Taiwan",
        "Singapore",
        "Argentina",
        "Cambodia",
        "Peru",
        "Kenya",
        "Norway",
        "Portugal",
        "Vietnam",
        "Morocco",
        "Finland",
        "Ireland",
        "Egypt",
        "Colombia",
        "Thailand",
        "Poland",
        "Greece",
        "Iceland",
        "Ghana",
        "Austria",
        "Chad",
        "Uruguay",
        "Bolivia",
        "Ecuador",
        "Jordan",
        "Mongolia",
        "Croatia",
    ),
    "city": (
        "Chicago",
        "Denver",
        "Houston",
        "Boston",
        "Miami",
        "Seattle",
        "Phoenix",
        "Atlanta",
        "Portland",
        "Dallas",
        "London",
        "Paris",
        "Tokyo",
        "Sydney",
        "Berlin",
        "Madrid",
        "Rome",
        "Toronto",
        "Lisbon",
        "Oslo",
        "Dublin",
        "Vienna",
        "Prague",
        "Seoul",
        "Mumbai",
        "Cairo",
        "Lima",
        "Austin",
        "Nashville",
        "Detroit",
        "Orlando",
        "Zurich",
        "Vancouver",
        "Montreal",
        "Istanbul",
        "Bangkok",
    ),
    "topic": (
        "space",
        "tech",
        "science",
        "sports",
        "politics",
        "health",
        "finance",
        "cosmology",
        "robotics",
        "climate",
        "medicine",
        "gaming",
        "movies",
        "music",
        "education",
        "travel",
        "energy",
        "aviation",
    ),
    "chain": (
        "Starbucks",
        "Subway",
        "Chipotle",
        "Burger King",
        "Taco Bell",
        "Pizza Hut",
        "Five Guys",
        "Panera",
        "Wendy's",
        "Dunkin",
        "Arby's",
        "Popeyes",
        "Sonic",
        "Culver's",
        "Shake Shack",
        "Denny's",
        "IHOP",
        "Olive Garden",
        "Red Lobster",
        "Jack in the Box",
    ),
    "store": (
        "Target",
        "Walgreens",
        "IKEA",
        "Home Depot",
        "Best Buy",
        "Verizon Store",
        "Apple Store",
        "CVS",
        "Costco",
        "Trader Joe's",
        "Whole Foods",
        "Lowe's",
        "Kroger",
        "Staples",
        "GameStop",
        "Petco",
    ),
    "animal": (
        "lion",
        "giraffe",
        "whale",
        "elephant",
        "tiger",
        "bear",
        "shark",
        "eagle",
        "gorilla",
        "hippo",
        "rhino",
        "zebra",
        "wolf",
        "octopus",
        "penguin",
        "koala",
    ),
    "vehicle": (
        "car",
        "plane",
        "bicycle",
        "train",
        "jet",
        "boat",
        "helicopter",
        "scooter",
        "motorcycle",
        "rocket",
        "skateboard",
        "bus",
    ),
    "cuisine": (
        "Indian",
        "Chinese",
        "Mexican",
        "Thai",
        "Italian",
        "French",
        "Greek",
        "Korean",
        "Japanese",
        "Vietnamese",
        "Ethiopian",
        "Spanish",
        "Turkish",
        "Lebanese",
        "Peruvian",
        "Brazilian",
    ),
    "product_kind": (
        "bronzer",
        "eyeliner",
        "hair dryer",
        "backpack",
        "beach towel",
        "beach chair",
        "yoga mat",
        "water bottle",
        "desk lamp",
        "sunscreen",
        "rain jacket",
        "coffee grinder",
        "phone case",
        "running shoes",
        "sleeping bag",
        "picnic basket",
        "camping stove",
        "travel pillow",
    ),
    "artist": (
        "Taylor Swift",
        "Bruno Mars",
        "Drake",
        "Beyonce",
        "Ed Sheeran",
        "Adele",
        "Rihanna",
        "Coldplay",
        "Shakira",
        "Dua Lipa",
        "The Weeknd",
        "Harry Styles",
        "Billie Eilish",
        "Post Malone",
        "Sia",
        "Imagine Dragons",
    ),
    "channel": (
        "IGN",
        "GameSpot",
        "BBC",
        "CNN",
        "Vox",
        "TED",
        "NASA",
        "National Geographic",
        "The Verge",
        "Wired",
        "Polygon",
        "Kurzgesagt",
        "Veritasium",
        "Vice News",
    ),
    "app3p": (
        "Facebook",
        "Spotify",
        "Instagram",
        "Twitter",
        "Netflix",
        "Uber",
        "Lyft",
        "Pandora",
        "Yelp",
        "Wikipedia",
        "Amazon",
        "ESPN",
        "CNN",
        "Zoom",
        "WhatsApp",
        "Pinterest",
        "Snapchat",
        "Duolingo",
        "Shazam",
        "Waze",
        "Airbnb",
        "Venmo",
        "Telegram",
        "Discord",
    ),
    "default_app": (
        "calculator",
        "clock",
        "camera",
        "gallery",
        "contacts",
        "calendar",
        "files",
        "music",
        "settings",
        "play store",
        "messages",
        "phone",
        "gmail",
        "YouTube",
        "Maps",
        "Chrome",
    ),
    "alarm_time": (
        "5am",
        "6am",
        "6:30am",
        "7am",
        "7:15am",
        "8am",
        "9am",
        "10am",
        "11am",
        "noon",
        "1pm",
        "2pm",
        "3:45pm",
        "4pm",
        "5pm",
        "6pm",
        "7pm",
        "8pm",
        "9:30pm",
        "10pm",
        "11pm",
        "5:50am",
        "12:05pm",
    ),
    "place_kind": (
        "coffee shops",
        "gas stations",
        "parks",
        "libraries",
        "gyms",
        "pharmacies",
        "bakeries",
        "bookstores",
        "museums",
        "car washes",
        "hardware stores",
        "ice cream shops",
    ),
    "shop_query": (
        "dell xps",
        "macbook pro",
        "logitech g pro",
        "razer huntsman",
        "asus rog",
        "acer nitro",
        "beats solo 3",
        "duracell triple a",
        "usb-c to usb-b",
        "lenovo thinkpad",
        "hp spectre",
        "samsung galaxy s9",
        "apple airpods",
        "bose soundlink",
        "sony wh-1000xm3",
        "corsair k70",
        "nintendo switch",
        "xbox one",
        "ps4 controller",
        "kindle paperwhite",
        "gopro hero",
        "canon eos",
        "fitbit charge",
        "anker power bank",
        "sandisk 128gb",
        "seagate 2tb",
        "logitech mx master",
        "jbl flip 4",
        "microsoft surface",
        "alienware aurora",
        "steelseries arctis",
        "hyperx cloud",
        "tp-link router",
        "netgear nighthawk",
        "western digital 1tb",
        "energizer aa",
    ),
    "site": tuple(SHOP_SITES),
}

# Slots in templates are {pool} or {pool2} (a second draw from the same pool).
TEMPLATES: dict[str, tuple[str, ...]] = {
    "search": (
        "What's the news in {country}?",
        "What's the weather like in {city}?",
        "What time is it in {city}?",
        "Search for hotels in {city}",
        "How much does a 2 bedroom apartment rent for in {city}?",
        "What's a good restaurant in {city}?",
        "Search for flights from {city} to {city2}",
        "What is the capital of {country}?",
        "Google the capital of {country}",
        "What's on the menu at {chain}?",
        "How big is a {animal}?",
        "What is the speed of a {vehicle}?",
        "What's the latest news in {topic}?",
        "Search for good {cuisine} restaurants",
        "Search for a new {product_kind}",
        "Where can I buy a nice {product_kind}?",
    ),
    "maps": (
        "How do I get to the nearest {store}?",
        "Find the nearest {store}",
        "Search for top rated {cuisine} restaurants on Maps",
        "Find {place_kind} on Maps",
    ),
    "youtube": (
        "Play the new {artist} video on YouTube",
        "What's the latest video from {channel}?",
        "Play the latest video from {channel}",
    ),
    "app_settings": ("Check the settings for the {app3p} app",),
    "notifications": (
        "Turn off notifications for the {app3p} app",
        "Turn on notifications for the {app3p} app",
        "Toggle notifications for the {app3p} app",
    ),
    "alarm": ("Set an alarm for {alarm_time}",),
    "open_app": ("Open the {default_app}", "Open the {default_app} app"),
    "install_app": ("Install the {app3p} app",),
    "chrome_tab": (
        "Open a new Chrome incognito tab",
        "Open a new incognito window in Chrome",
        "Open a new tab in Chrome",
        "Open a new Chrome private tab",
        "Open a new Chrome window",
        "Open a new private window in Chrome",
        "Open a new incognito tab in the chrome app",
        "Open a new tab in the chrome app",
    ),
    "go_to_site": ("Go to {site}.com",),
    "site_search": ('Go to {site}.com, search for "{shop_query}"',),
    "select_first": ('Go to {site}.com, search for "{shop_query}", and select the first entry',),
}

# Roughly AitW's mix (General: mostly web questions; Web Shopping: a third each).
FAMILY_WEIGHTS: dict[str, dict[str, float]] = {
    "general": {
        "search": 0.55,
        "maps": 0.08,
        "youtube": 0.07,
        "app_settings": 0.05,
        "notifications": 0.05,
        "alarm": 0.05,
        "open_app": 0.06,
        "install_app": 0.05,
        "chrome_tab": 0.04,
    },
    "webshop": {"go_to_site": 1 / 3, "site_search": 1 / 3, "select_first": 1 / 3},
}

# Pools whose entities are split between train and test. Sites are shared (AitW has five, in train
# and test alike), so "Go to SITE" is the one family whose test tasks also occur in training.
_SPLIT_POOLS = frozenset(POOLS) - {"site"}
_SLOT = re.compile(r"\{(\w+?)(2?)\}")


def split_pool(pool: str, split: str, split_seed: int = 0, test_fraction: float = 0.3) -> tuple[str, ...]:
    """The entities of ``pool`` that belong to ``split`` ("train" or "test")."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    items = POOLS[pool]
    if pool not in _SPLIT_POOLS:
        return items
    cut = round(test_fraction * 1000)
    test = tuple(e for e in items if stable_int(pool, e, split_seed) % 1000 < cut)
    chosen = test if split == "test" else tuple(e for e in items if e not in test)
    if not chosen:
        raise ValueError(f"pool {pool!r} has no {split} entities with split_seed={split_seed}")
    return chosen


def _templates(family: str, split: str, split_seed: int) -> tuple[str, ...]:
    """A family's templates; those of entity-free families are split like entities."""
    temps = TEMPLATES[family]
    if any(_SLOT.search(t) for t in temps) or family == "go_to_site":
        return temps
    cut = round(0.3 * 1000)
    test = tuple(t for t in temps if stable_int("template", t, split_seed) % 1000 < cut) or temps[-1:]
    return test if split == "test" else tuple(t for t in temps if t not in test)


def _fill(template: str, split: str, split_seed: int, rng: random.Random) -> str:
    used: dict[str, str] = {}

    def sub(m: re.Match[str]) -> str:
        pool, second = m.group(1), m.group(2)
        choices = split_pool(pool, split, split_seed)
        if second:  # a second, different entity from the same pool ("flights from A to B")
            choices = tuple(c for c in choices if c != used.get(pool)) or choices
            return rng.choice(choices)
        used[pool] = rng.choice(choices)
        return used[pool]

    return _SLOT.sub(sub, template)


def generate_tasks(
    task_set: str, split: str, n: int, seed: int = 0, split_seed: int = 0, families: Sequence[str] | None = None
) -> list[str]:
    """``n`` AitW-style instructions of ``task_set`` from ``split``'s entities.

    Every family of the task set appears at least once when ``n`` allows, so
    small lists still cover them all.
    """
    if task_set not in FAMILY_WEIGHTS:
        raise ValueError(f"task_set must be one of {sorted(FAMILY_WEIGHTS)}, got {task_set!r}")
    weights = FAMILY_WEIGHTS[task_set]
    fams = list(families) if families is not None else list(weights)
    unknown = [f for f in fams if f not in weights]
    if unknown:
        raise ValueError(f"unknown families for {task_set}: {unknown}")
    rng = random.Random(stable_int("taskgen", task_set, split, seed))
    order = fams[:n] + rng.choices(fams, weights=[weights[f] for f in fams], k=max(0, n - len(fams)))
    rng.shuffle(order)
    return [_fill(rng.choice(_templates(f, split, split_seed)), split, split_seed, rng) for f in order]
