"""The settings reference: every knob of every group, the value a run uses, where that value comes from, and what
it does, generated from the typed configs (:mod:`digiq.config`) and the params files.

    python -m digiq.reference            # writes docs/settings.md

A knob a params file does not set runs at its default; the reference shows
those too, so a reader of it sees every setting a run used. ``make test``
checks that the committed page is what this module writes.
"""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path

from digiq.config import PARAMS, SECTIONS, knob_default, load_params, load_settings
from digiq.io import atomic_write_text
from digiq.paths import ROOT

__all__ = ["settings_markdown", "main"]

REFERENCE = ROOT / "docs" / "settings.md"


def _cell(value: object) -> str:
    """A table cell: the value as YAML would read it, pipes escaped."""
    text = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return text.replace("|", "\\|")


def _summary(cls: type) -> str:
    """The first paragraph of a config class's docstring, on one line."""
    doc = inspect.getdoc(cls) or ""
    return " ".join(doc.split("\n\n")[0].split())


def settings_markdown(params_path: Path | str = PARAMS) -> str:
    """The settings reference page for the params at ``params_path`` (and the ``params/*.yaml`` beside it)."""
    params = load_params(params_path)
    root = Path(params_path).parent
    out = [
        "# Settings",
        "",
        "Every knob a stage reads, generated from the typed configs (`digiq/config.py`) and the params files by",
        "`python -m digiq.reference` (never edited by hand). *value* is what a run uses: the params file's where one",
        "sets it, otherwise the knob's default. A preset (`params/presets/`) writes its values into the params files.",
    ]
    for name, cls in SECTIONS.items():
        given = params.get(name) or {}
        files = sorted({params.source[name, key].relative_to(root).as_posix() for key in given})
        out += ["", f"## `{name}`" + (f" ({', '.join(files)})" if files else " (defaults)"), "", _summary(cls), ""]
        out += ["| knob | value | set in | what it does |", "|---|---|---|---|"]
        for key, f in cls.model_fields.items():
            if key in given:
                value, where = given[key], params.source[name, key].relative_to(root).as_posix()
            else:
                value, where = knob_default(f), "default"
            out.append(f"| `{key}` | {_cell(value)} | {where} | {_cell(f.description or '')} |")
    if load_settings(params_path, params).variants:
        out += ["", "## `variants` (params.yaml)", "",
                "Named critics beside the paper's, each the `critic` group with these knobs changed:", ""]  # fmt: skip
        for variant, changes in (params.get("variants") or {}).items():
            shown = ", ".join(f"`{k}`: {_cell(v)}" for k, v in changes.items())
            out.append(f"- `{variant}`: {shown}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m digiq.reference", description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=Path, default=PARAMS, help="params.yaml (its params/*.yaml beside it are read)")
    ap.add_argument("--out", type=Path, default=REFERENCE, help="the page to write")
    args = ap.parse_args(argv)
    atomic_write_text(args.out, settings_markdown(args.params))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
