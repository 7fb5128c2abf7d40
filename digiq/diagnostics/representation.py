"""Linear probes: what each VLM's (state, action) features hold, apart from any critic.

A critic trained on a VLM's features may fail for reasons of its own (TD
targets, conservatism, too few rewarded steps). These probes ask only
whether the features themselves carry a fact: an L2-regularised logistic
regression (:func:`linear_probe`) is fit on the rows of the training
trajectories and scored, by AUROC and accuracy, on held-out trajectories
(:func:`~digiq.data.trajectories.split_trajectories`, the same split for
every VLM), so a VLM that merely memorises screens gains nothing. A linear
probe is deliberately weak: it measures what the features state plainly,
which is what a small critic head can use.

- ``changes_screen``: the candidate feature of the data's own action
  (column 0) against :func:`~digiq.models.vlm.effect_label` of the stored
  transition, exactly the label the VLM fine-tune trains on. The feature of
  the (state, action) pair alone, not concatenated with the state's: the
  VLM sees the screen when it embeds the pair, so the pair's feature is what
  is measured, and a state feature beside it would let the probe score from
  the screen without the action (a screen where anything changes it).
- ``tap_on_goal_element``: over the tap candidates of every state whose view
  hierarchy is stored, whether the element under the tap (the smallest one
  holding the point that has a text or a content description,
  :func:`labels_at`) is named in the task's goal (:func:`named_in_goal`).
  A VLM that reads the screen knows which element sits under the point; one
  that does not cannot tell "Clock" from "Camera". Without stored
  hierarchies the probe is absent, with the reason.

A probe can score well without reading the screen: on a launcher whose
icons always sit in the same place, the goal's words and the tap's position
alone say whether the tap lands on the named app, and the fine-tune's label
follows largely from the kind of action (Home always changes the screen).
So each probe is also fit on ``control`` features (:func:`control_features`)
that hold only the goal's words, the kind of action and where it lands, and
which words go with which places: what the probes' labels owe to the text.
A VLM's score above the control's is what its features carry beyond it.

The fits are cheap: full-batch L-BFGS from a zero start (nothing random,
the same fit on every run), on at most :data:`TAP_CAP` tap candidates drawn
with the stage's seed. The labels read every stored screenshot pair once,
as the VLM fine-tune does, and each stored view hierarchy with a drawn tap.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from digiq.data.candidates import read_candidates
from digiq.data.features import load_features
from digiq.data.trajectories import DataError, TrajectoryStore, split_trajectories, step_ids
from digiq.env.actions import Action, ActionType, parse_action
from digiq.env.catalog import stable_int
from digiq.env.hierarchy import node_bounds, parse_dump
from digiq.models.vlm import effect_label
from digiq.paths import Paths

__all__ = ["PROBES", "HOLDOUT", "TAP_CAP", "auroc", "linear_probe", "goal_words", "named_in_goal", "labels_at",
           "control_features", "feature_vlms", "representation_probes", "probe_table"]  # fmt: skip

PROBES = ("changes_screen", "tap_on_goal_element")
HOLDOUT = 0.3  # share of the trajectories the probes are scored on
TAP_CAP = 20_000  # tap candidates the goal-element probe is fit and scored on, at most
# The control's hashed one-hot blocks: goal words, and (goal word, tap cell) pairs on a GRID x GRID grid.
CONTROL_WORDS, CONTROL_PAIRS, GRID = 128, 512, 8
CONTROL = "control"  # the key of the control's probes beside the VLMs'

_WORD = re.compile(r"\w+")


def auroc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    """The area under the ROC curve of ``scores`` for boolean ``labels``: the chance a positive outscores a negative.

    Rank-based (Mann-Whitney), tied scores sharing their mean rank, so a
    constant score gives 0.5. ``None`` when the labels hold one class only.
    """
    s, y = np.asarray(scores, np.float64), np.asarray(labels, bool)
    pos, neg = int(y.sum()), int((~y).sum())
    if pos == 0 or neg == 0:
        return None
    order = np.argsort(s, kind="stable")
    _, first, counts = np.unique(s[order], return_index=True, return_counts=True)
    ranks = np.empty(len(s))
    ranks[order] = np.repeat(first + (counts + 1) / 2, counts)  # 1-based ranks, each tie group at its mean
    return float((ranks[y].sum() - pos * (pos + 1) / 2) / (pos * neg))


def linear_probe(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray, *,
                 l2: float = 1e-2, iterations: int = 100) -> dict[str, Any]:  # fmt: skip
    """Fit an L2-regularised logistic regression on (``x_train``, ``y_train``), score it on the test rows.

    Features are standardised with the train rows' mean and deviation (a
    constant one stays 0), and the weights, but not the bias, pay ``l2 / 2``
    times their squared norm beside the mean log-loss. Full-batch L-BFGS from
    zero weights: no random draw, so a rerun gives the same numbers.
    Returns the held-out ``auroc`` (``None`` if the test labels are one class),
    ``accuracy`` (a logit above 0 says positive), ``positive_rate`` of the test
    labels (the majority's accuracy is the larger of it and its complement),
    and the row counts ``n_train`` and ``n_test``.
    """
    if not len(x_train) or not len(x_test):
        raise ValueError(f"linear_probe needs train and test rows, got {len(x_train)} and {len(x_test)}")
    x_tr, x_te = torch.as_tensor(np.asarray(x_train, np.float32)), torch.as_tensor(np.asarray(x_test, np.float32))
    y_tr, y_te = torch.as_tensor(np.asarray(y_train, np.float32)), np.asarray(y_test, bool)
    mean, std = x_tr.mean(0), x_tr.std(0, unbiased=False)
    std = torch.where(std > 1e-6, std, torch.ones_like(std))
    x_tr, x_te = (x_tr - mean) / std, (x_te - mean) / std
    w = torch.zeros(x_tr.shape[1], requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=iterations, history_size=10, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(x_tr @ w + b, y_tr) + 0.5 * l2 * (w @ w)
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        scores = (x_te @ w + b).numpy()
    score = auroc(scores, y_te)
    return {"auroc": None if score is None else round(score, 4),
            "accuracy": round(float(((scores > 0) == y_te).mean()), 4),
            "positive_rate": round(float(y_te.mean()), 4), "n_train": len(x_tr), "n_test": len(x_te)}  # fmt: skip


def goal_words(text: str) -> list[str]:
    """The words of ``text``, case-folded: runs of letters, digits and underscores ("ebay.com" is two)."""
    return _WORD.findall(text.casefold())


def named_in_goal(label: str, goal: str) -> bool:
    """Whether the words of ``label`` occur in ``goal`` as consecutive words, case ignored; a label without words is not."""
    want, words = goal_words(label), goal_words(goal)
    return bool(want) and any(words[i : i + len(want)] == want for i in range(len(words) - len(want) + 1))


def labels_at(xml: str, points: Sequence[tuple[float, float]], size: tuple[int, int]) -> list[str]:
    """Per point ((y, x) in [0, 1]): the label of the smallest element of the view hierarchy ``xml`` that holds it.

    Only elements with a ``text`` or, failing that, a ``content-desc`` count
    (a layout's box holds every point and names nothing); of two equally
    small ones, the later in the dump, drawn on top, wins. "" where no
    labelled element holds the point. ``size`` is the screen's (width,
    height) in the dump's pixels.

    Raises:
        ValueError: ``xml`` is not well-formed, or a labelled node's bounds are malformed.
    """
    root = parse_dump(xml)
    width, height = size
    boxes = []
    for node in root.iter("node"):
        label = (node.get("text") or "").strip() or (node.get("content-desc") or "").strip()
        if not label:
            continue
        x0, y0, x1, y1 = node_bounds(node)
        boxes.append(((x1 - x0) * (y1 - y0), x0, y0, x1, y1, label))
    out = []
    for y, x in points:
        px, py = x * width, y * height
        hits = [(area, -i, label) for i, (area, x0, y0, x1, y1, label) in enumerate(boxes)
                if x0 <= px < x1 and y0 <= py < y1]  # fmt: skip
        out.append(min(hits)[2] if hits else "")
    return out


def control_features(goals: Sequence[str], actions: Sequence[Action]) -> np.ndarray:
    """(len(goals), D) features of the goal's text and the action alone, no screen: the probes' control.

    Per row: the goal's words hashed into :data:`CONTROL_WORDS` one-hot
    buckets, the action's kind one-hot, its touch point (y, x) ((-1, -1)
    without one), the touch point's cell on a :data:`GRID` x :data:`GRID`
    grid one-hot, and each (goal word, cell) pair hashed into
    :data:`CONTROL_PAIRS` buckets. The pairs let a linear probe learn where
    the element a word names tends to sit (the Clock icon's place on the
    launcher) without seeing the screen.
    """
    kinds = list(ActionType)
    width = CONTROL_WORDS + len(kinds) + 2 + GRID * GRID + CONTROL_PAIRS
    out = np.zeros((len(goals), width), np.float32)
    for i, (goal, action) in enumerate(zip(goals, actions, strict=True)):
        words = set(goal_words(goal))
        out[i, [stable_int("goal word", w) % CONTROL_WORDS for w in words]] = 1.0
        at = CONTROL_WORDS
        out[i, at + kinds.index(action.type)] = 1.0
        at += len(kinds)
        out[i, at : at + 2] = action.touch
        at += 2
        if action.type is ActionType.DUAL_POINT:
            y, x = (min(int(v * GRID), GRID - 1) for v in action.touch)
            out[i, at + y * GRID + x] = 1.0
            pairs = [at + GRID * GRID + stable_int("goal word at", w, y, x) % CONTROL_PAIRS for w in words]
            out[i, pairs] = 1.0
    return out


def feature_vlms(paths: Paths) -> list[str]:
    """The VLMs whose feature folders the embed stage wrote (``data/features/<vlm>``), sorted; its temporary folders left out."""
    root = paths.features().parent
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.exists() else []


class _Taps(NamedTuple):
    """The goal-element probe's rows: tap candidates (state, column) and their labels."""

    states: np.ndarray
    columns: np.ndarray
    labels: np.ndarray


def _tap_rows(store: TrajectoryStore, images: Sequence[str], goals: Sequence[str],
              action_lists: Sequence[Sequence[str]], seed: int) -> _Taps | str:  # fmt: skip
    """Up to :data:`TAP_CAP` tap candidates of the states with a stored view hierarchy, labelled; or why there are none."""
    stored = [store.has_hierarchy(image) for image in images]
    if not any(stored):
        return f"no view hierarchy stored in {store.root} (collect.view_hierarchy: false)"
    rows = [(s, c, a) for s, row in enumerate(action_lists) if stored[s]
            for c, a in enumerate(map(parse_action, row)) if a.is_tap]  # fmt: skip
    if not rows:
        return "no tap candidate at a state with a stored view hierarchy"
    if len(rows) > TAP_CAP:
        keep = np.sort(np.random.default_rng(seed).choice(len(rows), TAP_CAP, replace=False))
        rows = [rows[i] for i in keep]
    labels = np.zeros(len(rows), bool)
    by_state: dict[int, list[int]] = {}
    for i, (s, _, _) in enumerate(rows):
        by_state.setdefault(s, []).append(i)
    for s, idx in by_state.items():
        xml, size = store.load_hierarchy(images[s])
        try:
            names = labels_at(xml, [rows[i][2].touch for i in idx], size)
        except ValueError as e:
            raise DataError(f"{store.root / store.hierarchy_name(images[s])}: {e}") from None
        labels[idx] = [named_in_goal(name, goals[s]) for name in names]
    return _Taps(np.array([r[0] for r in rows]), np.array([r[1] for r in rows]), labels)


def _fit(x: np.ndarray, y: np.ndarray, held: np.ndarray) -> dict[str, Any]:
    """:func:`linear_probe` trained on the rows outside ``held`` and scored on those in it; absent without either."""
    if held.all():
        return {"absent": f"all {len(held)} rows are in held-out trajectories: none to fit on"}
    if not held.any():
        return {"absent": f"none of the {len(held)} rows is in a held-out trajectory: none to score on"}
    return linear_probe(x[~held], y[~held], x[held], y[held])


def representation_probes(paths: Paths, vlms: Sequence[str], *, threshold: float, seed: int) -> dict[str, Any]:
    """Both probes of the module docstring for each VLM in ``vlms`` (its folder under ``data/features``) and the control.

    ``threshold`` is the VLM fine-tune's (``vlm_finetune.threshold``), so
    ``changes_screen`` uses its label; ``seed`` draws the held-out
    trajectories and the tap candidates. A probe that cannot be fit is
    ``{"absent": why}``.
    """
    if CONTROL in vlms:
        raise ValueError(f"a feature folder named {CONTROL!r} would hide the probes' control; rename it")
    store = TrajectoryStore(paths.offline)
    steps = store.read().select(["traj_id", "step_id", "task", "image_path", "next_image_path"]).to_pandas()
    cands = read_candidates(paths)
    if not np.array_equal(step_ids(cands), steps[["traj_id", "step_id"]].to_numpy()):
        raise DataError(f"the rows of {paths.candidates} are not the steps of {paths.offline}; rerun augment_actions")
    action_lists = cands.column("action_list").to_pylist()
    held = steps.traj_id.isin(split_trajectories(steps.traj_id.tolist(), HOLDOUT, seed)).to_numpy()
    goals = steps.task.tolist()
    changed = np.array([effect_label(store.load_image(a), store.load_image(b), threshold)
                        for a, b in zip(steps.image_path, steps.next_image_path, strict=True)])  # fmt: skip
    taps = _tap_rows(store, steps.image_path.tolist(), goals, action_lists, seed)

    every = (np.arange(len(steps)), np.zeros(len(steps), int))  # each state's data's own action

    def both(features: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> dict[str, Any]:
        """Both probes on ``features(states, columns)``, the features of those (state, candidate) pairs."""
        on_goal = ({"absent": taps} if isinstance(taps, str) else
                   _fit(features(taps.states, taps.columns), taps.labels, held[taps.states]))  # fmt: skip
        return {"changes_screen": _fit(features(*every), changed, held), "tap_on_goal_element": on_goal}

    out: dict[str, Any] = {}
    for vlm in vlms:
        c = load_features(paths, vlm)["candidates"]
        out[vlm] = both(lambda states, columns, c=c: np.asarray(c[states, columns]))
    out[CONTROL] = both(lambda states, columns: control_features(
        [goals[s] for s in states], [parse_action(action_lists[s][k]) for s, k in zip(states, columns, strict=True)]))  # fmt: skip
    return out


def probe_table(probes: dict[str, Any]) -> pd.DataFrame:
    """One row per VLM and the control, per probe its held-out AUROC, accuracy, positive rate and rows (notebook)."""
    columns = ("auroc", "accuracy", "positive_rate", "n_test")
    return pd.DataFrame({(probe, key): {name: r[probe].get(key) for name, r in probes.items()}
                         for probe in PROBES for key in columns})  # fmt: skip
