"""What the offline data's size and the actor's budget do to Digi-Q and Filtered BC, on the validation lists.

For each fraction of the offline data (a nested subset of each task set's
trajectories: the quarter is inside the half, the half inside the whole)
and each seed, Digi-Q's critic is fit per task set on that subset alone
(:func:`digiq.algos.digiq.fit_critic`, its held-out fifth drawn within the
subset) and Best-of-N picks its rows; Filtered BC takes the subset's
successful episodes. Each row is then fit per task set at each actor budget
(``actor.updates``) exactly as stage 07 fits it (:func:`fit_actor_job`),
and played on the validation lists by ``python -m digiq.evaluate``, as
``make val`` plays the stage's policies. ``--critic`` fits Digi-Q's critics
under one of the critic study's settings instead of the params' own, to
see what a critic that picks differently does to the actor. On the whole data at the params'
budget the study repeats stage 07's fits, so its policies are the stage's.

Beside each critic: its top-Q pick against the simulator's expert on the
subset's held-out trajectories, and the uninformed level there (a uniform
pick among the distinct valid actions), so the curve also says whether
more data moves the critic's picks; and for each row, how many rows it
imitates per task set and what share of them the expert would take.

``python -m digiq.scale_study --root . --out-dir DIR
[--fractions 0.25 0.5 1] [--updates 40] [--critic before] [--stage-critics]`` runs
on a pipeline root whose critic stage has run (``--stage-critics``: on the whole
data under the released critic, that stage's critics are read instead of fit
again); it reads the offline data of train tasks and plays the validation
lists, never a test list. ``DIR`` gets the policies, each
evaluation's JSON (``<fraction>_<updates>_<row>.json``) and ``study.json``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from digiq.algos.digiq import best_of_n_picks, fit_critic
from digiq.algos.filtered_bc import filtered_bc_picks
from digiq.config import (
    ComputeConfig,
    Settings,
    load_settings,
)
from digiq.data.candidates import read_candidates
from digiq.data.features import critic_inputs
from digiq.data.picks import Picks
from digiq.data.trajectories import TrajectoryStore, data_task_sets, heldout_rows
from digiq.diagnostics.critic_study import SETTINGS, critic_q, stage_critics
from digiq.diagnostics.ground_truth import expert_matrix
from digiq.diagnostics.reports import (
    action_kinds,
    distinct_decisions,
    expert_pick_report,
    expert_share,
    mean_over_seeds,
    weighted_share,
)
from digiq.evaluate import main as evaluate
from digiq.io import atomic_write_text
from digiq.models.critic import TextStart
from digiq.paths import Paths
from digiq.stages.actor import ActorFitJob, advantages, fit_actor_job, fit_inputs, trained_states
from digiq.workers import map_jobs

__all__ = ["ROWS", "nested_subset", "imitated", "study", "main"]

#: The rows the study fits, each by the kind of its picks (stage 07's names).
ROWS = {"digiq": "best_of_n", "filtered_bc": "filtered_bc"}


def nested_subset(steps: pd.DataFrame, fraction: float, seed: int) -> np.ndarray:
    """(S,) bool: the steps of the first ``fraction`` of each task set's trajectories in one fixed random order,
    so a smaller fraction's trajectories are always inside a larger one's (at least one trajectory per task set)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"a fraction of the data must be in (0, 1], got {fraction}")
    keep = np.zeros(len(steps), bool)
    task_sets, traj = steps.task_set.to_numpy(), steps.traj_id.to_numpy()
    for ts in data_task_sets(task_sets):
        ids = np.unique(traj[task_sets == ts])
        order = np.random.default_rng(seed).permutation(ids)
        keep |= (task_sets == ts) & np.isin(traj, order[: max(1, round(fraction * len(ids)))])
    return keep


def imitated(per_seed: Sequence[Picks], right: np.ndarray, of_set: np.ndarray) -> dict[str, dict[str, Any]]:
    """Per task set, means over seeds, as stage 08 measures them: how many rows a policy imitates, the share of them
    the expert would take, the share at states where some candidate is the expert's, and the expert's share of the
    rows at those states."""
    offered = right.any(1)
    shares, on_offer, there = [], [], []
    for p in per_seed:
        at = offered[p.states]
        shares.append(expert_share(right, p.states, p.columns, of_set))
        on_offer.append(weighted_share(at, of_set[p.states], of_set))
        there.append(expert_share(right, p.states[at], p.columns[at], of_set))

    shares, on_offer, there = mean_over_seeds(shares), mean_over_seeds(on_offer), mean_over_seeds(there)
    return {ts: {"rows": round(float(np.mean([(of_set[p.states] == ts).sum() for p in per_seed])), 1),
                 "expert_share": shares[ts], "at_states_with_an_expert_candidate": on_offer[ts],
                 "expert_share_there": there[ts]} for ts in data_task_sets(of_set)}  # fmt: skip


def _label(fraction: float, updates: int) -> str:
    return f"{fraction:g}_{updates}"


def study(paths: Paths, settings: Settings, fractions: Sequence[float], budgets: Sequence[int],
          rows: Sequence[str], out_dir: Path, workers: int, critic_setting: str = "released",
          from_stage: bool = False) -> dict[str, Any]:  # fmt: skip
    """Fit and evaluate every (fraction, budget, row) on the validation lists; the figures per task set.

    Digi-Q's critics are the params' critic changed by ``critic_setting``, one of
    :data:`~digiq.diagnostics.critic_study.SETTINGS` (``released``: as stage 06 fits them). ``from_stage``: on
    the whole data under ``released``, stage 06's own critics are read instead of fit again.
    """
    actor = settings.actor
    critic_cfg = settings.critic.but(**SETTINGS[critic_setting])
    seeds = settings.experiment.seeds
    collect = settings.collect
    every_step = TrajectoryStore(paths.offline).read().to_pandas()
    every_cand = read_candidates(paths).to_pandas()
    every_feat = critic_inputs(paths, text=critic_cfg.text_features, towers=critic_cfg.towers,
                               targets=critic_cfg.tap_targets, typed=critic_cfg.typed_match,
                               entries=critic_cfg.list_entries)  # fmt: skip
    encoder = TextStart.of(paths) if critic_cfg.towers else None
    right, _ = expert_matrix(settings.env, collect.seed, every_step, every_cand)
    val_tasks = out_dir / "val_tasks.txt"
    atomic_write_text(val_tasks, "".join(paths.task_list(ts, "val").read_text()
                                         for ts in data_task_sets(every_step.task_set.to_numpy())))  # fmt: skip
    out: dict[str, Any] = {"seeds": seeds, "critic": critic_setting, "fractions": {}}
    for fraction in fractions:
        keep = nested_subset(every_step, fraction, collect.seed)
        steps = every_step[keep].reset_index(drop=True)
        cands = every_cand[keep].reset_index(drop=True)
        feats = {k: np.asarray(v)[keep] for k, v in every_feat.items()}
        valid = np.stack(cands.valid_list.to_numpy())
        of_set = steps.task_set.to_numpy()
        task_sets = data_task_sets(of_set)
        held = heldout_rows(steps.traj_id.to_numpy(), critic_cfg.holdout, critic_cfg.seed, of_set)
        report_args = (right[keep][held], valid[held], distinct_decisions(cands.action_list[held].tolist()),
                       action_kinds(cands.action_list[held].tolist()))  # fmt: skip
        picks: dict[tuple[str, int], Picks] = {}
        critic_rates: list[dict[str, Any]] = []
        whole_released = from_stage and fraction == 1 and not SETTINGS[critic_setting]
        for s in range(seeds):
            q = np.zeros(valid.shape, np.float32)
            critics = stage_critics(paths, critic_cfg, s, task_sets) if whole_released else {}
            for ts in task_sets:
                mine = np.flatnonzero(of_set == ts)
                if ts not in critics:
                    critics[ts] = fit_critic(critic_cfg, {k: v[mine] for k, v in feats.items()},
                                             steps.iloc[mine].reset_index(drop=True), critic_cfg.seed + s,
                                             encoder=encoder)["critic"]  # fmt: skip
                q[mine] = critic_q(critics[ts], feats, mine)
            critic_rates.append(expert_pick_report(*report_args, {"critic": q[held]}, of_set[held]))
            adv = advantages(critics, feats, valid, of_set, actor.k_candidates, np.random.default_rng(actor.seed + s))
            picks[("digiq", s)] = best_of_n_picks(actor, adv, steps)[0]
            picks[("filtered_bc", s)] = filtered_bc_picks(steps)
        entry: dict[str, Any] = {
            "trajectories": {ts: int(steps.traj_id[of_set == ts].nunique()) for ts in task_sets},
            "steps": {ts: int((of_set == ts).sum()) for ts in task_sets},
            "imitated": {row: imitated([p for (r, _), p in picks.items() if r == row], right[keep], of_set)
                         for row in rows},  # fmt: skip
            "critic_heldout_pick": {key: {"uninformed": critic_rates[0][key]["uninformed"],
                                          "critic": round(float(np.mean([r[key]["critic"] for r in critic_rates])), 4),
                                          "critic_per_seed": [r[key]["critic"] for r in critic_rates]}
                                    for key in critic_rates[0] if key.startswith("hit_rate")},
            "budgets": {},
        }  # fmt: skip
        for updates in budgets:
            cfg = actor.but(updates=updates)
            trained = trained_states(cfg, critic_cfg, steps)  # within the share, as its critics held out
            folder = out_dir / _label(fraction, updates)
            where = paths.writing("actors", folder)
            jobs = []
            for (row, s), rows_picked in picks.items():
                if row not in rows:
                    continue
                for ts in task_sets:
                    fit_rows, pool = fit_inputs(steps, cands, rows_picked, ROWS[row], ts, trained)
                    jobs.append(ActorFitJob(where, row, s, ts, actor.seed + s, fit_rows, pool, cfg))
            map_jobs(fit_actor_job, jobs, ComputeConfig(workers=workers))
            entry["budgets"][updates] = {}
            for row in rows:
                result = out_dir / f"{_label(fraction, updates)}_{row}.json"
                report = evaluate(["--policy", *(str(where.actors / f"seed{s}" / row) for s in range(seeds)),
                                   "--tasks", str(val_tasks), "--params", str(paths.root / "params.yaml"),
                                   "--workers", str(workers), "--out", str(result)])  # fmt: skip
                entry["budgets"][updates][row] = {
                    ts: {"success_rate": report[ts]["success_rate"], "per_seed": report[ts]["per_seed"]}
                    for ts in task_sets if ts in report
                }  # fmt: skip
        out["fractions"][f"{fraction:g}"] = entry
        atomic_write_text(out_dir / "study.json", json.dumps(out, indent=1) + "\n")  # each fraction kept as it ends
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the study on a pipeline root; print validation success per fraction, budget and row; write JSON."""
    ap = argparse.ArgumentParser(prog="python -m digiq.scale_study", description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=Path("."), help="pipeline root whose critic stage has run")
    ap.add_argument("--out-dir", type=Path, required=True, help="the study's policies, evaluations and study.json")
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.25, 0.5, 1.0],
                    help="shares of each task set's trajectories, nested")  # fmt: skip
    ap.add_argument("--updates", type=int, nargs="+", default=None,
                    help="actor budgets (optimizer steps); default: the params' actor.updates")  # fmt: skip
    ap.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    ap.add_argument("--critic", choices=list(SETTINGS), default="released",
                    help="Digi-Q's critic: the params' one (released) or a critic study's setting")  # fmt: skip
    ap.add_argument("--stage-critics", action="store_true",
                    help="on the whole data under the released critic, read stage 06's critics instead of "
                         "fitting them again")  # fmt: skip
    args = ap.parse_args(argv)
    paths = Paths(args.root)
    settings = load_settings(paths.root / "params.yaml")
    budgets = args.updates or [settings.actor.updates]
    for f in args.fractions:
        if not 0 < f <= 1:
            ap.error(f"--fractions: {f} is not in (0, 1]")
    if min(budgets) < 1:
        ap.error(f"--updates: {min(budgets)} is not a positive number of steps")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    result = study(paths, settings, args.fractions, budgets, args.rows, args.out_dir,
                   settings.compute.workers, args.critic, from_stage=args.stage_critics)  # fmt: skip
    for fraction, entry in result["fractions"].items():
        pick = entry["critic_heldout_pick"].get("hit_rate", {})
        print(f"fraction {fraction}: critic held-out pick {pick.get('critic')} (uninformed {pick.get('uninformed')})")
        for updates, by_row in entry["budgets"].items():
            for row, by_ts in by_row.items():
                rates = "  ".join(f"{ts} {v['success_rate']:.3f}" for ts, v in by_ts.items())
                print(f"  updates {updates:<5} {row:<12} {rates}")
    return result


if __name__ == "__main__":
    main()
