"""Generate AitW-style train, validation and test task lists with disjoint entities.

Each family has sentence templates in AitW's own style and pools of entities
(cities, countries, products, queries, apps...), each pool a file of
``digiq/env/data/`` with one entity a line. Every entity belongs to
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
from pathlib import Path

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

ENTITIES = Path(__file__).with_name("data")  # one file per pool: its entities, one a line, in order


def _read_pool(name: str) -> tuple[str, ...]:
    """The entities of pool ``name``, as its file lists them (package data, so the lists read as data, not code)."""
    path = ENTITIES / f"{name}.txt"
    try:
        items = tuple(line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    except FileNotFoundError:
        raise FileNotFoundError(f"the task entity pool {name!r} has no file {path}") from None
    if not items:
        raise ValueError(f"the task entity pool file {path} lists no entities")
    if len(set(items)) != len(items):
        raise ValueError(f"the task entity pool file {path} lists an entity twice")
    return items


# The pools each template slot draws from: every entity of a pool falls in one split (train, val or test).
POOLS: dict[str, tuple[str, ...]] = {
    **{name: _read_pool(name) for name in (
        "country", "city", "topic", "chain", "store", "animal", "vehicle", "cuisine", "product_kind", "artist",
        "channel", "app3p", "default_app", "alarm_time", "place_kind", "shop_query",
    )},
    "site": tuple(SHOP_SITES),  # the simulator's shops, named in its catalog
}  # fmt: skip

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
