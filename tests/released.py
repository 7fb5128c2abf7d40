"""Files with the released Digi-Q / DigiRL schema, built here: the importer's and start-at's tests read them."""

import numpy as np
import torch
from PIL import Image

from digiq.data import mc_returns
from digiq.data.candidates import SPLIT
from digiq.data.legacy import IMAGE_PREFIX
from digiq.env.actions import format_action, press_back, press_enter, tap, type_text

TASKS = ("Search for hotels in Paris", "Open the settings", "Play some jazz on the moon")  # the last: unsupported


def released(tmp_path, digiq: bool, mc: bool = True) -> tuple[list, object]:
    """Trajectories with the released keys, their images under ``imgs/`` referenced through the prefix.

    Episode ``t``'s screens are ``ep<t>_<k>.png``, k = 0 .. its length. As
    DigiRL writes them, a step's ``image_path`` is the screen after its action
    (k = step + 1); Digi-Q's files name the screen before it and add
    ``next_image_path``.
    """
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    rng = np.random.default_rng(0)
    actions = [format_action(a) for a in (tap(0.2, 0.5), type_text("hotels in Paris"), press_enter(), press_back())]
    data = []
    for t, (task, n) in enumerate(zip(TASKS, (3, 2, 4), strict=True)):
        names = [f"ep{t}_{s}.png" for s in range(n + 1)]
        for name in names:
            Image.fromarray(rng.integers(0, 255, (24, 12, 3), dtype=np.uint8)).save(imgs / name)
        rewards = [0.0] * (n - 1) + [float(t != 2)]
        traj = []
        for s in range(n):
            step = {"observation": f"Previous Actions: Goal: {task}", "next_observation": f"Previous Actions: x Goal: {task}",
                    "image_features": torch.randn(1408), "next_image_features": torch.randn(1408),
                    "image_path": f"{IMAGE_PREFIX}/{names[s if digiq else s + 1]}", "task": task, "reward": rewards[s],
                    "done": s == n - 1, "action": actions[s % 4], "trajectory_reward": max(rewards)}  # fmt: skip
            if mc:
                step["mc_return"] = mc_returns(rewards, 0.95)[s]
            if digiq:
                cands = [actions[s % 4], actions[(s + 1) % 4], 'Action Decision: "action_type": "DUAL_POINT", garbled']
                step.update({"traj_id": 10 + t, "step_id": s, "next_image_path": f"{IMAGE_PREFIX}/{names[s + 1]}",
                             "action_list": SPLIT.join(cands), "q_rep_out_list": torch.randn(3, 8),
                             "q_response_list": ["Yes", "No", "No"]})  # fmt: skip
            traj.append(step)
        data.append(traj)
    return data, imgs


def save_released(tmp_path, data) -> object:
    path = tmp_path / "released.pt"
    torch.save(data, path)
    return path
