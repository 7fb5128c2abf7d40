"""Stage 08: the critics' picks judged against what only the simulator knows.

Nothing here feeds a policy: stage 07 trains the actors without waiting for
it, and stage 12 evaluates them. On stored states of the offline data, of the
trajectories stage 06 held out of every critic's training (a critic judged on
what it fit says little about what it ranks):

- **true values** (:func:`oracle_sample`): a sample of ``oracle_states``
  states is rebuilt, each candidate is taken on copies of it and the noisy
  expert plays on (:func:`~digiq.diagnostics.ground_truth.candidate_values`);
  with ``behaviour_rollouts`` the base policy plays on instead, the values
  Digi-Q's critic is trained towards. Rankings of the candidates by the
  critic, by probes fit on its inputs, by the base's likelihood and by the
  data's own action are scored against them (``top1_hit_rate``).
- **the expert's choices** on every stored state
  (:func:`~digiq.diagnostics.ground_truth.expert_matrix`): how often each
  critic's top candidate does what the expert would (``expert_pick``; on the
  trajectories the critics trained on, ``expert_pick_train``), how far
  Digi-Q's critic is above the uninformed level there, with a 95% interval
  over held-out episodes and seeds (``critic_pick_margin``), where
  it goes instead (``critic_wrong_picks``), whether the candidates hold the
  expert's action at all (``expert_support``), and how many of each policy's
  imitated rows are the expert's (``rows_expert_share``, from stage 07's
  picks; rows counted by their weight in the fit), how many sit at states
  where some candidate is the expert's (``rows_expert_on_offer``) and how
  many of those are (``rows_expert_share_where_on_offer``).
- **linear probes** of every VLM's (state, action) features
  (:mod:`~digiq.diagnostics.representation`): whether an action changes the
  screen and whether a tap lands on the element the goal names, scored on
  held-out trajectories beside a control that sees only the goal and the
  action (``probes``).

Every critic's Q is the one stage 07's Best-of-N read, stored beside its
picks (:func:`digiq.data.picks.read_stored`), and so is the expert's matrix
where stage 07 computed it (for the perfect critic); the expert rankers'
two fits each are jobs (:func:`ranker_job`).

Writes ``metrics/diagnostics.json``; with ``oracle_states: 0`` (imported
data, real devices) only ``{"off": why}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch

from digiq.config import (
    CollectConfig,
    ComputeConfig,
    DiagnosticsConfig,
    EnvConfig,
    Settings,
)
from digiq.data.candidates import read_candidates
from digiq.data.features import load_features, load_text_rows
from digiq.data.picks import EXPERT_MATRIX, critic_scores_name, read_picks, read_stored, stored_path
from digiq.data.trajectories import DataError, TrajectoryStore, data_task_sets, heldout_rows
from digiq.diagnostics.ground_truth import behaviour_values, candidate_values, expert_matrix, replay
from digiq.diagnostics.probes import expert_probe_half, feature_probe, within_state_share
from digiq.diagnostics.reports import (
    action_kinds,
    behaviour_report,
    distinct_decisions,
    expert_pick_report,
    expert_share,
    keep_by_group,
    mean_over_seeds,
    pick_margin,
    ranking_report,
    support_report,
    weighted_share,
    wrong_pick_report,
)
from digiq.diagnostics.representation import feature_vlms, representation_probes
from digiq.diagnostics.typed_text import typed_text_report, typed_versions_q, typing_states, versions_of
from digiq.env.actions import ActionType, parse_action
from digiq.env.catalog import stable_int
from digiq.env.state import Dynamics
from digiq.env.tasks import parse_task
from digiq.io import require
from digiq.models.agents import ModelPolicy
from digiq.models.checkpoint import read_meta, read_typed_config
from digiq.models.critic import Critic, CriticNetConfig, load_critics, per_task_set, trained_inputs
from digiq.models.policy import AutoUIPolicy
from digiq.models.vlm import saved_recipe
from digiq.paths import Paths
from digiq.rollout import episode_seed
from digiq.rows import VLM_OF_ROW, all_rows
from digiq.stages.common import one_run_at_a_time, timed, write_metrics
from digiq.workers import IN_PROCESS, map_jobs, process_cached

__all__ = [
    "run_diagnostics",
    "typed_text_check",
    "oracle_sample",
    "OracleJob",
    "oracle_job",
    "RankerJob",
    "ranker_job",
    "run",
]


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
    cfg: DiagnosticsConfig
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
        device = replay(task, st.episode_seed, st.earlier, Dynamics.of(job.env), job.env.width)
        out["oracle"][j] = candidate_values(device, task, task.max_steps - len(st.earlier), st.candidates,
                                            rollouts=cfg.oracle_rollouts, noise=cfg.oracle_noise, gamma=job.gamma,
                                            seed=st.branch_seed)  # fmt: skip
        if cfg.behaviour_rollouts:  # the same replayed state: candidate_values branches off copies of it
            starts.append((device, task, st.earlier, st.candidates))
        shot = base.screen.prepare(store.load_image(st.image_path)[None])
        shot = shot.expand(len(st.candidates), *shot.shape[1:])
        with torch.no_grad():
            out["loglik"][j] = base.action_logprobs([st.observation] * len(st.candidates), shot,
                                                    st.candidates).numpy()  # fmt: skip
    if starts:
        # The base continues as it collected the data; each branch's noise is keyed by the branch itself.
        seed = stable_int("behaviour values", cfg.seed, job.chunk)
        out["behaviour"] = np.stack(behaviour_values(
            starts, ModelPolicy(base, temperature=job.temperature), rollouts=cfg.behaviour_rollouts,
            gamma=job.gamma, seed=seed, screen_text=base.cfg.screen_text))  # fmt: skip
    return out


class RankerJob(NamedTuple):
    """One of the two fits of an expert ranker (:func:`~digiq.diagnostics.probes.expert_probe_half`) on the inputs
    ``row``'s critics read (the frozen text averages in place of towers): an MLP shaped like a Q head, or with
    ``hidden`` None a linear scorer."""

    paths: Paths
    row: str
    hidden: int | None
    half: int
    right: np.ndarray
    valid: np.ndarray
    episodes: np.ndarray
    seed: int


def ranker_job(job: RankerJob) -> tuple[np.ndarray, np.ndarray]:
    """The rows one fit scores and their scores."""
    inputs = process_cached(("frozen critic inputs", job.paths.root, job.row),
                            lambda: trained_inputs(job.paths, [job.row], frozen_text=True)[job.row],
                            slot="critic inputs")  # fmt: skip
    return expert_probe_half(inputs["state"], inputs["candidates"], job.right, job.valid, job.episodes,
                             half=job.half, seed=job.seed, hidden=job.hidden)  # fmt: skip


def typed_text_check(paths: Paths, rows: Sequence[str], seeds: int, seed: int, right: np.ndarray, kinds: np.ndarray,
                     action_lists: Sequence[Sequence[str]], held: np.ndarray, episodes: np.ndarray,
                     task_sets: np.ndarray) -> dict[str, Any]:  # fmt: skip
    """The typed-text check (:mod:`~digiq.diagnostics.typed_text`) of every critic row of ``rows`` that reads the
    action's text and nothing more of it, at the ``held`` states (row indices) where the expert types: per row,
    over all task sets and per task set, every seed's critic of each state's task set scoring."""
    states, columns = typing_states(right, kinds, action_lists, held)
    if not len(states):
        return {"states": 0}
    queries = [parse_action(action_lists[i][j]).text for i, j in zip(states, columns, strict=True)]
    versions, available = versions_of(queries, np.random.default_rng(seed))
    texts = load_text_rows(paths)[0]
    policy = AutoUIPolicy.load(paths.base_policy)
    of_set = task_sets[states]
    out: dict[str, Any] = {"states": len(states), "states_by_task_set": {str(ts): int((of_set == ts).sum())
                                                                        for ts in data_task_sets(of_set)}}  # fmt: skip
    for row in rows:
        net = read_typed_config(paths.critic(0, row, str(of_set[0])), "critic", CriticNetConfig)
        if not net.text or net.targets or net.typed or net.entries:
            continue
        inputs = trained_inputs(paths, [row])[row]

        def versions_q(critic: Critic, mine: np.ndarray, inputs: dict[str, np.ndarray] = inputs) -> np.ndarray:
            return typed_versions_q(critic, inputs, states[mine], columns[mine], [versions[k] for k in mine], texts,
                                    policy)  # fmt: skip

        q = [per_task_set(of_set, load_critics(paths, s, row, data_task_sets(of_set)), versions_q)
             for s in range(seeds)]  # fmt: skip
        out[row] = {"text_encoder": "trained" if net.towers else "frozen",
                    "all": typed_text_report(q, available, episodes[states]),
                    **{str(ts): typed_text_report([s[of_set == ts] for s in q], available[of_set == ts],
                                                  episodes[states][of_set == ts])
                       for ts in data_task_sets(of_set)}}  # fmt: skip
    return out


def oracle_sample(cfg: DiagnosticsConfig, env: EnvConfig, collect: CollectConfig, gamma: float, steps: pd.DataFrame,
                  cands: pd.DataFrame, pool: np.ndarray, paths: Paths, compute: ComputeConfig) -> dict[str, Any]:  # fmt: skip
    """True values, the base policy's log-likelihoods and (``behaviour_rollouts``) its values of the candidates of
    ``cfg.oracle_states`` states sampled from ``pool`` (row indices: the trajectories no critic trained on).

    The states are shared as ``compute`` says (:mod:`digiq.workers`) in chunks of :data:`ORACLE_CHUNK`.
    """
    rng = np.random.default_rng(cfg.seed)
    idx = np.sort(rng.choice(pool, min(cfg.oracle_states, len(pool)), replace=False))
    states = []
    for i in idx:
        r = steps.iloc[i]
        earlier = steps.action[(steps.traj_id == r.traj_id) & (steps.step_id < r.step_id)].tolist()
        states.append(OracleState(r.task, r.task_set, episode_seed(collect.seed, int(r.traj_id)), earlier,
                                  list(cands.action_list.iat[i]), r.observation, r.image_path,
                                  stable_int("oracle state", cfg.seed, int(i))))  # fmt: skip
    jobs = [OracleJob(paths, c, states[start : start + ORACLE_CHUNK], cfg, env, collect.temperature, gamma)
            for c, start in enumerate(range(0, len(states), ORACLE_CHUNK))]  # fmt: skip
    parts = map_jobs(oracle_job, jobs, compute)
    sample = {"idx": idx, "valid": np.stack(cands.valid_list.to_numpy()[idx])}
    sample.update({key: np.concatenate([p[key] for p in parts]) for key in parts[0]})
    return sample


def _taken(valid: np.ndarray) -> np.ndarray:
    """Scores that rank the data's own action (column 0) first: a ranking that trusts the data.

    A conservative critic leans on it, so the diagnostics set the critic against it.
    """
    scores = np.zeros(valid.shape)
    scores[:, 0] = 1.0
    return scores


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


@one_run_at_a_time("diagnostics")
def run_diagnostics(cfg: DiagnosticsConfig, paths: Paths, *, seeds: int, env: EnvConfig, collect: CollectConfig,
                    policies: Sequence[str], threshold: float, compute: ComputeConfig = IN_PROCESS) -> dict[str, Any]:  # fmt: skip
    """Every diagnostic of the module docstring, for every seed's critics; writes ``metrics/diagnostics.json``.

    ``policies`` are the ones stage 07 trained (:func:`digiq.rows.all_rows`); one that kept no
    row of a task set on a seed has no share there (``None``). ``threshold`` is the VLM fine-tune's
    (``vlm_finetune.threshold``): the probes' "changes the screen" is the label that VLM learnt.
    """
    metrics: dict[str, Any] = {}
    if cfg.oracle_states == 0:
        metrics["off"] = "diagnostics.oracle_states is 0"
        write_metrics(paths, "diagnostics", metrics)
        return metrics
    require("diagnostics", paths.picks, *(paths.critics / f"seed{s}" / "digiq" for s in range(seeds)))
    parts: dict[str, float] = {}
    with timed(metrics):
        steps = TrajectoryStore(paths.offline).read().to_pandas()
        cands = read_candidates(paths).to_pandas()
        picks = read_picks(paths)
        critic_rows = sorted(p.name for p in (paths.critics / "seed0").iterdir() if p.is_dir())
        require("diagnostics", *(stored_path(paths, critic_scores_name(row, s)) for row in critic_rows
                                 for s in range(seeds)))  # fmt: skip
        task_sets = steps.task_set.to_numpy()
        in_data = data_task_sets(task_sets)
        first = paths.critic(0, "digiq", in_data[0])
        # The paper's critic inputs on each VLM's features: what the probes read.
        probed = [row for row in critic_rows if row in VLM_OF_ROW]
        feats = trained_inputs(paths, probed, frozen_text=True)
        by_vlm = {VLM_OF_ROW[row]: feats[row] for row in probed}
        gamma = float(read_meta(first)["gamma"])  # true values discounted as the critic's
        valid, episodes = np.stack(cands.valid_list.to_numpy()), steps.traj_id.to_numpy()
        distinct = distinct_decisions(cands.action_list.tolist())  # the uninformed level's decisions
        candidate_kinds = action_kinds(cands.action_list.tolist())
        # Every figure of a critic's picks is on the trajectories no seed's critic trained on (stage 06 holds the
        # same ones out of every seed, within each task set); the expert picks are also given on the training ones,
        # for contrast.
        split = read_meta(first)
        if "split_seed" not in split:
            raise DataError(f"{first} does not say which trajectories it held out; rerun the critic stage")
        held = heldout_rows(episodes, float(split["holdout"]), int(split["split_seed"]), task_sets)

        with timed(parts, "representation_probes"):  # every VLM whose features the embed stage wrote
            metrics["probes"] = representation_probes(paths, feature_vlms(paths), threshold=threshold, seed=cfg.seed)
        with timed(parts, "oracle_values"):
            sample = oracle_sample(cfg, env, collect, gamma, steps, cands, np.flatnonzero(held), paths, compute)
        # The representation's slices as the VLM's recipe made them; features from elsewhere count as one.
        slices = saved_recipe(paths.vlm).parts if (paths.vlm / "config.json").exists() else ("representation",)
        probes: dict[str, np.ndarray] = {}
        for vlm, f in by_vlm.items():  # what the critic's inputs allow, whatever the critic: once per VLM
            s_f, c_f = f["state"][sample["idx"]], f["candidates"][sample["idx"]]
            probes[f"feature_probe_{vlm}"] = feature_probe(s_f, c_f, sample["oracle"], sample["valid"], seed=cfg.seed)
            metrics.setdefault("candidate_variance_within_state", {})[vlm] = within_state_share(
                load_features(paths, vlm)["candidates"][sample["idx"]], slices
            )
        behaviour: dict[str, np.ndarray] = {}
        if "behaviour" in sample:  # a perfect Digi-Q critic ranks by these; its ties (mostly all 0) broken at random
            noise = np.random.default_rng(cfg.seed).uniform(0, 1e-9, sample["behaviour"].shape)
            behaviour["behaviour_value"] = sample["behaviour"] + noise
            metrics["behaviour_values"] = {
                "rollouts": cfg.behaviour_rollouts, "temperature": collect.temperature,
                **behaviour_report(sample["oracle"], sample["behaviour"], sample["valid"], cfg.oracle_tolerance,
                                   task_sets[sample["idx"]])}  # fmt: skip

        with timed(parts, "expert_matrix"):
            if stored_path(paths, EXPERT_MATRIX).exists():  # the perfect critic's, which stage 07 computed
                stored = read_stored(paths, EXPERT_MATRIX, steps, ("right", "kinds"), "diagnostics")
                right, kinds = stored["right"], stored["kinds"]
            else:
                right, kinds = expert_matrix(env, collect.seed, steps, cands)
        metrics["expert_support"] = support_report(right, task_sets, steps.family.to_numpy())
        metrics["expert_support_by_kind"] = support_report(right, task_sets, kinds)
        # What the critic's inputs allow with a label on every candidate (the critic has none): once per VLM.
        # A ranker as big as a Q head and a linear one, cross-fitted over episodes: each of its two fits a job.
        rankers = [(f"{name}_ranker_{VLM_OF_ROW[row]}", RankerJob(paths, row, hidden, half, right, valid, episodes,
                                                                  cfg.seed))
                   for row in probed for name, hidden in (("mlp", 256), ("linear", None)) for half in (0, 1)]  # fmt: skip
        with timed(parts, "expert_rankers"):
            fitted = map_jobs(ranker_job, [job for _, job in rankers], compute)
        expert_probes: dict[str, np.ndarray] = {}
        for (name, _), (rows, half_scores) in zip(rankers, fitted, strict=True):
            expert_probes.setdefault(name, np.zeros(valid.shape, np.float32))[rows] = half_scores

        # The rows each policy of stage 07 imitates: how many are the expert's; how many are at states where some
        # candidate is (elsewhere every pick is wrong), and how many of the rows there are the expert's.
        shares: dict[str, list[dict[str, float | None]]] = {}
        on_offer: dict[str, list[dict[str, float | None]]] = {}
        shares_there: dict[str, list[dict[str, float | None]]] = {}
        offered = right.any(1)
        digiq_kept, digiq_right = np.zeros(len(steps), int), np.zeros(len(steps), int)  # over seeds
        by_key = dict(iter(picks.groupby(["policy", "seed"], sort=True)))
        for policy in policies:
            for s in range(seeds):
                rows = by_key.get((policy, s), picks.iloc[:0])  # no rows: it kept none on this seed
                states, columns, w = rows.state.to_numpy(), rows.column.to_numpy(), rows.weight.to_numpy()
                there = offered[states]
                shares.setdefault(policy, []).append(expert_share(right, states, columns, task_sets, w))
                on_offer.setdefault(policy, []).append(weighted_share(there, task_sets[states], task_sets, w))
                shares_there.setdefault(policy, []).append(expert_share(right, states[there], columns[there],
                                                                        task_sets, w[there]))  # fmt: skip
                if policy == "digiq":
                    digiq_kept[states] += 1
                    digiq_right[states] += right[states, columns]
        metrics["rows_expert_share"] = {name: mean_over_seeds(s) for name, s in shares.items()}
        metrics["rows_expert_share_per_seed"] = shares
        metrics["rows_expert_on_offer"] = {name: mean_over_seeds(s) for name, s in on_offer.items()}
        metrics["rows_expert_share_where_on_offer"] = {name: mean_over_seeds(s) for name, s in shares_there.items()}
        metrics["digiq_rows_by_kind"] = keep_by_group(digiq_kept, digiq_right, seeds, task_sets, kinds)

        reports, by_row = [], {row: [] for row in critic_rows}  # each critic row's Q, per seed
        expert_reports: dict[str, list[dict[str, Any]]] = {"heldout": [], "train": []}
        for s in range(seeds):
            # Each critic's Q of every stored state, as stage 07's Best-of-N read it.
            q = {row: read_stored(paths, critic_scores_name(row, s), steps, ("q",), "diagnostics")["q"]
                 for row in critic_rows}  # fmt: skip
            for row, scores in q.items():
                by_row[row].append(scores)
            reports.append(ranking_report(sample["oracle"], sample["valid"], distinct[sample["idx"]],
                                          {"critic": q["digiq"][sample["idx"]], "base_likelihood": sample["loglik"],
                                           "taken_action": _taken(sample["valid"]), **probes, **behaviour},
                                          cfg.oracle_tolerance))  # fmt: skip
            # every stored state: does each critic's argmax do what the expert would?
            scores = {**{f"critic_{row}": scores for row, scores in q.items()}, **expert_probes,
                      "taken_action": _taken(valid)}  # fmt: skip
            for part, rows in (("heldout", held), ("train", ~held)):
                expert_reports[part].append(expert_pick_report(right[rows], valid[rows], distinct[rows],
                                                               candidate_kinds[rows],
                                                               {k: v[rows] for k, v in scores.items()},
                                                               task_sets[rows]))  # fmt: skip
        metrics.update(_mean_report(reports))
        metrics["per_seed"] = reports
        metrics["expert_pick"] = {**_mean_report(expert_reports["heldout"]), "per_seed": expert_reports["heldout"]}
        metrics["expert_pick_train"] = {**_mean_report(expert_reports["train"]), "per_seed": expert_reports["train"]}
        # Digi-Q's critic against the uninformed level on the held-out states, with an interval over episodes and seeds.
        critic_q = by_row["digiq"]
        metrics["critic_pick_margin"] = pick_margin(right[held], valid[held], distinct[held],
                                                    [q[held] for q in critic_q], episodes[held], task_sets[held])  # fmt: skip
        metrics["critic_wrong_picks"] = wrong_pick_report(right[held], valid[held], [q[held] for q in critic_q],
                                                          candidate_kinds[held], kinds[held],
                                                          task_sets[held])  # fmt: skip
        # The same margin where the expert types and elsewhere, per task set; every critic row's (the frozen-text
        # variant's beside Digi-Q's).
        typing = np.where(kinds == ActionType.TYPE.name, "typing", "other")
        metrics["critic_pick_margin_typing"] = {
            row: {ts: pick_margin(right[mine], valid[mine], distinct[mine], [q[mine] for q in per_seed],
                                  episodes[mine], typing[mine])
                  for ts in ["all", *in_data] if (mine := held & ((task_sets == ts) | (ts == "all"))).any()}
            for row, per_seed in by_row.items()}  # fmt: skip
        # Digi-Q's critic against each other critic row's on the same states and seeds (the frozen-text variant's:
        # what training the text towers changes), paired, where the expert types and elsewhere.
        metrics["critic_pick_lead"] = {
            row: {ts: pick_margin(right[mine], valid[mine], distinct[mine], [q[mine] for q in critic_q],
                                  episodes[mine], typing[mine], against=[q[mine] for q in per_seed])
                  for ts in ["all", *in_data] if (mine := held & ((task_sets == ts) | (ts == "all"))).any()}
            for row, per_seed in by_row.items() if row != "digiq"}  # fmt: skip
        with timed(parts, "typed_text"):
            metrics["typed_text"] = typed_text_check(paths, critic_rows, seeds, cfg.seed, right, kinds,
                                                     cands.action_list.tolist(), np.flatnonzero(held), episodes,
                                                     task_sets)  # fmt: skip
    metrics["part_time_s"] = parts
    write_metrics(paths, "diagnostics", metrics)
    return metrics


def run(settings: Settings, paths: Paths) -> dict[str, Any]:
    """Stage 08 as ``params.yaml`` sets it."""
    cfg = settings.diagnostics
    if settings.devices.backend == "emulator" and cfg.oracle_states:
        raise ValueError("diagnostics.oracle_states must be 0 with devices.backend emulator: the diagnostics "
                         "replay the collected episodes in the simulator, and these happened on real devices")  # fmt: skip
    table = all_rows(settings.ablations, list(settings.variants))
    return run_diagnostics(cfg, paths, seeds=settings.experiment.seeds,
                           policies=[r.name for r in table],
                           threshold=settings.vlm_finetune.threshold,
                           env=settings.env,
                           collect=settings.collect,
                           compute=settings.compute)  # fmt: skip
