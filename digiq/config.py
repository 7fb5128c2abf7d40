"""Typed stage configs read from ``params.yaml``.

``params.yaml`` is the one source of truth for every knob, grouped by stage.
Each group maps onto a frozen dataclass whose fields carry a one-line help;
:func:`load_section` checks names and types and names the file and key of
anything wrong, so a typo stops a stage at once instead of deep in a run.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from digiq.env.state import Dynamics

__all__ = ["ConfigError", "EnvConfig", "TasksConfig", "load_params", "load_section", "help_text"]

T = TypeVar("T")
PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


class ConfigError(ValueError):
    """A params file or key is missing or has the wrong type."""


def _help(text: str, default: Any) -> Any:
    return field(default=default, metadata={"help": text})


@dataclass(frozen=True)
class EnvConfig:
    """The simulated device (DESIGN.md section 4)."""

    width: int = _help("screenshot width in pixels; the height keeps 1080x2280's aspect", 216)
    popup_rate: float = _help("P(dialog) when an app launches or a web site loads", 0.25)
    delay_rate: float = _help("P(a web page load shows only one step later)", 0.15)
    jitter_px: int = _help("content moves down by up to this many logical pixels per screen load", 48)
    ad_rate: float = _help("P(a sponsored entry heads a result list)", 0.3)

    def __post_init__(self) -> None:
        if not 32 <= self.width <= 1080:
            raise ValueError(f"width must be in [32, 1080], got {self.width}")
        self.dynamics()  # range checks of the rates

    def dynamics(self) -> Dynamics:
        return Dynamics(self.popup_rate, self.delay_rate, self.jitter_px, self.ad_rate)


@dataclass(frozen=True)
class TasksConfig:
    """Train and test task lists from disjoint entities."""

    n_train: int = _help("tasks per task set in the train lists", 400)
    n_test: int = _help("tasks per task set in the test lists (the protocol uses the first 96)", 96)
    seed: int = _help("which tasks are drawn", 0)
    split_seed: int = _help("which entities are test-only", 0)


def help_text(cls: type) -> str:
    """One line per field: name, type, default, help."""
    return "\n".join(
        f"{f.name} ({_type_name(f.type)}, default {f.default!r}): {f.metadata.get('help', '')}"
        for f in dataclasses.fields(cls)
    )


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def load_params(path: Path | str = PARAMS) -> dict[str, Any]:
    """The whole params file as a dict, with a clear error for a missing or malformed file."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read params file {p}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"params file {p} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"params file {p} must hold a mapping of stage groups, got {type(data).__name__}")
    return data


def _check(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_check(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin in (list, tuple):
        (inner, *_) = typing.get_args(tp) or (Any,)
        return isinstance(value, list) and all(inner is Any or _check(v, inner) for v in value)
    return isinstance(value, tp)


def load_section(cls: type[T], name: str, params: dict[str, Any] | None = None, path: Path | str = PARAMS) -> T:
    """Build ``cls`` from group ``name`` of the params (read from ``path`` unless given).

    Unknown keys and values of the wrong type raise :class:`ConfigError`
    naming the file, the group and the key; missing keys take the default.
    """
    params = load_params(path) if params is None else params
    raw = params.get(name, {})
    where = f"{Path(path).name}: {name}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping of keys, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known keys: {sorted(known)}")
    for key, value in raw.items():
        if not _check(value, hints[key]):
            raise ConfigError(f"{where}.{key} must be {_type_name(hints[key])}, got {value!r} ({type(value).__name__})")
    values = {k: (float(v) if hints[k] is float else v) for k, v in raw.items()}
    try:
        return cls(**values)
    except ValueError as e:  # a dataclass's own range checks
        raise ConfigError(f"{where}: {e}") from None
