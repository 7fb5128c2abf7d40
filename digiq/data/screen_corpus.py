"""Screens with their elements: what the VLM's pretraining reads and is asked about.

A screen is a stored screenshot and the view hierarchy dumped with it
(``uiautomator dump`` on a device; the simulator writes the same XML). The
corpus comes from the noisy expert's episodes on the tasks of one split
(recorded by :func:`digiq.stages.vlm_pretrain.record_screens`), so
pretraining on the train split never shows a validation or test entity.
Nothing here is particular to the simulator: any stored episodes whose
hierarchies were kept (``collect.view_hierarchy``) make a corpus.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from digiq.data.trajectories import TrajectoryStore
from digiq.env.hierarchy import Element, screen_elements

__all__ = ["LabelledScreen", "labelled_screens", "screen_images"]


@dataclass(frozen=True)
class LabelledScreen:
    """A stored screenshot (its path in the store) and the elements one can tap or type into on it."""

    image_path: str
    elements: tuple[Element, ...]
    xml: str


def labelled_screens(store: TrajectoryStore, exclude: Sequence[LabelledScreen] = ()) -> list[LabelledScreen]:
    """Every distinct screen the store's steps were taken on that shows at least one labelled element.

    Screens whose hierarchy equals one in ``exclude`` are left out, so that a
    held-out set asks about no screen the model was trained on (the home
    screen, a settings page with nothing typed, appear in every split).
    """
    seen = {s.xml for s in exclude}
    out = []
    for image in store.read().column("image_path").to_pylist():
        xml, size = store.load_hierarchy(image)
        if xml in seen:
            continue
        seen.add(xml)
        elements = tuple(screen_elements(xml, size))
        if elements:
            out.append(LabelledScreen(image, elements, xml))
    return out


def screen_images(store: TrajectoryStore, screens: Sequence[LabelledScreen]) -> list[np.ndarray]:
    """The screenshots of ``screens``, in order."""
    return [store.load_image(s.image_path) for s in screens]
