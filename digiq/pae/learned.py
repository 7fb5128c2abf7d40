"""The learned evaluator: the pretrained tiny VLM fine-tuned to answer "is this task finished?".

With no VLM judge on a laptop CPU, PAE's evaluator is learned here from
stored episodes whose outcome is known: each step of the offline data is a
question (the task, the screen before and after the step side by side, the
step's action in words) whose answer is Yes when the task was done by that
step. A model could answer from the screens alone (a results page looks
finished whatever was asked), so each Yes is asked twice more, answered No:
with the task of an episode of another family, and with another task of its
own family where the store holds one (a search for something else, another
app to open), so the model must read the task's object as well as its verb.
Practice asks it after every step and ends the episode on its first "done",
so its threshold on P(Yes) is chosen as practice uses it, over whole
episodes of the validation tasks (:func:`choose_threshold`), never on the
tasks it will judge.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from digiq.data.trajectories import TrajectoryStore
from digiq.env.actions import ActionType, parse_action
from digiq.io import atomic_write_text
from digiq.models.checkpoint import part_digest
from digiq.models.vlm import ScreenVLM, trainable
from digiq.progress import progress

__all__ = ["Example", "LearnedEvaluator", "OTHER_FAMILY", "SAME_FAMILY", "action_words", "choose_threshold",
           "fit_evaluator", "question", "side_by_side", "stored_examples"]  # fmt: skip

OTHER_FAMILY, SAME_FAMILY = "other family", "same family"  # the two swapped-task questions asked of each Yes
VLM_DIGEST = "vlm_config_sha256"  # evaluator.json's key: the VLM its threshold was chosen for


def action_words(action: str) -> str:
    """An AutoUI action string as a few words: ``tap at [0.45, 0.49]``, ``type "dell xps"``, ``press Back``..."""
    a = parse_action(action)
    if a.type is ActionType.DUAL_POINT:
        (ty, tx), (ly, lx) = a.touch, a.lift
        return (
            f"tap at [{ty:.2f}, {tx:.2f}]" if a.is_tap else f"swipe from [{ty:.2f}, {tx:.2f}] to [{ly:.2f}, {lx:.2f}]"
        )
    if a.type is ActionType.TYPE:
        return f'type "{a.text}"'
    return {ActionType.PRESS_BACK: "press Back", ActionType.PRESS_HOME: "press Home",
            ActionType.PRESS_ENTER: "press Enter", ActionType.STATUS_TASK_COMPLETE: "declare the task done",
            ActionType.STATUS_TASK_IMPOSSIBLE: "declare the task impossible"}.get(a.type, "an invalid action")  # fmt: skip


def question(task: str, action: str) -> str:
    return f"<image>\nTask: {task}\nLast action: {action_words(action)}\nIs the task finished? Answer:"


def side_by_side(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """The screen before the step on the left, after it on the right: two phone screens make a near-square image."""
    return np.concatenate([before, after], axis=1)


@dataclass(frozen=True)
class Example:
    """One question: the image at the VLM's input size, the prompt, the answer (1 = Yes), its episode, and whose
    task it asks about (None: the episode's own; :data:`OTHER_FAMILY` or :data:`SAME_FAMILY`: a swapped one)."""

    image: np.ndarray
    prompt: str
    label: int
    traj_id: int
    swap: str | None = None


def stored_examples(store: TrajectoryStore, vlm: ScreenVLM, seed: int = 0, need_success: bool = True) -> list[Example]:
    """One example per stored step, in the store's order, and for each Yes two swapped-task Noes: the task of an
    episode of another family (:data:`OTHER_FAMILY`) and, where the store holds one, another task of the same family
    (:data:`SAME_FAMILY`).

    Raises:
        ValueError: the store holds no successful step (with ``need_success``: nothing to learn "finished" from),
            or no family other than the successes' to swap in.
    """
    t = store.read().select(["traj_id", "task", "family", "image_path", "next_image_path", "action", "reward"])
    rows = t.to_pylist()
    tasks_by_family: dict[str, list[str]] = {}
    for r in rows:
        tasks_by_family.setdefault(r["family"], [])
        if r["task"] not in tasks_by_family[r["family"]]:
            tasks_by_family[r["family"]].append(r["task"])
    if need_success and not any(r["reward"] > 0 for r in rows):
        raise ValueError(f"{store.root}: no successful step to learn 'finished' from")
    rng = random.Random(seed)
    out: list[Example] = []
    for i in progress(range(0, len(rows), 64), desc="evaluator examples"):
        batch = rows[i : i + 64]
        pairs = [store.load_images([r["image_path"], r["next_image_path"]]) for r in batch]
        images = vlm.recipe.base([side_by_side(before, after) for before, after in pairs])
        for r, image in zip(batch, images, strict=True):
            label = int(r["reward"] > 0)
            out.append(Example(image, question(r["task"], r["action"]), label, r["traj_id"]))
            if label:
                others = [task for fam, tasks in tasks_by_family.items() if fam != r["family"] for task in tasks]
                if not others:
                    raise ValueError(f"{store.root}: every episode is of family {r['family']!r}: no task to swap in")
                out.append(Example(image, question(rng.choice(others), r["action"]), 0, r["traj_id"], OTHER_FAMILY))
                kin = [task for task in tasks_by_family[r["family"]] if task != r["task"]]
                if kin:
                    out.append(Example(image, question(rng.choice(kin), r["action"]), 0, r["traj_id"], SAME_FAMILY))
    return out


def fit_evaluator(vlm: ScreenVLM, examples: Sequence[Example], *, epochs: float, batch_size: int, lr: float,
                  last_layers: int, seed: int) -> list[float]:  # fmt: skip
    """Fine-tune ``vlm`` on the examples' Yes/No answers (AdamW, constant rate); the loss per update."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    params = trainable(vlm, last_layers)
    opt = torch.optim.AdamW(params, lr=lr)
    order = list(range(len(examples)))
    total = max(1, round(epochs * len(examples) / batch_size))
    curve: list[float] = []
    vlm.model.train()
    bar = progress(total=total, desc="fit evaluator")
    while len(curve) < total:
        rng.shuffle(order)
        for i in range(0, len(order), batch_size):
            if len(curve) == total:
                break
            batch = [examples[j] for j in order[i : i + batch_size]]
            opt.zero_grad()
            loss = vlm.loss([e.image for e in batch], [e.prompt for e in batch],
                            torch.tensor([e.label for e in batch]))  # fmt: skip
            loss.backward()
            opt.step()
            curve.append(loss.item())
            bar.update()
    bar.close()
    vlm.model.eval()
    return curve


def choose_threshold(probabilities: np.ndarray, labels: np.ndarray, episodes: np.ndarray
                     ) -> tuple[float, dict[str, float]]:  # fmt: skip
    """The P(Yes) threshold with the best F1 of "finished" over whole episodes, judged as practice judges them, and
    its precision, recall and F1 there.

    The steps come in episode order (``episodes``: each step's episode; ``labels``: 1 at the step that finished
    its task). Practice ends an episode at its first step whose P(Yes) reaches the threshold: the episode is
    rightly said done when that step is its finishing step, wrongly when it comes before (or the episode never
    finished), and each episode counts once, however many of its steps reach the threshold. Candidates are the
    midpoints between sorted distinct probabilities (and the ends); ties go to the higher threshold, the more
    cautious evaluator.
    """
    p, y, ep = np.asarray(probabilities, float), np.asarray(labels, bool), np.asarray(episodes)
    starts = np.flatnonzero(np.r_[True, ep[1:] != ep[:-1]])
    if len(starts) != len(np.unique(ep)):
        raise ValueError("choose_threshold: each episode's steps must come together, in order")
    early, finish = [], []  # per episode: the highest P(Yes) before its finishing step, that step's P(Yes) (NaN: none)
    for steps, done in zip(np.split(p, starts[1:]), np.split(y, starts[1:]), strict=True):
        end = int(np.argmax(done)) if done.any() else len(steps)
        early.append(steps[:end].max(initial=-np.inf))
        finish.append(steps[end] if done.any() else np.nan)
    early_a, finish_a = np.array(early), np.array(finish)
    finished = ~np.isnan(finish_a)
    distinct = np.unique(p)
    candidates = np.concatenate([[0.0], (distinct[1:] + distinct[:-1]) / 2, [1.0]]) if len(distinct) else [0.5]
    best: tuple[float, float, dict[str, float]] = (-1.0, 0.0, {})
    for c in candidates:
        wrong = early_a >= c
        right = finished & ~wrong & (np.nan_to_num(finish_a, nan=-np.inf) >= c)
        said = int(wrong.sum() + right.sum())
        precision = right.sum() / said if said else 0.0
        recall = right.sum() / finished.sum() if finished.any() else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        if f1 >= best[0]:
            best = (f1, float(c), {"precision": round(float(precision), 4), "recall": round(float(recall), 4),
                                   "f1": round(float(f1), 4)})  # fmt: skip
    return best[1], best[2]


class LearnedEvaluator:
    """A fine-tuned VLM and its threshold as an :class:`~digiq.pae.evaluators.Evaluator`."""

    def __init__(self, vlm: ScreenVLM, threshold: float) -> None:
        self.vlm, self.threshold = vlm, threshold

    @torch.no_grad()
    def probabilities(self, tasks: Sequence[str], screens: Sequence[Sequence[np.ndarray]],
                      actions: Sequence[str]) -> np.ndarray:  # fmt: skip
        """P(Yes) for each (task, its last screens, its last action): the last two screens are shown."""
        images = self.vlm.recipe.base([side_by_side(s[-2] if len(s) > 1 else s[-1], s[-1]) for s in screens])
        _, yes = self.vlm.embed(images, [question(t, a) for t, a in zip(tasks, actions, strict=True)])
        return yes

    def finished(self, task: str, screens: Sequence[np.ndarray], action: str) -> bool:
        return bool(self.probabilities([task], [screens], [action])[0] >= self.threshold)

    def save(self, folder: Path, **meta: object) -> None:
        """The VLM in ``vlm/`` and the threshold (with ``meta``) in ``evaluator.json``, written last.

        The folder holds more (the stage's threshold episodes), so it is not
        replaced whole; ``evaluator.json`` records the digest of the VLM's
        config.json (which records the VLM's own digests), and a load refuses
        a threshold beside a VLM it was not chosen for (a save cut between the two).
        """
        self.vlm.save(folder / "vlm", stage="pae_evaluator")
        doc = {"threshold": self.threshold, VLM_DIGEST: part_digest(folder / "vlm" / "config.json"), **meta}
        atomic_write_text(folder / "evaluator.json", json.dumps(doc, indent=1))

    @classmethod
    def load(cls, folder: Path) -> LearnedEvaluator:
        """Raises: ValueError naming the folder when it holds no saved evaluator, or a VLM its threshold is not for."""
        meta = folder / "evaluator.json"
        if not meta.is_file():
            raise ValueError(f"{folder} holds no learned evaluator (no evaluator.json): run the pae stage first")
        doc = json.loads(meta.read_text())
        vlm = ScreenVLM.load(folder / "vlm")
        want = doc.get(VLM_DIGEST)  # none in an evaluator saved before it was recorded
        if want is not None and want != part_digest(folder / "vlm" / "config.json"):
            raise ValueError(f"{meta}: its threshold was chosen for another VLM than {folder / 'vlm'} (the digest "
                             "of its config.json differs); rerun the pae stage")  # fmt: skip
        return cls(vlm, float(doc["threshold"]))
