import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from digiq.env import AndroidSimEnv, Dynamics, Expert, SimVecEnv, format_action
from digiq.env.actions import task_complete


def test_passes_gymnasium_checker():
    check_env(AndroidSimEnv(["Open the clock", "What's the news in Peru?"]), skip_render_check=True)


def test_episode_api_reward_termination_info():
    env = AndroidSimEnv(dynamics=Dynamics.calm())
    obs, info = env.reset(seed=0, options={"task": "Open the calculator"})
    assert obs["task"] == "Open the calculator" and info["family"] == "open_app"
    assert env.observation_space.contains(obs)
    action = format_action(Expert().act(env.device, env.task))  # the AutoUI string form
    obs, r, term, trunc, info = env.step(action)
    assert (r, term, trunc, info["success"], info["valid"]) == (1.0, True, False, True, True)


def test_task_complete_ends_without_reward_when_not_done():
    env = AndroidSimEnv()
    env.reset(seed=0, options={"task": "Open the calculator"})
    _, r, term, _, _ = env.step(task_complete())
    assert term and r == 0.0


@pytest.mark.parametrize("instruction, limit", [("Open the calculator", 10), ("Go to ebay.com", 20)])
def test_truncation_at_task_set_step_limit(instruction, limit):
    env = AndroidSimEnv()
    env.reset(seed=0, options={"task": instruction})
    for i in range(limit):
        _, _, term, trunc, _ = env.step("not an action")
        assert not term and trunc == (i == limit - 1)


def test_reset_without_task_needs_tasks():
    with pytest.raises(ValueError, match="task"):
        AndroidSimEnv().reset(seed=0)


def test_vector_env_steps_many_devices():
    tasks = ["Open the clock", "What's the news in Peru?", "Go to walmart.com", "Install the Strava app"]
    vec = SimVecEnv(len(tasks), width=108)
    obs = vec.reset(tasks, seeds=range(4))
    assert obs["screenshot"].shape == (4, 228, 108, 3)
    experts = [Expert() for _ in tasks]
    total = np.zeros(4)
    for _ in range(20):
        acts = [e.act(env.device, env.task) for e, env in zip(experts, vec.envs)]
        obs, rew, *_ = vec.step(acts)
        total += rew
        if vec.done.all():
            break
    assert total.tolist() == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="actions"):
        vec.step(["x"])
