"""Stage 06: policies extracted from the same offline data, and the oracle diagnostic.

All start from the base policy and are fit by (filtered) negative
log-likelihood; they differ only in which (state, action) rows they imitate:

- ``digiq``: Best-of-N. For each state, K of the N candidates (always with
  the action taken) are scored by the critic, A = Q(s, a) - V(s); the best
  valid one is kept when A clears a threshold (0.10 General, 0.05 Web Shopping).
- ``filtered_bc``: every step of the trajectories that succeeded.
- ``digirl_offline``: the steps whose action beat a learned value baseline,
  MC return - V(s) > threshold (DigiRL's binary advantage filter, offline).
- named variants (``digiq_cql``, ``digiq_hierarchy``): Best-of-N with a
  critic beyond the paper's (stage 05, ``variants`` in params.yaml).
- ablations: Best-of-N over fewer candidates (``digiq_n1``, ``digiq_n4``),
  on the features of the VLM without the stage-03 fine-tune
  (``digiq_untuned``), and on a perfect critic's picks.

Each is trained once per seed, every seed alike, for the same number of
optimizer steps (``actor.updates``) whatever the number of rows it keeps. The oracle diagnostic (:mod:`digiq.oracle`)
checks the critic's ranking of candidates against their true values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from digiq import parallel
from digiq.config import (
    PERFECT_CRITIC_ROW,
    UNTUNED_ROW,
    AblationsConfig,
    ActorConfig,
    CollectConfig,
    ComputeConfig,
    DeviceConfig,
    EnvConfig,
    ExperimentConfig,
    load_section,
    load_variants,
)
from digiq.data.candidates import read_candidates
from digiq.data.features import load_features
from digiq.data.trajectories import TrajectoryStore, split_trajectories
from digiq.env.actions import parse_action
from digiq.env.catalog import stable_int
from digiq.env.tasks import parse_task
from digiq.io import require
from digiq.models.checkpoint import read_meta
from digiq.models.critic import Critic, CriticNetConfig, mlp
from digiq.models.critic_inputs import inputs_for
from digiq.models.policy import AutoUIPolicy
from digiq.models.policy_fit import FitRow, ModelPolicy, fit_policy, load_screens
from digiq.models.vlm import REPRESENTATION_PARTS
from digiq.oracle import (
    action_kinds,
    behaviour_report,
    behaviour_values,
    candidate_values,
    expert_equivalent,
    expert_kind,
    expert_pick_report,
    expert_probe,
    feature_probe,
    group_masks,
    ranking_report,
    replay,
    support_report,
    within_state_share,
    wrong_pick_report,
)
from digiq.paths import Paths
from digiq.rollout import episode_seed
from digiq.stages.common import save_curve_plot, timed, write_metrics
from digiq.workers import map_jobs, process_cached

__all__ = [
    "from_params",
    "run_actor",
    "ActorFitJob",
    "fit_actor_job",
    "best_of_n",
    "policy_names",
    "METHODS",
    "Picks",
    "expert_share",
    "keep_by_group",
]

METHODS = ("digiq", "filtered_bc", "digirl_offline")


def best_of_n_plan(ablations: AblationsConfig, variants: Sequence[str] = ()) -> dict[str, tuple[str, int | None]]:
    """Every Best-of-N policy stage 06 trains: name -> (whose critic, candidates per state).

    The critic is named by its row (stage 05, :func:`digiq.stages.critic.critic_specs`); ``None``
    candidates means ``actor.k_candidates`` (Digi-Q's own setting).
    """
    out: dict[str, tuple[str, int | None]] = {"digiq": ("digiq", None)}
    out.update({name: (name, None) for name in variants})
    out.update({f"digiq_n{n}": ("digiq", n) for n in ablations.n_candidates})
    if ablations.untuned_vlm:
        out[UNTUNED_ROW] = (UNTUNED_ROW, None)
    return out


def policy_names(ablations: AblationsConfig, variants: Sequence[str] = ()) -> tuple[list[str], list[str], list[str]]:
    """The policies stage 06 trains and stage 07 evaluates: the paper's comparison, the named variants, the ablations."""
    extra = [n for n in best_of_n_plan(ablations) if n != "digiq"]
    return list(METHODS), list(variants), extra + ([PERFECT_CRITIC_ROW] if ablations.perfect_critic else [])


def best_of_n(critic: Critic, state: np.ndarray, candidates: np.ndarray, valid: np.ndarray, k: int,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Per state: the index of the best valid candidate among K drawn (0 always in), and its advantage."""
    S, N = valid.shape
    drawn = np.zeros((S, N), bool)
    drawn[:, 0] = True
    for i in range(S):
        drawn[i, 1 + rng.permutation(N - 1)[: max(0, min(k, N) - 1)]] = True
    _, _, adv = critic.advantage(torch.from_numpy(np.asarray(state)), torch.from_numpy(np.asarray(candidates)))
    adv = adv.numpy()
    adv[~(drawn & valid)] = -np.inf
    best = adv.argmax(1)
    return best, adv[np.arange(S), best]


class Picks(NamedTuple):
    """Which rows a policy imitates: stored states and, per state, the column of the candidate to imitate.

    Column 0 is the action the data took there (stage 02 stores it first).
    Every method's rows are picks, so the expert-share diagnostic judges
    them all alike.
    """

    states: np.ndarray
    columns: np.ndarray

    @classmethod
    def taken(cls, states: np.ndarray) -> "Picks":
        """The data's own action at ``states``."""
        return cls(states, np.zeros(len(states), int))


def _rows(steps: pd.DataFrame, cands: pd.DataFrame, picks: Picks) -> list[FitRow]:
    """Imitation rows: each picked state with its picked candidate."""
    return [FitRow(steps.observation.iat[i], steps.image_path.iat[i], cands.action_list.iat[i][c])
            for i, c in zip(picks.states, picks.columns, strict=True)]  # fmt: skip


def _best_of_n_picks(cfg: ActorConfig, critic: Critic, feats: dict[str, np.ndarray], steps: pd.DataFrame,
                     valid: np.ndarray, k: int, seed: int) -> tuple[Picks, dict[str, float]]:  # fmt: skip
    best, adv = best_of_n(critic, feats["state"], feats["candidates"], valid, k, np.random.default_rng(seed))
    task_sets = steps.task_set.to_numpy()
    kept = adv > cfg.thresholds(task_sets)
    keep = np.flatnonzero(kept)
    stats = {"kept_not_taken_fraction": float(np.mean(best[keep] != 0)) if len(keep) else 0.0,
             **{f"kept_fraction_{ts}": float(kept[task_sets == ts].mean()) for ts in np.unique(task_sets)}}  # fmt: skip
    return Picks(keep, best[keep]), stats


def expert_share(right: np.ndarray, picks: Picks, task_sets: np.ndarray) -> dict[str, float | None]:
    """Per task set, the share of a policy's rows whose action does what the simulator's expert would there.

    ``right`` is :func:`_expert_matrix`. It says what the keep rule feeds
    the actor, apart from how well the actor learns it: Filtered BC's rows
    were the expert's twice as often as Best-of-N's on General (README,
    results). ``None`` where the policy keeps no row of a task set.
    """
    hit = right[picks.states, picks.columns]
    sets = task_sets[picks.states]
    return {ts: round(float(hit[sets == ts].mean()), 4) if np.any(sets == ts) else None
            for ts in np.unique(task_sets)}  # fmt: skip


def _expert_matrix(env: EnvConfig, collect_seed: int, steps: pd.DataFrame,
                   cands: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(S, N): which candidates of each stored state do what the simulator's expert would there; (S,): its kind of action.

    Each collected episode is replayed once, and every state's candidates are
    checked on copies of it (:func:`~digiq.oracle.expert_equivalent`). It
    feeds the perfect critic's rows and the expert-pick and support diagnostics.
    """
    right = np.zeros((len(steps), len(cands.action_list.iat[0])), bool)
    kinds = np.empty(len(steps), object)
    for _, traj in steps.groupby("traj_id", sort=True):
        traj = traj.sort_values("step_id")
        task = parse_task(traj.task.iat[0], traj.task_set.iat[0])
        device = replay(task, episode_seed(collect_seed, int(traj.traj_id.iat[0])), [], env.dynamics(), env.width)
        for i, action in zip(traj.index, traj.action, strict=True):
            right[i] = expert_equivalent(device, task, list(cands.action_list.iat[i]))
            kinds[i] = expert_kind(device, task)
            device.step(parse_action(action))
    return right, kinds.astype(str)


def keep_by_group(kept: np.ndarray, kept_right: np.ndarray, seeds: int, task_sets: np.ndarray,
                  groups: np.ndarray) -> dict[str, dict[str, dict[str, float | None]]]:  # fmt: skip
    """Per task set and group: the share of its states a policy keeps a row at, and the share of those rows that are the expert's.

    ``kept`` and ``kept_right`` (S,) count, over ``seeds`` fits, the seeds
    that kept a row at each state and those whose row did what the expert
    would. Grouped by the expert's kind of action it shows where the critic
    sends the actor wrong, e.g. rows kept at states that need Back whose
    action is not Back (README, results).
    """
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for ts, group, mask in group_masks(task_sets, groups):
        rows = int(kept[mask].sum())
        out.setdefault(ts, {})[group] = {"kept": round(rows / (int(mask.sum()) * seeds), 4),
                                         "expert": round(int(kept_right[mask].sum()) / rows, 4) if rows else None}  # fmt: skip
    return out


def _perfect_critic_picks(right: np.ndarray) -> Picks:
    """Best-of-N with a perfect critic: at each stored state, the first candidate that does what the expert would.

    ``right`` is :func:`_expert_matrix`. States where no candidate does are
    left out, as a critic could not pick what was never sampled. Trained like
    Digi-Q's actor, this policy bounds what any critic could give Digi-Q on
    these data: a target it misses is out of reach of the actor, not of the
    critic.
    """
    states = np.flatnonzero(right.any(1))
    return Picks(states, right[states].argmax(1))


def _filtered_bc_picks(steps: pd.DataFrame) -> Picks:
    return Picks.taken(np.flatnonzero(steps.trajectory_reward.to_numpy() > 0))


def _digirl_picks(cfg: ActorConfig, state: np.ndarray, steps: pd.DataFrame, seed: int) -> Picks:
    """Steps whose Monte-Carlo return beats V(s) by the threshold.

    V is regressed on MC returns with 2-fold cross-fitting by trajectory: a
    value fit on the very trajectories it judges would memorise their returns
    and leave every advantage near zero.
    """
    torch.manual_seed(seed)
    x = torch.from_numpy(np.asarray(state))
    y = torch.tensor(steps.mc_return.to_numpy(), dtype=torch.float32)
    fold = steps.traj_id.isin(split_trajectories(steps.traj_id.tolist(), 0.5, seed)).to_numpy()
    v = np.zeros(len(steps), np.float32)
    for held in (fold, ~fold):
        train = np.flatnonzero(~held)
        net = mlp(x.shape[1], 256)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
        gen = np.random.default_rng(seed)
        for _ in range(cfg.digirl_value_epochs):
            for _b in range(0, len(train), 256):
                idx = torch.from_numpy(train[gen.integers(0, len(train), 256)])
                loss = F.mse_loss(net(x[idx])[:, 0], y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
        with torch.no_grad():
            v[held] = net(x[torch.from_numpy(np.flatnonzero(held))])[:, 0].numpy()
    return Picks.taken(np.flatnonzero(steps.mc_return.to_numpy() - v > cfg.digirl_threshold))


# States per oracle job. Fixed, not derived from the number of workers, so the
# diagnostic's random streams (one per chunk) and its values do not depend on it.
ORACLE_CHUNK = 25


class OracleState(NamedTuple):
    """One sampled state of the oracle diagnostic, as its job needs it: enough to replay and score it."""

    task: str
    task_set: str
    episode_seed: int  # the collecting episode's device seed
    earlier: list[str]  # the episode's actions before this state
    candidates: list[str]
    observation: str  # the prompt the base saw here
    image_path: str
    branch_seed: int  # the oracle rollouts' seed for this state


class OracleJob(NamedTuple):
    """Oracle values, base log-likelihoods and behaviour values of one chunk of sampled states (:func:`oracle_job`)."""

    paths: Paths
    chunk: int
    states: list[OracleState]
    cfg: ActorConfig
    env: EnvConfig
    temperature: float  # the base's sampling temperature when it collected the data
    gamma: float


def oracle_job(job: OracleJob) -> dict[str, np.ndarray]:
    """``{"oracle", "loglik"[, "behaviour"]}``, each (states, candidates), for one chunk of states."""
    cfg = job.cfg
    base = process_cached(("base policy", job.paths.root), lambda: AutoUIPolicy.load(job.paths.base_policy))
    store = TrajectoryStore(job.paths.offline)
    n = len(job.states[0].candidates)
    out = {"oracle": np.zeros((len(job.states), n)), "loglik": np.zeros((len(job.states), n))}
    starts = []
    for j, st in enumerate(job.states):
        task = parse_task(st.task, st.task_set)
        device = replay(task, st.episode_seed, st.earlier, job.env.dynamics(), job.env.width)
        out["oracle"][j] = candidate_values(device, task, task.max_steps - len(st.earlier), st.candidates,
                                            rollouts=cfg.oracle_rollouts, noise=cfg.oracle_noise, gamma=job.gamma,
                                            seed=st.branch_seed)  # fmt: skip
        if cfg.oracle_behaviour_rollouts:  # the same replayed state: candidate_values branches off copies of it
            starts.append((device, task, st.earlier, st.candidates))
        shot = base.screen.prepare(store.load_image(st.image_path)[None])
        shot = shot.expand(len(st.candidates), *shot.shape[1:])
        with torch.no_grad():
            out["loglik"][j] = base.action_logprobs([st.observation] * len(st.candidates), shot,
                                                    st.candidates).numpy()  # fmt: skip
    if starts:
        # The base continues as it collected the data, on this chunk's own random stream; run in the
        # notebook's process, it must not shift the draws that follow.
        seed = stable_int("behaviour values", cfg.seed, job.chunk)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            out["behaviour"] = np.stack(behaviour_values(
                starts, ModelPolicy(base, temperature=job.temperature), rollouts=cfg.oracle_behaviour_rollouts,
                gamma=job.gamma, seed=seed, screen_text=base.cfg.screen_text))  # fmt: skip
    return out


def _oracle_sample(cfg: ActorConfig, env: EnvConfig, collect: CollectConfig, gamma: float, steps: pd.DataFrame,
                   cands: pd.DataFrame, paths: Paths, workers: int) -> dict[str, Any]:  # fmt: skip
    """Oracle values, the base policy's log-likelihoods and (``oracle_behaviour_rollouts``) its values of the candidates of sampled states.

    The states are shared among ``workers`` processes in chunks of :data:`ORACLE_CHUNK`.
    """
    rng = np.random.default_rng(cfg.seed)
    idx = np.sort(rng.choice(len(steps), min(cfg.oracle_states, len(steps)), replace=False))
    states = []
    for i in idx:
        r = steps.iloc[i]
        earlier = steps.action[(steps.traj_id == r.traj_id) & (steps.step_id < r.step_id)].tolist()
        states.append(OracleState(r.task, r.task_set, episode_seed(collect.seed, int(r.traj_id)), earlier,
                                  list(cands.action_list.iat[i]), r.observation, r.image_path,
                                  stable_int("oracle state", cfg.seed, int(i))))  # fmt: skip
    jobs = [OracleJob(paths, c, states[start : start + ORACLE_CHUNK], cfg, env, collect.temperature, gamma)
            for c, start in enumerate(range(0, len(states), ORACLE_CHUNK))]  # fmt: skip
    parts = map_jobs(oracle_job, jobs, workers)
    sample = {"idx": idx, "valid": np.stack(cands.valid_list.to_numpy()[idx])}
    sample.update({key: np.concatenate([p[key] for p in parts]) for key in parts[0]})
    return sample


class ActorFitJob(NamedTuple):
    """One policy of stage 06: the base policy fit on a method's ``rows`` for seed ``seed`` (``fit_seed`` seeds it)."""

    paths: Paths
    name: str
    seed: int
    fit_seed: int
    rows: list[FitRow]
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
        curve = fit_policy(model, job.rows, screens, updates=job.cfg.updates,
                           batch_size=job.cfg.batch_size, lr=job.cfg.lr, seed=job.fit_seed,
                           desc=f"fit {job.name} (seed {job.seed})")  # fmt: skip
    if parallel.is_main():
        model.save(job.paths.actor(job.name, job.seed), stage="actor", method=job.name, seed=job.fit_seed,
                   kept=len(job.rows))  # fmt: skip
    return [p["loss"] for p in curve]


def run_actor(cfg: ActorConfig, paths: Paths, *, seeds: int, ablations: AblationsConfig, env: EnvConfig,
              collect: CollectConfig, variants: Sequence[str] = (), workers: int = 1) -> dict[str, Any]:  # fmt: skip
    """Train every policy (the paper's comparison, the named ``variants``, the ablations) for every seed.

    The fits, all with the same number of updates, are shared among ``workers`` processes (:mod:`digiq.workers`).

    Writes ``metrics/actor.json`` and ``metrics/oracle.json``.
    """
    plan = best_of_n_plan(ablations, variants)
    critic_rows = sorted({row for row, _ in plan.values()})  # the stage-05 critics the Best-of-N policies use
    require("actor", paths.base_policy / "config.json",
            *(paths.critic(s, row) / "config.json" for s in range(seeds) for row in critic_rows))  # fmt: skip
    main, named, extra = policy_names(ablations, variants)
    metrics: dict[str, Any] = {}
    oracle_metrics: dict[str, Any] = {}
    parts: dict[str, float] = {}
    with timed(metrics):
        store = TrajectoryStore(paths.offline)
        steps = store.read().to_pandas()
        cands = read_candidates(paths).to_pandas()
        # What each row's critics were trained on (in each critic's config), built once per distinct input set.
        built: dict[tuple[str, CriticNetConfig], dict[str, np.ndarray]] = {}
        feats: dict[str, dict[str, np.ndarray]] = {}
        for row in critic_rows:
            key = (str(read_meta(paths.critic(0, row)).get("vlm", "finetuned")), Critic.load(paths.critic(0, row)).cfg)
            if key not in built:
                built[key] = inputs_for(paths, *key)
            feats[row] = built[key]
        # The paper's critic inputs on each VLM's features: what the probes read.
        by_vlm = {"finetuned": feats["digiq"], **({"untuned": feats[UNTUNED_ROW]} if UNTUNED_ROW in feats else {})}
        gamma = float(read_meta(paths.critic(0))["gamma"])  # true values discounted as the critic's
        # The oracle diagnostic only feeds metrics: the main process computes it, sharing it among its workers.
        oracle_on = cfg.oracle_states > 0 and parallel.is_main()
        with timed(parts, "oracle_values"):
            sample = _oracle_sample(cfg, env, collect, gamma, steps, cands, paths, workers) if oracle_on else None
        probes: dict[str, np.ndarray] = {}
        if sample is not None:  # what the critic's inputs allow, whatever the critic: once per VLM, not per seed
            for vlm, f in by_vlm.items():
                s_f, c_f = f["state"][sample["idx"]], f["candidates"][sample["idx"]]
                probes[f"feature_probe_{vlm}"] = feature_probe(
                    s_f, c_f, sample["oracle"], sample["valid"], seed=cfg.seed
                )
                oracle_metrics.setdefault("candidate_variance_within_state", {})[vlm] = within_state_share(
                    load_features(paths, vlm)["candidates"][sample["idx"]], REPRESENTATION_PARTS
                )
        behaviour: dict[str, np.ndarray] = {}
        # A perfect Digi-Q critic ranks by the behaviour values; its ties (mostly all 0) are broken at random.
        if sample is not None and "behaviour" in sample:
            noise = np.random.default_rng(cfg.seed).uniform(0, 1e-9, sample["behaviour"].shape)
            behaviour["behaviour_value"] = sample["behaviour"] + noise
            oracle_metrics["behaviour_values"] = {
                "rollouts": cfg.oracle_behaviour_rollouts, "temperature": collect.temperature,
                **behaviour_report(sample["oracle"], sample["behaviour"], sample["valid"], cfg.oracle_tolerance,
                                   steps.task_set.to_numpy()[sample["idx"]])}  # fmt: skip
        right = kinds = None
        valid, episodes = np.stack(cands.valid_list.to_numpy()), steps.traj_id.to_numpy()
        if ablations.perfect_critic or oracle_on:
            with timed(parts, "expert_matrix"):
                right, kinds = _expert_matrix(env, collect.seed, steps, cands)
            metrics["expert_support"] = support_report(right, steps.task_set.to_numpy(), steps.family.to_numpy())
            metrics["expert_support_by_kind"] = support_report(right, steps.task_set.to_numpy(), kinds)
        # What the critic's inputs allow with a label on every candidate (the critic has none): once per VLM.
        expert_probes = {f"probe_{vlm}": expert_probe(f["state"], f["candidates"], right, valid, episodes,
                                                      seed=cfg.seed)
                         for vlm, f in by_vlm.items()} if oracle_on else {}  # fmt: skip
        digiq_kept, digiq_right = np.zeros(len(steps), int), np.zeros(len(steps), int)  # Digi-Q's rows, over seeds
        if ablations.perfect_critic:
            perfect = _perfect_critic_picks(right)
            metrics["perfect_critic"] = {"states_with_expert_candidate": round(len(perfect.states) / len(steps), 4),
                                         "taken_action_is_expert": round(float(right[:, 0].mean()), 4)}  # fmt: skip
        kept: dict[str, list[int]] = {name: [] for name in main + named + extra}
        not_taken: dict[str, list[float]] = {}
        by_set: dict[str, list[dict[str, float]]] = {}  # Best-of-N's kept share per task set, per seed
        expert: dict[str, list[dict[str, float | None]]] = {}  # the rows' share of expert actions, per seed
        task_sets = steps.task_set.to_numpy()
        curves: dict[str, list[float]] = {}
        reports, expert_reports, critic_q = [], [], []
        fits: list[ActorFitJob] = []  # every (method, seed) fit, run once all seeds' rows are picked
        for s in range(seeds):
            seed = cfg.seed + s
            critics = {row: Critic.load(paths.critic(s, row)) for row in critic_rows}
            plans: dict[str, Picks] = {}
            for name, (row, k) in plan.items():
                k = cfg.k_candidates if k is None else k
                plans[name], stats = _best_of_n_picks(cfg, critics[row], feats[row], steps, valid, k, seed)
                not_taken.setdefault(name, []).append(stats.pop("kept_not_taken_fraction"))
                by_set.setdefault(name, []).append({k: round(v, 4) for k, v in stats.items()})
            if ablations.perfect_critic:
                plans[PERFECT_CRITIC_ROW] = perfect
            plans["filtered_bc"] = _filtered_bc_picks(steps)
            plans["digirl_offline"] = _digirl_picks(cfg, feats["digiq"]["state"], steps, seed)
            for name, picks in plans.items():
                rows = _rows(steps, cands, picks)
                if right is not None:
                    expert.setdefault(name, []).append(expert_share(right, picks, task_sets))
                    if name == "digiq":
                        digiq_kept[picks.states] += 1
                        digiq_right[picks.states] += right[picks.states, picks.columns]
                kept[name].append(len(rows))
                fits.append(ActorFitJob(paths, name, s, seed, rows, cfg))
            if sample is not None:  # Q of every stored state's candidates, from each VLM's critic
                q = {row: _all_q(critic, feats[row]) for row, critic in critics.items()}
                critic_q.append(q["digiq"])
                reports.append(ranking_report(sample["oracle"], sample["valid"],
                                              {"critic": q["digiq"][sample["idx"]], "base_likelihood": sample["loglik"],
                                               "taken_action": _taken(sample["valid"]), **probes, **behaviour},
                                              cfg.oracle_tolerance))  # fmt: skip
                # every stored state: does each critic's argmax do what the expert would?
                picks = {f"critic_{row}": scores for row, scores in q.items()}
                expert_reports.append(expert_pick_report(right, valid, {**picks, **expert_probes,
                                                                        "taken_action": _taken(valid)},
                                                         steps.task_set.to_numpy()))  # fmt: skip
        with timed(parts, "fits"):
            losses = map_jobs(fit_actor_job, fits, workers)
        curves.update({job.name: curve for job, curve in zip(fits, losses, strict=True) if job.seed == 0 and curve})
    metrics["states"] = len(steps)
    metrics["part_time_s"] = parts  # where the stage's time went: the diagnostics' share of it
    metrics["kept_rows"] = {name: round(float(np.mean(v)), 1) for name, v in kept.items()}
    metrics["kept_fraction"] = {name: round(float(np.mean(v)) / max(1, len(steps)), 4) for name, v in kept.items()}
    metrics["best_of_n_kept_not_taken_fraction"] = {name: round(float(np.mean(v)), 4) for name, v in not_taken.items()}
    metrics["best_of_n_kept_fraction_per_seed"] = by_set
    if expert:
        metrics["rows_expert_share"] = {name: _mean_share(shares) for name, shares in expert.items()}
        metrics["digiq_rows_by_kind"] = keep_by_group(digiq_kept, digiq_right, seeds, task_sets, kinds)
        metrics["rows_expert_share_per_seed"] = expert
    if reports:
        oracle_metrics.update(_mean_report(reports))
        oracle_metrics["per_seed"] = reports
    if expert_reports:
        oracle_metrics["expert_pick"] = {**_mean_report(expert_reports), "per_seed": expert_reports}
        oracle_metrics["critic_wrong_picks"] = wrong_pick_report(right, valid, critic_q,
                                                                 action_kinds(cands.action_list.tolist()), kinds,
                                                                 task_sets)  # fmt: skip
    if parallel.is_main():
        # A declared output even when the diagnostic is off (oracle_states 0, as with imported data).
        write_metrics(paths, "oracle", oracle_metrics or {"states": 0})
        # Always drawn (a declared output); empty when no method kept a row, e.g. a tiny base policy whose
        # candidates are all invalid.
        save_curve_plot(paths.plots / "actor_loss.png", curves,
                        "Stage 06: actor NLL (seed 0)" + ("" if curves else ": no rows kept"))  # fmt: skip
        write_metrics(paths, "actor", metrics)
    parallel.barrier()
    return {"actor": metrics, "oracle": oracle_metrics}


def _taken(valid: np.ndarray) -> np.ndarray:
    """Scores that rank the data's own action (column 0) first: a ranking that trusts the data.

    A conservative critic leans on it, so the diagnostics set the critic against it.
    """
    scores = np.zeros(valid.shape)
    scores[:, 0] = 1.0
    return scores


def _all_q(critic: Critic, feats: dict[str, np.ndarray]) -> np.ndarray:
    """Q (S, N) of every stored state's candidates."""
    q, _, _ = critic.advantage(torch.from_numpy(np.asarray(feats["state"])),
                               torch.from_numpy(np.asarray(feats["candidates"])))  # fmt: skip
    return q.numpy()


def _mean_share(shares: list[dict[str, float | None]]) -> dict[str, float | None]:
    """Per task set, the mean of :func:`expert_share` over the seeds that kept rows there."""
    out: dict[str, float | None] = {}
    for ts in shares[0]:
        kept = [x[ts] for x in shares if x[ts] is not None]
        out[ts] = round(float(np.mean(kept)), 4) if kept else None
    return out


def _mean_report(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Average the numeric leaves of per-seed ranking reports.

    A leaf that only some seeds have is averaged over those.
    """
    out: dict[str, Any] = {}
    for key, value in reports[0].items():
        if isinstance(value, dict):
            names = dict.fromkeys(k for r in reports for k in r[key])
            out[key] = {k: round(float(np.mean([r[key][k] for r in reports if k in r[key]])), 4) for k in names}
        else:
            out[key] = value
    return out


def from_params(params: dict[str, Any], paths: Paths) -> dict[str, Any]:
    """Stage 06 as ``params.yaml`` sets it (:func:`digiq.stages.launch.run_stage` runs it in one process or several)."""
    actor, ablations = load_section(ActorConfig, "actor", params), load_section(AblationsConfig, "ablations", params)
    if load_section(DeviceConfig, "devices", params).backend == "emulator" and (
        actor.oracle_states or ablations.perfect_critic
    ):
        raise ValueError("actor.oracle_states must be 0 and ablations.perfect_critic false with devices.backend "
                         "emulator: both replay the collected episodes in the simulator, and these happened on "
                         "real devices")  # fmt: skip
    return run_actor(actor, paths, seeds=load_section(ExperimentConfig, "experiment", params).seeds,
                     ablations=ablations, env=load_section(EnvConfig, "env", params),
                     collect=load_section(CollectConfig, "collect", params), variants=list(load_variants(params)),
                     workers=load_section(ComputeConfig, "compute", params).workers)  # fmt: skip
