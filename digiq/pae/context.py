"""What a crawl of a device found (:mod:`digiq.pae.crawl`): the context a task proposer writes from.

Plain data, importing nothing of the device code, so a proposer that reads it
can be shown (by an import test) to know nothing of the simulator.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from digiq.io import atomic_write_text

__all__ = ["HOME", "DeviceContext", "ScreenRecord"]

HOME = "home"  # the app name of the home screen itself


@dataclass(frozen=True)
class ScreenRecord:
    """One distinct screen: the taps from the home screen that reach it, and what it holds.

    ``switches`` keep their state (``"Notifications on"``), as the screen shows it.
    """

    path: tuple[str, ...]
    buttons: tuple[str, ...]
    inputs: tuple[str, ...]
    switches: tuple[str, ...]

    @property
    def app(self) -> str:
        return self.path[0] if self.path else HOME

    @property
    def labels(self) -> tuple[str, ...]:
        return self.buttons + self.inputs + self.switches


@dataclass
class DeviceContext:
    """Every screen a crawl found, by app in the order the home screen lists them (``home`` first)."""

    apps: dict[str, list[ScreenRecord]] = field(default_factory=dict)
    depth: int = 0
    taps: int = 0  # taps the crawl made, replays included: what it cost on the device

    def screens(self) -> list[ScreenRecord]:
        return [s for screens in self.apps.values() for s in screens]

    def save(self, path: Path) -> None:
        doc = {"depth": self.depth, "taps": self.taps,
               "apps": {app: [asdict(s) for s in screens] for app, screens in self.apps.items()}}  # fmt: skip
        atomic_write_text(path, json.dumps(doc, indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> DeviceContext:
        """A saved crawl.

        Raises:
            ValueError: the file is not a saved crawl (naming the file and what is missing).
        """
        try:
            doc = json.loads(Path(path).read_text())
            apps = {
                app: [
                    ScreenRecord(tuple(s["path"]), tuple(s["buttons"]), tuple(s["inputs"]), tuple(s["switches"]))
                    for s in screens
                ]  # fmt: skip
                for app, screens in doc["apps"].items()
            }
            return cls(apps, int(doc["depth"]), int(doc["taps"]))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{path} is not a saved crawl ({type(e).__name__}: {e})") from None
