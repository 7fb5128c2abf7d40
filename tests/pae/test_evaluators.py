"""The evaluators and the env they put in charge: verdicts end episodes, ground truth is only reported."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from digiq.config import JudgeConfig
from digiq.data.trajectories import TrajectoryStore
from digiq.env.gym_env import AndroidSimEnv
from digiq.env.taskgen import generate_tasks
from digiq.env.tasks import parse_task, unchecked_task
from digiq.judge import NoVerdict
from digiq.models.tokenizer import default_corpus, train_tokenizer
from digiq.models.vlm import ScreenVLM, VLMConfig
from digiq.pae.evaluators import SCREENS, JudgedEnv, JudgeEvaluator
from digiq.pae.learned import (
    OTHER_FAMILY,
    SAME_FAMILY,
    LearnedEvaluator,
    action_words,
    choose_threshold,
    fit_evaluator,
    question,
    stored_examples,
)
from digiq.rollout import ExpertPolicy, RolloutBatch, rollout


class Scripted:
    """Says "done" at the steps given (1-based, per episode); records what it was shown."""

    def __init__(self, done_at: set[int]) -> None:
        self.done_at, self.calls = done_at, []

    def finished(self, task, screens, action):
        self.calls.append((task, len(screens), action))
        return sum(1 for c in self.calls if c[0] == task) in self.done_at


def test_the_evaluator_ends_the_episode_and_ground_truth_is_only_reported():
    task = parse_task("Open the clock")
    env = JudgedEnv(AndroidSimEnv(), Scripted({3}))
    env.reset(seed=0, options={"task": task})
    expert = ExpertPolicy(seed=0)
    outcomes = []
    for _ in range(5):
        shot = env.render()
        action = expert.act(RolloutBatch(shot[None], [""], [env.env], [0]))[0]
        outcomes.append(env.step(action))
        if outcomes[-1][2] or outcomes[-1][3]:
            break
    rewards = [o[1] for o in outcomes]
    assert rewards == [0.0, 0.0, 1.0] and outcomes[-1][2]  # the evaluator's third "done", not the clock's opening
    assert outcomes[0][4]["ground_truth"] is True or outcomes[1][4]["ground_truth"] is True  # opened before the end
    assert [o[4]["success"] for o in outcomes] == [False, False, True]
    assert [c[1] for c in env.evaluator.calls] == [2, 3, 3]  # the last screens, at most SCREENS
    assert SCREENS == 3


def test_a_task_the_device_cannot_check_has_no_ground_truth_and_runs_to_the_step_limit():
    env = JudgedEnv(AndroidSimEnv(), Scripted(set()))
    env.reset(seed=0, options={"task": unchecked_task("Wake me up at 6:20am")})
    for k in range(1, 11):
        _, reward, terminated, truncated, info = env.step('Action Decision: "action_type": "PRESS_HOME"')
        assert info["ground_truth"] is None and reward == 0.0 and not terminated
        assert truncated == (k == 10)


def test_a_rollout_reports_ground_truth_beside_the_verdict(tmp_path):
    tasks = [parse_task(t) for t in generate_tasks("general", "train", 4, seed=1)]
    never = rollout(
        ExpertPolicy(seed=0), tasks, n_envs=2, env_factory=lambda: JudgedEnv(AndroidSimEnv(), Scripted(set()))
    )
    assert not any(r.success for r in never)
    assert [r.ground_truth for r in never] == [True] * 4  # the expert did every task; the evaluator never said so
    plain = rollout(ExpertPolicy(seed=0), tasks, n_envs=2)
    assert all(r.success for r in plain) and {r.ground_truth for r in plain} == {None}


# ---------------------------------------------------------------- the learned evaluator


@pytest.fixture(scope="module")
def expert_store(tmp_path_factory) -> TrajectoryStore:
    tasks = [parse_task(t) for ts in ("general", "webshop") for t in generate_tasks(ts, "train", 6, seed=2)]
    store = TrajectoryStore(tmp_path_factory.mktemp("evaluator") / "offline")
    rollout(ExpertPolicy(noise=0.3, seed=1), tasks, n_envs=4, store=store)
    return store


@pytest.fixture(scope="module")
def vlm() -> ScreenVLM:
    tok = train_tokenizer(default_corpus(n_tasks=40), vocab_size=400)
    return ScreenVLM.tiny(tok, VLMConfig(image_size=32, vision_hidden=32, hidden=32, layers=1), seed=0)


def test_examples_ask_each_step_and_each_success_again_with_another_familys_task_and_a_kin_task(expert_store, vlm):
    steps = expert_store.read().to_pandas()
    examples = stored_examples(expert_store, vlm, seed=0)
    plain = [e for e in examples if e.swap is None]
    other = [e for e in examples if e.swap == OTHER_FAMILY]
    kin = [e for e in examples if e.swap == SAME_FAMILY]
    assert len(plain) == len(steps) and sum(e.label for e in plain) == int((steps.reward > 0).sum())
    assert len(other) == sum(e.label for e in plain) and not any(e.label for e in other + kin)
    family = dict(zip(steps.task, steps.family))
    tasks_of = steps.groupby("family").task.nunique()
    done_tasks = steps[steps.reward > 0].task
    # a kin question for each success whose family holds another task, and none for the rest
    assert len(kin) == sum(tasks_of[family[t]] > 1 for t in done_tasks) > 0
    for e in other + kin:
        original = steps[steps.traj_id == e.traj_id].task.iat[0]
        shown = e.prompt.split("Task: ")[1].split("\n")[0]
        assert shown != original and (family[shown] == family[original]) == (e.swap == SAME_FAMILY)
    assert plain[0].image.shape == (32, 32, 3)


def test_action_words_are_short_and_name_the_action():
    assert action_words('Action Decision: "action_type": "TYPE", "touch_point": "[-1.0, -1.0]", '
                        '"lift_point": "[-1.0, -1.0]", "typed_text": "dell xps"') == 'type "dell xps"'  # fmt: skip
    assert action_words("nonsense") == "an invalid action"
    assert question("Open the clock", "nonsense").startswith("<image>\nTask: Open the clock\nLast action: an invalid")


def test_fitting_lowers_the_loss_and_the_evaluator_round_trips(expert_store, vlm, tmp_path):
    examples = stored_examples(expert_store, vlm, seed=0)[:48]
    tuned = vlm.fresh()
    curve = fit_evaluator(tuned, examples, epochs=6, batch_size=16, lr=3e-3, last_layers=0, seed=0)
    assert len(curve) == 18 and np.mean(curve[-3:]) < np.mean(curve[:3])
    evaluator = LearnedEvaluator(tuned, 0.42)
    evaluator.save(tmp_path / "ev", trained_on=len(examples))
    again = LearnedEvaluator.load(tmp_path / "ev")
    assert again.threshold == 0.42
    screens = [np.zeros((456, 216, 3), np.uint8), np.full((456, 216, 3), 200, np.uint8)]
    p1 = evaluator.probabilities(["Open the clock"], [screens], ["nonsense"])
    p2 = again.probabilities(["Open the clock"], [screens], ["nonsense"])
    assert torch.allclose(torch.tensor(p1), torch.tensor(p2))
    with pytest.raises(ValueError, match="holds no learned evaluator"):
        LearnedEvaluator.load(tmp_path)


def test_the_threshold_is_the_best_f1_over_episodes_ended_at_their_first_done():
    # Episode 0 finished at its second step (0.9), episode 1 never did. A threshold at or below 0.6 ends episode 0 at
    # its first step, before it finished: wrong. Above 0.6 and up to 0.9 both episodes are judged right.
    p = np.array([0.6, 0.9, 0.5])
    threshold, stats = choose_threshold(p, np.array([0, 1, 0]), np.array([0, 0, 1]))
    assert threshold == pytest.approx(0.75) and stats == {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    # Episode 0's five wrong steps count once, as one episode wrongly said done; episodes 1 and 2 finished at 0.6
    # and 0.4. Saying done to all three is the best F1 (0.8); counted per step, 0.55 (F1 0.67) would win.
    p = np.array([0.5] * 5 + [0.6, 0.4])
    threshold, stats = choose_threshold(p, np.array([0] * 5 + [1, 1]), np.array([0] * 5 + [1, 2]))
    assert threshold == 0.0 and stats == {"precision": 0.6667, "recall": 1.0, "f1": 0.8}
    with pytest.raises(ValueError, match="must come together"):
        choose_threshold(p[:4], np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1]))


# ---------------------------------------------------------------- the judge as evaluator


def test_the_judge_evaluator_sees_the_last_screens_and_the_task_not_the_action(serve):
    server = serve((200, "The list of alarms shows 6:20.\nStatus: success", {}), (200, "I cannot tell.", {}))
    judge = JudgeEvaluator(JudgeConfig(base_url=server.url, api_key_env="", bad_reply="retry"))
    screens = [np.zeros((40, 20, 3), np.uint8)] * 3
    assert judge.finished("Set an alarm at 6:20am", screens, "press-home-action") is True
    content = server.requests[0][2]["messages"][1]["content"]
    assert [part["type"] for part in content] == ["image_url"] * 3 + ["text"]
    assert "Set an alarm at 6:20am" in content[-1]["text"] and "press-home-action" not in str(content)
    with pytest.raises(NoVerdict, match="no Status"):
        judge.finished("Set an alarm at 6:20am", screens, "")
