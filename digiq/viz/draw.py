"""Pictures for the notebooks: actions drawn on screenshots, screenshots tiled, a figure as a PNG.

Light on purpose (PIL, and matplotlib and IPython only when called): the
stages' notebooks draw with it, so it adds nothing heavy to what they run,
and the interactive viewers (:mod:`digiq.viz.viewers`) build on it.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from digiq.env.actions import Action, ActionType, parse_action

if TYPE_CHECKING:
    from IPython.display import Image as IPImage
    from matplotlib.figure import Figure

__all__ = ["contact_sheet", "draw_action", "draw_candidates", "draw_touch", "figure_png", "short_action", "snapshot"]

_RED = (230, 30, 60)
_PALETTE = [(230, 30, 60), (30, 120, 230), (20, 160, 80), (240, 150, 0), (150, 60, 200), (0, 170, 170)]


def draw_action(screenshot: np.ndarray, action: Action) -> Image.Image:
    """The screenshot with ``action`` drawn on it.

    A tap is a ring at the touch point, a swipe an arrow from touch to lift,
    typed text and key presses a caption at the bottom.
    """
    img = Image.fromarray(np.asarray(screenshot)).convert("RGB")
    d = ImageDraw.Draw(img)
    w, h = img.size
    r = max(3, w // 30)
    if action.type is ActionType.DUAL_POINT:
        draw_touch(d, action, (w, h), _RED)
    else:
        caption = {ActionType.TYPE: f'type "{action.text}"', ActionType.INVALID: f"invalid: {action.error}"}.get(
            action.type, action.type.value
        )
        font = ImageFont.load_default(size=max(8, w // 16))
        d.rectangle((0, h - 3 * r - 4, w, h), fill=(255, 255, 255))
        d.text((4, h - 1.5 * r - 2), caption, fill=_RED, font=font, anchor="lm")
    return img


def draw_touch(d: ImageDraw.ImageDraw, action: Action, size: tuple[int, int], color: tuple[int, int, int]) -> None:
    """A DUAL_POINT action on an image of ``size``: a ring at a tap, a line ending in a dot for a swipe."""
    w, h = size
    r = max(3, w // 30)
    (ty, tx), (ly, lx) = action.touch, action.lift
    p0, p1 = (tx * w, ty * h), (lx * w, ly * h)
    if action.is_tap:
        d.ellipse((p0[0] - r, p0[1] - r, p0[0] + r, p0[1] + r), outline=color, width=max(2, r // 2))
    else:
        d.line((*p0, *p1), fill=color, width=max(2, r // 2))
        d.ellipse((p1[0] - r, p1[1] - r, p1[0] + r, p1[1] + r), fill=color)


def short_action(action: str) -> str:
    """A one-line summary of an AutoUI action string."""
    a = parse_action(action)
    if a.type is ActionType.DUAL_POINT:
        (ty, tx), (ly, lx) = a.touch, a.lift
        return f"tap ({ty:.2f}, {tx:.2f})" if a.is_tap else f"swipe ({ty:.2f}, {tx:.2f})->({ly:.2f}, {lx:.2f})"
    if a.type is ActionType.TYPE:
        return f'type "{a.text}"'
    return a.type.value if a.is_valid else f"invalid ({a.error})"


def draw_candidates(screenshot: np.ndarray, actions: list[str], indices: list[int]) -> Image.Image:
    """Every touch candidate drawn on the screenshot: a numbered ring per tap, an arrow per swipe.

    A candidate's colour follows its index (``_PALETTE[index % 6]``), so it
    keeps its colour whatever the order of the list beside the picture.
    """
    img = Image.fromarray(np.asarray(screenshot)).convert("RGB")
    d = ImageDraw.Draw(img)
    w, h = img.size
    r = max(3, w // 30)
    font = ImageFont.load_default(size=max(8, w // 18))
    for text, index in zip(actions, indices, strict=True):
        a = parse_action(text)
        if a.type is not ActionType.DUAL_POINT:
            continue
        color = _PALETTE[index % len(_PALETTE)]
        draw_touch(d, a, (w, h), color)
        ty, tx = a.touch
        d.text((tx * w + r + 1, ty * h), str(index), fill=color, font=font, anchor="lm")
    return img


def figure_png(fig: Figure) -> bytes:
    """A matplotlib figure as PNG bytes, the figure closed."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def snapshot(fig: Figure) -> IPImage:
    """A matplotlib figure as a PNG image for ``display``: what an executed notebook keeps.

    The pipeline's modules select matplotlib's Agg backend (no display needed),
    under which Jupyter shows a bare figure as text; a PNG shows everywhere.
    """
    from IPython.display import Image as IPImage

    return IPImage(data=figure_png(fig), format="png")


def contact_sheet(rows: Sequence[tuple[str, Sequence[Image.Image]]], label_width: int = 260) -> Image.Image:
    """One row per (label, frames); frames left to right."""
    if not rows or not any(frames for _, frames in rows):
        raise ValueError("contact_sheet needs at least one frame")
    fw, fh = next(f for _, fr in rows for f in fr).size
    cols = max(len(fr) for _, fr in rows)
    pad = 6
    sheet = Image.new("RGB", (label_width + cols * (fw + pad), len(rows) * (fh + pad)), (250, 250, 250))
    d = ImageDraw.Draw(sheet)
    font = ImageFont.load_default(size=16)
    for i, (label, frames) in enumerate(rows):
        y = i * (fh + pad)
        lines, line = [], ""
        for word in label.split():  # wrap the label into the left column
            if font.getlength(f"{line} {word}") > label_width - 12 and line:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}".strip()
        lines.append(line)
        for k, text in enumerate(lines[:12]):
            d.text((6, y + 8 + 20 * k), text, fill=(20, 20, 20), font=font)
        for j, f in enumerate(frames):
            sheet.paste(f, (label_width + j * (fw + pad), y))
    return sheet
