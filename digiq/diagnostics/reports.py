"""Reports of the diagnostics: how a critic's ranking compares with true values and with the expert's choices.

Each takes arrays over states and candidates (true values, the expert's
choices, scores to judge) and returns plain dicts, which the diagnostics
stage writes into ``metrics/diagnostics.json``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd

from digiq.env.actions import parse_action
from digiq.stats import cluster_bootstrap

__all__ = ["distinct_decisions", "ranking_report", "behaviour_report", "expert_pick_report", "pick_margin",
           "action_kinds", "wrong_pick_report", "group_masks", "support_report", "expert_share", "mean_over_seeds",
           "weighted_share", "keep_by_group"]  # fmt: skip


def distinct_decisions(action_lists: Sequence[Sequence[str]]) -> np.ndarray:
    """(S, N) bool: each state's first candidate of every distinct action text.

    Candidates drawn twice are one decision to a critic: the same text has the
    same features and so the same Q, and the argmax cannot tell them apart.
    A ranking that knows nothing picks uniformly among decisions, not among
    draws: that is the uninformed level the diagnostics compare with
    (``uninformed``), beside the rate of a uniform pick among the draws
    (``base_sample``), which is the base policy's own sampling rate.
    """
    out = np.zeros((len(action_lists), max(map(len, action_lists), default=0)), bool)
    for i, row in enumerate(action_lists):
        seen: set[str] = set()
        for j, text in enumerate(row):
            out[i, j] = text not in seen
            seen.add(text)
    return out


def _levels(right: np.ndarray, ok: np.ndarray, distinct: np.ndarray) -> dict[str, np.ndarray]:
    """(S,) per state: the chance that a uniform pick among the valid draws (``base_sample``) and among the valid
    distinct decisions (``uninformed``) is ``right``."""
    once = ok & distinct
    return {"base_sample": (right & ok).sum(1) / np.maximum(ok.sum(1), 1),
            "uninformed": (right & once).sum(1) / np.maximum(once.sum(1), 1)}  # fmt: skip


def ranking_report(
    oracle: np.ndarray, valid: np.ndarray, distinct: np.ndarray, scores: dict[str, np.ndarray], tolerance: float
) -> dict[str, Any]:
    """How often each ranking's top valid candidate is among the truly best ones.

    ``oracle``, ``valid``, ``distinct`` (:func:`distinct_decisions`) and every
    ``scores[name]`` are (S, N). The truly best candidates of a state are the
    valid ones within ``tolerance`` of its best oracle value (rollouts are
    noisy). Only states whose valid candidates differ in oracle value by more
    than ``tolerance`` count: elsewhere every pick is right. ``uninformed``
    and ``base_sample`` are the expected rates of a uniform pick among the
    distinct decisions and among the draws.
    """
    o = np.where(valid, oracle, -np.inf)
    best = o.max(1, keepdims=True)
    truly_best = valid & (o >= best - tolerance)
    informative = _spread(oracle, valid) > tolerance
    report: dict[str, Any] = {"states": int(len(oracle)), "informative_states": int(informative.sum())}
    if not informative.any():
        return report
    tb, ok, orc = truly_best[informative], valid[informative], oracle[informative]
    once = ok & np.asarray(distinct, bool)[informative]
    rows = np.arange(len(tb))
    report["top1_hit_rate"] = {k: round(float(v.mean()), 4) for k, v in _levels(tb, ok, once).items()}
    report["oracle_value_of_pick"] = {
        "uninformed": round(float((np.where(once, orc, 0).sum(1) / once.sum(1)).mean()), 4),
        "base_sample": round(float((np.where(ok, orc, 0).sum(1) / ok.sum(1)).mean()), 4),
        "best": round(float(best[informative].mean()), 4),
    }
    for name, s in scores.items():
        pick = np.where(ok, s[informative], -np.inf).argmax(1)
        report["top1_hit_rate"][name] = round(float(tb[rows, pick].mean()), 4)
        report["oracle_value_of_pick"][name] = round(float(orc[rows, pick].mean()), 4)
    return report


def _spread(values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """(S,) the best minus the worst value among each state's valid candidates."""
    return np.where(valid, values, -np.inf).max(1) - np.where(valid, values, np.inf).min(1)


def behaviour_report(oracle: np.ndarray, behaviour: np.ndarray, valid: np.ndarray, tolerance: float,
                     task_sets: np.ndarray) -> dict[str, dict[str, float | int]]:  # fmt: skip
    """Per task set: of the sampled states whose candidates differ in true value, the share where the behaviour values do not.

    ``behaviour`` is :func:`behaviour_values` of the states, ``oracle`` their
    true values (:func:`candidate_values`). A flat state is one where the
    policy that collected the data fails after every candidate alike, so
    Digi-Q's objective, one step of improvement on that policy, prefers none
    of them, the right one included.
    """
    informative = _spread(oracle, valid) > tolerance
    flat = _spread(behaviour, valid) <= 0.0
    out: dict[str, dict[str, float | int]] = {}
    for ts in ("all", *np.unique(task_sets)):
        mask = informative & ((task_sets == ts) if ts != "all" else True)
        if mask.any():
            out[str(ts)] = {"states": int(mask.sum()), "flat": round(float(flat[mask].mean()), 4)}
    return out


def _expert_hits(right: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(S, N) valid, (S, N) valid and expert-equivalent, and (S,) informative: states with both such and other valid candidates.

    Elsewhere every pick is alike, so the expert-pick diagnostics count only the informative states.
    """
    ok = np.asarray(valid, bool)
    hit = np.asarray(right, bool) & ok
    return ok, hit, hit.any(1) & (ok & ~hit).any(1)


def _top_valid(scores: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """(S,) the column of each state's highest-scored valid candidate."""
    return np.where(ok, scores, -np.inf).argmax(1)


def expert_pick_report(right: np.ndarray, valid: np.ndarray, distinct: np.ndarray, kinds: np.ndarray,
                       scores: dict[str, np.ndarray], groups: np.ndarray) -> dict[str, Any]:  # fmt: skip
    """How often each ranking's top valid candidate does what the simulator's expert would, per group of states.

    ``right`` (S, N) marks the expert-equivalent candidates
    (:func:`expert_equivalent`), ``valid`` (S, N) the ones that parse, and
    ``groups`` (S,) names each state's group (its task set). Only states whose
    valid candidates include both right and wrong ones count: elsewhere every
    pick is alike. Unlike :func:`ranking_report` it needs no rollouts, so it
    covers every stored state rather than a sample of a few hundred, at the
    price of judging by the expert's next action instead of the true value.
    ``uninformed`` and ``base_sample`` are the expected rates of a uniform
    pick among the valid distinct decisions (``distinct``,
    :func:`distinct_decisions`) and among the valid draws.

    A pick is split in two (over all groups): ``kind_rate``, how often it is
    of a kind (``kinds``, :func:`action_kinds`) that some right candidate is
    of (a tap where the expert taps, say), and ``within_kind_rate``, how often
    a pick of the right kind is the right action of that kind (the right
    element to tap): the hit rate is their product.
    """
    ok, hit, informative = _expert_hits(right, valid)
    kinds = np.asarray(kinds)
    right_kind = ok & np.array([np.isin(row, row[h]) for row, h in zip(kinds, hit, strict=True)]).reshape(hit.shape)
    report: dict[str, Any] = {"states": int(len(hit)), "informative_states": int(informative.sum())}
    distinct = np.asarray(distinct, bool)
    rates, kind_rates = _levels(hit, ok, distinct), _levels(right_kind, ok, distinct)
    rows = np.arange(len(hit))
    for name, s in scores.items():
        pick = _top_valid(s, ok)
        rates[name], kind_rates[name] = hit[rows, pick].astype(float), right_kind[rows, pick].astype(float)
    groups = np.asarray(groups)
    for group in ["all", *sorted(set(groups.tolist()))]:
        mask = informative & (np.ones(len(hit), bool) if group == "all" else groups == group)
        if mask.any():
            report["hit_rate" + ("" if group == "all" else f"_{group}")] = {
                name: round(float(r[mask].mean()), 4) for name, r in rates.items()
            }
    if informative.any():
        report["kind_rate"] = {name: round(float(r[informative].mean()), 4) for name, r in kind_rates.items()}
        report["within_kind_rate"] = {
            name: round(float(rates[name][informative].sum() / max(r[informative].sum(), 1e-12)), 4)
            for name, r in kind_rates.items()
        }
    return report


def pick_margin(right: np.ndarray, valid: np.ndarray, distinct: np.ndarray, scores: Sequence[np.ndarray],
                episodes: np.ndarray, groups: np.ndarray,
                against: Sequence[np.ndarray] | None = None) -> dict[str, dict[str, Any]]:  # fmt: skip
    """How far a critic's top valid pick is above the uninformed level, with a 95% interval, per group and over all.

    ``scores`` holds one (S, N) array per seed (that seed's critic), the
    other arrays are as in :func:`expert_pick_report`, and ``episodes`` (S,)
    names each state's episode. Over the informative states, each state adds
    its pick's hit (0 or 1) minus its uninformed level (the chance that a
    uniform pick among its valid distinct decisions is right). The states of
    one episode are not independent draws, so the interval resamples whole
    episodes, and seeds (:func:`digiq.stats.cluster_bootstrap`): it says
    whether the critic's lead over a ranking that knows nothing is more than
    the luck of which episodes were held out and how each seed's fit went.
    With ``against`` (another critic's (S, N) per seed, seed for seed), each
    state adds its pick's hit minus that critic's instead: two critics
    compared on the same states, paired. Returns ``{group:
    cluster_bootstrap(...)}`` with ``all`` first, in points.
    """
    ok, hit, informative = _expert_hits(right, valid)
    rows = np.arange(len(hit))
    picked = np.stack([hit[rows, _top_valid(np.asarray(s), ok)] for s in scores]).astype(float)  # (seeds, S)
    if against is None:
        margins = picked - _levels(hit, ok, np.asarray(distinct, bool))["uninformed"]
    elif len(against) != len(scores):
        raise ValueError(f"pick_margin: {len(scores)} seeds' scores against {len(against)} seeds' of the other critic")
    else:
        margins = picked - np.stack([hit[rows, _top_valid(np.asarray(s), ok)] for s in against])
    groups, episodes = np.asarray(groups), np.asarray(episodes)
    out: dict[str, dict[str, Any]] = {}
    for group in ["all", *sorted(set(groups[informative].tolist()))]:
        mask = informative & (np.ones(len(hit), bool) if group == "all" else groups == group)
        if mask.any():
            _, cluster = np.unique(episodes[mask], return_inverse=True)
            sums = np.stack([np.bincount(cluster, weights=m[mask]) for m in margins])
            out[group] = cluster_bootstrap(sums, np.bincount(cluster).astype(float))
    return out


def action_kinds(action_lists: Sequence[Sequence[str]]) -> np.ndarray:
    """(S, N) str: each candidate's kind of action (``DUAL_POINT``, ``PRESS_BACK`` ...), ``invalid`` where it does not parse."""
    return np.array([[a.type.name if a.is_valid else "invalid" for a in map(parse_action, row)]
                     for row in action_lists])  # fmt: skip


def wrong_pick_report(right: np.ndarray, valid: np.ndarray, scores: Sequence[np.ndarray], kinds: np.ndarray,
                      expert_kinds: np.ndarray, task_sets: np.ndarray) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Per task set: where a ranking's top pick is not the expert's, which kind of action it picks instead.

    Over the informative states (as in :func:`expert_pick_report`) whose
    top valid candidate under ``scores`` (one (S, N) array per seed, pooled)
    is not an expert's: the share of those picks of each kind (``kinds``,
    :func:`action_kinds`), beside the kind of the data's own action (column
    0) and of the expert's (``expert_kinds``, (S,)) at the same states. A
    kind the critic picks far more often than the expert takes it is a bias
    of the critic, not noise: a conservative term raises Q of whatever the
    data took, so the base's commonest slip (Back) rises with it.
    """
    ok, hit, informative = _expert_hits(right, valid)
    rows, kinds, task_sets = np.arange(len(hit)), np.asarray(kinds), np.asarray(task_sets)
    frames = []
    for s in scores:
        pick = _top_valid(s, ok)
        wrong = informative & ~hit[rows, pick]
        frames.append(pd.DataFrame({"task_set": task_sets[wrong], "critic": kinds[rows, pick][wrong],
                                    "data": kinds[wrong, 0], "expert": np.asarray(expert_kinds)[wrong]}))  # fmt: skip
    out: dict[str, dict[str, Any]] = {}
    for ts, picks in pd.concat(frames).groupby("task_set"):
        shares = {column: picks[column].value_counts(normalize=True) for column in ("critic", "data", "expert")}
        kinds_seen = set().union(*(x.index for x in shares.values()))
        names = sorted(kinds_seen, key=lambda k: (-shares["critic"].get(k, 0.0), k))  # most picked first
        out[str(ts)] = {"wrong_picks": round(len(picks) / len(scores), 1),
                        "kinds": {str(k): {c: round(float(x.get(k, 0.0)), 4) for c, x in shares.items()}
                                  for k in names}}  # fmt: skip
    return out


def group_masks(task_sets: np.ndarray, groups: np.ndarray) -> Iterator[tuple[str, str, np.ndarray]]:
    """Each (task set, group) pair present, in sorted order, with the mask of its states."""
    task_sets, groups = np.asarray(task_sets), np.asarray(groups)
    for ts, group in sorted(set(zip(task_sets.tolist(), groups.tolist(), strict=True))):
        yield ts, group, (task_sets == ts) & (groups == group)


def support_report(right: np.ndarray, task_sets: np.ndarray, groups: np.ndarray) -> dict[str, dict[str, Any]]:
    """Per task set and group: how often the data's action, and any stored candidate, does what the expert would.

    ``right`` (S, N) marks the expert-equivalent candidates
    (:func:`expert_equivalent`), column 0 being the data's own action. An
    offline method learns only what the data hold: where no candidate does
    what the expert would, no critic can pick it and no actor can imitate it,
    so a family whose states rarely have one stays where the base left it,
    whatever the method.
    ``groups`` labels each state: its task family, or the kind of the
    expert's action there (:func:`expert_kind`), which shows what the base
    never samples (Home where it is lost in the wrong app).
    """
    hit = np.asarray(right, bool)
    out: dict[str, dict[str, Any]] = {}
    for ts, group, mask in group_masks(task_sets, groups):
        out.setdefault(ts, {})[group] = {"states": int(mask.sum()),
                                         "taken_is_expert": round(float(hit[mask, 0].mean()), 4),
                                         "expert_candidate": round(float(hit[mask].any(1).mean()), 4)}  # fmt: skip
    return out


def expert_share(right: np.ndarray, states: np.ndarray, columns: np.ndarray, task_sets: np.ndarray,
                 weights: np.ndarray | None = None) -> dict[str, float | None]:  # fmt: skip
    """Per task set, the share of a policy's rows whose action does what the simulator's expert would there.

    ``right`` is :func:`~digiq.diagnostics.ground_truth.expert_matrix`. It says what the keep rule feeds
    the actor, apart from how well the actor learns it. With the rows'
    ``weights`` (the extraction ablation's), it is the share of the weight the
    fit puts on imitating the expert's action: rows count by their weight.
    ``None`` where the policy imitates no row of a task set.
    """
    return weighted_share(right[states, columns], task_sets[states], task_sets, weights)


def mean_over_seeds(per_seed: Sequence[dict[str, float | None]]) -> dict[str, float | None]:
    """Per task set, the mean of per-seed shares (:func:`expert_share`, :func:`weighted_share`) over the seeds that
    had rows there; ``None`` where none had."""
    out: dict[str, float | None] = {}
    for ts in per_seed[0]:
        kept = [share[ts] for share in per_seed if share[ts] is not None]
        out[ts] = round(float(np.mean(kept)), 4) if kept else None
    return out


def weighted_share(hit: np.ndarray, sets: np.ndarray, task_sets: np.ndarray,
                   weights: np.ndarray | None = None) -> dict[str, float | None]:  # fmt: skip
    """Per task set of ``task_sets``: the share of rows (of task sets ``sets``) that ``hit``, rows counted by their
    ``weights`` (negative ones not at all); ``None`` where a task set has no row."""
    w = np.ones(len(hit)) if weights is None else np.maximum(np.asarray(weights, np.float64), 0.0)
    out: dict[str, float | None] = {}
    for ts in np.unique(task_sets):
        mine = sets == ts
        total = w[mine].sum()
        out[ts] = round(float((w[mine] * hit[mine]).sum() / total), 4) if total > 0 else None
    return out


def keep_by_group(kept: np.ndarray, kept_right: np.ndarray, seeds: int, task_sets: np.ndarray,
                  groups: np.ndarray) -> dict[str, dict[str, dict[str, float | None]]]:  # fmt: skip
    """Per task set and group: the share of its states a policy keeps a row at, and the share of those rows that are the expert's.

    ``kept`` and ``kept_right`` (S,) count, over ``seeds`` fits, the seeds
    that kept a row at each state and those whose row did what the expert
    would. Grouped by the expert's kind of action it shows where the critic
    sends the actor wrong, e.g. rows kept at states that need Back whose
    action is not Back.
    """
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for ts, group, mask in group_masks(task_sets, groups):
        rows = int(kept[mask].sum())
        out.setdefault(ts, {})[group] = {"kept": round(rows / (int(mask.sum()) * seeds), 4),
                                         "expert": round(int(kept_right[mask].sum()) / rows, 4) if rows else None}  # fmt: skip
    return out
