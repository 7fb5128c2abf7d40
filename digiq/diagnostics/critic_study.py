"""What moves the critic's picks: Digi-Q's critic fit under named settings on the same data, judged alike.

For each setting, seed and task set one critic is fit on the task set's
training trajectories (:func:`digiq.algos.digiq.fit_critic`, the held-out
fifth as stage 06 holds it out). Every critic's top-Q valid candidate is
then judged against the simulator's expert (:func:`expert_pick_report`) on
strata of the stored states:

- the held-out trajectories, and the training ones beside them;
- held-out states of episodes that succeeded, and of episodes that failed;
- held-out states where the action taken was the expert's, and where it was
  not;
- held-out states where the expert types, and where it does something else
  (a critic that cannot read typed text picks worst at the first).

If TD pushes right actions down in failed episodes while untried candidates
win by extrapolation, the critic picks the expert's action less often where
the data took it in a failed episode than where the data took something
else. Each stratum carries its own uninformed level (a uniform pick among
the distinct valid actions), so a rate is read against what knowing
nothing gives on the same states.

``python -m digiq.diagnostics.critic_study --root . --out FILE`` runs
:data:`SETTINGS` on a pipeline root after its critic inputs are built
(``dvc repro critic_inputs``); it reads only the offline data of train
tasks, never a validation or test list. With ``--stage-critics`` the
``released`` setting reads stage 06's ``digiq`` critics instead of fitting
the same critics again (about a quarter of an hour each on two cores), on a
root whose critic stage is up to date. Each fit critic's Q is kept in
``FILE.parts/`` as it ends, so the same command after an interruption fits
only the critics still missing (delete the folder after the data change).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from digiq.algos.digiq import fit_critic
from digiq.config import CriticConfig, EnvConfig, load_settings
from digiq.data.candidates import read_candidates
from digiq.data.features import critic_inputs
from digiq.data.trajectories import TrajectoryStore, data_task_sets, heldout_rows
from digiq.diagnostics.ground_truth import expert_matrix
from digiq.diagnostics.reports import action_kinds, distinct_decisions, expert_pick_report
from digiq.env.actions import ActionType
from digiq.io import atomic_path, atomic_write_text
from digiq.models.checkpoint import read_meta
from digiq.models.critic import Critic, TextStart, load_critics
from digiq.paths import Paths

__all__ = ["SETTINGS", "strata", "critic_q", "stage_critics", "kept_q", "study", "main"]

#: Named settings, each the critic's keys it changes from the params' critic (the released ones by default).
SETTINGS: dict[str, dict[str, Any]] = {
    "released": {},
    # What the digiq row ran before it followed the release: AdamW, a larger step and no clip, about 100 passes,
    # the pessimistic twin heads.
    "before": {
        "lr": 3e-4,
        "weight_decay": 0.01,
        "grad_clip": None,
        "steps": 1600,
        "batch_size": 256,
        "twin_heads": "min",
    },  # fmt: skip
    "twin_min": {"twin_heads": "min"},  # the released regime with the pessimistic twin heads
    "steps_x4": {"steps": 3200},  # the released regime, four times the passes
    "lr_x30": {"lr": 3e-4},  # the released regime at the earlier step size
    # The frozen text averages instead of the trained towers, under the released regime and under the one before.
    "frozen_text": {"text_encoder": "frozen"},
}
SETTINGS["before_frozen_text"] = {**SETTINGS["before"], "text_encoder": "frozen"}


def strata(steps: pd.DataFrame, right: np.ndarray, expert_kinds: np.ndarray, held: np.ndarray
           ) -> dict[str, np.ndarray]:  # fmt: skip
    """(S,) masks of the stored states :func:`study` judges on (see the module's docstring); ``expert_kinds``
    (S,) is the kind of action the expert takes at each state (:func:`expert_matrix`)."""
    succeeded = steps.trajectory_reward.to_numpy() > 0
    taken_right = np.asarray(right, bool)[:, 0]
    typing = np.asarray(expert_kinds) == ActionType.TYPE.name
    return {
        "heldout": held,
        "train": ~held,
        "heldout, episode succeeded": held & succeeded,
        "heldout, episode failed": held & ~succeeded,
        "heldout, taken action the expert's": held & taken_right,
        "heldout, taken action not the expert's": held & ~taken_right,
        "heldout, the expert types": held & typing,
        "heldout, the expert does not type": held & ~typing,
    }


@torch.no_grad()
def critic_q(critic: Critic, feats: Mapping[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
    """(len(rows), N): Q of every candidate of ``rows``' states, the heads joined as the actor reads them."""
    x = critic.read(feats, rows, ("state", "candidates"))
    q, _, _ = critic.advantage(x["state"], x["candidates"])
    return q.cpu().numpy()


def stage_critics(paths: Paths, cfg: CriticConfig, s: int, task_sets: Sequence[str]) -> dict[str, Critic]:
    """Stage 06's ``digiq`` critics of seed index ``s``, one per task set, refused (naming the checkpoint) where
    one was not fit as ``cfg`` with seed ``cfg.seed + s`` would fit it (its TD steps, gamma, split or seed)."""
    critics = load_critics(paths, s, "digiq", task_sets)
    want = {"seed": cfg.seed + s, "steps": cfg.steps, "gamma": cfg.gamma, "holdout": cfg.holdout,
            "split_seed": cfg.seed}  # fmt: skip
    for ts in task_sets:
        meta = read_meta(paths.critic(s, "digiq", ts))
        wrong = {k: (meta.get(k), v) for k, v in want.items() if meta.get(k) != v}
        if wrong or meta.get("row") != "digiq":
            raise ValueError(
                f"critic checkpoint {paths.critic(s, 'digiq', ts)} was not fit under the params' "
                f"critic (checkpoint, params): {wrong}; rerun the critic stage (dvc repro critic)"
            )
    return critics


def kept_q(parts: Path | None, cfg: CriticConfig, seed: int, feats: Mapping[str, np.ndarray], rows: np.ndarray,
           fit: Callable[[], Critic]) -> np.ndarray:  # fmt: skip
    """:func:`critic_q` of ``rows`` by the critic ``fit`` returns, kept in ``parts`` (one file per critic, named by
    its settings, seed and rows) so a study stopped part-way fits again only the critics it had not finished."""
    if parts is None:
        return critic_q(fit(), feats, rows)
    key = json.dumps({"critic": cfg.model_dump(mode="json"), "seed": seed, "rows": rows.tolist()}, sort_keys=True)
    where = parts / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.npy"
    if where.exists():
        return np.load(where)
    q = critic_q(fit(), feats, rows)
    parts.mkdir(parents=True, exist_ok=True)
    with atomic_path(where) as tmp, open(tmp, "wb") as f:
        np.save(f, q)
    return q


def study(paths: Paths, base: CriticConfig, settings: Mapping[str, Mapping[str, Any]], seeds: int,
          env: EnvConfig, collect_seed: int, from_stage: bool = False, parts: Path | None = None
          ) -> dict[str, Any]:  # fmt: skip
    """Per setting: the critics' expert-pick rates on every stratum (means over seeds), and their passes.

    ``base`` is the critic the settings change (``settings[name]`` its changed keys); every setting reads the
    inputs ``base`` reads, so only the training differs. ``from_stage``: a setting that changes nothing reads
    stage 06's critics (:func:`stage_critics`) instead of fitting them again. ``parts``: a folder that keeps
    each fit critic's Q (:func:`kept_q`), so a rerun after an interruption resumes.
    """
    steps = TrajectoryStore(paths.offline).read().to_pandas()
    cands = read_candidates(paths).to_pandas()
    inputs = {towers: critic_inputs(paths, text=base.text_features, towers=towers, targets=base.tap_targets,
                                    typed=base.typed_match, entries=base.list_entries)
              for towers in {base.but(**changes).towers for changes in settings.values()}}  # fmt: skip
    encoder = TextStart.of(paths) if any(inputs) else None
    right, expert_kinds = expert_matrix(env, collect_seed, steps, cands)
    valid = np.stack(cands.valid_list.to_numpy())
    distinct = distinct_decisions(cands.action_list.tolist())
    kinds = action_kinds(cands.action_list.tolist())
    task_sets = steps.task_set.to_numpy()
    held = heldout_rows(steps.traj_id.to_numpy(), base.holdout, base.seed, task_sets)
    masks = strata(steps, right, expert_kinds, held)
    out: dict[str, Any] = {"states": {name: int(m.sum()) for name, m in masks.items()}, "settings": {}}
    masks = {name: m for name, m in masks.items() if m.any()}  # a stratum without states has no rate
    for name, changes in settings.items():
        cfg = base.but(**changes)
        feats = inputs[cfg.towers]
        per_seed: list[dict[str, Any]] = []
        for s in range(seeds):
            q = np.zeros(valid.shape, np.float32)
            stage = stage_critics(paths, cfg, s, data_task_sets(task_sets)) if from_stage and not changes else {}
            for ts in data_task_sets(task_sets):
                mine = np.flatnonzero(task_sets == ts)
                if ts in stage:
                    q[mine] = critic_q(stage[ts], feats, mine)
                    continue
                fit = partial(fit_critic, cfg, {k: np.asarray(v)[mine] for k, v in feats.items()},
                              steps.iloc[mine].reset_index(drop=True), cfg.seed + s, encoder=encoder)  # fmt: skip
                q[mine] = kept_q(parts, cfg, cfg.seed + s, feats, mine, lambda fit=fit: fit()["critic"])
            per_seed.append({stratum: expert_pick_report(right[m], valid[m], distinct[m], kinds[m], {"critic": q[m]},
                                                         task_sets[m]) for stratum, m in masks.items()})  # fmt: skip
        # Each critic's TD samples over its task set's training transitions: how often it saw each.
        passes = {ts: round(cfg.steps * cfg.batch_size / max(1, int((~held & (task_sets == ts)).sum())), 2)
                  for ts in data_task_sets(task_sets)}  # fmt: skip
        out["settings"][name] = {"changes": dict(changes), "passes": passes, "strata": _mean_over_seeds(per_seed)}
    return out


def _mean_over_seeds(per_seed: Sequence[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per stratum: the critic's hit rate (mean over seeds, and per seed) beside the stratum's uninformed and
    base-sample levels, overall and per task set."""
    out: dict[str, dict[str, Any]] = {}
    for stratum, first in per_seed[0].items():
        entry: dict[str, Any] = {"informative_states": first["informative_states"]}
        for key in (k for k in first if k.startswith("hit_rate")):
            entry[key] = {"uninformed": first[key]["uninformed"], "base_sample": first[key]["base_sample"],
                          "critic": round(float(np.mean([r[stratum][key]["critic"] for r in per_seed])), 4),
                          "critic_per_seed": [r[stratum][key]["critic"] for r in per_seed]}  # fmt: skip
        out[stratum] = entry
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run :data:`SETTINGS` (or ``--settings``) on a pipeline root; print the held-out rates, write JSON."""
    ap = argparse.ArgumentParser(prog="python -m digiq.diagnostics.critic_study", description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=Path("."), help="pipeline root with its critic inputs built")
    ap.add_argument("--out", type=Path, required=True, help="write the results here as JSON")
    ap.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    ap.add_argument("--seeds", type=int, default=3, help="critics per setting and task set")
    ap.add_argument(
        "--stage-critics",
        action="store_true",
        help="the released setting reads stage 06's digiq critics instead of fitting them again",
    )
    args = ap.parse_args(argv)
    paths = Paths(args.root)
    configured = load_settings(paths.root / "params.yaml")
    result = study(paths, configured.critic, {n: SETTINGS[n] for n in args.settings}, args.seeds, configured.env,
                   configured.collect.seed, from_stage=args.stage_critics,
                   parts=args.out.with_name(args.out.name + ".parts"))  # fmt: skip
    atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")
    for name, entry in result["settings"].items():
        rates = entry["strata"]["heldout"].get("hit_rate", {})
        print(
            f"{name:<10} held out: critic {rates.get('critic')}  uninformed {rates.get('uninformed')}  "
            f"passes {entry['passes']}"
        )
    return result


if __name__ == "__main__":
    main()
