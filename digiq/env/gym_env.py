"""Gymnasium interface to the simulated device, single and batched.

Observation: ``{"screenshot": uint8 (H, W, 3), "task": instruction}``.
Action: an AutoUI action string (parsed with :func:`parse_action`, never
raising) or an :class:`Action`. Reward 1 when the task's success condition
holds, which also ends the episode; STATUS_TASK_COMPLETE / TASK_IMPOSSIBLE
end it too; the step limit truncates it (10 General, 20 Web Shopping).
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from digiq.env.actions import Action, ActionType, parse_action
from digiq.env.device import SimDevice
from digiq.env.hierarchy import hierarchy_xml
from digiq.env.state import Dynamics
from digiq.env.tasks import Task, parse_task
from digiq.env.ui import SCREEN_H, SCREEN_W

__all__ = ["AndroidSimEnv", "PhoneEnv", "SimVecEnv"]

_CHARSET = string.printable + "\u2019\u201c\u201d"
_ENDING = (ActionType.STATUS_TASK_COMPLETE, ActionType.STATUS_TASK_IMPOSSIBLE)


def _as_task(t: Task | str) -> Task:
    return t if isinstance(t, Task) else parse_task(t)


class PhoneEnv(gym.Env):
    """One phone working on one task per episode: the AitW episode rules every device backend shares.

    Subclasses say how a device starts an episode, carries out an action, shows
    its screen and judges success; the task drawing, step counting, rewards,
    termination and the info dict live here once, so the simulator and the
    emulator backend give the same results for the same device behaviour.

    Args:
        tasks: tasks (or instructions) to draw from at reset when none is given.
        width: screenshot width in pixels; the height keeps 1080x2280's aspect.
        max_steps: step limit; by default the task set's (10 General, 20 Web Shopping).
    """

    metadata = {"render_modes": ["rgb_array"]}
    # Whether stepping waits on something outside this process (a device over adb):
    # rollouts step such envs from threads so that a pool of devices works in parallel.
    parallel_steps = False
    # Whether the device is known to be lost for good (a cluster node that went away): rollouts retire it
    # before it takes an episode. A device in this process is never gone.
    gone = False

    def __init__(self, tasks: Sequence[Task | str] = (), width: int = 216, max_steps: int | None = None) -> None:
        self.tasks = [_as_task(t) for t in tasks]
        self.max_steps = max_steps
        self.width, self.height = width, round(width * SCREEN_H / SCREEN_W)
        self.observation_space = spaces.Dict(
            {
                "screenshot": spaces.Box(0, 255, (self.height, self.width, 3), np.uint8),
                "task": spaces.Text(max_length=512, charset=_CHARSET),
            }
        )
        self.action_space = spaces.Text(max_length=2048, charset=_CHARSET)
        self.render_mode = "rgb_array"
        self.task: Task | None = None
        self._steps = 0

    # ------------------------------------------------------------ backend hooks

    def _start(self, seed: int, task: Task) -> None:
        """Put the device at the start of ``task``'s episode (``seed`` drives a simulated device)."""
        raise NotImplementedError

    def _act(self, action: Action) -> bool:
        """Carry out ``action``; return whether the screen changed."""
        raise NotImplementedError

    def _succeeded(self) -> bool:
        """Whether the task is done on the device now."""
        raise NotImplementedError

    def render(self) -> np.ndarray:
        """The current screen, (H, W, 3) uint8 (read-only; copy before writing)."""
        raise NotImplementedError

    def view_hierarchy(self) -> str:
        """The current screen's view hierarchy, as ``uiautomator dump`` writes it (XML)."""
        raise NotImplementedError

    def screen_size(self) -> tuple[int, int]:
        """The screen's (width, height) in the view hierarchy's pixels."""
        return SCREEN_W, SCREEN_H

    # ------------------------------------------------------------ gymnasium API

    def _obs(self) -> dict[str, Any]:
        assert self.task is not None
        # A copy: frames may be shared (the simulator's render cache), and callers keep observations.
        return {"screenshot": self.render().copy(), "task": self.task.instruction}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode; ``options={"task": Task | str}`` picks the task."""
        super().reset(seed=seed)
        task = (options or {}).get("task")
        if task is None:
            if not self.tasks:
                raise ValueError(
                    f"{type(self).__name__}.reset needs options={{'task': ...}} when the env was built without tasks"
                )
            task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        self.task = _as_task(task)
        self._start(int(self.np_random.integers(2**31)), self.task)
        self._steps = 0
        return self._obs(), {"task": self.task.instruction, "family": self.task.family, "task_set": self.task.task_set}

    @property
    def step_limit(self) -> int:
        assert self.task is not None
        return self.max_steps if self.max_steps is not None else self.task.max_steps

    def step(self, action: str | Action) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        parsed = action if isinstance(action, Action) else parse_action(action)
        changed = self._act(parsed)
        self._steps += 1
        success = self._succeeded()
        terminated = success or parsed.type in _ENDING
        truncated = not terminated and self._steps >= self.step_limit
        return self._obs(), float(success), terminated, truncated, self._info(parsed, success, changed)

    def _info(self, action: Action, success: bool, changed: bool) -> dict[str, Any]:
        assert self.task is not None
        return {
            "action": action,
            "valid": action.is_valid,
            "error": action.error,
            "screen_changed": changed,
            "success": success,
            "family": self.task.family,
            "task_set": self.task.task_set,
            "step": self._steps,
        }


class AndroidSimEnv(PhoneEnv):
    """One simulated phone working on one task per episode.

    Args:
        tasks: tasks (or instructions) to draw from at reset when none is given.
        dynamics: in-the-wild disturbance rates.
        width: screenshot width in pixels.
        max_steps: step limit; by default the task set's (10 General, 20 Web Shopping).
    """

    def __init__(
        self,
        tasks: Sequence[Task | str] = (),
        dynamics: Dynamics | None = None,
        width: int = 216,
        max_steps: int | None = None,
    ) -> None:
        self.device = SimDevice(dynamics, width)
        super().__init__(tasks, width, max_steps)

    def _start(self, seed: int, task: Task) -> None:
        self.device.reset(seed, task.goal.setup, task.start_app)

    def _act(self, action: Action) -> bool:
        return self.device.step(action)

    def _succeeded(self) -> bool:
        assert self.task is not None
        return self.task.goal.check(self.device.state)

    def render(self) -> np.ndarray:
        return self.device.screenshot()

    def view_hierarchy(self) -> str:
        return hierarchy_xml(self.device.screen().widgets)


class SimVecEnv:
    """Many simulated phones stepped together, one task each.

    Episodes that have ended are left alone (their later actions are ignored
    and they report ``done``) until the next :meth:`reset`, which is what
    rollout collection wants: one episode per slot.
    """

    def __init__(self, n: int, dynamics: Dynamics | None = None, width: int = 216) -> None:
        if n < 1:
            raise ValueError(f"SimVecEnv needs at least one env, got n={n}")
        self.envs = [AndroidSimEnv(dynamics=dynamics, width=width) for _ in range(n)]
        self.done = np.ones(n, dtype=bool)

    def __len__(self) -> int:
        return len(self.envs)

    def reset(self, tasks: Sequence[Task | str], seeds: Sequence[int]) -> dict[str, Any]:
        if len(tasks) != len(self.envs) or len(seeds) != len(self.envs):
            raise ValueError(f"need {len(self.envs)} tasks and seeds, got {len(tasks)} and {len(seeds)}")
        for env, t, sd in zip(self.envs, tasks, seeds):
            env.reset(seed=int(sd), options={"task": t})
        self.done[:] = False
        return self._obs()

    def _obs(self) -> dict[str, Any]:
        return {
            "screenshot": np.stack([e.device.screenshot() for e in self.envs]),
            "task": [e.task.instruction if e.task else "" for e in self.envs],
        }

    def step(
        self, actions: Sequence[str | Action]
    ) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        n = len(self.envs)
        if len(actions) != n:
            raise ValueError(f"need {n} actions, got {len(actions)}")
        rewards, term, trunc = np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool)
        infos: list[dict[str, Any]] = []
        for i, (env, a) in enumerate(zip(self.envs, actions)):
            if self.done[i]:
                infos.append({"skipped": True})
                continue
            _, rewards[i], term[i], trunc[i], info = env.step(a)
            infos.append(info)
        self.done |= term | trunc
        return self._obs(), rewards, term, trunc, infos
