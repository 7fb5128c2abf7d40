"""Pretraining questions for the tiny VLM: the CPU-sized stand-in for what LLaVA learned before Digi-Q.

LLaVA-1.5 comes pretrained on images and text, so it can read a screen
before Digi-Q fine-tunes it; the tiny VLM starts from random weights. These
questions teach it to read screens, with answers taken from the view
hierarchy stored with each screenshot (nothing per task or app):

- ``element``: what does a tap at the red circle land on? (the element's
  label, or "nothing"): the marker and the question the representation
  fine-tune and the critic's features use, answered in words;
- ``point``: where is the element labelled L? (its centre as "y x", two
  decimals, the coordinates AutoUI's actions are written in): finding a
  named element, as a task naming an app or an entry needs;
- ``presence``: is there an element labelled L on the screen? (Yes / No,
  half of them about a label from another screen): reading what a screen
  holds as a whole.

Every answer is free text, learned by next-token loss and judged on the
greedy answer (:meth:`digiq.models.vlm.ScreenVLM.greedy_answers`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from digiq.config import PRETRAIN_OBJECTIVES as OBJECTIVES
from digiq.data.screen_corpus import LabelledScreen
from digiq.env.actions import Action, ActionType
from digiq.models.vlm_recipes import Recipe

__all__ = ["OBJECTIVES", "Question", "ask", "correct", "NOTHING"]

NOTHING = "nothing"  # the element answer for a tap on no element
_OFF_ELEMENT = 0.2  # share of element questions asked about a point on no element
_POINT = re.compile(r"^\s*(-?\d*\.?\d+)\s+(-?\d*\.?\d+)")


@dataclass(frozen=True)
class Question:
    """One pretraining example: the image shown, the prompt, the expected answer and how to judge one."""

    objective: str
    image: np.ndarray
    prompt: str
    answer: str
    box: tuple[float, float, float, float] | None = None  # ``point``: any answer inside it is right


def _normal(text: str) -> str:
    return " ".join(text.lower().split())


def _tap(point: tuple[float, float]) -> Action:
    return Action(ActionType.DUAL_POINT, touch=point, lift=point)


def _inside(point: tuple[float, float], box: tuple[float, float, float, float]) -> bool:
    y0, x0, y1, x1 = box
    return y0 <= point[0] < y1 and x0 <= point[1] < x1


def ask(objective: str, screen: LabelledScreen, base: np.ndarray, recipe: Recipe, rng: random.Random,
        other_labels: Sequence[str]) -> Question:  # fmt: skip
    """A question of ``objective`` about ``screen`` (its screenshot prepared by ``recipe.base`` as ``base``).

    ``other_labels``: labels seen on other screens, from which ``presence`` draws its "No" questions.
    """
    elements = screen.elements
    if objective == "element":
        if rng.random() < _OFF_ELEMENT:
            for _ in range(20):
                point = (rng.uniform(0.08, 0.92), rng.uniform(0.02, 0.98))
                if not any(_inside(point, e.box) for e in elements):
                    return Question(objective, recipe.mark(base, _tap(point)),
                                    "<image>\nWhat does tapping at the red circle land on? Answer:", NOTHING)  # fmt: skip
        element = rng.choice(elements)
        y0, x0, y1, x1 = element.box
        point = (rng.uniform(y0 + 0.25 * (y1 - y0), y1 - 0.25 * (y1 - y0)),
                 rng.uniform(x0 + 0.25 * (x1 - x0), x1 - 0.25 * (x1 - x0)))  # fmt: skip
        # The label of the element drawn on top there: boxes may overlap (a list entry and its text).
        hits = [e.label for e in elements if _inside(point, e.box)]
        label = hits[-1] if hits else element.label
        return Question(objective, recipe.mark(base, _tap(point)),
                        "<image>\nWhat does tapping at the red circle land on? Answer:", _normal(label))  # fmt: skip
    if objective == "point":
        counts: dict[str, int] = {}
        for e in elements:
            counts[_normal(e.label)] = counts.get(_normal(e.label), 0) + 1
        element = rng.choice([e for e in elements if counts[_normal(e.label)] == 1] or list(elements))
        y, x = element.center
        return Question(objective, recipe.state(base), f"<image>\nWhere is {_normal(element.label)}? Answer:",
                        f"{y:.2f} {x:.2f}", element.box)  # fmt: skip
    if objective == "presence":
        here = {_normal(e.label) for e in elements}
        absent = [label for label in other_labels if _normal(label) not in here]
        if absent and rng.random() < 0.5:
            label, answer = _normal(rng.choice(absent)), "No"
        else:
            label, answer = _normal(rng.choice(elements).label), "Yes"
        return Question(objective, recipe.state(base), f"<image>\nIs there {label} on the screen? Answer:", answer)
    raise ValueError(f"unknown pretraining objective {objective!r}; one of {OBJECTIVES}")


def correct(question: Question, answer: str) -> bool:
    """Whether ``answer`` is right: the same words (case and spacing aside), or for ``point`` a point inside the element."""
    if question.objective == "point":
        m = _POINT.match(answer)
        return m is not None and question.box is not None and _inside((float(m[1]), float(m[2])), question.box)
    return _normal(answer) == _normal(question.answer)
