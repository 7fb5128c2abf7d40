"""The simulated Android device, the AitW action space, tasks and the scripted expert."""

from digiq.env.actions import Action, ActionType, format_action, parse_action
from digiq.env.device import SimDevice
from digiq.env.expert import Expert, run_episode
from digiq.env.gym_env import AndroidSimEnv, SimVecEnv
from digiq.env.state import DeviceState, Dynamics, Page
from digiq.env.taskgen import generate_tasks
from digiq.env.tasks import Task, UnsupportedInstruction, parse_task

__all__ = [
    "Action",
    "ActionType",
    "AndroidSimEnv",
    "DeviceState",
    "Dynamics",
    "Expert",
    "Page",
    "SimDevice",
    "SimVecEnv",
    "Task",
    "UnsupportedInstruction",
    "format_action",
    "generate_tasks",
    "parse_action",
    "parse_task",
    "run_episode",
]
