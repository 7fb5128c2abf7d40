"""Does the critic read what is typed? Its Q of a right query against perturbed copies of it, at typing states.

Two thirds of Web Shopping's tasks hinge on a typed query, and Best-of-N
takes whichever of about 15 sampled candidates the critic scores highest:
a critic that cannot tell "seagate 2tb" from "seagte 2tb" picks mistyped
queries as often as right ones. At every held-out state where the
simulator's expert types, the right query (the data's own action where it is
right, else the first right TYPE candidate) is scored against versions of it
with a word dropped, two words swapped, a word misspelt and another task's
query (:func:`perturbations`). Every version keeps the right candidate's
VLM representation, so what changes is only what the critic reads of the
typed text: its text encoders (trained towers, or the frozen averages).

A critic that cannot tell them apart ties, so the uninformed level is one
half: each comparison adds 1 where the right query's Q is higher, one half
on a tie, and the report gives the mean minus one half, in points, with a
95% interval over held-out episodes and seeds (:func:`typed_text_report`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from digiq.env.actions import ActionType, format_action, parse_action, type_text
from digiq.models.critic import Critic
from digiq.models.critic_inputs import action_text, encode_texts
from digiq.models.policy import AutoUIPolicy
from digiq.stats import cluster_bootstrap

__all__ = ["PERTURBATIONS", "perturbations", "versions_of", "typing_states", "typed_versions_q", "typed_text_report"]

PERTURBATIONS = ("drop_word", "swap_words", "misspell", "other_task")


def perturbations(text: str, others: Sequence[str], rng: np.random.Generator) -> dict[str, str]:
    """Versions of a typed ``text``, each differing from it: a word dropped, two neighbouring words swapped, one
    word's two neighbouring letters swapped (one letter doubled where they are the same), another task's query
    from ``others``. Kinds a text cannot give (one word cannot lose or swap one) are left out."""
    words = text.split()
    out: dict[str, str] = {}
    if len(words) >= 2:
        i = int(rng.integers(len(words)))
        out["drop_word"] = " ".join(words[:i] + words[i + 1 :])
        j = int(rng.integers(len(words) - 1))
        swapped = [*words[:j], words[j + 1], words[j], *words[j + 2 :]]
        out["swap_words"] = " ".join(swapped)
    long = [k for k, w in enumerate(words) if len(w) >= 2]
    if long:
        k = long[int(rng.integers(len(long)))]
        w = words[k]
        c = int(rng.integers(len(w) - 1))
        typo = w[:c] + w[c + 1] + w[c] + w[c + 2 :] if w[c] != w[c + 1] else w[: c + 1] + w[c:]
        out["misspell"] = " ".join([*words[:k], typo, *words[k + 1 :]])
    other = sorted({o for o in others if o.strip() and o.strip().casefold() != text.strip().casefold()})
    if other:
        out["other_task"] = other[int(rng.integers(len(other)))]
    return {kind: version for kind, version in out.items() if version != text}


def versions_of(queries: Sequence[str], rng: np.random.Generator) -> tuple[list[list[str]], np.ndarray]:
    """Each right query followed by its :data:`PERTURBATIONS` (:func:`perturbations`; another task's from the other
    ``queries``), and (len(queries), len(PERTURBATIONS)) bool: which kinds it has. A kind it lacks repeats the query
    and is masked."""
    rows, available = [], np.zeros((len(queries), len(PERTURBATIONS)), bool)
    for i, query in enumerate(queries):
        made = perturbations(query, queries, rng)
        rows.append([query, *(made.get(kind, query) for kind in PERTURBATIONS)])
        available[i] = [kind in made for kind in PERTURBATIONS]
    return rows, available


def typing_states(right: np.ndarray, kinds: np.ndarray, action_lists: Sequence[Sequence[str]],
                  rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Of ``rows``, the states where the expert types and some candidate types what it would, and that candidate's
    column: the data's action (column 0) where it is one, else the first."""
    states, columns = [], []
    for i in rows:
        if kinds[i] != ActionType.TYPE.name:
            continue
        typed = [j for j, a in enumerate(action_lists[i]) if right[i, j] and _typed(a) is not None]
        if typed:
            states.append(int(i))
            columns.append(typed[0])
    return np.array(states, int), np.array(columns, int)


def _typed(action: str) -> str | None:
    parsed = parse_action(action)
    return parsed.text if parsed.is_valid and parsed.type is ActionType.TYPE else None


@torch.no_grad()
def typed_versions_q(critic: Critic, inputs: Mapping[str, np.ndarray], states: np.ndarray, columns: np.ndarray,
                     versions: Sequence[Sequence[str]], texts: Sequence[str],
                     policy: AutoUIPolicy | None = None) -> np.ndarray:  # fmt: skip
    """(len(states), V) Q of each state's typed ``versions`` (column 0 the right query), each read with the right
    candidate's (``columns``) VLM representation and inputs beyond the text: ``critic`` joined heads.

    ``inputs`` are the critic's (:func:`~digiq.models.critic.inputs_for`), ``texts`` the critic_inputs stage's
    ``texts.json``. A critic with towers reads the versions through them; one on frozen averages through
    ``policy``'s encoder (the base policy, which computed its averages).

    Raises:
        ValueError: a frozen critic without ``policy``, or one whose candidates read more than the action's text
            (the tapped element, the typed match, the list entry: their values for a version are not stored).
    """
    V = len(versions[0]) if len(versions) else 0
    actions = [format_action(type_text(v)) for row in versions for v in row]
    if critic.towers is not None:  # a table of only the texts these states and versions read
        goal = np.asarray(inputs["goal_row"])[states]
        before = np.asarray(inputs["before_rows"])[states]
        table = list(dict.fromkeys([*(texts[r] for r in goal), *(texts[r] for r in before.reshape(-1)),
                                    *(t for a in actions for t in action_text(a))]))  # fmt: skip
        critic = copy.copy(critic).read_texts(table)  # the same weights; the caller's critic keeps its own table
        at = {t: k for k, t in enumerate(table)}

        def rows_of(found: Sequence[str], shape: tuple[int, ...]) -> torch.Tensor:
            return torch.tensor([at[t] for t in found], dtype=torch.long).view(shape)

        vlm = torch.from_numpy(np.asarray(inputs["candidates"])[states, columns])[:, None].expand(-1, V, -1)
        batch = {"state": torch.from_numpy(np.asarray(inputs["state"])[states]),
                 "goal_row": rows_of([texts[r] for r in goal], (len(states),)),
                 "before_rows": rows_of([texts[r] for r in before.reshape(-1)], (len(states), 2)),
                 "candidates": vlm, "action_rows": rows_of([t for a in actions for t in action_text(a)],
                                                           (len(states), V, 2))}  # fmt: skip
        device = next(critic.parameters()).device
        x = critic.inputs({k: t.to(device) for k, t in batch.items()}, ("state", "candidates"), critic.encode_texts())
        state, candidates = x["state"], x["candidates"]
    else:
        if policy is None or critic.cfg.targets or critic.cfg.typed or critic.cfg.entries:
            raise ValueError("a frozen critic is checked with the base policy's encoder, on the action's text alone")
        state = critic.read(inputs, states, ("state",))["state"]
        kinds, typed = zip(*map(action_text, actions), strict=True) if actions else ((), ())
        text = np.concatenate([encode_texts(policy, list(kinds)), encode_texts(policy, list(typed))], 1)
        right = np.asarray(inputs["candidates"])[states, columns]
        vlm = right[:, : right.shape[1] - text.shape[1]]
        candidates = torch.from_numpy(
            np.concatenate([np.repeat(vlm[:, None], V, 1), text.reshape(len(states), V, -1)], 2)
        )
    q, _, _ = critic.advantage(state, candidates.to(state.device))
    return q.cpu().numpy()


def typed_text_report(q: Sequence[np.ndarray], available: np.ndarray, episodes: np.ndarray) -> dict[str, Any]:
    """How often the right query's Q is above each kind of version's (each seed's ``q`` from
    :func:`typed_versions_q`, ``available`` from :func:`versions_of`), per kind and over all: a win counts 1, a tie
    one half; the mean minus one half with a 95% interval over episodes and seeds
    (:func:`~digiq.stats.cluster_bootstrap`), beside the shares of wins and ties. ``episodes`` names each state's."""
    wins = np.stack([(s[:, :1] > s[:, 1:]) + 0.5 * (s[:, :1] == s[:, 1:]) for s in q])  # (seeds, states, kinds)
    ties = np.stack([s[:, :1] == s[:, 1:] for s in q])
    _, cluster = np.unique(episodes, return_inverse=True)
    out: dict[str, Any] = {}
    for name, cols in [("all", list(range(len(PERTURBATIONS)))), *((k, [c]) for c, k in enumerate(PERTURBATIONS))]:
        there = available[:, cols]  # (states, kinds counted)
        if not there.any():
            continue
        per_state = ((wins[:, :, cols] - 0.5) * there).sum(2)  # (seeds, states)
        sums = np.stack([np.bincount(cluster, weights=s, minlength=cluster.max() + 1) for s in per_state])
        counts = np.bincount(cluster, weights=there.sum(1)).astype(float)
        out[name] = {**cluster_bootstrap(sums, counts),
                     "win_share": round(float((wins[:, :, cols] * there).sum() / (there.sum() * len(q))), 4),
                     "tie_share": round(float((ties[:, :, cols] * there).sum() / (there.sum() * len(q))), 4)}  # fmt: skip
    return out
