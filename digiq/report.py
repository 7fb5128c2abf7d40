"""Write the README's results from the metrics files, never by hand.

``python -m digiq.report`` rebuilds the block between the markers
``<!-- results:start -->`` and ``<!-- results:end -->`` in README.md from
``metrics/*.json``: success rates per policy and task set, per-family
success, each stage's wall time and its headline numbers.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from digiq.io import atomic_write_text
from digiq.paths import Paths

__all__ = ["results_markdown", "update_readme"]

START, END = "<!-- results:start -->", "<!-- results:end -->"
STAGES = ("tasks", "base_policy", "collect", "augment_actions", "vlm_finetune", "embed", "critic", "actor", "eval")
HEADLINES = {
    "base_policy": ("demo_episodes", "train_loss_last"),
    "collect": ("trajectories", "transitions", "success_rate_by_task_set"),
    "augment_actions": ("states", "n_candidates", "sampled_valid_rate"),
    "vlm_finetune": ("accuracy_heldout", "majority_rate_heldout"),
    "embed": ("states", "pairs_per_s"),
    "critic": ("v_mc_return_corr_heldout", "q_loss_last"),
    "actor": ("kept_fraction", "kept_not_taken_fraction"),
}


def _load(paths: Paths, stage: str) -> dict[str, Any] | None:
    p = paths.metrics / f"{stage}.json"
    return json.loads(p.read_text()) if p.exists() else None


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def results_markdown(paths: Paths) -> str:
    ev = _load(paths, "eval")
    out = []
    if ev:
        out += ["| policy | General test | Web Shopping test |", "|---|---|---|"]
        for policy, sets in ev.items():
            cells = [f"{_pct(sets[ts]['success_rate'])} (n={sets[ts]['n_episodes']})" if ts in sets else "-"
                     for ts in ("general", "webshop")]  # fmt: skip
            out.append(f"| {policy} | {' | '.join(cells)} |")
        out += ["", "Success by family (%):", ""]
        fams = sorted({f for sets in ev.values() for r in sets.values() for f in r["by_family"]})
        policies = list(ev)
        out += ["| family | " + " | ".join(policies) + " |", "|---" * (len(policies) + 1) + "|"]
        for f in fams:
            vals = []
            for p in policies:
                v = next((r["by_family"][f] for r in ev[p].values() if f in r["by_family"]), None)
                vals.append(_pct(v) if v is not None else "-")
            out.append(f"| {f} | " + " | ".join(vals) + " |")
    else:
        out.append("No `metrics/eval.json` yet: run `make repro`.")
    out += ["", "| stage | wall time (s) | headline |", "|---|---|---|"]
    timing = _load(paths, "eval_timing") or {}
    for stage in STAGES:
        m = _load(paths, stage)
        if m is None:
            continue
        wall = timing.get("wall_time_s") if stage == "eval" else m.get("wall_time_s", "-")
        head = ", ".join(f"{k}={m[k]}" for k in HEADLINES.get(stage, ()) if k in m)
        out.append(f"| {stage} | {wall if wall is not None else '-'} | {head} |")
    return "\n".join(out)


def update_readme(readme: Path, paths: Paths) -> None:
    text = readme.read_text(encoding="utf-8")
    if START not in text or END not in text:
        raise ValueError(f"{readme} has no {START} ... {END} block to fill")
    block = f"{START}\n{results_markdown(paths)}\n{END}"
    atomic_write_text(readme, re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--readme", default=str(Paths().root / "README.md"))
    args = ap.parse_args()
    update_readme(Path(args.readme), Paths())
    print(f"updated {args.readme}")


if __name__ == "__main__":
    main()
