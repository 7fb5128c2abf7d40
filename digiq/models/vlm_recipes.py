"""How the VLM is asked about a (screen, action) pair: the image it sees and the question, per recipe.

Two recipes share one model class (:class:`~digiq.models.vlm.ScreenVLM`):

``tiny`` (the default, for the VLM built here at 96 x 96): the screenshot is
resized whole to the tower's square input and the action is drawn on it in
red (a ring as wide as Digi-Q's click icon for a tap, a line for a swipe, a
bar for anything else); the question names the action, with a touch's
point as Digi-Q's question states it, and the task ("Does tapping at the
red circle, at [0.4552, 0.4869], change the screen?"). Drawing at the small
size keeps embedding 16 candidates per state cheap on a CPU.

``original`` (Digi-Q's own preparation, for a released LLaVA-1.5): a click
icon is pasted on the full-size screenshot at a tap's touch point (250 px
wide on a 1080 px screen), the screenshot is scaled to 1/4, padded to a
square with the image processor's mean colour and resized to the tower's
input, as LLaVA-1.5's ``image_aspect_ratio: pad`` does. The question is
Digi-Q's, per action type, without the task ("There is a cursor in the
screen. The touch point is located at [y, x] Is this cursor Clicking on any
interactive elements?"), followed by its instruction to answer only Yes or
No, inside LLaVA-1.5's (Vicuna v1) conversation with its system prompt,
after the ``<s>`` token it was trained with.

A recipe prepares a state's screenshot once (:meth:`Recipe.base`) and marks
each candidate on that (:meth:`Recipe.mark`), so the work per candidate is
what the recipe must redo per action.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from PIL import Image
from torch.nn import functional as F

from digiq.env.actions import Action, ActionType

__all__ = ["Recipe", "TinyRecipe", "OriginalRecipe", "RECIPES", "TINY_RECIPES", "recipe", "click_icon",
           "LLAVA_TEMPLATE", "VICUNA_SYSTEM", "ANSWER_ONLY"]  # fmt: skip

# tiny_no_point: the tiny recipe with a tap's or swipe's point left out of the question, so that only the marker
# shows where (the question the tiny recipe asked before it followed Digi-Q's); docs/experiments-critic-actor.md
# measures it.
TINY_RECIPES = ("tiny", "tiny_no_point")
RECIPES = (*TINY_RECIPES, "original")
_RED = np.array([230, 30, 60], np.uint8)
# LLaVA-1.5's conversation format (llava-hf model cards): the answer slot is the position after "ASSISTANT:".
LLAVA_TEMPLATE = "USER: {} ASSISTANT:"
# LLaVA-1.5's "v1" conversation (Vicuna's system prompt), the one Digi-Q fine-tuned and queried in.
VICUNA_SYSTEM = (
    "A chat between a curious human and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the human's questions."
)
ANSWER_ONLY = "Respond only 'Yes' or 'No' (without period / quotation marks) and don't respond anything else."
ICON_FRACTION = 250 / 1080  # Digi-Q pastes a 250 px icon on AitW's 1080 px wide screenshots
SCALE = 0.25  # Digi-Q's screenshots are shown to the VLM at 1/4 size


class Recipe(Protocol):
    name: str
    bos: bool  # whether the prompt starts with the tokenizer's BOS token
    parts: tuple[str, ...]  # the equal slices of a representation, in order (the diagnostics report on each)

    def template(self, prompt: str) -> str:
        """The whole text given to the model for ``prompt`` (its image tag still single)."""
        ...

    def question(self, action: Action, task: str) -> str: ...

    def state_question(self, task: str) -> str: ...

    def base(self, screenshots: list[np.ndarray]) -> list[np.ndarray]:
        """Each screenshot prepared once per state: what :meth:`mark` and :meth:`state` start from."""
        ...

    def mark(self, base: np.ndarray, action: Action) -> np.ndarray:
        """The tower-size input that shows ``action`` on a state's prepared screenshot."""
        ...

    def state(self, base: np.ndarray) -> np.ndarray:
        """The tower-size input for the state alone."""
        ...


@dataclass(frozen=True)
class TinyRecipe:
    """The CPU recipe: a red marker drawn at the tower's size, a question naming the action and the task."""

    image_size: int
    prompt_template: str = "{}"
    name: str = "tiny"
    bos: bool = False
    parts: tuple[str, ...] = ("answer_slot", "pooled")
    point_in_question: bool = True  # a touch's point as Digi-Q's question states it; False: the marker alone

    def template(self, prompt: str) -> str:
        return self.prompt_template.replace("{}", prompt, 1)

    def question(self, action: Action, task: str) -> str:
        if action.type is ActionType.DUAL_POINT:  # the point as Digi-Q's question states it: [y, x] of the screen
            (ty, tx), (ly, lx) = action.touch, action.lift
            if action.is_tap:
                what = "tapping at the red circle" + (f", at [{ty}, {tx}]" if self.point_in_question else "")
            else:
                what = "swiping along the red line" + (f", from [{ty}, {tx}] to [{ly}, {lx}]" if self.point_in_question
                                                       else "")  # fmt: skip
            what += ","
        elif action.type is ActionType.TYPE:
            what = f'typing "{action.text}"'
        elif action.type is ActionType.INVALID:
            what = "an invalid action"
        else:
            what = {ActionType.PRESS_BACK: "pressing Back", ActionType.PRESS_HOME: "pressing Home",
                    ActionType.PRESS_ENTER: "pressing Enter"}.get(action.type, "declaring the task done")  # fmt: skip
        return f"<image>\nTask: {task}\nDoes {what} change the screen? Answer:"

    def state_question(self, task: str) -> str:
        return f"<image>\nTask: {task}\nWhat is on the screen? Answer:"

    def base(self, screenshots: list[np.ndarray], chunk: int = 64) -> list[np.ndarray]:
        """Screenshots resized whole (area) to the square input, in chunks, each result its own small array.

        Resizing one at a time leaves the allocator fragmented by the
        full-size float temporaries (about 0.75 MB kept per image: gigabytes
        for a dataset); chunked, the temporaries are few and large.
        """
        s, out = self.image_size, []
        for i in range(0, len(screenshots), chunk):
            t = torch.as_tensor(np.stack(screenshots[i : i + chunk])).permute(0, 3, 1, 2).float()
            small = F.interpolate(t, size=(s, s), mode="area").round().clamp(0, 255).byte().permute(0, 2, 3, 1).numpy()
            out += [np.array(x) for x in small]  # copies: no view keeps the chunk alive
        return out

    def mark(self, base: np.ndarray, action: Action) -> np.ndarray:
        return draw_marker(base, action)

    def state(self, base: np.ndarray) -> np.ndarray:
        return base


@dataclass(frozen=True)
class OriginalRecipe:
    """Digi-Q's recipe for LLaVA-1.5: click icon, 1/4 scale, padded square, its questions, Vicuna v1 chat, BOS."""

    image_size: int
    image_mean: tuple[float, float, float]
    name: str = "original"
    bos: bool = True
    parts: tuple[str, ...] = ("answer_token",)

    def template(self, prompt: str) -> str:
        return f"{VICUNA_SYSTEM} USER: {prompt} ASSISTANT:"

    def question(self, action: Action, task: str) -> str:
        """Digi-Q's question for the action's type (the task is not part of it)."""
        if action.type is ActionType.DUAL_POINT:  # taps and swipes alike; only a tap gets the icon
            text = (
                "You're given a user interface. There is a cursor in the screen. The touch point is located at "
                f"[{action.touch[0]}, {action.touch[1]}] Is this cursor Clicking on any interactive elements?"
            )
        elif action.type is ActionType.TYPE:
            text = (f"You're given a user interface. If a user now Types {action.text}, will this Type action "
                    "effectively input the text into somewhere on the Screenshot?")  # fmt: skip
        elif action.type is ActionType.PRESS_HOME:
            text = ("You're given a user interface. If a user now Presses the <HOME> button, will this action "
                    "effectively navigate the user to the Home screen?")  # fmt: skip
        elif action.type is ActionType.PRESS_BACK:
            text = ("You're given a user interface. If a user now Presses the <BACK> button, will this action "
                    "effectively navigate the user to the previous screen?")  # fmt: skip
        elif action.type is ActionType.PRESS_ENTER:
            text = ("You're given a user interface. If a user now Presses the <ENTER> button, will this action "
                    "effectively submit the form?")  # fmt: skip
        else:
            text = "You're given a user interface. Is this action effective?"
        return f"<image>\n{text}\n{ANSWER_ONLY}"

    def state_question(self, task: str) -> str:
        """The state alone. Digi-Q's V(s) reads BLIP-2 features instead; here it is the same VLM, shown no action."""
        return (
            f"<image>\nYou're given a user interface. Task: {task}\nIs the task finished on this screen?\n{ANSWER_ONLY}"
        )

    def base(self, screenshots: list[np.ndarray]) -> list[np.ndarray]:
        return screenshots  # the icon goes on the full-size screenshot, before any scaling

    def mark(self, base: np.ndarray, action: Action) -> np.ndarray:
        image = Image.fromarray(base).convert("RGB")
        if action.is_tap:
            w, h = image.size
            size = max(1, round(ICON_FRACTION * w))
            icon = click_icon().resize((size, size), Image.Resampling.LANCZOS)
            y, x = int(action.touch[0] * h), int(action.touch[1] * w)
            image.paste(icon, (x - size // 2, y - size // 2), icon)
        return self._square(image)

    def state(self, base: np.ndarray) -> np.ndarray:
        return self._square(Image.fromarray(base).convert("RGB"))

    def _square(self, image: Image.Image) -> np.ndarray:
        """1/4 scale, padded to a centred square in the mean colour, resized to the tower's input (bicubic)."""
        w, h = image.size
        image = image.resize((int(w * SCALE), int(h * SCALE)), Image.Resampling.BICUBIC)
        w, h = image.size
        side = max(w, h)
        square = Image.new("RGB", (side, side), tuple(int(m * 255) for m in self.image_mean))
        square.paste(image, ((side - w) // 2, (side - h) // 2))
        return np.asarray(square.resize((self.image_size, self.image_size), Image.Resampling.BICUBIC))


def recipe(name: str, image_size: int, image_mean: tuple[float, float, float], prompt_template: str) -> Recipe:
    """The recipe called ``name`` for a tower of ``image_size`` with the processor's ``image_mean``."""
    if name in TINY_RECIPES:
        return TinyRecipe(image_size, prompt_template, name=name, point_in_question=name == "tiny")
    if name == "original":
        return OriginalRecipe(image_size, tuple(image_mean))
    raise ValueError(f"unknown VLM recipe {name!r}; one of {RECIPES}")


def draw_marker(image: np.ndarray, action: Action) -> np.ndarray:
    """``image`` (any size) with the action marked in red: a ring for a tap, a line for a swipe.

    Drawn at the VLM's input resolution with numpy, which is what keeps
    embedding N candidates per state cheap.
    """
    out = image.copy()
    h, w = out.shape[:2]
    if action.type is not ActionType.DUAL_POINT:
        out[-max(2, h // 24) :, :] = _RED  # a bar: "something other than a touch"
        return out
    yy, xx = np.mgrid[0:h, 0:w]
    (ty, tx), (ly, lx) = action.touch, action.lift
    r = max(2.0, ICON_FRACTION * w / 2)  # as wide as Digi-Q's click icon on the same screen
    if action.is_tap:
        d = np.hypot(yy - ty * (h - 1), xx - tx * (w - 1))
        out[(d > r - 1.5) & (d < r + 0.5)] = _RED
    else:
        for s in np.linspace(0, 1, 2 * max(h, w)):
            out[round((ty + s * (ly - ty)) * (h - 1)), round((tx + s * (lx - tx)) * (w - 1))] = _RED
        out[np.hypot(yy - ly * (h - 1), xx - lx * (w - 1)) < r / 2] = _RED
    return out


_ICON: Image.Image | None = None


def click_icon(size: int = 250) -> Image.Image:
    """The click icon (RGBA, ``size`` square): a dark ring around a white disc with a red centre, soft-edged.

    Drawn here rather than read from a file; like Digi-Q's, it is pasted with
    its alpha channel, so the screen shows around it.
    """
    global _ICON
    if _ICON is None or _ICON.size != (size, size):
        c = (size - 1) / 2
        yy, xx = np.mgrid[0:size, 0:size]
        r = np.hypot(yy - c, xx - c) / (size / 2)  # 0 at the centre, 1 at the edge
        rgba = np.zeros((size, size, 4), np.float32)
        rgba[..., :3] = np.where((r < 0.72)[..., None], 255.0, 20.0)  # white disc inside a dark ring
        rgba[r < 0.3, :3] = (230, 30, 60)
        rgba[..., 3] = 255 * np.clip((0.95 - r) * size / 4, 0, 1)  # opaque to r = 0.95, anti-aliased edge
        _ICON = Image.fromarray(rgba.round().astype(np.uint8), "RGBA")
    return _ICON
