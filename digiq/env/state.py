"""The simulated device's state: what is on screen and what the phone remembers.

Success conditions of tasks are checked against this state (which page is
shown, which apps are installed, which alarms are set, ...), never against
pixels, so the simulator's ground truth is exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the simulator reads the config's values, never the config module at run time
    from digiq.config import EnvConfig

__all__ = ["DeviceState", "Dynamics", "Page", "Popup"]


@dataclass(frozen=True)
class Page:
    """One screen of one app. Unused fields stay empty.

    ``app`` is an app key (``"chrome"``, ``"settings"``...) or ``"home"`` /
    ``"shade"``; ``name`` the screen within it; ``query`` what was searched;
    ``site`` a web site; ``index`` which list entry was opened; ``item`` an
    app key the screen is about (Settings app pages, Play Store listings).
    """

    app: str
    name: str = "main"
    query: str = ""
    site: str = ""
    index: int = -1
    item: str = ""


HOME = Page("home")


@dataclass(frozen=True)
class Popup:
    """A dialog that blocks the screen until one of its buttons (or Back) dismisses it."""

    kind: str  # "cookies" on web pages, "rate" on app launches
    subject: str  # the site or app that shows it


@dataclass(frozen=True)
class Dynamics:
    """In-the-wild disturbances, each a rate in [0, 1] or a size in logical pixels.

    Defaults are moderate: the noiseless expert still solves every task within
    AitW's step limits, but a policy that taps fixed positions or ignores
    dialogs does not.
    """

    popup_rate: float = 0.25  # P(dialog) when an app launches or a web site loads
    delay_rate: float = 0.15  # P(a web page load shows only one step later)
    jitter_px: int = 48  # content moves by up to this many pixels per screen load
    ad_rate: float = 0.3  # P(a sponsored entry heads a result list)

    def __post_init__(self) -> None:
        for name in ("popup_rate", "delay_rate", "ad_rate"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"Dynamics.{name} must be in [0, 1], got {v!r}")
        if not 0 <= self.jitter_px <= 200:
            raise ValueError(f"Dynamics.jitter_px must be in [0, 200], got {self.jitter_px!r}")

    @classmethod
    def of(cls, env: EnvConfig) -> Dynamics:
        """The disturbances that params' ``env`` group sets."""
        return cls(env.popup_rate, env.delay_rate, env.jitter_px, env.ad_rate)

    @classmethod
    def calm(cls) -> Dynamics:
        """No disturbances at all: the device as a tidy test bench."""
        return cls(popup_rate=0.0, delay_rate=0.0, jitter_px=0, ad_rate=0.0)


@dataclass
class DeviceState:
    """Everything the device remembers. Mutable; copy it to branch an episode."""

    page: Page = HOME
    back_stack: list[Page] = field(default_factory=list)
    installed: list[str] = field(default_factory=list)
    notifications: dict[str, bool] = field(default_factory=dict)
    initial_notifications: dict[str, bool] = field(default_factory=dict)  # at reset, for "toggle" tasks
    alarms: list[tuple[int, int, bool]] = field(default_factory=list)  # (hour 0-23, minute, enabled)
    focus: str = ""  # kind of the focused text field ("web", "url", "site", ...); "" when none
    text: str = ""  # what has been typed into the focused field
    scroll: int = 0  # vertical scroll of the current page, logical pixels
    jitter: int = 0  # layout offset of the current page's content
    ad: bool = False  # whether the current list page shows a sponsored entry
    popup: Popup | None = None
    pending: Page | None = None  # a page load that shows only after the next step
    picker: tuple[int, int, bool] = (9, 0, False)  # alarm picker: hour 1-12, minute, pm
    tabs_opened: int = 0
    incognito_opened: int = 0
    steps: int = 0
