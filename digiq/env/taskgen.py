"""Generate AitW-style train, validation and test task lists with disjoint entities.

Each family has sentence templates in AitW's own style and pools of entities
(cities, countries, products, queries, apps...). Every entity belongs to
exactly one split (train, val or test), decided by a stable hash of (pool,
entity, split_seed), so a validation or test task never mentions a city,
product, query or app seen in training, and choices made on validation never
see a test entity. Which tasks are drawn is decided by ``seed``.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Sequence

from digiq.env.catalog import SHOP_SITES, stable_int

__all__ = [
    "FAMILY_WEIGHTS",
    "POOLS",
    "PROTOCOL_TASKS",
    "SPLITS",
    "SPLIT_SHARES",
    "TEMPLATES",
    "family_counts",
    "generate_tasks",
    "split_pool",
]

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
        "Canada",
        "Mexico",
        "India",
        "Japan",
        "Spain",
        "Italy",
        "Sweden",
        "Denmark",
        "Nigeria",
        "Ethiopia",
        "Pakistan",
        "Indonesia",
        "Malaysia",
        "Philippines",
        "Hungary",
        "Romania",
        "Belgium",
        "Netherlands",
        "Switzerland",
        "Paraguay",
        "Venezuela",
        "Tunisia",
        "Senegal",
        "Latvia",
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
        "San Diego",
        "Las Vegas",
        "Philadelphia",
        "Minneapolis",
        "Pittsburgh",
        "Baltimore",
        "Cleveland",
        "Honolulu",
        "Amsterdam",
        "Barcelona",
        "Munich",
        "Stockholm",
        "Copenhagen",
        "Helsinki",
        "Warsaw",
        "Budapest",
        "Athens",
        "Dubai",
        "Hong Kong",
        "Melbourne",
        "Auckland",
        "Cape Town",
        "Nairobi",
        "Buenos Aires",
        "Santiago",
        "Bogota",
        "Havana",
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
        "education",
        "travel",
        "energy",
        "aviation",
        "art",
        "business",
        "fashion",
        "food",
        "history",
        "law",
        "nature",
        "real estate",
        "startups",
        "crypto",
        "biology",
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
        "McDonald's",
        "KFC",
        "Domino's",
        "Papa John's",
        "Chick-fil-A",
        "In-N-Out",
        "Qdoba",
        "Jimmy John's",
        "Little Caesars",
        "Waffle House",
        "Dairy Queen",
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
        "Macy's",
        "Nordstrom",
        "Safeway",
        "Aldi",
        "Office Depot",
        "REI",
        "Dick's Sporting Goods",
        "T-Mobile Store",
        "AT&T Store",
        "Barnes & Noble",
        "Ulta",
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
        "cheetah",
        "dolphin",
        "camel",
        "kangaroo",
        "moose",
        "panda",
        "ostrich",
        "crocodile",
        "leopard",
        "bison",
        "walrus",
        "sloth",
        "hedgehog",
        "jaguar",
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
        "truck",
        "submarine",
        "tram",
        "sailboat",
        "hovercraft",
        "snowmobile",
        "tractor",
        "glider",
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
        "Moroccan",
        "Indonesian",
        "Filipino",
        "Cuban",
        "Caribbean",
        "German",
        "Russian",
        "Polish",
        "Nepalese",
        "Persian",
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
        "toaster",
        "umbrella",
        "wallet",
        "sunglasses",
        "tent",
        "hiking boots",
        "electric kettle",
        "bath towel",
        "desk chair",
        "throw pillow",
        "laundry basket",
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
        "Kendrick Lamar",
        "Lady Gaga",
        "Justin Bieber",
        "Ariana Grande",
        "Olivia Rodrigo",
        "Bad Bunny",
        "SZA",
        "Maroon 5",
        "Katy Perry",
        "Lizzo",
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
        "MKBHD",
        "Linus Tech Tips",
        "Vsauce",
        "SmarterEveryDay",
        "Tasty",
        "Bloomberg",
        "Al Jazeera",
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
        "TikTok",
        "LinkedIn",
        "Tumblr",
        "Hulu",
        "Twitch",
        "Signal",
        "Slack",
        "Dropbox",
        "Evernote",
        "Strava",
        "DoorDash",
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
        "4:30am",
        "5:15am",
        "6:45am",
        "7:30am",
        "8:20am",
        "9:10am",
        "10:30am",
        "1:30pm",
        "2:45pm",
        "3pm",
        "6:15pm",
        "8:30pm",
        "11:45pm",
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
        "hospitals",
        "post offices",
        "dentists",
        "florists",
        "pet stores",
        "barbershops",
        "laundromats",
        "supermarkets",
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
        "samsung galaxy tab",
        "apple watch",
        "ipad air",
        "sony playstation 5",
        "logitech webcam",
        "razer mouse",
        "asus zenbook",
        "lg ultragear",
        "samsung t7 ssd",
        "kingston fury",
        "crucial 16gb",
        "nvidia rtx 3060",
        "amd ryzen 5",
        "intel core i7",
        "google pixel 7",
        "oneplus 9",
        "roku express",
        "fire tv stick",
        "echo dot",
        "ring doorbell",
        "nest thermostat",
        "dyson v8",
        "instant pot",
        "keurig k-mini",
        "ninja blender",
        "philips hue",
        "tile mate",
        "garmin forerunner",
        "jabra elite",
        "skullcandy indy",
        "sennheiser hd 450",
        "audio-technica m50x",
        "blue yeti",
        "elgato stream deck",
        "wacom intuos",
        "epson ecotank",
        "brother laser printer",
        "hp envy",
        "dell ultrasharp",
        "benq monitor",
        "msi katana",
        "gigabyte aorus",
        "razer blade",
        "asus tuf",
        "lenovo legion",
        "dell inspiron",
        "acer aspire",
        "samsung galaxy buds",
        "apple magic mouse",
        "logitech k380",
        "corsair vengeance",
        "samsung 980 pro",
        "wd black sn850",
        "seagate barracuda",
        "netgear orbi",
        "eero pro",
        "tp-link deco",
        "sony a7 iii",
        "nikon z6",
        "fujifilm x100v",
        "bose quietcomfort",
        "sony xm4",
        "jbl charge 5",
        "anker soundcore",
        "ugreen usb hub",
        "belkin surge protector",
        "cable matters usb-c",
        "otterbox defender",
        "spigen tough armor",
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

# Family shares of every list. General follows AitW's General test list (its 432 lines: web search and
# questions 70%, maps 7%, app settings and notifications 5% together, YouTube, open app and install app 4%
# each, Chrome tabs 3%, alarms 2.5%); Web Shopping is a third each, as AitW's.
FAMILY_WEIGHTS: dict[str, dict[str, float]] = {
    "general": {
        "search": 0.70,
        "maps": 0.07,
        "youtube": 0.04,
        "app_settings": 0.025,
        "notifications": 0.025,
        "alarm": 0.025,
        "open_app": 0.04,
        "install_app": 0.04,
        "chrome_tab": 0.03,
    },
    "webshop": {"go_to_site": 1 / 3, "site_search": 1 / 3, "select_first": 1 / 3},
}

SPLITS = ("train", "val", "test")
PROTOCOL_TASKS = 96  # the paper evaluates the first 96 tasks of a test list
# Each pool's entities are ranked by a stable hash and cut into these shares, so every split of every pool
# is non-empty and a split's entities never appear in another split's tasks.
SPLIT_SHARES: dict[str, float] = {"test": 0.3, "val": 0.2, "train": 0.5}

# Pools whose entities are split. Sites are shared (AitW has five, in train and test alike), so "Go to
# SITE" is the one family whose instructions occur in every split.
_SPLIT_POOLS = frozenset(POOLS) - {"site"}
_SLOT = re.compile(r"\{(\w+?)(2?)\}")


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")


def _cut(items: tuple[str, ...], key: str, split: str, split_seed: int) -> tuple[str, ...]:
    """``split``'s share of ``items``: ranked by a stable hash, test first, then val, then train."""
    ranked = sorted(items, key=lambda e: (stable_int(key, e, split_seed), e))
    bounds, start = {}, 0
    for name in ("test", "val"):
        stop = start + max(1, round(SPLIT_SHARES[name] * len(items)))
        bounds[name], start = (start, stop), stop
    bounds["train"] = (start, len(items))
    lo, hi = bounds[split]
    chosen = tuple(e for e in items if e in set(ranked[lo:hi]))  # in the pool's own order
    if not chosen:
        raise ValueError(f"{key!r} has too few entries ({len(items)}) for a {split} share with split_seed={split_seed}")
    return chosen


def split_pool(pool: str, split: str, split_seed: int = 0) -> tuple[str, ...]:
    """The entities of ``pool`` that belong to ``split`` ("train", "val" or "test")."""
    _check_split(split)
    return _cut(POOLS[pool], pool, split, split_seed) if pool in _SPLIT_POOLS else POOLS[pool]


def _templates(family: str, split: str, split_seed: int) -> tuple[str, ...]:
    """A family's templates; those of entity-free families are split like entities."""
    temps = TEMPLATES[family]
    if any(_SLOT.search(t) for t in temps) or family == "go_to_site":
        return temps
    return _cut(temps, "template", split, split_seed)


def _fillings(template: str, split: str, split_seed: int) -> list[str]:
    """Every instruction ``template`` makes from ``split``'s entities (a second slot of a pool differs from the first)."""
    slots = _SLOT.findall(template)
    choices = [split_pool(pool, split, split_seed) for pool, _ in slots]
    out = []
    for combo in itertools.product(*choices):
        firsts = {pool: value for (pool, second), value in zip(slots, combo, strict=True) if not second}
        if any(second and value == firsts.get(pool) for (pool, second), value in zip(slots, combo, strict=True)):
            continue
        values = iter(combo)
        out.append(_SLOT.sub(lambda _m, filled=values: next(filled), template))
    return out


def family_counts(task_set: str, n: int, families: Sequence[str] | None = None) -> dict[str, int]:
    """How many of ``n`` tasks each family gets: its share of ``FAMILY_WEIGHTS`` by largest remainder.

    Every family gets at least one task when ``n`` allows, so small lists still cover them all; the shares of
    a list are then exact up to rounding, not a random draw around them.
    """
    weights = FAMILY_WEIGHTS[task_set]
    fams = list(families) if families is not None else list(weights)
    total = sum(weights[f] for f in fams)
    exact = {f: weights[f] / total * n for f in fams}
    counts = {f: int(exact[f]) for f in fams}
    for f in sorted(fams, key=lambda f: (int(exact[f]) - exact[f], fams.index(f)))[: n - sum(counts.values())]:
        counts[f] += 1
    for f in fams:  # a family the rounding left out takes one task from the largest
        if counts[f] == 0 and n >= len(fams):
            counts[max(counts, key=counts.__getitem__)] -= 1
            counts[f] = 1
    return counts


def generate_tasks(
    task_set: str, split: str, n: int, seed: int = 0, split_seed: int = 0, families: Sequence[str] | None = None
) -> list[str]:
    """``n`` AitW-style instructions of ``task_set`` from ``split``'s entities.

    Families get their shares of ``FAMILY_WEIGHTS`` (:func:`family_counts`), both in the first
    ``PROTOCOL_TASKS`` lines (the paper's protocol reads those) and in the whole list; each part is shuffled.
    Within a family, a template is drawn uniformly and then one of its instructions not yet used; an
    instruction repeats only once its family has none left (Web Shopping's five "Go to SITE" instructions,
    the few Chrome-tab phrasings), and each repeat is another episode.
    """
    if task_set not in FAMILY_WEIGHTS:
        raise ValueError(f"task_set must be one of {sorted(FAMILY_WEIGHTS)}, got {task_set!r}")
    _check_split(split)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    weights = FAMILY_WEIGHTS[task_set]
    fams = list(families) if families is not None else list(weights)
    unknown = [f for f in fams if f not in weights]
    if unknown:
        raise ValueError(f"unknown families for {task_set}: {unknown}")
    rng = random.Random(stable_int("taskgen", task_set, split, seed))
    total = family_counts(task_set, n, fams)
    head_counts = family_counts(task_set, min(n, PROTOCOL_TASKS), fams)
    head: list[str] = []
    tail: list[str] = []
    for family, count in total.items():
        drawn = _draw(family, count, split, split_seed, rng)
        cut = min(head_counts[family], count)
        head += drawn[:cut]
        tail += drawn[cut:]
    rng.shuffle(head)
    rng.shuffle(tail)
    return head + tail


def _draw(family: str, count: int, split: str, split_seed: int, rng: random.Random) -> list[str]:
    """``count`` instructions of ``family``: a uniform template, then one of its unused instructions."""
    everything = {t: _fillings(t, split, split_seed) for t in _templates(family, split, split_seed)}
    unused: dict[str, list[str]] = {}
    out = []
    for _ in range(count):
        if not any(unused.values()):  # none left (or the first draw): a new round over every instruction
            unused = {t: rng.sample(pool, len(pool)) for t, pool in everything.items()}
        template = rng.choice([t for t, pool in unused.items() if pool])
        out.append(unused[template].pop())
    return out
