"""Pictures of screens, actions and values."""

from digiq.viz.draw import contact_sheet, draw_action

__all__ = ["contact_sheet", "draw_action"]
