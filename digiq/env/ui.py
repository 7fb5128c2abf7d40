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

__all__ = ["SCREEN_H", "SCREEN_W", "ABOVE_DIALOG", "Color", "Renderer", "Widget"]

SCREEN_W, SCREEN_H = 1080, 2280
Color = tuple[int, int, int]

WHITE: Color = (255, 255, 255)
BLACK: Color = (32, 33, 36)
GREY: Color = (128, 134, 139)
LIGHT: Color = (241, 243, 244)
BLUE: Color = (26, 115, 232)

# While a dialog shows, only its own widgets and the navigation bar take taps (the device) and are in
# the view hierarchy (uiautomator sees the dialog's window): widget ids that start with these.
ABOVE_DIALOG = ("popup", "nav")


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
def _text_mask(label: str, px: int) -> np.ndarray:
    """The text's coverage (uint8 alpha), rendered once: FreeType is the costliest step."""
    font = _font(px)
    x0, y0, x1, y1 = font.getbbox(label)
    mask = Image.new("L", (max(1, x1 - x0), max(1, y1 - y0)), 0)
    ImageDraw.Draw(mask).text((-x0, -y0), label, fill=255, font=font)
    return np.asarray(mask)


@lru_cache(maxsize=4096)
def _shape_mask(shape: str, w: int, h: int, r: int) -> np.ndarray:
    """Which pixels of a w x h box a shape covers ("round" rectangle of radius r, "ellipse", "cross")."""
    img = Image.new("1", (w, h), 0)
    d = ImageDraw.Draw(img)
    if shape == "round":
        d.rounded_rectangle((0, 0, w - 1, h - 1), radius=r, fill=1)
    elif shape == "ellipse":
        d.ellipse((0, 0, w - 1, h - 1), fill=1)
    else:  # the two diagonals of an image placeholder
        d.line((0, 0, w - 1, h - 1), fill=1)
        d.line((0, h - 1, w - 1, 0), fill=1)
    return np.asarray(img, dtype=bool)


def _blend(rgb: np.ndarray, alpha: np.ndarray, color: Color) -> np.ndarray:
    """``color`` laid over ``rgb`` with coverage ``alpha`` (uint8 arrays)."""
    a = alpha[..., None].astype(np.uint16)
    return ((rgb * (255 - a) + np.array(color, np.uint16) * a + 127) // 255).astype(np.uint8)


@lru_cache(maxsize=16384)
def _on_plain(label: str, px: int, color: Color, bg: int) -> np.ndarray:
    """A text patch on a plain background, as RGBX pixels: most labels sit on a plain fill."""
    alpha = _text_mask(label, px)
    plain = np.full(alpha.shape, bg, np.uint32)
    rgb = plain.view(np.uint8).reshape(*alpha.shape, 4)[..., :3]
    rgb[...] = _blend(rgb, alpha, color)
    return plain


_KEY_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm")
Box = tuple[int, int, int, int]


def _packed(color: Color) -> np.uint32:
    """An RGB colour as one RGBX pixel: filling 32-bit pixels is many times faster than 3-byte ones."""
    r, g, b = color
    return np.uint32(r | g << 8 | b << 16 | 0xFF << 24)


class Renderer:
    """Draws widget lists at a fixed output width, with an LRU frame cache.

    Frames are drawn into a numpy array of 32-bit RGBX pixels: rectangles are
    slice assignments, every other shape and every text label is a mask drawn
    once by Pillow and cached, and Pillow packs the result to RGB at the end.
    """

    def __init__(self, width: int = 216, cache_size: int = 2048) -> None:
        if width < 32 or width > SCREEN_W:
            raise ValueError(f"screenshot width must be in [32, {SCREEN_W}], got {width}")
        self.width = width
        self.height = round(width * SCREEN_H / SCREEN_W)
        self.scale = width / SCREEN_W
        self._cache: OrderedDict[tuple[Widget, ...], np.ndarray] = OrderedDict()
        self._cache_size = cache_size
        self._kbd: np.ndarray | None = None  # uint32 RGBX pixels
        self._blank = np.full((self.height, self.width), _packed(WHITE), np.uint32)
        self._r = max(1, round(24 * self.scale))  # corner radius
        self._t = max(1, round(3 * self.scale))  # line thickness
        self._pad = round(24 * self.scale)  # text inset from the left edge

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

    def _keyboard(self, panel: Widget) -> np.ndarray:
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
            full = self._canvas((Widget("panel", "rect", panel.box, fill=panel.fill), *keys))
            x0, y0, x1, y1 = self._xy(panel.box)
            self._kbd = full[y0:y1, x0:x1].copy()
        return self._kbd

    def _xy(self, box: Box) -> Box:
        """Logical box -> pixel box (end-exclusive, at least one pixel wide and high)."""
        s = self.scale
        x0, y0 = round(box[0] * s), round(box[1] * s)
        return x0, y0, max(round(box[2] * s), x0 + 1), max(round(box[3] * s), y0 + 1)

    def _clip(self, x0: int, y0: int, x1: int, y1: int) -> tuple[slice, slice, slice, slice] | None:
        """Canvas slices of a pixel box, and the matching slices of a mask the box's size."""
        cx0, cy0, cx1, cy1 = max(x0, 0), max(y0, 0), min(x1, self.width), min(y1, self.height)
        if cx0 >= cx1 or cy0 >= cy1:
            return None
        return slice(cy0, cy1), slice(cx0, cx1), slice(cy0 - y0, cy1 - y0), slice(cx0 - x0, cx1 - x0)

    def _fill(self, c: np.ndarray, xy: Box, color: Color, shape: str = "rect", r: int = 0) -> None:
        x0, y0, x1, y1 = xy
        cl = self._clip(x0, y0, x1, y1)
        if cl is None:
            return
        ys, xs, my, mx = cl
        if shape == "rect":
            c[ys, xs] = _packed(color)
        else:
            c[ys, xs][_shape_mask(shape, x1 - x0, y1 - y0, r)[my, mx]] = _packed(color)

    def _text(self, c: np.ndarray, label: str, size: int, xy: Box, center: bool, color: Color) -> None:
        if not label:
            return
        px = max(4, round(size * self.scale))
        alpha = _text_mask(label, px)
        th, tw = alpha.shape
        x0, y0, x1, y1 = xy
        x = (x0 + x1 - tw) // 2 if center else x0 + self._pad
        y = (y0 + y1 - th) // 2
        cl = self._clip(x, y, x + tw, y + th)
        if cl is None:
            return
        ys, xs, my, mx = cl
        region = c[ys, xs]
        bg = region[0, 0]
        if my == slice(0, th) and mx == slice(0, tw) and (region == bg).all():
            region[...] = _on_plain(label, px, color, int(bg))
            return
        region_rgb = region.view(np.uint8).reshape(*region.shape, 4)[..., :3]
        region_rgb[...] = _blend(region_rgb, alpha[my, mx], color)

    def _draw(self, widgets: tuple[Widget, ...]) -> np.ndarray:
        c = self._canvas(widgets)
        rgb = Image.frombuffer("RGBX", (self.width, self.height), c, "raw", "RGBX", 0, 1).tobytes("raw", "RGB")
        return np.frombuffer(rgb, np.uint8).reshape(self.height, self.width, 3)

    def _canvas(self, widgets: tuple[Widget, ...]) -> np.ndarray:
        c = self._blank.copy()
        r, t = self._r, self._t
        for w in widgets:
            xy = self._xy(w.box)
            x0, y0, x1, y1 = xy
            k = w.kind
            if k == "rect":
                self._fill(c, xy, w.fill)
                self._text(c, w.label, w.size, xy, True, w.fg)
            elif k == "text":
                self._text(c, w.label, w.size, xy, False, w.fg)
            elif k in ("button", "icon"):
                self._fill(c, xy, w.fill, "round", r)
                if k == "icon":  # an app icon shows its initial
                    self._text(c, w.label[:1].upper(), w.size, xy, True, WHITE)
                else:
                    self._text(c, w.label, w.size, xy, True, w.fg)
            elif k == "input":
                self._fill(c, xy, BLUE if w.on else GREY, "round", r)
                b = max(1, round(4 * self.scale))  # outline width
                self._fill(c, (x0 + b, y0 + b, x1 - b, y1 - b), LIGHT, "round", max(1, r - b))
                self._text(c, w.label, w.size, xy, False, w.fg)
                if w.on:  # a text cursor at the end of what was typed
                    tw = _text_mask(w.label, max(4, round(w.size * self.scale))).shape[1] if w.label else 0
                    x = x0 + self._pad + tw + 1
                    self._fill(c, (x, y0 + 2, x + t, y1 - 2), BLUE)
            elif k == "circle":
                self._fill(c, xy, w.fill, "ellipse")
                self._text(c, w.label, w.size, xy, True, w.fg)
            elif k == "toggle":
                h = y1 - y0
                self._fill(c, xy, BLUE if w.on else GREY, "round", h // 2)
                kx = x1 - h if w.on else x0
                self._fill(c, (kx, y0, kx + h, y1), WHITE, "ellipse")
            elif k == "item":
                self._fill(c, xy, w.fill)
                self._fill(c, (x0, y1 - t, x1, y1), LIGHT)  # divider
                self._text(c, w.label, w.size, xy, False, w.fg)
            elif k == "image":
                self._fill(c, xy, w.fill)
                self._fill(c, xy, WHITE, "cross")
                self._text(c, w.label, w.size, xy, True, w.fg)
            elif k == "keyboard":
                kb = self._keyboard(w)
                c[y0 : y0 + kb.shape[0], x0 : x0 + kb.shape[1]] = kb
            else:
                raise ValueError(f"widget {w.id!r} has unknown kind {k!r}")
        return c
