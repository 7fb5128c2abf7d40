"""Apply a preset: a set of settings, grouped by the params file each belongs in, written into those files.

A preset is laid out as DVC's ``-S file:group.key=value`` overrides name
their targets::

    params.yaml:
      vlm_finetune:
        lr: 2.0e-5   # why, and where the value comes from
    params/released_models.yaml:
      vlm_finetune:
        dtype: bfloat16

Each value replaces the one in its file, keeping the file's comments; a key
the file does not set yet is added to its group with the knob's help as its
comment. Nothing is written unless every setting names a known group and
knob, no other params file sets the same knob, and the merged params still
pass the stages' checks. DVC then sees which params changed and reruns the
stages that read them.

    python -m digiq.preset params/presets/real.yaml
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from digiq.config import PARAMS, SECTIONS, ConfigError, Params, load_params, load_settings, params_files
from digiq.io import atomic_path

__all__ = ["apply_preset", "read_preset"]


def read_preset(path: Path | str, params: Path | str = PARAMS) -> dict[Path, dict[str, dict[str, Any]]]:
    """The preset's settings by target file, each checked against the params files beside ``params``.

    Raises:
        ConfigError: naming the preset, the file, group or knob that is unknown, or set in another file.
    """
    path, params = Path(path), Path(params)
    raw = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a preset maps params files to groups of knobs")
    files = {f.relative_to(params.parent).as_posix(): f for f in params_files(params)}
    merged = load_params(params)
    out: dict[Path, dict[str, dict[str, Any]]] = {}
    for name, groups in raw.items():
        if name not in files:
            raise ConfigError(f"{path}: {name!r} is not a params file here; one of {sorted(files)}")
        if not isinstance(groups, dict):
            raise ConfigError(f"{path}: {name} must map groups to knobs")
        for group, keys in groups.items():
            if group not in SECTIONS or not isinstance(keys, dict):
                raise ConfigError(f"{path}: {name}: {group!r} is not a group of knobs; one of {sorted(SECTIONS)}")
            known = set(SECTIONS[group].model_fields)
            for key in keys:
                if key not in known:
                    raise ConfigError(f"{path}: {name}: {group}.{key} is no knob; {group} has {sorted(known)}")
                where = merged.source.get((group, key))
                if where is not None and where != files[name]:
                    rel = where.relative_to(params.parent).as_posix()
                    raise ConfigError(f"{path}: {group}.{key} is set in {rel}, and the preset writes it to {name}")
            out.setdefault(files[name], {})[group] = dict(keys)
    return out


def apply_preset(path: Path | str, params: Path | str = PARAMS) -> list[str]:
    """Write the preset into the params files; returns one line per knob that changed.

    Every file is written only after the merged result has passed the
    stages' checks; a preset that breaks one changes nothing. Each file is
    replaced whole; a run killed between two files leaves the preset partly
    applied, which applying it again completes (a value already set is left).
    """
    params = Path(params)
    targets = read_preset(path, params)
    texts: dict[Path, str] = {}
    changes: list[str] = []
    for file, groups in targets.items():
        lines = file.read_text().splitlines()
        before = yaml.safe_load("\n".join(lines)) or {}
        for group, keys in groups.items():
            helps = {key: f.description or "" for key, f in SECTIONS[group].model_fields.items()}
            for key, value in keys.items():
                old = (before.get(group) or {}).get(key, "(default)")
                if old == value:
                    continue
                _set(lines, group, key, value, helps[key])
                changes.append(f"{file.relative_to(params.parent).as_posix()}: {group}.{key}: {old} -> {value}")
        texts[file] = "\n".join(lines) + "\n"
    _check(params, texts)
    for file, text in texts.items():
        with atomic_path(file) as tmp:
            tmp.write_text(text)
    return changes


def _set(lines: list[str], group: str, key: str, value: Any, help_text: str) -> None:
    """Set ``group.key`` in a params file's lines: the value replaced in place, or a new line after the group's last.

    Line by line rather than through a YAML round trip, which would drop a
    ``null`` or move the comment above the next group; a comment beside the
    knob stays in its column.
    """
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16).removesuffix("\n...\n").strip()
    head = re.compile(rf"^{re.escape(group)}:\s*(\{{\}})?\s*(#.*)?$")
    at = next((i for i, line in enumerate(lines) if head.match(line)), None)
    if at is None:
        lines += ["", f"{group}:"]
        at = len(lines) - 1
    elif head.match(lines[at]).group(1):  # `group: {}`: open it up for keys
        lines[at] = f"{group}:"
    body = at + 1
    while body < len(lines) and (lines[body].startswith("  ") or not lines[body].strip()):
        body += 1
    keyed = [i for i in range(at + 1, body) if re.match(r"^  [A-Za-z_]\w*:", lines[i])]
    mine = next((i for i in keyed if lines[i].startswith(f"  {key}:")), None)
    if mine is not None:
        comment = lines[mine].find("  #", len(f"  {key}:"))
        tail = lines[mine][comment:].lstrip() if comment >= 0 else ""
        lines[mine] = _line(key, text, tail, comment + 2 if comment >= 0 else 0)
        return
    column = max((line.find("  #") + 2 for line in (lines[i] for i in keyed) if "  #" in line), default=0)
    lines.insert(keyed[-1] + 1 if keyed else at + 1, _line(key, text, f"# {help_text}" if help_text else "", column))


def _line(key: str, value: str, comment: str, column: int) -> str:
    line = f"  {key}: {value}"
    return f"{line.ljust(column - 2)}  {comment}" if comment else line


def _check(params: Path, texts: dict[Path, str]) -> None:
    """The stages' checks on the params as they would be after writing ``texts``, without writing them."""
    merged = Params()
    for f in params_files(params):
        for group, keys in (yaml.safe_load(texts.get(f, f.read_text())) or {}).items():
            merged.setdefault(group, {}).update(keys if isinstance(keys, dict) else {})
            merged.source.update({(group, key): f for key in (keys if isinstance(keys, dict) else {})})
    load_settings(params, merged)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("preset", type=Path, help="the preset file, e.g. params/presets/real.yaml")
    parser.add_argument("--params", type=Path, default=PARAMS, help="params.yaml of the repository to change")
    args = parser.parse_args(argv)
    try:
        changes = apply_preset(args.preset, args.params)
    except (ConfigError, ValueError, OSError) as e:
        print(f"preset not applied: {e}", file=sys.stderr)
        return 2
    print("\n".join(changes) if changes else "every setting was already as the preset has it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
