"""Who says a practised task is done: the evaluator protocol, and the env that ends episodes on its verdict.

PAE's evaluator sees the task, the agent's last three screenshots and its
answer, and says SUCCESS or NOT SUCCESS; the reward is that verdict, given at
the end. An AutoUI action carries no answer and the tiny policy writes no
reasoning, so here the evaluator is asked after every step (the task, the
last screens, the last action), and the episode ends on its first "done", as
an episode on the simulator ends when the task's check first holds.

Three evaluators share the protocol (:class:`Evaluator`):

- ``learned`` (:class:`digiq.pae.learned.LearnedEvaluator`): the tiny VLM fine-tuned to answer "is this task
  finished?", the CPU default;
- ``judge`` (:class:`JudgeEvaluator`): a chat VLM over the judge's endpoint, asked as PAE asks;
- ``oracle``: the device's own check of the task (the simulator's ground truth), an upper bound: no
  wrapper at all, the env decides as it always does.

:class:`JudgedEnv` puts a learned or judge evaluator in charge of an env: its
reward, termination and ``info["success"]`` are the evaluator's; the
device's own check, where it has one, is kept as ``info["ground_truth"]``
for reports only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from digiq.env.actions import Action, ActionType, format_action
from digiq.env.adb_env import VerdictError
from digiq.env.gym_env import PhoneEnv
from digiq.judge import VLMJudge, image_part

__all__ = ["SCREENS", "Evaluator", "JudgeEvaluator", "JudgedEnv"]

SCREENS = 3  # the last screenshots an evaluator sees, as PAE's does
_ENDING = (ActionType.STATUS_TASK_COMPLETE, ActionType.STATUS_TASK_IMPOSSIBLE)


class Evaluator(Protocol):
    """Whether ``task`` is done, from the last screens (oldest first, at most :data:`SCREENS`) and the last action.

    May raise :class:`~digiq.env.adb_env.VerdictError` for a step it cannot judge (a fault of that episode).
    """

    def finished(self, task: str, screens: Sequence[np.ndarray], action: str) -> bool: ...


class JudgedEnv:
    """``env`` with ``evaluator`` deciding success: what a rollout steps during practice.

    Each step asks the evaluator about the task, the last :data:`SCREENS`
    screens and the action; the episode ends on its "done", on the agent's own
    ending action, or at the step limit, never on the device's check, which
    is reported as ``info["ground_truth"]`` (None for a task it cannot check).
    Everything else is the wrapped env's.
    """

    def __init__(self, env: PhoneEnv, evaluator: Evaluator) -> None:
        self.env, self.evaluator = env, evaluator
        self.screens: deque[np.ndarray] = deque(maxlen=SCREENS)

    def __getattr__(self, name: str) -> Any:  # task, serial, parallel_steps, gone, view_hierarchy, close, ...
        return getattr(self.env, name)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
        obs, info = self.env.reset(seed=seed, options=options)
        self.screens.clear()
        self.screens.append(obs["screenshot"])
        return obs, info

    def step(self, action: str | Action) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        obs, truth, _, truncated, info = self.env.step(action)
        if info.get("fault") or info.get("verdict_fault"):
            return obs, 0.0, False, truncated, info
        self.screens.append(obs["screenshot"])
        task = self.env.task
        assert task is not None
        text = action if isinstance(action, str) else format_action(action)
        try:
            done = self.evaluator.finished(task.instruction, list(self.screens), text)
        except VerdictError as e:
            if e.count_failed:
                return obs, 0.0, False, True, {**info, "success": False, "verdict_fault": f"evaluator: {e}"}
            return obs, 0.0, False, True, {**info, "fault": f"evaluator: {e}"}
        terminated = done or info["action"].type in _ENDING
        truncated = not terminated and info["step"] >= self.env.step_limit
        ground_truth = bool(truth) if task.checkable else None
        return obs, float(done), terminated, truncated, {**info, "success": done, "ground_truth": ground_truth}


# PAE's evaluator question, in words of our own: the task, the agent's last screens, a reasoned reply, a verdict.
JUDGE_SYSTEM = (
    "You check whether a phone assistant completed a user's task. You see the task and the phone's last few "
    "screens, oldest first; the last one is the screen now. The task is complete when these screens show its "
    "result. Judge only from what they show."
)
JUDGE_FORMAT = (
    "Think about what the screens would show if the task were complete and whether they show it. "
    "End with one line: 'Status: success' or 'Status: failure'."
)


class JudgeEvaluator(VLMJudge):
    """The VLM judge asked as PAE asks: the task and the last screens (no action), a reasoned reply, read by the
    repository's verdict parser (:func:`digiq.judge.verdict`), so anything but a clear verdict is none.

    Everything else is :class:`~digiq.judge.VLMJudge`'s: a step without a verdict is
    :class:`~digiq.judge.NoVerdict` (``judge.bad_reply`` decides whether its episode starts again or ends
    failed), too many in a row stop the stage, and no message carries the key.
    """

    def finished(self, task: str, screens: Sequence[np.ndarray], action: str) -> bool:
        return self.judge(task, np.stack(screens))

    def messages(self, task: str, screenshot: np.ndarray) -> list[dict[str, Any]]:
        """The chat for the screens ``screenshot`` stacks (k, H, W, 3), oldest first."""
        shown = [image_part(s, self.cfg.max_image_side) for s in screenshot]
        content = [*shown, {"type": "text", "text": f"Task: {task}\n{JUDGE_FORMAT}"}]
        return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": content}]
