"""The screen as text: a uiautomator view hierarchy, and the short listing a policy reads.

AutoUI reads the screen through pretrained BLIP-2 features, which carry some
of the text on it. Our tiny policy sees a 114x54 screenshot on which no label
is legible, so it cannot tap an app or a list entry it never saw in training
(the expert-skill diagnostic, docs/diagnostics.md). Android exposes what is on the
screen as an accessibility hierarchy (``uiautomator dump``), which agents in
this field commonly read; the policy can be given the same in its prompt
(``base_policy.screen_text``): each element that can be tapped or typed into,
with its centre in AutoUI's (y, x) coordinates, e.g.
``Clock 0.33 0.70 ; Settings 0.33 0.50``. Coordinates are written with two
decimals, one token each for the tiny tokenizer, so the policy can copy an
element's position into its tap.

One path for every backend: the simulator writes its widgets as the XML a
real device would dump (:func:`hierarchy_xml`, also what the adb simulator
answers to ``uiautomator dump``), and :func:`describe` and
:func:`tapped_elements` read any such XML.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import quoteattr

from digiq.env.screens import NOOP
from digiq.env.ui import ABOVE_DIALOG, SCREEN_H, SCREEN_W, Widget

__all__ = ["DUMP_TRAILER", "Element", "Tapped", "hierarchy_xml", "describe", "screen_elements", "tapped_elements",
           "strip_dump_trailer", "xml_text", "parse_dump", "node_bounds"]  # fmt: skip

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
# The simulator names entry k of a list L "L:k" (result:0, product:3, settings:2); its dump nests a list's
# entries in one container of this class, as apps' dumps do.
_ENTRY_ID = re.compile(r"^(?P<list>.+):(?P<k>\d+)$")
_LIST_CLASS = "androidx.recyclerview.widget.RecyclerView"
# Containers whose children are the entries of a list, on a device: which entry a tap lands on is its child's place.
_LISTS = ("RecyclerView", "ListView", "GridView")


def _tappable(w: Widget) -> bool:
    return w.intent is not None and w.intent != NOOP


def hierarchy_xml(widgets: Sequence[Widget]) -> str:
    """The widgets as a ``uiautomator dump`` hierarchy of the 1080x2280 screen.

    Icons carry their name as ``content-desc`` (as launcher icons do), other
    widgets as ``text``; a widget is clickable when tapping it does something.
    The entries of a list are the children of one RecyclerView, in order,
    placed where the first entry is drawn; all else hangs from the root. So a
    reader can tell the first result from the third (:class:`Tapped`), as on
    a device. While a dialog shows, only its window and the navigation bar are
    dumped, as on a device: the screen behind it takes no taps.
    """
    if any(w.id.startswith("popup") for w in widgets):
        widgets = [w for w in widgets if w.id.startswith(ABOVE_DIALOG)]
    top: list[Widget | str] = []  # a widget, or the name of a list, where its first entry is drawn
    lists: dict[str, list[Widget]] = {}
    for w in widgets:
        m = _ENTRY_ID.match(w.id)
        if m is None:
            top.append(w)
            continue
        if m.group("list") not in lists:
            top.append(m.group("list"))
        lists.setdefault(m.group("list"), []).append(w)
    nodes = []
    for i, item in enumerate(top):
        if isinstance(item, Widget):
            nodes.append(_node(item, i))
            continue
        name, entry_widgets = item, lists[item]
        x0, y0 = min(w.box[0] for w in entry_widgets), min(w.box[1] for w in entry_widgets)
        x1, y1 = max(w.box[2] for w in entry_widgets), max(w.box[3] for w in entry_widgets)
        entries = "".join(_node(w, k) for k, w in enumerate(entry_widgets))
        nodes.append(f'<node index="{i}" text="" resource-id={quoteattr(name + ".list")} class="{_LIST_CLASS}" '
                     f'package="digiq.sim" content-desc="" clickable="false" enabled="true" '
                     f'bounds="[{x0},{y0}][{x1},{y1}]">{entries}</node>')  # fmt: skip
    root = f'<node index="0" text="" class="android.widget.FrameLayout" bounds="[0,0][{SCREEN_W},{SCREEN_H}]">'
    return (
        "<?xml version='1.0' encoding='UTF-8' standalone='yes' ?>"
        f'<hierarchy rotation="0">{root}{"".join(nodes)}</node></hierarchy>'
    )


def _node(w: Widget, index: int) -> str:
    """One widget as a childless ``<node>``, ``index`` its place among its parent's children."""
    x0, y0, x1, y1 = w.box
    text, desc = ("", w.label) if w.kind == "icon" else (w.label, "")
    attrs = {
        "index": str(index), "text": text, "resource-id": w.id, "class": _CLASS.get(w.kind, "android.view.View"),
        "package": _SYSTEM_UI if w.id.split(".")[0] in ("status", "nav") else "digiq.sim",
        "content-desc": desc, "checkable": str(w.kind == "toggle").lower(),
        "checked": str(w.kind == "toggle" and w.on).lower(), "clickable": str(_tappable(w)).lower(),
        "enabled": "true", "bounds": f"[{x0},{y0}][{x1},{y1}]",
    }  # fmt: skip
    return "<node " + " ".join(f"{k}={quoteattr(xml_text(v))}" for k, v in attrs.items()) + " />"


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


def parse_dump(xml: str) -> ET.Element:
    """The dump's root; characters XML cannot hold are read as "." (dumps stored before the writer replaced them)."""
    try:
        root = ET.fromstring(xml_text(xml))
    except ET.ParseError as e:
        raise ValueError(f"the screen's view hierarchy is not well-formed XML: {e}") from None
    if root.tag != "hierarchy":
        raise ValueError(f"expected a <hierarchy> from uiautomator dump, got <{root.tag}>")
    return root


def node_bounds(node: ET.Element) -> tuple[int, int, int, int]:
    m = _BOUNDS.match(node.get("bounds", ""))
    if m is None:
        raise ValueError(f"node {node.get('resource-id') or node.get('class')!r} has bounds "
                         f"{node.get('bounds')!r}, expected [x0,y0][x1,y1]")  # fmt: skip
    x0, y0, x1, y1 = map(int, m.groups())
    return x0, y0, x1, y1


def _actionable(node: ET.Element) -> bool:
    return node.tag == "node" and (node.get("clickable") == "true" or node.get("class", "").endswith("EditText"))


@dataclass(frozen=True)
class Tapped:
    """What a tap lands on: the element's label ("" for none), and which entry of a list it is (0: the first; -1: none).

    The entry is the place, among a list container's children (RecyclerView,
    ListView, GridView), of the tapped element or of its ancestor that is one.
    A pretrained VLM reads both off a screenshot ("the first result"); the
    critic here gets them from the dump (``critic.tap_targets``,
    ``critic.list_entries``).
    """

    label: str
    entry: int = -1


def tapped_elements(
    xml: str, points: Sequence[tuple[float, float]], size: tuple[int, int] = (SCREEN_W, SCREEN_H)
) -> list[Tapped]:
    """What a tap at each point ((y, x) in [0, 1], AutoUI's order) lands on.

    The element is the last one in the dump, so the one drawn on top, that can
    be tapped or typed into and whose bounds hold the point; system bars count
    (their Back button is a tap of its own). All of a screen's candidates are
    looked up in one parse: stages 06 and 07 read 16 candidates of every
    stored screen.

    Raises:
        ValueError: ``xml`` is not a view hierarchy, or a node's bounds are malformed.
    """
    width, height = size
    root = parse_dump(xml)
    parent = {child: node for node in root.iter() for child in node}
    boxes = [(node_bounds(node), node) for node in root.iter("node") if _actionable(node)]
    out = []
    for y, x in points:
        hits = [node for (x0, y0, x1, y1), node in boxes if x0 <= x * width < x1 and y0 <= y * height < y1]
        out.append(Tapped(_label(hits[-1]), _entry(hits[-1], parent)) if hits else Tapped(""))
    return out


def _entry(node: ET.Element, parent: dict[ET.Element, ET.Element]) -> int:
    """The place of ``node``, or of its nearest ancestor that is a list's child, in that list; -1 outside lists."""
    while node in parent:
        up = parent[node]
        if up.get("class", "").endswith(_LISTS):
            return list(up).index(node)
        node = up
    return -1


@dataclass(frozen=True)
class Element:
    """An element one can tap or type into, as a screen reader lists it.

    ``box`` is (y0, x0, y1, x1) in [0, 1] of the screen, AutoUI's (y, x) order;
    ``label`` its text (a switch's ends in `` on`` or `` off``); ``kind`` what
    the element is, read from its class and whether it is checkable.
    """

    label: str
    box: tuple[float, float, float, float]
    kind: str = "button"  # "input" (a text field), "switch" (checkable) or "button" (anything else one taps)

    @property
    def center(self) -> tuple[float, float]:
        y0, x0, y1, x1 = self.box
        return (y0 + y1) / 2, (x0 + x1) / 2


def screen_elements(xml: str, size: tuple[int, int] = (SCREEN_W, SCREEN_H)) -> list[Element]:
    """The elements of a ``uiautomator dump`` one can tap or type into, in the dump's order.

    ``size`` is the screen's (width, height) in the dump's pixels. Elements
    without a label, or whose centre is off the screen, and the system bars are left out.
    Children of a listed element are not listed again (their text is its label when it has none of its own).

    Raises:
        ValueError: ``xml`` is not a view hierarchy, or a node's bounds are malformed.
    """
    root = parse_dump(xml)
    width, height = size
    out: list[Element] = []

    def visit(node: ET.Element) -> None:
        if node.get("package") == _SYSTEM_UI:
            return
        if _actionable(node):
            x0, y0, x1, y1 = node_bounds(node)
            element = Element(_label(node), (y0 / height, x0 / width, y1 / height, x1 / width))
            y, x = element.center
            if element.label and 0 <= x < 1 and 0 <= y < 1:
                switch = node.get("checkable") == "true"
                state = (" on" if node.get("checked") == "true" else " off") if switch else ""
                kind = "switch" if switch else "input" if node.get("class", "").endswith("EditText") else "button"
                out.append(Element(element.label + state, element.box, kind))
            return
        for child in node:
            visit(child)

    visit(root)
    return out


def describe(xml: str, size: tuple[int, int] = (SCREEN_W, SCREEN_H)) -> str:
    """The elements of a ``uiautomator dump`` one can tap or type into (:func:`screen_elements`), as
    ``label y x`` each (the centre, two decimals), ``" ; "`` between.

    Raises:
        ValueError: ``xml`` is not a view hierarchy, or a node's bounds are malformed.
    """
    return " ; ".join(f"{e.label} {e.center[0]:.2f} {e.center[1]:.2f}" for e in screen_elements(xml, size))
