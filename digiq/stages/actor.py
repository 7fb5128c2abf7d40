"""The actor stage: policies extracted from the same offline data.

All start from the base policy and are fit by (weighted) negative
log-likelihood; they differ only in which (state, action, weight) rows they
imitate:

- ``digiq``: Best-of-N. For each state, K of the N candidates (always with
  the action taken) are scored by the critic, A = Q(s, a) - V(s); the best
  valid one is kept when A clears a threshold (0.10 General, 0.05 Web Shopping).
- ``filtered_bc``: every step of the trajectories that succeeded.
- ``digirl_offline``: DigiRL's own rule on the same data (:mod:`digiq.algos.digirl`):
  success classifiers V_inst and V_step on the frozen base policy's
  features, the doubly-robust step advantage, the 1/H filter, and the top
  share of episodes by outcome - V_inst.
- named variants (e.g. ``digiq_hierarchy``): Best-of-N with a
  critic beyond the paper's (the critic stage, ``variants`` in params.yaml).
- ablations: Best-of-N over fewer candidates (``digiq_n1``, ``digiq_n4``),
  on the features of the pretrained VLM without the representation fine-tune
  (``digiq_untuned``) and of a VLM fine-tuned without pretraining
  (``digiq_blind``), and on a perfect critic's picks;
  and the paper's extraction ablation (``ablations.extraction``), as released
  Digi-Q runs it: on Digi-Q's critic and exactly the K candidates Best-of-N
  drew at each state, the best valid one is imitated with a weight of its
  advantage clamped to [0, 1], ``digiq_awr`` with exp(A / beta)
  (advantage-weighted regression) and ``digiq_reinforce`` with A itself (a
  policy-gradient step on the base policy's samples).

As released Digi-Q trains them, each task set gets its own policy, fit on
that task set's rows alone (on its own critic's picks, stage 06), by Adam
at a constant learning rate with the gradient's norm clipped, each step on
``actor.batch_size`` stored states drawn uniformly with replacement: the
task set's states for Digi-Q's rows (a state it kept nothing of imitates
nothing), the method's own rows for the baselines. Each policy is trained
once per seed and task set, every one alike, for the same number of
optimizer steps (``actor.updates``) whatever the number of rows it keeps.
The rows every policy imitates, and their weights, are written beside the
actors (:mod:`digiq.data.picks`); the diagnostics stage judges them.

What the stage computes over every stored state is computed once and kept
beside them too (:func:`digiq.data.picks.write_stored`), for the stages
after it to read: each critic's Q and V of every candidate, once per row
and seed however many rows read that critic (:func:`score_job`);
the perfect critic's expert matrix; offline DigiRL's step features, one
task set at a time as off-to-online DigiRL's runs read them
(:func:`step_features_job`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from digiq import parallel
from digiq.algos.digiq import (
    best_of_n_picks,
    drawn_among,
    extraction_picks,
    imitation_rows,
    perfect_critic_picks,
)
from digiq.algos.digirl import (
    StepFeatures,
    digirl_offline_picks,
    step_features,
    store_steps,
    write_offline_step_features,
)
from digiq.algos.filtered_bc import filtered_bc_picks
from digiq.config import (
    TOKEN_CLAMP,
    ActorConfig,
    CollectConfig,
    ComputeConfig,
    CriticConfig,
    DigiRLConfig,
    EnvConfig,
    Settings,
)
from digiq.data.candidates import read_candidates
from digiq.data.picks import EXPERT_MATRIX, Picks, critic_scores_name, write_picks, write_stored
from digiq.data.trajectories import TrajectoryStore, data_task_sets, heldout_rows
from digiq.diagnostics.ground_truth import expert_matrix
from digiq.io import require
from digiq.models.critic import Critic, critic_scores, load_critics, trained_inputs
from digiq.models.policy import AutoUIPolicy
from digiq.models.policy_fit import FitRow, ImitationLoss, fit_policy, load_screens
from digiq.paths import Paths
from digiq.rows import Row, all_rows
from digiq.stages.common import one_run_at_a_time, save_curve_plot, timed, write_metrics, written_whole
from digiq.workers import IN_PROCESS, map_jobs, process_cached

__all__ = [
    "run",
    "run_actor",
    "PICKS",
    "PickInputs",
    "ActorFitJob",
    "fit_actor_job",
    "ScoreJob",
    "score_job",
    "StepFeaturesJob",
    "step_features_job",
    "advantages",
    "drawn_per_task_set",
    "trained_states",
    "fit_inputs",
]

# With compute.processes > 1, every process takes its share of each fit's batches (digiq.parallel).
DATA_PARALLEL = True
# The rows whose fits draw among the task set's states (with actor.draws critic_train, those of the trajectories
# their critics trained on), as released Digi-Q's actor does: Digi-Q's extractions.
DRAW_FROM_STATES = ("best_of_n", "extraction", "perfect_critic")


class ScoreJob(NamedTuple):
    """Q and V of every stored state's candidates by ``row``'s stage-06 critics of seed index ``seed``
    (:func:`score_job`); ``of_set`` is each stored step's task set, whose critic scores it."""

    paths: Paths
    row: str
    seed: int
    of_set: np.ndarray


def score_job(job: ScoreJob) -> dict[str, np.ndarray]:
    """:func:`~digiq.models.critic.critic_scores` of one row's critics of one seed, on the inputs they trained on."""
    data = process_cached(("critic inputs", job.paths.root, job.row),
                          lambda: trained_inputs(job.paths, [job.row])[job.row], slot="critic inputs")  # fmt: skip
    return critic_scores(load_critics(job.paths, job.seed, job.row, data_task_sets(job.of_set)), data, job.of_set)


class StepFeaturesJob(NamedTuple):
    """Offline DigiRL's step features of one task set's stored steps (:func:`step_features_job`)."""

    paths: Paths
    task_set: str


def step_features_job(job: StepFeaturesJob) -> StepFeatures:
    """What offline DigiRL's value functions read: the frozen base policy's features of one task set's stored steps
    (:func:`~digiq.algos.digirl.store_steps`' rows), as off-to-online DigiRL's runs read them."""
    base = AutoUIPolicy.load(job.paths.base_policy)
    store = TrajectoryStore(job.paths.offline)
    steps = store_steps(store, job.task_set)
    return step_features(base, steps, load_screens(base, store, [*steps.image_path, *steps.next_image_path]))


class ActorFitJob(NamedTuple):
    """One policy of stage 07: the base policy fit on a method's ``rows`` of one task set for seed ``seed``
    (``fit_seed`` seeds it), each step drawing among ``draws_from`` states (:func:`fit_policy`)."""

    paths: Paths
    name: str
    seed: int
    task_set: str
    fit_seed: int
    rows: list[FitRow]
    draws_from: int
    cfg: ActorConfig


def fit_actor_job(job: ActorFitJob) -> list[float]:
    """Fit and save one policy (the base itself where the method kept no row); its loss curve."""
    model = AutoUIPolicy.load(job.paths.base_policy)
    curve = []
    if job.rows:
        store = TrajectoryStore(job.paths.offline)
        screens = process_cached(
            ("screens", job.paths.root),  # at the policy's input size, once per process
            lambda: load_screens(model, store, store.read().column("image_path").to_pylist()),
        )
        cfg = job.cfg
        loss = ImitationLoss(per_token=cfg.token_loss == "mean", clamp=TOKEN_CLAMP if cfg.token_clamp else None,
                             dropout=cfg.dropout)  # fmt: skip
        curve = fit_policy(model, job.rows, screens, updates=cfg.updates, batch_size=cfg.batch_size, lr=cfg.lr,
                           seed=job.fit_seed, weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip,
                           one_cycle=False, draws_from=job.draws_from, loss=loss,
                           desc=f"fit {job.name} (seed {job.seed}, {job.task_set})")  # fmt: skip
    if parallel.is_main():
        model.save(job.paths.actor(job.name, job.seed, job.task_set), stage="actor", method=job.name,
                   task_set=job.task_set, seed=job.fit_seed, kept=len(job.rows))  # fmt: skip
    return [p["loss"] for p in curve]


@dataclass
class PickInputs:
    """What the rows of every kind are picked from at one seed: the stored steps, their candidates and task sets,
    what stage 07 computed once for all rows (each critic's scores, offline DigiRL's step features, the perfect
    critic's expert matrix), and the knobs."""

    cfg: ActorConfig
    digirl: DigiRLConfig
    steps: pd.DataFrame
    valid: np.ndarray  # (S, N): the candidates that parse
    of_set: np.ndarray  # each stored step's task set
    task_sets: list[str]
    scored: dict[tuple[str, int], dict[str, np.ndarray]]  # (critic row, seed index): Q and V of every candidate
    digirl_feats: dict[str, StepFeatures]  # per task set
    right: np.ndarray | None  # the expert matrix, where a perfect-critic row asks for it
    index: int  # the seed's index, from 0
    seed: int  # actor.seed + index
    # drawn()'s matrices, one per (critic, K)
    _drawn: dict[tuple[str, int], np.ndarray] = field(default_factory=dict, init=False, repr=False)

    def drawn(self, critic: str, k: int) -> np.ndarray:
        """(S, N): A = Q - V by ``critic``'s critics at the K candidates drawn per state (:func:`drawn_per_task_set`),
        -inf elsewhere; one draw per (critic, K) and seed, so that the extractions see the candidates Best-of-N
        drew."""
        if (critic, k) not in self._drawn:
            self._drawn[critic, k] = drawn_per_task_set(self.scored[(critic, self.index)], self.valid, self.of_set,
                                                        self.task_sets, k, np.random.default_rng(self.seed))  # fmt: skip
        return self._drawn[critic, k]


def best_of_n_row(row: Row, at: PickInputs) -> tuple[Picks, dict[str, Any]]:
    """Digi-Q's Best-of-N on ``row``'s critic over its K candidates (:func:`~digiq.algos.digiq.best_of_n_picks`)."""
    k = at.cfg.k_candidates if row.candidates is None else row.candidates
    return best_of_n_picks(at.cfg, at.drawn(row.critic, k), at.steps)


def extraction_row(row: Row, at: PickInputs) -> tuple[Picks, dict[str, Any]]:
    """The paper's extraction ablation on the very candidates Best-of-N drew with ``row``'s critic
    (:func:`~digiq.algos.digiq.extraction_picks`)."""
    return extraction_picks(at.cfg, row.extraction, at.drawn(row.critic, at.cfg.k_candidates))


def perfect_critic_row(row: Row, at: PickInputs) -> tuple[Picks, dict[str, Any]]:
    """Best-of-N on a perfect critic: the expert's candidates (:func:`~digiq.algos.digiq.perfect_critic_picks`)."""
    return perfect_critic_picks(at.right), {}


def filtered_bc_row(row: Row, at: PickInputs) -> tuple[Picks, dict[str, Any]]:
    """Every step of the episodes that succeeded (:func:`~digiq.algos.filtered_bc.filtered_bc_picks`)."""
    return filtered_bc_picks(at.steps), {}


def digirl_offline_row(row: Row, at: PickInputs) -> tuple[Picks, dict[str, Any]]:
    """DigiRL's rule on the stored steps, its value functions fit per task set
    (:func:`~digiq.algos.digirl.digirl_offline_picks`); its statistics by task set."""
    states, stats = [], {}
    for ts in at.task_sets:
        mine = np.flatnonzero(at.of_set == ts)  # the rows of store_steps(ts), in its order
        picked, stats[ts] = digirl_offline_picks(at.digirl, at.digirl_feats[ts],
                                                 at.steps.iloc[mine].reset_index(drop=True), at.seed)  # fmt: skip
        states.append(mine[picked.states])
    return Picks.taken(np.sort(np.concatenate(states))), stats


#: Each kind of offline row (:data:`digiq.rows.Kind`) and what picks its rows at one seed: a new kind is its
#: function and one line here.
PICKS: dict[str, Callable[[Row, PickInputs], tuple[Picks, dict[str, Any]]]] = {
    "best_of_n": best_of_n_row,
    "extraction": extraction_row,
    "perfect_critic": perfect_critic_row,
    "filtered_bc": filtered_bc_row,
    "digirl_offline": digirl_offline_row,
}


@one_run_at_a_time("actor")
def run_actor(cfg: ActorConfig, paths: Paths, *, seeds: int, table: Sequence[Row], env: EnvConfig,
              collect: CollectConfig, digirl: DigiRLConfig | None = None, compute: ComputeConfig = IN_PROCESS,
              split: CriticConfig | None = None) -> dict[str, Any]:  # fmt: skip
    """Train the policy of every offline row of ``table`` (:func:`digiq.rows.all_rows`: the paper's comparison,
    the named variants, the ablations) for every seed: each row's picks by its kind (:data:`PICKS`), then its fits.

    The fits, all with the same number of updates, are shared as ``compute`` says (:mod:`digiq.workers`).
    ``digirl`` sets offline DigiRL's rule (default: the paper's values). With ``actor.draws`` "critic_train",
    Digi-Q's rows imitate and draw among only the states of the trajectories the critics trained on, held out
    as ``split`` (the critic's ``holdout`` and ``seed``; default: the paper's critic) says.

    Writes ``metrics/actor.json`` and every policy's picks (:attr:`Paths.picks`).
    """
    digirl = digirl or DigiRLConfig()
    offline = [r for r in table if r.group != "online"]
    if unknown := sorted({r.kind for r in offline} - set(PICKS)):
        raise ValueError(f"no picks function for row kind(s) {unknown}; known: {list(PICKS)}")
    critic_rows = sorted({r.critic for r in offline if r.critic})  # the stage-06 critics the rows read
    require("actor", paths.base_policy / "config.json",
            *(paths.critics / f"seed{s}" / row for s in range(seeds) for row in critic_rows))  # fmt: skip
    metrics: dict[str, Any] = {}
    parts: dict[str, float] = {}
    # Inside the block, paths.actors is a temporary folder, swapped in whole at its end.
    with written_whole(paths, "actors") as paths, timed(metrics):
        steps = TrajectoryStore(paths.offline).read().to_pandas()
        of_set = steps.task_set.to_numpy()
        task_sets = data_task_sets(of_set)
        cands = read_candidates(paths).to_pandas()
        valid = np.stack(cands.valid_list.to_numpy())
        # Each critic's scores of every state, once per row and seed: the rows reading one critic share them.
        with timed(parts, "scores"):
            score_jobs = [ScoreJob(paths, row, s, of_set) for row in critic_rows for s in range(seeds)]
            scored = {(job.row, job.seed): q_and_v
                      for job, q_and_v in zip(score_jobs, map_jobs(score_job, score_jobs, compute), strict=True)}  # fmt: skip
        with timed(parts, "digirl_features"):
            digirl_jobs = [StepFeaturesJob(paths, ts) for ts in task_sets]
            digirl_feats = dict(zip(task_sets, map_jobs(step_features_job, digirl_jobs, compute), strict=True))
        right = None
        if any(r.kind == "perfect_critic" for r in offline):
            with timed(parts, "expert_matrix"):
                right, expert_kinds = expert_matrix(env, collect.seed, steps, cands)
            metrics["perfect_critic"] = {"states_with_expert_candidate": round(float(right.any(1).mean()), 4),
                                         "taken_action_is_expert": round(float(right[:, 0].mean()), 4)}  # fmt: skip
        if parallel.is_main():  # for the stages after this one, which would compute them again
            for (row, s), q_and_v in scored.items():
                write_stored(paths, critic_scores_name(row, s), steps, q_and_v)
            write_offline_step_features(paths, steps, digirl_feats)
            if right is not None:
                write_stored(paths, EXPERT_MATRIX, steps, {"right": right, "kinds": expert_kinds})
        trained = trained_states(cfg, split or CriticConfig(), steps)
        every: dict[tuple[str, int], Picks] = {}
        stats: dict[str, list[dict[str, Any]]] = {r.name: [] for r in offline}  # per row, per seed
        passes: dict[str, dict[str, list[float]]] = {}  # each fit's expected passes over its rows, per task set
        fits: list[ActorFitJob] = []  # every (row, seed, task set) fit, run once all seeds' rows are picked
        for s in range(seeds):
            at = PickInputs(cfg, digirl, steps, valid, of_set, task_sets, scored, digirl_feats, right, s, cfg.seed + s)
            for row in offline:
                every[(row.name, s)], stat = PICKS[row.kind](row, at)
                stats[row.name].append(stat)
                for ts in task_sets:
                    rows, pool = fit_inputs(steps, cands, every[(row.name, s)], row.kind, ts, trained)
                    if rows:
                        passes.setdefault(row.name, {}).setdefault(ts, []).append(cfg.updates * cfg.batch_size / pool)
                    fits.append(ActorFitJob(paths, row.name, s, ts, at.seed, rows, pool, cfg))
        with timed(parts, "fits"):
            losses = map_jobs(fit_actor_job, fits, compute)
        curves = {f"{job.name} ({job.task_set})": curve for job, curve in zip(fits, losses, strict=True)
                  if job.seed == 0 and curve}  # fmt: skip
        if parallel.is_main():
            write_picks(paths, every)
    kept = {r.name: [len(every[(r.name, s)].states) for s in range(seeds)] for r in offline}
    metrics["states"] = len(steps)
    metrics["part_time_s"] = parts
    metrics["kept_rows"] = {name: round(float(np.mean(v)), 1) for name, v in kept.items()}
    # Row visits (updates x batch, the draws landing on the rows) over the rows: how often each fit saw each row.
    metrics["passes"] = {name: {ts: round(float(np.mean(v)), 2) for ts, v in by_ts.items()}
                         for name, by_ts in passes.items()}  # fmt: skip
    metrics["kept_fraction"] = {r.name: round(float(np.mean([len(np.unique(every[(r.name, s)].states))
                                                             for s in range(seeds)])) / max(1, len(steps)), 4)
                                for r in offline}  # fmt: skip
    metrics |= _picks_metrics(offline, stats, kept)
    if parallel.is_main():
        # Always drawn (a declared output); empty when no method kept a row, e.g. a tiny base policy whose
        # candidates are all invalid.
        save_curve_plot(paths.plots / "actor_loss.png", curves,
                        "Stage 07: actor NLL (seed 0)" + ("" if curves else ": no rows kept"))  # fmt: skip
        write_metrics(paths, "actor", metrics)
    parallel.barrier()
    return metrics


def _picks_metrics(offline: Sequence[Row], stats: dict[str, list[dict[str, Any]]], kept: dict[str, list[int]]
                   ) -> dict[str, Any]:  # fmt: skip
    """What the picks functions said of their rows, per seed, as the stage's metrics: Best-of-N's share of kept
    rows whose candidate the data did not take and its kept share per task set; the extraction ablation's rows and
    weights, means over seeds (no key where it kept no row); offline DigiRL's value losses, mean advantage and what
    its filter kept, per task set and seed."""
    of_kind = {kind: [r.name for r in offline if r.kind == kind] for kind in PICKS}
    best_of_n = {name: [dict(stat) for stat in stats[name]] for name in of_kind["best_of_n"]}
    return {
        "best_of_n_kept_not_taken_fraction": {name: round(float(np.mean([stat.pop("kept_not_taken_fraction")
                                                                         for stat in per_seed])), 4)
                                              for name, per_seed in best_of_n.items()},
        "best_of_n_kept_fraction_per_seed": {name: [{k: round(v, 4) for k, v in stat.items()} for stat in per_seed]
                                             for name, per_seed in best_of_n.items()},
        "extraction": {name: {"rows": round(float(np.mean(kept[name])), 1),
                              **{k: round(float(np.mean([p[k] for p in stats[name] if k in p])), 4)
                                 for k in dict.fromkeys(k for p in stats[name] for k in p)}}
                       for name in of_kind["extraction"]},
        "digirl_offline_per_seed": {ts: [stat[ts] for name in of_kind["digirl_offline"] for stat in stats[name]]
                                    for ts in dict.fromkeys(ts for name in of_kind["digirl_offline"]
                                                            for stat in stats[name] for ts in stat)},
    }  # fmt: skip


def advantages(critics: dict[str, Critic], data: dict[str, np.ndarray], valid: np.ndarray, of_set: np.ndarray,
                k: int, rng: np.random.Generator) -> np.ndarray:  # fmt: skip
    """(S, N): :func:`~digiq.algos.digiq.drawn_advantages` of every stored state, each scored by its own task set's
    critic."""
    return drawn_per_task_set(critic_scores(critics, data, of_set), valid, of_set, list(critics), k, rng)


def drawn_per_task_set(scores: dict[str, np.ndarray], valid: np.ndarray, of_set: np.ndarray,
                       task_sets: Sequence[str], k: int, rng: np.random.Generator) -> np.ndarray:  # fmt: skip
    """(S, N): A = Q - V of ``scores`` (:func:`~digiq.models.critic.critic_scores`) at the K candidates drawn per
    state (:func:`~digiq.algos.digiq.drawn_among`), -inf elsewhere; the states drawn for one task set after the
    other, in the order of ``task_sets``, as they were when each task set's critic was asked in turn."""
    adv = scores["q"] - scores["v"][:, None]
    out = np.full_like(adv, -np.inf)
    for ts in task_sets:
        rows = np.flatnonzero(of_set == ts)
        out[rows] = drawn_among(adv[rows], valid[rows], k, rng)
    return out


def trained_states(cfg: ActorConfig, split: CriticConfig, steps: pd.DataFrame) -> np.ndarray | None:
    """(S,) bool: the stored steps of the trajectories the critics trained on (held out as ``split``'s ``holdout``
    and ``seed`` say, within each task set), where Digi-Q's rows imitate with ``actor.draws`` critic_train, as
    released; None with ``all``."""
    if cfg.draws != "critic_train":
        return None
    return ~heldout_rows(steps.traj_id.to_numpy(), split.holdout, split.seed, steps.task_set.to_numpy())


def fit_inputs(steps: pd.DataFrame, cands: pd.DataFrame, picks: Picks, kind: str, task_set: str,
               trained: np.ndarray | None) -> tuple[list[FitRow], int]:  # fmt: skip
    """One fit's rows, ``picks``' at ``task_set``'s states, and the states its batches draw among.

    Digi-Q's rows (kinds of :data:`DRAW_FROM_STATES`) draw among the task set's states, as released, only those
    ``trained`` marks (:func:`trained_states`) where given; the baselines among their own rows.
    """
    mine = steps.task_set.to_numpy() == task_set
    if trained is not None and kind in DRAW_FROM_STATES:
        mine = mine & trained
    there = mine[picks.states]
    rows = imitation_rows(steps, cands, Picks(picks.states[there], picks.columns[there],
                                              None if picks.weights is None else picks.weights[there]))  # fmt: skip
    return rows, int(mine.sum()) if kind in DRAW_FROM_STATES else len(rows)


def run(settings: Settings, paths: Paths) -> dict[str, Any]:
    """Stage 07 as ``params.yaml`` sets it (:func:`digiq.stages.launch.run_stage` runs it in one process or several)."""
    actor, ablations = settings.actor, settings.ablations
    if settings.devices.backend == "emulator" and ablations.perfect_critic:
        raise ValueError("ablations.perfect_critic must be false with devices.backend emulator: the perfect critic "
                         "replays the collected episodes in the simulator, and these happened on real devices")  # fmt: skip
    split = settings.critic
    if moved := sorted(n for n, v in settings.variants.items() if (v.holdout, v.seed) != (split.holdout, split.seed)):
        raise ValueError(f"variants {moved} change critic.holdout or critic.seed: every Digi-Q row's actor draws "
                         "among the trajectories the critic group's split trains on, so a variant keeps that split")  # fmt: skip
    return run_actor(actor, paths, seeds=settings.experiment.seeds,
                     table=all_rows(ablations, list(settings.variants)), env=settings.env,
                     collect=settings.collect,
                     digirl=settings.digirl,
                     compute=settings.compute, split=split)  # fmt: skip
