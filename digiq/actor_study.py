"""What moves Digi-Q's actor, on the validation lists: its loss as released against the one before, its rows, its budget.

Reads a pipeline root whose actor stage (07) has run: the stage's picks
(Digi-Q's Best-of-N rows, the perfect critic's) and the expert's matrix it
stored. Each setting of :data:`SETTINGS` refits Digi-Q's policy per seed and
task set from those picks exactly as stage 07 fits it
(:func:`~digiq.stages.actor.fit_inputs`, :func:`~digiq.stages.actor.fit_actor_job`),
changing either the actor's knobs or the rows it imitates, at each budget of
``--updates``, and plays it on the validation lists as ``make val`` plays the
stage's policies. Each setting is compared with ``released`` at the same
budget by a paired bootstrap over tasks and seeds.

- ``released``: the params' actor (the loss as released) on the stage's picks;
  at the params' budget, the stage's own fits.
- ``mean_tokens``, ``no_clamp``, ``dropout_on``, ``all_states``: one part of the
  actor back to what this repository ran before following the release (the mean
  over an action's tokens, no clamp of their probabilities, dropout on while
  fitting, draws among the held-out trajectories' states too); ``before``: all four.
- ``typing_taken``: Digi-Q's picks with every untaken typing row (a TYPE
  candidate other than the data's action) replaced by the data's action there.
- ``perfect_on_kept``: the perfect critic's picks (the expert's candidates) at
  only the states Digi-Q kept. If ``typing_taken`` stops the decline with the
  budget and ``perfect_on_kept`` rises, the cause is the rows, not the fitting.

Beside them, what Digi-Q's rows are (:func:`row_report`), per task set and
over the seeds: the kind of action picked against the kind the expert would
take; at the states where the expert types, how much of the goal the picked
text holds against the data's action's; the share of rows with a token the
base policy gives a probability below 0.001 or above 0.99 (where released
Digi-Q's clamp bites).

``python -m digiq.actor_study --root . --out-dir DIR [--settings ...]
[--updates 40] [--task-sets webshop] [--row filtered_bc]`` never reads a
test list (``--row filtered_bc``: the actor's settings refit Filtered BC's
picks instead, to see whether a knob every row shares helps more than
Digi-Q). ``DIR`` gets the policies, each evaluation's JSON and
``study.json``; the same command on the same ``DIR`` after an interruption
plays only what is missing.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from digiq.config import TOKEN_CLAMP, ComputeConfig, Settings, load_settings
from digiq.data.candidates import read_candidates
from digiq.data.picks import EXPERT_MATRIX, Picks, read_picks, read_stored
from digiq.data.trajectories import TrajectoryStore, data_task_sets
from digiq.env.actions import ActionType, parse_action
from digiq.evaluate import main as evaluate
from digiq.io import atomic_write_text, require
from digiq.models.critic_inputs import typed_match
from digiq.models.policy import AutoUIPolicy
from digiq.models.policy_fit import load_screens
from digiq.paths import Paths
from digiq.rows import PERFECT_CRITIC_ROW
from digiq.stages.actor import ActorFitJob, fit_actor_job, fit_inputs, trained_states
from digiq.stats import paired_bootstrap
from digiq.workers import map_jobs

__all__ = [
    "ACTOR_CHANGES",
    "SETTINGS",
    "ROW_KINDS",
    "typing_taken",
    "on_kept",
    "beyond_clamp",
    "row_report",
    "study",
    "main",
]

#: The actor knobs each setting changes (the rest of :data:`SETTINGS` change the rows instead).
ACTOR_CHANGES: dict[str, dict[str, Any]] = {
    "released": {},
    "mean_tokens": {"token_loss": "mean"},
    "no_clamp": {"token_clamp": False},
    "dropout_on": {"dropout": True},
    "all_states": {"draws": "all"},
    "before": {"token_loss": "mean", "token_clamp": False, "dropout": True, "draws": "all"},
}
SETTINGS = (*ACTOR_CHANGES, "typing_taken", "perfect_on_kept")
#: The stage-07 rows whose picks the actor's settings can refit, and the kind of fit each is.
ROW_KINDS = {"digiq": "best_of_n", "filtered_bc": "filtered_bc"}


def _kind(action: str) -> str:
    parsed = parse_action(action)
    return parsed.type.name if parsed.is_valid else "invalid"


def typing_taken(picks: Picks, action_lists: Sequence[Sequence[str]]) -> Picks:
    """``picks`` with every row that types and is not the data's action (column 0) replaced by the data's action."""
    typing = np.array([c != 0 and _kind(action_lists[s][c]) == ActionType.TYPE.name
                       for s, c in zip(picks.states, picks.columns, strict=True)], bool)  # fmt: skip
    return Picks(picks.states, np.where(typing, 0, picks.columns), picks.weights)


def on_kept(picks: Picks, kept: np.ndarray) -> Picks:
    """The rows of ``picks`` at the states of ``kept`` (another policy's picked states)."""
    there = np.isin(picks.states, kept)
    return Picks(picks.states[there], picks.columns[there], None if picks.weights is None else picks.weights[there])


def row_report(picks: Sequence[Picks], steps: pd.DataFrame, cands: pd.DataFrame, right: np.ndarray,
               kinds: np.ndarray, base: AutoUIPolicy | None = None,
               screens: Mapping[str, torch.Tensor] | None = None) -> dict[str, Any]:  # fmt: skip
    """Per task set, over the seeds' ``picks`` (Digi-Q's rows): the share of rows by (expert's kind, picked kind);
    at the states where the expert types, the rows' share of the goal their typed text holds
    (:func:`~digiq.models.critic_inputs.typed_match`) and that of the data's action there, and how many of each are
    the expert's; with ``base`` (and its ``screens``, :func:`~digiq.models.policy_fit.load_screens`), the share of
    rows with a token it gives a probability below / above the release's clamp."""
    lists, of_set, goals = cands.action_list.tolist(), steps.task_set.to_numpy(), steps.task.tolist()
    out: dict[str, Any] = {}
    for ts in data_task_sets(of_set):
        states = np.concatenate([p.states[of_set[p.states] == ts] for p in picks])
        columns = np.concatenate([p.columns[of_set[p.states] == ts] for p in picks])
        picked = np.array([_kind(lists[s][c]) for s, c in zip(states, columns, strict=True)], dtype=object)
        table = pd.crosstab(pd.Series(kinds[states], name="expert"), pd.Series(picked, name="picked"),
                            normalize=True)  # fmt: skip
        typing = kinds[states] == ActionType.TYPE.name
        entry: dict[str, Any] = {
            "rows_per_seed": round(len(states) / max(1, len(picks)), 1),
            "kinds": {str(e): {str(p): round(float(v), 4) for p, v in row.items() if v > 0}
                      for e, row in table.iterrows()},
            "typing_rows_per_seed": round(int(typing.sum()) / max(1, len(picks)), 1),
        }  # fmt: skip
        if typing.any():
            at, col = states[typing], columns[typing]
            entry["typing"] = {
                "goal_share_picked": _mean(typed_match(goals[s], lists[s][c])[0] for s, c in zip(at, col, strict=True)),
                "goal_share_data": _mean(typed_match(goals[s], lists[s][0])[0] for s in at),
                "expert_share_picked": round(float(right[at, col].mean()), 4),
                "expert_share_data": round(float(right[at, 0].mean()), 4),
            }  # fmt: skip
        if base is not None and screens is not None and len(states):
            images = torch.stack([screens[p] for p in steps.image_path.to_numpy()[states]])
            below, above = beyond_clamp(base, steps.observation.to_numpy()[states].tolist(), images,
                                        [lists[s][c] for s, c in zip(states, columns, strict=True)])  # fmt: skip
            entry["rows_with_a_token_below_clamp"] = round(float(below.mean()), 4)
            entry["rows_with_a_token_above_clamp"] = round(float(above.mean()), 4)
        out[ts] = entry
    return out


@torch.no_grad()
def beyond_clamp(base: AutoUIPolicy, prompts: list[str], images: torch.Tensor, actions: list[str]
                 ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Per row, whether ``base`` gives one of the action's tokens a probability below, and one above, the release's
    clamp (:data:`~digiq.config.TOKEN_CLAMP`): clamping only that side moves the row's summed log-probability."""
    plain = base._summed_logprobs(prompts, images, actions, 32)[0]
    low = base._summed_logprobs(prompts, images, actions, 32, clamp=(TOKEN_CLAMP[0], 1.0))[0]
    high = base._summed_logprobs(prompts, images, actions, 32, clamp=(1e-30, TOKEN_CLAMP[1]))[0]
    return (low > plain).cpu().numpy(), (high < plain).cpu().numpy()


def _mean(values: Any) -> float:
    return round(float(np.mean(list(values))), 4)


def _picks(name: str, seed: int, by_key: Mapping[tuple[str, int], pd.DataFrame], lists: Sequence[Sequence[str]],
           row: str = "digiq") -> Picks:  # fmt: skip
    """Seed ``seed``'s rows of setting ``name``: ``row``'s picks of stage 07, or Digi-Q's as the setting changes
    them."""

    def of(policy: str) -> Picks:  # none where the policy kept no row on this seed
        rows = by_key.get((policy, seed))
        return (
            Picks(np.zeros(0, int), np.zeros(0, int))
            if rows is None
            else Picks(rows.state.to_numpy(), rows.column.to_numpy())
        )

    if name == "typing_taken":
        return typing_taken(of("digiq"), lists)
    if name == "perfect_on_kept":
        return on_kept(of(PERFECT_CRITIC_ROW), of("digiq").states)
    return of(row)


def study(paths: Paths, settings: Settings, names: Sequence[str], budgets: Sequence[int], task_sets: Sequence[str],
          out_dir: Path, workers: int, row: str = "digiq") -> dict[str, Any]:  # fmt: skip
    """Fit every (setting, budget) per seed and task set, play it on the validation lists, compare each setting
    with ``released``; with ``row`` digiq, the row report of Digi-Q's picks first. ``study.json`` is rewritten as each evaluation ends,
    and a (setting, budget) whose evaluation ``out_dir`` already holds is read, not fit again: a study stopped
    part-way resumes where it stopped (an empty ``out_dir`` starts afresh). ``row``: the stage-07 row whose picks
    the actor's settings refit (``digiq`` or ``filtered_bc``; the row settings change Digi-Q's picks)."""
    seeds, actor = settings.experiment.seeds, settings.actor
    require("actor study", paths.picks)
    steps = TrajectoryStore(paths.offline).read().to_pandas()
    cands = read_candidates(paths).to_pandas()
    lists = cands.action_list.tolist()
    stored = read_stored(paths, EXPERT_MATRIX, steps, ("right", "kinds"), "actor")
    by_key = dict(iter(read_picks(paths).groupby(["policy", "seed"], sort=True)))
    out: dict[str, Any] = {"seeds": seeds, "task_sets": list(task_sets), "settings": {}, "against_released": {}}
    if row == "digiq":  # what Digi-Q's rows are, beside the fits of its picks
        base = AutoUIPolicy.load(paths.base_policy)
        screens = load_screens(base, TrajectoryStore(paths.offline), steps.image_path.tolist())
        out["rows"] = row_report([_picks("digiq", s, by_key, lists) for s in range(seeds)], steps, cands,
                                 stored["right"], stored["kinds"], base, screens)  # fmt: skip
    val_tasks = out_dir / "val_tasks.txt"
    atomic_write_text(val_tasks, "".join(paths.task_list(ts, "val").read_text() for ts in task_sets))
    outcomes: dict[tuple[str, int], dict[str, np.ndarray]] = {}
    for updates in budgets:
        for name in names:
            evaluation = out_dir / f"{name}_{updates}.json"
            if evaluation.exists():  # played by an earlier call of the study on this folder
                report = json.loads(evaluation.read_text())
            else:
                cfg = actor.but(updates=updates, **ACTOR_CHANGES.get(name, {}))
                trained = trained_states(cfg, settings.critic, steps)
                where = paths.writing("actors", out_dir / f"{name}_{updates}")
                jobs = []
                for s in range(seeds):
                    picked = _picks(name, s, by_key, lists, row)
                    for ts in task_sets:
                        rows, pool = fit_inputs(steps, cands, picked, ROW_KINDS[row], ts, trained)
                        jobs.append(ActorFitJob(where, row, s, ts, actor.seed + s, rows, pool, cfg))
                map_jobs(fit_actor_job, jobs, ComputeConfig(workers=workers))
                report = evaluate(["--policy", *(str(where.actors / f"seed{s}" / row) for s in range(seeds)),
                                   "--tasks", str(val_tasks), "--params", str(paths.root / "params.yaml"),
                                   "--workers", str(workers), "--out", str(evaluation)])  # fmt: skip
            outcomes[(name, updates)] = {ts: np.array([[c == "1" for c in seed] for seed in report["outcomes"][ts]])
                                         for ts in task_sets if ts in report["outcomes"]}  # fmt: skip
            out["settings"].setdefault(name, {})[str(updates)] = {
                ts: {"success_rate": report[ts]["success_rate"], "per_seed": report[ts]["per_seed"]}
                for ts in task_sets if ts in report}  # fmt: skip
            if name != "released" and ("released", updates) in outcomes:
                out["against_released"].setdefault(name, {})[str(updates)] = {
                    ts: paired_bootstrap(o.astype(np.int8), outcomes[("released", updates)][ts].astype(np.int8))
                    for ts, o in outcomes[(name, updates)].items()}  # fmt: skip
            atomic_write_text(out_dir / "study.json", json.dumps(out, indent=1) + "\n")
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the study on a pipeline root; print validation success per setting and budget; write JSON."""
    ap = argparse.ArgumentParser(prog="python -m digiq.actor_study", description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=Path("."), help="pipeline root whose actor stage has run")
    ap.add_argument("--out-dir", type=Path, required=True, help="the study's policies, evaluations and study.json")
    ap.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS),
                    help="released always runs first, as every other is compared with it")  # fmt: skip
    ap.add_argument("--updates", type=int, nargs="+", default=None,
                    help="actor budgets (optimizer steps); default: the params' actor.updates")  # fmt: skip
    ap.add_argument("--task-sets", nargs="+", default=None, help="default: every task set the data hold")
    ap.add_argument(
        "--row",
        choices=list(ROW_KINDS),
        default="digiq",
        help="the stage-07 row whose picks the actor's settings refit (the row settings: digiq only)",
    )
    args = ap.parse_args(argv)
    paths = Paths(args.root)
    settings = load_settings(paths.root / "params.yaml")
    budgets = args.updates or [settings.actor.updates]
    if min(budgets) < 1:
        ap.error(f"--updates: {min(budgets)} is not a positive number of steps")
    held = data_task_sets(TrajectoryStore(paths.offline).read().column("task_set").to_pylist())
    task_sets = args.task_sets or held
    if unknown := sorted(set(task_sets) - set(held)):
        ap.error(f"--task-sets: {unknown} not in the offline data ({held})")
    names = ["released", *(n for n in args.settings if n != "released")]
    if args.row != "digiq" and (rows_changed := [n for n in names if n not in ACTOR_CHANGES]):
        ap.error(f"--settings: {rows_changed} change Digi-Q's picks; with --row {args.row} only the actor's settings")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    result = study(paths, settings, names, budgets, task_sets, args.out_dir, settings.compute.workers, args.row)
    for name, by_budget in result["settings"].items():
        for updates, by_ts in by_budget.items():
            rates = "  ".join(f"{ts} {v['success_rate']:.3f}" for ts, v in by_ts.items())
            print(f"{name:<16} updates {updates:<5} {rates}")
    return result


if __name__ == "__main__":
    main()
