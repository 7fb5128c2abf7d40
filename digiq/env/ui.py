"""Screen description and rendering for the simulated device.

A screen is a list of :class:`Widget` records in *logical* pixels of the
1080x2280 AitW screen. The device hit-tests taps against them and the
renderer draws them at any smaller size. Rendering is a pure function of the
widget list, so the device can cache frames: screens recur a lot (home screen,
app front pages), and that cache is what keeps collection off the critical
path on a CPU.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

__all__ = ["SCREEN_H", "SCREEN_W", "Color", "Renderer", "Widget"]

SCREEN_W, SCREEN_H = 1080, 2280
Color = tuple[int, int, int]

WHITE: Color = (255, 255, 255)
BLACK: Color = (32, 33, 36)
GREY: Color = (128, 134, 139)
LIGHT: Color = (241, 243, 244)
BLUE: Color = (26, 115, 232)


@dataclass(frozen=True)
class Widget:
    """One drawable, tappable element.

    ``box`` is (x0, y0, x1, y1) in logical pixels. ``intent`` says what a tap
    does (interpreted by the device); it is excluded from equality so that two
    screens that look the same share one cached frame.
    """

    id: str
    kind: str
    box: tuple[int, int, int, int]
    label: str = ""
    fill: Color = WHITE
    fg: Color = BLACK
    size: int = 40
    on: bool = False
    intent: Any = field(default=None, compare=False, hash=False)

    def contains(self, x: float, y: float) -> bool:
        x0, y0, x1, y1 = self.box
        return x0 <= x < x1 and y0 <= y < y1

    @property
    def center(self) -> tuple[float, float]:
        """Center as logical (x, y)."""
        x0, y0, x1, y1 = self.box
        return ((x0 + x1) / 2, (y0 + y1) / 2)


@lru_cache(maxsize=64)
def _font(px: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    # Pillow's embedded scalable font: identical on every machine, no system fonts needed.
    return ImageFont.load_default(size=max(px, 4))


@lru_cache(maxsize=16384)
def _text_mask(label: str, px: int) -> tuple[Image.Image, int, int]:
    """The text as a coverage mask, rendered once: FreeType is the renderer's main cost."""
    font = _font(px)
    x0, y0, x1, y1 = font.getbbox(label)
    mask = Image.new("L", (max(1, x1 - x0), max(1, y1 - y0)), 0)
    ImageDraw.Draw(mask).text((-x0, -y0), label, fill=255, font=font)
    return mask, x1 - x0, y1 - y0


_KEY_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm")


class Renderer:
    """Draws widget lists at a fixed output width, with an LRU frame cache."""

    def __init__(self, width: int = 216, cache_size: int = 2048) -> None:
        if width < 32 or width > SCREEN_W:
            raise ValueError(f"screenshot width must be in [32, {SCREEN_W}], got {width}")
        self.width = width
        self.height = round(width * SCREEN_H / SCREEN_W)
        self.scale = width / SCREEN_W
        self._cache: OrderedDict[tuple[Widget, ...], np.ndarray] = OrderedDict()
        self._cache_size = cache_size
        self._kbd: Image.Image | None = None

    def render(self, widgets: tuple[Widget, ...]) -> np.ndarray:
        """Return an (H, W, 3) uint8 array; callers must not write to it."""
        frame = self._cache.get(widgets)
        if frame is not None:
            self._cache.move_to_end(widgets)
            return frame
        frame = self._draw(widgets)
        frame.setflags(write=False)
        self._cache[widgets] = frame
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return frame

    def _keyboard(self, panel: Widget) -> Image.Image:
        """The on-screen keyboard's letter keys, drawn once per renderer (it is on every typing frame)."""
        if self._kbd is None:
            kw = SCREEN_W // 10
            keys = [
                Widget(f"key:{c}", "button", (x + i * kw + 6, y, x + (i + 1) * kw - 6, y + 140), c, size=48)
                for r, row in enumerate(_KEY_ROWS)
                for x, y in [((SCREEN_W - kw * len(row)) // 2, panel.box[1] + 20 + r * 160)]
                for i, c in enumerate(row)
            ]
            keys.append(Widget("key:space", "button", (220, panel.box[1] + 500, 760, panel.box[1] + 640)))
            full = self._draw((Widget("panel", "rect", panel.box, fill=panel.fill), *keys))
            x0, y0, x1, y1 = self._xy(panel.box)
            self._kbd = Image.fromarray(full[y0 : y1 + 1, x0 : x1 + 1])
        return self._kbd

    def _xy(self, box: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        s = self.scale
        x0, y0, x1, y1 = box
        return (
            round(x0 * s),
            round(y0 * s),
            max(round(x1 * s) - 1, round(x0 * s)),
            max(round(y1 * s) - 1, round(y0 * s)),
        )

    def _text(
        self, d: ImageDraw.ImageDraw, label: str, size: int, xy: tuple[int, int, int, int], center: bool, color: Color
    ) -> None:
        if not label:
            return
        mask, tw, th = _text_mask(label, max(4, round(size * self.scale)))
        x0, y0, x1, y1 = xy
        x = (x0 + x1 - tw) // 2 if center else x0 + round(24 * self.scale)
        d.bitmap((x, (y0 + y1 - th) // 2), mask, fill=color)

    def _draw(self, widgets: tuple[Widget, ...]) -> np.ndarray:
        img = Image.new("RGB", (self.width, self.height), WHITE)
        d = ImageDraw.Draw(img)
        r = max(1, round(24 * self.scale))
        for w in widgets:
            xy = self._xy(w.box)
            k = w.kind
            if k == "rect":
                d.rectangle(xy, fill=w.fill)
                self._text(d, w.label, w.size, xy, True, w.fg)
            elif k == "text":
                self._text(d, w.label, w.size, xy, False, w.fg)
            elif k == "button":
                d.rounded_rectangle(xy, radius=r, fill=w.fill)
                self._text(d, w.label, w.size, xy, True, w.fg)
            elif k == "input":
                d.rounded_rectangle(
                    xy, radius=r, fill=LIGHT, outline=BLUE if w.on else GREY, width=max(1, round(4 * self.scale))
                )
                self._text(d, w.label, w.size, xy, False, w.fg)
                if w.on:  # a text cursor at the end of the field
                    x = (
                        xy[0]
                        + round(24 * self.scale)
                        + (_text_mask(w.label, max(4, round(w.size * self.scale)))[1] if w.label else 0)
                        + 1
                    )
                    d.line((x, xy[1] + 2, x, xy[3] - 2), fill=BLUE, width=max(1, round(3 * self.scale)))
            elif k == "icon":
                d.rounded_rectangle(xy, radius=r, fill=w.fill)
                self._text(d, w.label[:1].upper(), w.size, xy, True, WHITE)
            elif k == "circle":
                d.ellipse(xy, fill=w.fill)
                self._text(d, w.label, w.size, xy, True, w.fg)
            elif k == "toggle":
                d.rounded_rectangle(xy, radius=(xy[3] - xy[1]) // 2, fill=BLUE if w.on else GREY)
                h = xy[3] - xy[1]
                kx = xy[2] - h if w.on else xy[0]
                d.ellipse((kx, xy[1], kx + h, xy[3]), fill=WHITE)
            elif k == "item":
                d.rectangle(xy, fill=w.fill)
                d.line((xy[0], xy[3], xy[2], xy[3]), fill=LIGHT, width=max(1, round(3 * self.scale)))
                self._text(d, w.label, w.size, xy, False, w.fg)
            elif k == "image":
                d.rectangle(xy, fill=w.fill)
                d.line((xy[0], xy[1], xy[2], xy[3]), fill=WHITE)
                d.line((xy[0], xy[3], xy[2], xy[1]), fill=WHITE)
                self._text(d, w.label, w.size, xy, True, w.fg)
            elif k == "keyboard":
                img.paste(self._keyboard(w), xy[:2])
            else:
                raise ValueError(f"widget {w.id!r} has unknown kind {k!r}")
        # frombuffer(tobytes()) is several times faster than np.asarray(img) for RGB in Pillow.
        return np.frombuffer(img.tobytes(), np.uint8).reshape(self.height, self.width, 3)
