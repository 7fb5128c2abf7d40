"""Policies as rollouts use them: a trained checkpoint sampling actions, and one with a skill lent by the expert."""

from __future__ import annotations

from digiq.config import EXPERT_SKILLS
from digiq.env.actions import ActionType, format_action, parse_action
from digiq.env.expert import next_action
from digiq.env.gym_env import AndroidSimEnv
from digiq.models.policy import AutoUIPolicy
from digiq.rollout import Policy, RolloutBatch

__all__ = ["ModelPolicy", "ExpertSkill"]


class ModelPolicy:
    """A trained policy as a rollout :class:`~digiq.rollout.Policy` (sampling at ``temperature``, or greedy)."""

    def __init__(self, model: AutoUIPolicy, temperature: float = 1.0, greedy: bool = False) -> None:
        self.model, self.temperature, self.greedy = model, temperature, greedy

    def act(self, batch: RolloutBatch) -> list[str]:
        images = self.model.screen.prepare(batch.screenshots)
        out = self.model.sample(batch.observations, images, n=1, temperature=self.temperature, greedy=self.greedy,
                                noise=batch.noise)  # fmt: skip
        return [o[0] for o in out]


class ExpertSkill:
    """A policy with one skill taken from the simulator's noiseless expert: where does its success go?

    - ``type``: when both type, the expert's text replaces the policy's.
    - ``tap``: when both touch the screen, the expert's points replace the policy's.
    - ``action_type``: when the kinds differ, the expert's action replaces the policy's.

    Everything else stays the policy's own. The rise in success over the
    policy alone bounds what mending that one skill could give; for the base
    policy it says which skill the offline methods have to teach. Simulator
    only: the expert reads the device's state.
    """

    def __init__(self, policy: Policy, skill: str) -> None:
        if skill not in EXPERT_SKILLS:
            raise ValueError(f"skill must be one of {EXPERT_SKILLS}, got {skill!r}")
        self.policy, self.skill = policy, skill

    def act(self, batch: RolloutBatch) -> list[str]:
        out = []
        for env, text in zip(batch.envs, self.policy.act(batch), strict=True):
            if not isinstance(env, AndroidSimEnv) or env.task is None:
                raise TypeError(f"ExpertSkill needs in-process simulated phones, got {type(env).__name__}")
            own, expert = parse_action(text), next_action(env.device, env.task)
            same_kind = own.type == expert.type
            lend = {"type": same_kind and own.type == ActionType.TYPE,
                    "tap": same_kind and own.type == ActionType.DUAL_POINT,
                    "action_type": not same_kind}[self.skill]  # fmt: skip
            out.append(format_action(expert) if lend else text)
        return out
