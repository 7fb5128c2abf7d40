"""Pictures of screens, actions and values; the Q/V viewers."""

from digiq.viz.draw import contact_sheet, draw_action
from digiq.viz.values import ValueData, load_values
from digiq.viz.viewers import ActionViewer, TrajectoryViewer, draw_candidates, snapshot

__all__ = [
    "contact_sheet",
    "draw_action",
    "ValueData",
    "load_values",
    "ActionViewer",
    "TrajectoryViewer",
    "draw_candidates",
    "snapshot",
]
