import numpy as np
import pytest
import torch

from digiq.data import TrajectoryStore
from digiq.diagnostics.ground_truth import behaviour_values, candidate_values, expert_equivalent, replay
from digiq.diagnostics.probes import expert_probe, expert_probe_half, feature_probe, within_state_share
from digiq.diagnostics.reports import (
    action_kinds,
    behaviour_report,
    distinct_decisions,
    expert_pick_report,
    ranking_report,
    support_report,
    wrong_pick_report,
)
from digiq.env import Dynamics, parse_task
from digiq.env.actions import (
    format_action,
    parse_action,
    press_back,
    press_enter,
    press_home,
    tap,
    task_complete,
    type_text,
)
from digiq.env.expert import next_action
from digiq.env.taskgen import generate_tasks
from digiq.models.agents import ExpertSkill
from digiq.rollout import ExpertPolicy, RolloutBatch, episode_seed, rollout


def test_replay_rebuilds_the_stored_state_exactly(tmp_path):
    tasks = [parse_task(t) for t in generate_tasks("webshop", "train", 4, seed=2)]
    store = TrajectoryStore(tmp_path)
    rollout(ExpertPolicy(noise=0.3, seed=1), tasks, n_envs=2, seed=5, width=108, store=store)
    table = store.read().to_pandas()
    for _, r in table.iloc[::3].iterrows():
        earlier = table.action[(table.traj_id == r.traj_id) & (table.step_id < r.step_id)].tolist()
        dev = replay(tasks[r.traj_id], episode_seed(5, int(r.traj_id)), earlier, Dynamics(), 108)
        assert np.array_equal(dev.screenshot(), store.load_image(r.image_path)), (r.traj_id, r.step_id)


def test_the_right_action_is_worth_more_than_giving_up_or_going_home():
    task = parse_task("Search for hotels in Paris")
    dev = replay(task, 3, [], Dynamics.calm(), 108)
    right = format_action(next_action(dev, task))
    values = candidate_values(dev, task, task.max_steps, [right, format_action(task_complete()),
                                                          format_action(press_home())],
                              rollouts=3, noise=0.0, gamma=0.9, seed=0)  # fmt: skip
    assert values[1] == 0.0  # declaring success on the home screen ends the episode, failed
    # Tap the box, type, Enter: success on the third step (worth gamma^2); Home first wastes one step.
    assert np.allclose(values[[0, 2]], [0.9**2, 0.9**3])


def test_expert_equivalent_candidates_reach_the_experts_next_state():
    task = parse_task("Search for hotels in Paris")
    dev = replay(task, 3, [], Dynamics(), 108)
    box = next_action(dev, task)  # from the home screen: tap the search box
    assert box.is_tap
    y, x = box.touch
    near, far = format_action(tap(y + 0.004, x + 0.004)), format_action(tap(0.97, 0.5))
    picks = expert_equivalent(dev, task, [format_action(box), near, far, format_action(task_complete()),
                                          format_action(press_home()), "not an action"])  # fmt: skip
    assert picks.tolist() == [True, True, False, False, False, False]
    dev.step(box)
    typing = next_action(dev, task)
    assert typing.text == "hotels in Paris"
    picks = expert_equivalent(dev, task, [format_action(type_text("hotels in Pari")), format_action(typing)])
    assert picks.tolist() == [False, True]


def test_ranking_report_counts_hits_only_where_candidates_differ():
    oracle = np.array([[1.0, 0.5, 0.0], [0.7, 0.7, 0.7], [0.2, 0.9, 0.88]])
    valid = np.array([[True, True, True], [True, True, True], [True, True, False]])
    critic = np.array([[0.3, 0.1, 0.2], [0.0, 1.0, 0.0], [0.0, 0.0, 5.0]])  # the invalid top score is skipped
    distinct = np.array([[True, True, False], [True, True, True], [True, True, True]])  # state 1: #2 drawn twice
    report = ranking_report(oracle, valid, distinct, {"critic": critic}, tolerance=0.05)
    assert report["states"] == 3 and report["informative_states"] == 2  # the second state: all equal
    assert report["top1_hit_rate"]["critic"] == 0.5  # right in state 1; in state 3 it picks 0.2 over 0.9
    assert report["top1_hit_rate"]["base_sample"] == round((1 / 3 + 1 / 2) / 2, 4)
    assert report["top1_hit_rate"]["uninformed"] == round((1 / 2 + 1 / 2) / 2, 4)
    assert report["oracle_value_of_pick"]["uninformed"] == round((0.75 + 0.55) / 2, 4)
    assert report["oracle_value_of_pick"]["best"] == 0.95


class _Scripted:
    """A continuation policy that answers every prompt with one fixed action, and records what it saw."""

    def __init__(self, action: str) -> None:
        self.action, self.prompts = action, []

    def act(self, batch: RolloutBatch) -> list[str]:
        assert batch.screenshots.shape[0] == len(batch.observations)
        self.prompts += batch.observations
        return [self.action] * len(batch.observations)


def test_behaviour_values_follow_the_continuation_policy_not_the_expert():
    task = parse_task("Search for hotels in Paris")
    dev = replay(task, 3, [], Dynamics.calm(), 108)
    box = next_action(dev, task)  # tap the search box; then the expert types the query and presses Enter
    after = dev.clone()
    after.step(box)
    query = format_action(next_action(after, task))
    home, invalid = format_action(press_home()), "not an action"
    candidates = [format_action(box), home, invalid, format_action(box)]
    # A policy that only ever types the query: after the tap that focuses the box it types, but never presses
    # Enter, so no candidate succeeds and the objective prefers none (a flat state).
    typist = _Scripted(query)
    values = behaviour_values([(dev, task, [], candidates)], typist, rollouts=2, gamma=0.9, seed=0)[0]
    assert values.tolist() == [0.0, 0.0, 0.0, 0.0]
    assert all(p.startswith("Previous Actions:") for p in typist.prompts)
    decision = home.split("Action Decision: ")[-1]  # prompts show an action's decision part
    assert any(decision in p for p in typist.prompts) and not any(invalid in p for p in typist.prompts)
    reader = _Scripted(query)  # a base that reads the screen's elements gets them in its prompts, as in collection
    behaviour_values([(dev, task, [], [home])], reader, rollouts=1, gamma=0.9, seed=0, screen_text=True)
    assert reader.prompts and all(" Screen: " in p for p in reader.prompts)
    # After typing: Enter as the candidate succeeds at once (worth 1); after Home, a policy that presses Enter
    # has no query to submit and never succeeds.
    after.step(parse_action(query))
    enter = format_action(next_action(after, task))
    values = behaviour_values([(after, task, [format_action(box), query], [enter, home])], _Scripted(enter),
                              rollouts=2, gamma=0.9, seed=0)[0]  # fmt: skip
    assert values.tolist() == [1.0, 0.0]


def test_behaviour_report_counts_flat_states_among_informative_ones_per_task_set():
    oracle = np.array([[1.0, 0.0], [1.0, 0.0], [0.5, 0.5], [0.9, 0.1]])
    behaviour = np.array([[0.0, 0.0], [0.3, 0.0], [0.0, 0.0], [0.2, 0.2]])
    valid = np.ones((4, 2), bool)
    report = behaviour_report(oracle, behaviour, valid, 0.05, np.array(["general", "general", "webshop", "webshop"]))
    # the third state is not informative (equal true values); the first and the fourth are flat
    assert report == {"all": {"states": 3, "flat": 0.6667}, "general": {"states": 2, "flat": 0.5},
                      "webshop": {"states": 1, "flat": 1.0}}  # fmt: skip


def test_identical_candidates_share_one_value():
    task = parse_task("Search for hotels in Paris")
    dev = replay(task, 3, [], Dynamics(), 108)
    right = format_action(next_action(dev, task))
    values = candidate_values(dev, task, task.max_steps, [right, format_action(press_home()), right, right],
                              rollouts=2, noise=0.5, gamma=0.9, seed=1)  # fmt: skip
    assert values[0] == values[2] == values[3]


def test_expert_pick_report_counts_states_with_right_and_wrong_valid_candidates_per_group():
    right = np.array([[True, False, False], [True, True, True], [False, False, True], [False, True, False]])
    valid = np.array([[True, True, True], [True, True, True], [True, True, False], [True, True, True]])
    critic = np.array([[0.9, 0.1, 0.0], [0.0, 1.0, 0.0], [0.0, 0.5, 9.0], [1.0, 0.0, 0.0]])
    groups = np.array(["general", "general", "webshop", "webshop"])
    distinct = np.array([[True, True, False], [True, True, True], [True, True, True], [True, True, True]])
    kinds = np.array([["TAP", "TAP", "BACK"]] * 4)
    report = expert_pick_report(right, valid, distinct, kinds, {"critic": critic}, groups)
    # state 1: every candidate right; state 2: its only right candidate is invalid (and the critic's top score)
    assert report["states"] == 4 and report["informative_states"] == 2
    # state 0 has two decisions (its wrong candidate drawn twice): a third of its draws, half its decisions, right
    assert report["hit_rate"] == {"base_sample": round((1 / 3 + 1 / 3) / 2, 4),
                                  "uninformed": round((1 / 2 + 1 / 3) / 2, 4), "critic": 0.5}  # fmt: skip
    assert report["hit_rate_general"]["critic"] == 1.0 and report["hit_rate_webshop"]["critic"] == 0.0
    # state 3: the critic taps, as the expert does, but the wrong element: the right kind, the wrong action
    assert report["kind_rate"]["critic"] == 1.0 and report["within_kind_rate"]["critic"] == 0.5
    assert report["kind_rate"]["uninformed"] == round((1 + 2 / 3) / 2, 4)
    assert report["within_kind_rate"]["uninformed"] == round((1 / 2 + 1 / 3) / (1 + 2 / 3), 4)


def test_distinct_decisions_mark_each_action_text_once():
    back, tap_ = format_action(press_back()), format_action(tap(0.5, 0.5))
    marks = distinct_decisions([[back, tap_, back, tap_], [tap_, tap_, tap_, back]])
    assert marks.tolist() == [[True, True, False, False], [True, False, False, True]]


def test_wrong_pick_report_names_what_the_critic_picks_where_it_misses_the_expert():
    back, tap_, enter = (format_action(a) for a in (press_back(), tap(0.5, 0.5), press_enter()))
    lists = [[back, tap_, enter], [tap_, back, enter], [back, tap_, "garbage"], [tap_, tap_, tap_]]
    kinds = action_kinds(lists)
    assert kinds[0].tolist() == ["PRESS_BACK", "DUAL_POINT", "PRESS_ENTER"] and kinds[2, 2] == "invalid"
    right = np.array([[False, True, False], [True, False, False], [False, True, False], [True, True, True]])
    valid = kinds != "invalid"
    expert = np.array(["DUAL_POINT", "DUAL_POINT", "DUAL_POINT", "DUAL_POINT"])
    sets = np.array(["general", "general", "webshop", "general"])
    # seed A picks Back, Back, the right tap (its 9.0 is on an invalid candidate); seed B right, Enter, Back
    seed_a = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 1.0, 9.0], [1.0, 0.0, 0.0]])
    seed_b = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    report = wrong_pick_report(right, valid, [seed_a, seed_b], kinds, expert, sets)
    # state 3 is not informative (every candidate right); seed A misses twice on general, seed B once on each set
    assert report["general"]["wrong_picks"] == 1.5 and report["webshop"]["wrong_picks"] == 0.5
    assert report["general"]["kinds"] == {
        "PRESS_BACK": {"critic": round(2 / 3, 4), "data": round(1 / 3, 4), "expert": 0.0},
        "DUAL_POINT": {"critic": 0.0, "data": round(2 / 3, 4), "expert": 1.0},
        "PRESS_ENTER": {"critic": round(1 / 3, 4), "data": 0.0, "expert": 0.0},
    }
    assert list(report["general"]["kinds"])[0] == "PRESS_BACK"  # most picked first
    assert report["webshop"]["kinds"]["PRESS_BACK"] == {"critic": 1.0, "data": 1.0, "expert": 0.0}


def test_support_report_counts_the_taken_action_and_any_candidate_per_family():
    right = np.array([[True, False], [False, True], [False, False], [False, False], [False, True]])
    task_sets = np.array(["general", "general", "general", "webshop", "webshop"])
    families = np.array(["search", "search", "alarm", "select_first", "select_first"])
    report = support_report(right, task_sets, families)
    assert report == {
        "general": {"alarm": {"states": 1, "taken_is_expert": 0.0, "expert_candidate": 0.0},
                    "search": {"states": 2, "taken_is_expert": 0.5, "expert_candidate": 1.0}},
        "webshop": {"select_first": {"states": 2, "taken_is_expert": 0.0, "expert_candidate": 0.5}},
    }  # fmt: skip


def test_within_state_share_separates_action_features_from_state_features():
    rng = np.random.default_rng(0)
    state_part = np.repeat(rng.normal(size=(50, 1, 4)), 8, axis=1)  # the same for every candidate of a state
    action_part = rng.normal(size=(50, 8, 4))
    share = within_state_share(np.concatenate([state_part, action_part], -1), ("state", "action"))
    assert share["state"] == 0.0 and share["action"] > 0.8


def test_feature_probe_ranks_by_what_the_features_carry():
    rng = np.random.default_rng(0)
    S, N = 200, 8
    oracle = rng.uniform(size=(S, N))
    valid = np.ones((S, N), bool)
    state = rng.normal(size=(S, 64)).astype(np.float32)  # wide, like real features: LayerNorm's statistics settle
    informative = np.concatenate([3 * oracle[..., None], rng.normal(size=(S, N, 63))], -1).astype(np.float32)
    blind = np.repeat(rng.normal(size=(S, 1, 64)), N, axis=1).astype(np.float32)  # no action in it
    report = ranking_report(oracle, valid, valid, {
        "informative": feature_probe(state, informative, oracle, valid, seed=0),
        "blind": feature_probe(state, blind, oracle, valid, seed=0)}, tolerance=0.05)  # fmt: skip
    assert report["top1_hit_rate"]["informative"] > 0.6
    assert report["top1_hit_rate"]["blind"] < 0.35  # a constant score picks one candidate blindly (uninformed ~0.19)


def test_expert_probe_picks_right_on_episodes_it_was_not_fit_on_and_leaves_torch_seeded():
    rng = np.random.default_rng(1)
    S, N = 400, 8
    right = rng.uniform(size=(S, N)) < 0.3
    valid = rng.uniform(size=(S, N)) < 0.9
    episodes = np.repeat(np.arange(S // 4), 4)
    state = rng.normal(size=(S, 32)).astype(np.float32)
    # telling carries the label in one feature; blind is noise a probe could memorise, but only for the states it
    # is fit on, so a probe that scored those would rise above random on it.
    telling = np.concatenate([2 * right[..., None], rng.normal(size=(S, N, 31))], -1).astype(np.float32)
    blind = rng.normal(size=(S, N, 32)).astype(np.float32)
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    scores = {
        "telling": expert_probe(state, telling, right, valid, episodes, seed=0, epochs=20),
        "telling_linear": expert_probe(state, telling, right, valid, episodes, seed=0, epochs=20, hidden=None),
        "blind": expert_probe(state, blind, right, valid, episodes, seed=0, epochs=20),
    }
    assert torch.equal(torch.rand(2), expected)  # the stage's actors draw the same numbers as without the probe
    report = expert_pick_report(right, valid, np.ones((S, N), bool), np.zeros((S, N), int), scores, np.zeros(S, int))
    rates = report["hit_rate"]
    assert rates["telling"] > 0.9 and rates["telling_linear"] > 0.9  # one feature carries the label: linear suffices
    assert abs(rates["blind"] - rates["uninformed"]) < 0.1
    assert np.array_equal(scores["telling"], expert_probe(state, telling, right, valid, episodes, seed=0, epochs=20))


@pytest.mark.parametrize("hidden", [16, None])
def test_an_expert_probe_s_two_fits_run_apart_give_what_one_run_gives(hidden):
    """Stage 08 runs each fit as a job: the second alone, in another process, draws the batches it drew after the
    first, so the scores are the same bits."""
    rng = np.random.default_rng(4)
    S, N = 120, 5
    right = rng.uniform(size=(S, N)) < 0.4
    valid = rng.uniform(size=(S, N)) < 0.9
    episodes = np.repeat(np.arange(S // 3), 3)
    state = rng.normal(size=(S, 6)).astype(np.float32)
    candidates = np.concatenate([right[..., None], rng.normal(size=(S, N, 5))], -1).astype(np.float32)
    whole = expert_probe(state, candidates, right, valid, episodes, seed=2, hidden=hidden, epochs=3)
    apart = np.full((S, N), np.nan, np.float32)
    for half in (1, 0):  # the second first: it needs nothing of the first but the seed
        rows, scores = expert_probe_half(state, candidates, right, valid, episodes, half=half, seed=2, hidden=hidden,
                                         epochs=3)  # fmt: skip
        assert np.isnan(apart[rows]).all()  # the halves score different states
        apart[rows] = scores
    assert np.array_equal(apart, whole)
    with pytest.raises(ValueError, match="halves 0 and 1, got 2"):
        expert_probe_half(state, candidates, right, valid, episodes, half=2, seed=2)


class _TypesGarbage(ExpertPolicy):
    """The expert, except that it types "zzz" wherever it should type."""

    def act(self, batch: RolloutBatch) -> list[str]:
        return [format_action(type_text("zzz")) if '"TYPE"' in a else a for a in super().act(batch)]


class _AlwaysHome:
    def act(self, batch: RolloutBatch) -> list[str]:
        return [format_action(press_home())] * len(batch.envs)


@pytest.mark.parametrize(
    ("policy", "skill", "solves"),
    [(_TypesGarbage(), "type", True), (_TypesGarbage(), "tap", False), (_TypesGarbage(), "action_type", False),
     (_AlwaysHome(), "action_type", True), (_AlwaysHome(), "type", False)],
)  # fmt: skip
def test_expert_skill_lends_exactly_the_one_skill(policy, skill, solves):
    tasks = [parse_task(t) for t in ("Search for hotels in Paris", 'Go to ebay.com, search for "logitech g pro"')]
    alone = rollout(policy, tasks, n_envs=2, seed=3, width=108, dynamics=Dynamics.calm())
    lent = rollout(ExpertSkill(policy, skill), tasks, n_envs=2, seed=3, width=108, dynamics=Dynamics.calm())
    assert not any(r.success for r in alone)
    assert all(r.success for r in lent) == solves and (any(r.success for r in lent) == solves)


def test_expert_skill_names_an_unknown_skill():
    with pytest.raises(ValueError, match="'swipe'"):
        ExpertSkill(_AlwaysHome(), "swipe")
