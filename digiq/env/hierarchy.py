"""The screen as text: a uiautomator view hierarchy, and the short listing a policy reads.

AutoUI reads the screen through pretrained BLIP-2 features, which carry some
of the text on it. Our tiny policy sees a 114x54 screenshot on which no label
is legible, so it cannot tap an app or a list entry it never saw in training
(the expert-skill diagnostic in the README). Android exposes what is on the
screen as an accessibility hierarchy (``uiautomator dump``), which agents in
this field commonly read; the policy can be given the same in its prompt
(``base_policy.screen_text``): each element that can be tapped or typed into,
with its centre in AutoUI's (y, x) coordinates, e.g.
``Clock 0.33 0.70 ; Settings 0.33 0.50``. Coordinates are written with two
decimals, one token each for the tiny tokenizer, so the policy can copy an
element's position into its tap.

One path for every backend: the simulator writes its widgets as the XML a
real device would dump (:func:`hierarchy_xml`, also what the adb simulator
answers to ``uiautomator dump``), and :func:`describe` reads any such XML.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from xml.sax.saxutils import quoteattr

from digiq.env.screens import NOOP
from digiq.env.ui import ABOVE_DIALOG, SCREEN_H, SCREEN_W, Widget

__all__ = ["DUMP_TRAILER", "hierarchy_xml", "describe", "elements_at", "strip_dump_trailer", "xml_text"]

# What `uiautomator dump /dev/tty` prints after the XML.
DUMP_TRAILER = "UI hierchary dumped to: /dev/tty"

_CLASS = {"input": "android.widget.EditText", "button": "android.widget.Button", "toggle": "android.widget.Switch",
          "icon": "android.widget.TextView", "item": "android.widget.LinearLayout", "image": "android.widget.ImageView",
          "text": "android.widget.TextView", "keyboard": "android.inputmethodservice.KeyboardView"}  # fmt: skip
_BOUNDS = re.compile(r"^\[(-?\d+),(-?\d+)\]\[(-?\d+),(-?\d+)\]$")
# Characters XML 1.0 forbids even escaped (control characters, lone surrogates, U+FFFE/U+FFFF). A policy can
# type them (the tiny tokenizer decodes any byte), and a field then shows them.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
# One element's label in the listing: at most this many words and characters. Longer ones
# (a result's whole line) cost prompt tokens, and the policy's time grows with them.
_MAX_WORDS, _MAX_CHARS = 4, 28
# The status and navigation bars: the same on every screen, and Back and Home are actions of their own.
_SYSTEM_UI = "com.android.systemui"


def _tappable(w: Widget) -> bool:
    return w.intent is not None and w.intent != NOOP


def hierarchy_xml(widgets: Sequence[Widget]) -> str:
    """The widgets as a flat ``uiautomator dump`` hierarchy of the 1080x2280 screen.

    Icons carry their name as ``content-desc`` (as launcher icons do), other
    widgets as ``text``; a widget is clickable when tapping it does something.
    While a dialog shows, only its window and the navigation bar are dumped,
    as on a device: the screen behind it takes no taps.
    """
    if any(w.id.startswith("popup") for w in widgets):
        widgets = [w for w in widgets if w.id.startswith(ABOVE_DIALOG)]
    nodes = []
    for i, w in enumerate(widgets):
        x0, y0, x1, y1 = w.box
        text, desc = ("", w.label) if w.kind == "icon" else (w.label, "")
        attrs = {
            "index": str(i), "text": text, "resource-id": w.id, "class": _CLASS.get(w.kind, "android.view.View"),
            "package": _SYSTEM_UI if w.id.split(".")[0] in ("status", "nav") else "digiq.sim",
            "content-desc": desc, "checkable": str(w.kind == "toggle").lower(),
            "checked": str(w.kind == "toggle" and w.on).lower(), "clickable": str(_tappable(w)).lower(),
            "enabled": "true", "bounds": f"[{x0},{y0}][{x1},{y1}]",
        }  # fmt: skip
        nodes.append("<node " + " ".join(f"{k}={quoteattr(xml_text(v))}" for k, v in attrs.items()) + " />")
    root = f'<node index="0" text="" class="android.widget.FrameLayout" bounds="[0,0][{SCREEN_W},{SCREEN_H}]">'
    return (
        "<?xml version='1.0' encoding='UTF-8' standalone='yes' ?>"
        f'<hierarchy rotation="0">{root}{"".join(nodes)}</node></hierarchy>'
    )


def xml_text(text: str) -> str:
    """``text`` with each character XML cannot hold replaced by ".", as Android's uiautomator dumper does."""
    return _NOT_XML.sub(".", text)


def strip_dump_trailer(out: str) -> str:
    """The XML of ``uiautomator dump /dev/tty`` output, without the line the tool appends."""
    end = out.rfind("</hierarchy>")
    if end < 0:
        raise ValueError(f"not a uiautomator dump (no </hierarchy>): {out[:120]!r}")
    return out[out.find("<") : end + len("</hierarchy>")]


def _label(node: ET.Element) -> str:
    own = node.get("text") or node.get("content-desc") or ""
    if not own.strip():  # a clickable container: its label is what its children say
        own = " ".join(filter(None, (n.get("text") or n.get("content-desc") for n in node.iter() if n is not node)))
    return " ".join(own.split()[:_MAX_WORDS])[:_MAX_CHARS].strip()


def _parse(xml: str) -> ET.Element:
    """The dump's root; characters XML cannot hold are read as "." (dumps stored before the writer replaced them)."""
    try:
        root = ET.fromstring(xml_text(xml))
    except ET.ParseError as e:
        raise ValueError(f"the screen's view hierarchy is not well-formed XML: {e}") from None
    if root.tag != "hierarchy":
        raise ValueError(f"expected a <hierarchy> from uiautomator dump, got <{root.tag}>")
    return root


def _bounds(node: ET.Element) -> tuple[int, int, int, int]:
    m = _BOUNDS.match(node.get("bounds", ""))
    if m is None:
        raise ValueError(f"node {node.get('resource-id') or node.get('class')!r} has bounds "
                         f"{node.get('bounds')!r}, expected [x0,y0][x1,y1]")  # fmt: skip
    x0, y0, x1, y1 = map(int, m.groups())
    return x0, y0, x1, y1


def _actionable(node: ET.Element) -> bool:
    return node.tag == "node" and (node.get("clickable") == "true" or node.get("class", "").endswith("EditText"))


def elements_at(
    xml: str, points: Sequence[tuple[float, float]], size: tuple[int, int] = (SCREEN_W, SCREEN_H)
) -> list[str]:
    """The label of the element a tap at each point ((y, x) in [0, 1], AutoUI's order) lands on; "" for none.

    The element is the last one in the dump, so the one drawn on top, that can
    be tapped or typed into and whose bounds hold the point; system bars count
    (their Back button is a tap of its own). It tells the critic what a tap
    candidate touches (``critic.tap_targets``), as a pretrained VLM reads it
    off the screenshot. All of a screen's candidates are looked up in one
    parse: stages 05 and 06 label 16 candidates of every stored screen.

    Raises:
        ValueError: ``xml`` is not a view hierarchy, or a node's bounds are malformed.
    """
    width, height = size
    boxes = [(_bounds(node), node) for node in _parse(xml).iter("node") if _actionable(node)]
    out = []
    for y, x in points:
        hits = [node for (x0, y0, x1, y1), node in boxes if x0 <= x * width < x1 and y0 <= y * height < y1]
        out.append(_label(hits[-1]) if hits else "")
    return out


def describe(xml: str, size: tuple[int, int] = (SCREEN_W, SCREEN_H)) -> str:
    """The elements of a ``uiautomator dump`` one can tap or type into: ``label y x`` each, ``" ; "`` between.

    ``size`` is the screen's (width, height) in the dump's pixels. Elements
    without a label, or whose centre is off the screen, and the system bars are left out;
    switches say ``on`` or ``off``. Children of a listed element are not
    listed again (their text is its label when it has none of its own).

    Raises:
        ValueError: ``xml`` is not a view hierarchy, or a node's bounds are malformed.
    """
    root = _parse(xml)
    width, height = size
    out: list[str] = []

    def visit(node: ET.Element) -> None:
        if node.get("package") == _SYSTEM_UI:
            return
        if _actionable(node):
            x0, y0, x1, y1 = _bounds(node)
            x, y = (x0 + x1) / 2 / width, (y0 + y1) / 2 / height
            label = _label(node)
            if label and 0 <= x < 1 and 0 <= y < 1:
                switch = node.get("checkable") == "true"
                state = (" on" if node.get("checked") == "true" else " off") if switch else ""
                out.append(f"{label}{state} {y:.2f} {x:.2f}")
            return
        for child in node:
            visit(child)

    visit(root)
    return " ; ".join(out)
