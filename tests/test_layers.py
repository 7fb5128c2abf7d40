"""The package's layers: each module imports only from its own layer or those below it, so that the
pipeline reads from the bottom up (simulator, data, models, learning rules, stages, reports)."""

import ast
from pathlib import Path

from digiq.paths import ROOT

# Lowest first. A top-level module or subpackage of digiq belongs to exactly one layer.
LAYERS = (
    {
        "io",
        "paths",
        "noise",
        "lock",
        "parallel",
        "progress",
        "config",
        "rows",
        "pipeline",
        "fingerprint",
        "stats",
        "endpoint",
        "redaction",
        "kernels",
    },
    {"env"},  # the simulated and real devices, tasks, actions
    {"data", "judge"},  # stored trajectories, candidates, features; the VLM judge of a real episode
    {"rollout", "cluster"},  # episodes of any policy on any devices; jobs and devices on a Ray cluster
    {"models", "pae"},  # the networks and their checkpoints; PAE's crawler, proposers and evaluators
    {"algos", "workers"},  # the learning rules; jobs over worker processes
    {"diagnostics", "evaluate"},
    {"tables", "viz"},  # what a person reads: tables, figures, viewers
    {"stages"},  # load, call, save: one module per stage
    {
        "report",
        "rerun",
        "preset",
        "reference",
        "scale_study",
        "actor_study",
        "demo",
    },  # the README's tables, rerun spreads, presets, the
    # settings reference, studies of stage 07, the demo
)


def layer_of(module: str) -> int:
    part = module.split(".")[1]
    found = [i for i, layer in enumerate(LAYERS) if part in layer]
    assert len(found) == 1, f"{module}: in {len(found)} layers"
    return found[0]


def imports(path: Path) -> set[str]:
    """The digiq modules ``path`` imports, at the top or inside a function (lazy imports run upward too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("digiq"):
            names = [f"digiq.{a.name}" for a in node.names] if node.module == "digiq" else [node.module]
            found.update(names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("digiq."))
    return found


def test_every_module_imports_only_its_own_layer_or_lower_ones():
    upward = []
    for path in sorted((ROOT / "digiq").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        if rel.parts == ("digiq", "__init__"):
            continue
        mine = layer_of(".".join(rel.parts))
        upward += [f"{'/'.join(rel.parts)}.py imports {m}" for m in sorted(imports(path)) if layer_of(m) > mine]
    assert upward == []


def test_an_upward_import_is_found(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from digiq.viz.draw import contact_sheet\n")
    assert {layer_of(m) for m in imports(module)} == {7}
