import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from digiq.data.picks import Picks
from digiq.diagnostics.reports import expert_share, keep_by_group
from digiq.env.actions import format_action, press_enter, tap, type_text
from digiq.models.critic import Critic, CriticNetConfig
from digiq.models.policy import AutoUIPolicy, PolicyConfig
from digiq.models.policy_fit import FitRow, fit_policy
from digiq.models.tokenizer import default_corpus, train_tokenizer
from digiq.paths import Paths
from digiq.report import (
    DIAGNOSTICS,
    END,
    START,
    VALIDATION,
    diagnostics_markdown,
    expert_pick_table,
    results_markdown,
    rewarded_table,
    save_results_chart,
    update_readme,
    validation_markdown,
    wrong_pick_table,
)
from digiq.stages.actor import best_of_n
from digiq.stages.base_policy import randomize_copied_words
from digiq.stages.common import write_metrics
from digiq.stages.critic import conservative_penalty, moved_forward, rewarded_fit, td_fit, td_step
from digiq.stats import sample_std


def test_td_learning_recovers_values_of_a_two_step_chain():
    # s0 -a-> s1 -a-> end (reward 1): V(s1) = 1, V(s0) = gamma.
    torch.manual_seed(0)
    s = torch.eye(3)
    batch = {
        "state": s[[0, 1]],
        "next_state": s[[1, 2]],
        "action": s[[0, 1]],
        "reward": torch.tensor([0.0, 1.0]),
        "done": torch.tensor([0.0, 1.0]),
    }
    critic = Critic(CriticNetConfig(feature_dim=3, hidden=32))
    untrained = td_fit(critic, batch, gamma=0.9)
    target = critic.target()
    opt = torch.optim.Adam(critic.parameters(), lr=3e-3)
    for _ in range(1500):
        q_loss, v_loss = td_step(critic, target, batch, gamma=0.9)
        opt.zero_grad()
        (q_loss + v_loss).backward()
        opt.step()
        target.soft_update(critic, 0.1)
    v = torch.minimum(*critic.v(s[[0, 1]])).detach()
    assert torch.allclose(v, torch.tensor([0.9, 1.0]), atol=0.05)
    # The stage's fit diagnostic: Q of the taken actions on its TD target, and level with V.
    fit = td_fit(critic, batch, gamma=0.9)
    assert fit["q_td_rmse"] < 0.05 and abs(fit["q_taken_minus_v"]) < 0.05
    assert untrained["q_td_rmse"] > 0.3


def test_rewarded_fit_reads_q_at_the_rewarded_steps_each_critic_trained_on_per_family():
    import pandas as pd

    torch.manual_seed(0)
    critic = Critic(CriticNetConfig(feature_dim=2, hidden=8))
    state = torch.randn(5, 2)
    feats = {"state": state.numpy(), "candidates": state[:, None].numpy()}
    q = torch.minimum(*critic.q(state, state)).detach().numpy()
    steps = pd.DataFrame({"reward": [1.0, 0.0, 1.0, 1.0, 1.0], "task_set": ["webshop"] * 4 + ["general"],
                          "family": ["select_first", "select_first", "select_first", "site_search", "search"]})  # fmt: skip
    # seed A trained on rows 0-3, seed B on 0 and 4: the unrewarded row 1 and untrained rows never count
    report = rewarded_fit([(critic, np.array([0, 1, 2, 3])), (critic, np.array([0, 4]))], feats, steps)
    assert set(report) == {"general", "webshop"} and set(report["webshop"]) == {"select_first", "site_search"}
    assert report["webshop"]["select_first"]["steps"] == 1.5  # 2 rows for seed A, 1 for seed B
    expected = ((q[0] + q[2]) / 2 + q[0]) / 2
    assert report["webshop"]["select_first"]["q_taken"] == pytest.approx(expected, abs=1e-4)
    assert report["general"]["search"] == {"steps": 1.0, "q_taken": pytest.approx(q[4], abs=1e-4)}


def test_moved_forward_keeps_steps_that_raised_the_value_or_whose_episode_succeeded():
    target = Critic(CriticNetConfig(feature_dim=1, hidden=4))
    target.v = lambda state: (state[:, 0], state[:, 0] + 1.0)  # V(s) = the feature (the lower head)
    batch = {"state": torch.tensor([[0.5], [0.5], [0.5], [0.5]]), "next_state": torch.tensor([[0.9], [0.1], [0.1], [0.9]]),
             "reward": torch.tensor([0.0, 0.0, 0.0, 1.0]), "done": torch.tensor([0.0, 0.0, 0.0, 1.0]),
             "mc_return": torch.tensor([0.0, 0.0, 0.3, 0.0])}  # fmt: skip
    # 0.95 * 0.9 > 0.5; 0.95 * 0.1 < 0.5 (a slip); the same, but its episode went on to succeed; a final success
    assert moved_forward(target, batch, gamma=0.95).tolist() == [True, False, True, True]


def test_conservative_term_keeps_untried_candidates_below_the_taken_action():
    # Every state took action 0 (reward 0.5, end); candidate 1 was never tried, candidate 2 does not parse.
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    state, cands = torch.randn(64, 4, generator=gen), torch.randn(64, 3, 4, generator=gen)
    valid = torch.tensor([[True, True, False]]).expand(64, -1)
    batch = {"state": state, "next_state": state, "action": cands[:, 0], "reward": torch.full((64,), 0.5),
             "done": torch.ones(64)}  # fmt: skip

    def fit(conservative: float) -> torch.Tensor:
        torch.manual_seed(0)
        critic = Critic(CriticNetConfig(feature_dim=4, hidden=32))
        target, opt = critic.target(), torch.optim.Adam(critic.parameters(), lr=3e-3)
        for _ in range(400):
            q_loss, v_loss = td_step(critic, target, batch, gamma=0.9)
            loss = q_loss + v_loss + conservative * conservative_penalty(critic, state, cands, valid).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            target.soft_update(critic, 0.1)
        return critic.advantage(state, cands)[0]

    plain, conservative = fit(0.0), fit(1.0)
    assert (plain[:, 1] > plain[:, 0]).float().mean() > 0.2  # TD alone leaves untried actions anywhere
    assert (conservative[:, 1] < conservative[:, 0]).all()
    assert torch.allclose(conservative[:, 0], torch.tensor(0.5), atol=0.1)  # the taken action's value stays
    # The invalid candidate is left out of the log-sum-exp: changing its features changes nothing.
    critic = Critic(CriticNetConfig(feature_dim=4, hidden=8))
    moved = cands.clone()
    moved[:, 2] += 100
    assert torch.equal(
        conservative_penalty(critic, state, cands, valid), conservative_penalty(critic, state, moved, valid)
    )


def test_conservative_floor_stops_pushing_an_untried_candidate_below_it():
    # Untried candidates already below the floor get no gradient from the term; without a floor they still do,
    # and the taken action's side is the same either way.
    torch.manual_seed(0)
    critic = Critic(CriticNetConfig(feature_dim=4, hidden=16))
    state, cands = torch.randn(8, 4), torch.randn(8, 3, 4, requires_grad=True)
    scored = torch.ones(8, 3, dtype=torch.bool)
    q = torch.minimum(*critic.q(state[:, None].expand(-1, 3, -1), cands)).detach()
    floor = float(q[:, 1:].max()) + 1.0  # every untried candidate is below it
    (grad_floor,) = torch.autograd.grad(conservative_penalty(critic, state, cands, scored, floor).sum(), cands)
    (grad_plain,) = torch.autograd.grad(conservative_penalty(critic, state, cands, scored).sum(), cands)
    assert torch.count_nonzero(grad_floor[:, 1:]) == 0 and torch.count_nonzero(grad_plain[:, 1:]) > 0
    assert torch.count_nonzero(grad_floor[:, 0]) > 0
    # A floor under every Q changes nothing.
    low = float(q.min()) - 10.0
    torch.testing.assert_close(conservative_penalty(critic, state, cands, scored, low),
                               conservative_penalty(critic, state, cands, scored))  # fmt: skip


def test_best_of_n_picks_the_highest_valid_advantage():
    class Fixed(Critic):
        def advantage(self, state, actions):
            q = actions[..., 0]
            return q, torch.zeros(len(state)), q

    critic = Fixed(CriticNetConfig(feature_dim=1))
    cands = np.array([[[0.1], [0.9], [0.5]], [[0.3], [0.2], [0.1]]], np.float32)
    valid = np.array([[True, False, True], [True, True, True]])
    best, adv = best_of_n(critic, np.zeros((2, 1), np.float32), cands, valid, k=3, rng=np.random.default_rng(0))
    assert best.tolist() == [2, 0] and np.allclose(adv, [0.5, 0.3])  # the invalid 0.9 is never chosen
    best, _ = best_of_n(critic, np.zeros((2, 1), np.float32), cands, valid, k=1, rng=np.random.default_rng(0))
    assert best.tolist() == [0, 0]  # K = 1: only the taken action


def test_expert_share_judges_the_picked_candidate_per_task_set():
    right = np.array([[False, True], [True, False], [True, True], [False, False]])
    task_sets = np.array(["general", "general", "webshop", "webshop"])
    # General: state 0's column 1 is the expert's, state 1's column 1 is not; Web Shopping keeps no row.
    assert expert_share(right, np.array([0, 1]), np.array([1, 1]), task_sets) == {
        "general": 0.5,
        "webshop": None,
    }
    # The data's own actions (column 0): state 1 right, state 2 right, state 3 wrong.
    assert expert_share(right, *Picks.taken(np.array([1, 2, 3])), task_sets) == {"general": 1.0, "webshop": 0.5}


def _result(rates: list[float], family: str) -> dict:
    return {"success_rate": float(np.mean(rates)), "success_rate_std": sample_std(rates), "per_seed": rates,
            "n_episodes": 96, "by_family": {family: rates[0]}, "tasks_by_family": {family: 96}}  # fmt: skip


def _base_and_digiq() -> dict:
    """eval.json of two policies over two seeds."""
    return {"base": {"general": _result([0.2, 0.3], "search"), "webshop": _result([0.1, 0.1], "go_to_site")},
            "digiq": {"general": _result([0.5, 0.6], "search"), "webshop": _result([0.3, 0.5], "go_to_site")}}  # fmt: skip


def test_report_fills_the_readme_and_experiments_blocks_from_metrics(tmp_path):
    paths = Paths(tmp_path)
    write_metrics(paths, "eval", _base_and_digiq())
    write_metrics(paths, "ablations", {
        "digiq": _base_and_digiq()["digiq"],
        "digiq_perfect_critic": {"general": _result([0.7, 0.7], "search"), "webshop": _result([0.6, 0.6], "go_to_site")},
    })  # fmt: skip
    write_metrics(paths, "actor", {"perfect_critic": {"states_with_expert_candidate": 0.772,
                                                      "taken_action_is_expert": 0.395},
                                   "kept_rows": {"digiq": 120.5, "filtered_bc": 80}})  # fmt: skip
    write_metrics(paths, "critic", {"wall_time_s": 12.5, "v_mc_return_corr_heldout": 0.7,
                                    "rewarded_steps": {"webshop": {"select_first": {"steps": 4.0, "q_taken": 0.0888}}}})  # fmt: skip
    write_metrics(paths, "collect", {"success_rate_by_family": {"select_first": 0.029}})
    write_metrics(paths, "diagnostics", {"states": 10, "informative_states": 4,
                                    "expert_support": {"webshop": {"select_first": {"states": 40, "taken_is_expert": 0.3,
                                                                                    "expert_candidate": 0.65}}},
                                    "rows_expert_share": {"digiq": {"general": 0.2, "webshop": 0.61},
                                                          "filtered_bc": {"general": None, "webshop": 0.7}},
                                    "expert_support_by_kind": {"webshop": {"PRESS_BACK": {
                                        "states": 12, "taken_is_expert": 0.1, "expert_candidate": 0.6}}},
                                    "digiq_rows_by_kind": {"webshop": {"PRESS_BACK": {"kept": 0.4, "expert": 0.0}}},
                                    "top1_hit_rate": {"random": 0.25, "critic": 0.5},
                                    "oracle_value_of_pick": {"random": 0.4, "critic": 0.6, "best": 0.8},
                                    "expert_pick": {"states": 50, "informative_states": 30,
                                                    "hit_rate": {"random": 0.4, "critic_finetuned": 0.55},
                                                    "hit_rate_general": {"random": 0.3, "critic_finetuned": 0.35},
                                                    "hit_rate_webshop": {"random": 0.5, "critic_finetuned": 0.75}},
                                    "critic_wrong_picks": {"general": {"wrong_picks": 610.3, "kinds": {
                                        "PRESS_BACK": {"critic": 0.373, "data": 0.2228, "expert": 0.0}}}}})  # fmt: skip
    write_metrics(paths, "skills", {"policy": "base", "seed": 0,
                                    "none": {"general": {"success_rate": 0.2}, "webshop": {"success_rate": 0.4}},
                                    "type": {"general": {"success_rate": 0.45}, "webshop": {"success_rate": 0.85}}})  # fmt: skip
    md = results_markdown(paths)
    assert "| base | 25.0 ± 7.1 | 10.0 ± 0.0 |" in md and "over 2 seed(s); 96 General and 96 Web Shopping" in md
    assert "No `metrics/comparisons.json`" in md  # no margin is stated without its interval
    assert "| digiq | 55.0 ± 7.1 | 40.0 ± 14.1 |" in md and "| digiq_perfect_critic | 70.0 ± 0.0 | 60.0 ± 0.0 |" in md
    assert "77.2% of states have one, and the data's own action is it in 39.5%" in md
    md = diagnostics_markdown(paths)
    assert "| alone | 20.0 | 40.0 |" in md and "| + the expert's type | 45.0 | 85.0 |" in md
    assert "| general | search | 20.0 | 50.0 |" in md and "| critic | 12.5 |" in md
    assert "| critic | 50.0 | 0.600 |" in md and "4 of 10 sampled states" in md
    assert "| ranking | all | general | webshop |" in md and "| critic_finetuned | 55.0 | 35.0 | 75.0 |" in md
    assert "over the 30 of 50 stored states" in md
    assert "| webshop | select_first | 40 | 2.9 | 30.0 | 65.0 |" in md  # where the data can teach
    assert "| webshop | PRESS_BACK | 12 | 10.0 | 60.0 | 40.0 | 0.0 |" in md  # ... by the expert's kind of action
    assert "| digiq | 120.5 | 20.0 | 61.0 |" in md and "| filtered_bc | 80 | - | 70.0 |" in md
    assert "| general | PRESS_BACK | 37.3 | 22.3 | 0.0 |" in md and "(general 610.3 per seed" in md
    assert "| webshop | select_first | 4 | 0.089 |" in md  # the critic at the data's rewarded steps
    assert expert_pick_table({}) == [
        "Expert picks off (`diagnostics.oracle_states: 0`)."
    ]  # notebook 07 with the stage off
    assert "off" in wrong_pick_table({})[0] and "No rewarded step" in rewarded_table({})[0]  # notebooks 06 and 05
    readme, experiments = tmp_path / "README.md", tmp_path / "experiments.md"
    readme.write_text(f"intro\n{START}\nold\n{END}\nrest\n")
    experiments.write_text(f"{VALIDATION[0]}\nold\n{VALIDATION[1]}\nnotes\n{DIAGNOSTICS[0]}\nold\n{DIAGNOSTICS[1]}\n")
    update_readme(readme, paths, experiments)
    assert "run `make val` after `make repro`" in experiments.read_text()  # no metrics/val/ yet
    text = readme.read_text()
    assert "old" not in text and "| base | 25.0" in text and text.endswith("rest\n")
    assert "old" not in experiments.read_text() and "| alone | 20.0 | 40.0 |" in experiments.read_text()
    with pytest.raises(ValueError, match="no <!-- validation:start -->"):
        update_readme(readme, paths, readme)
    for row, rate in (("base", 0.2), ("digiq", 0.35)):  # what `make val` writes, one python -m digiq.evaluate per row
        run = {ts: {"success_rate": rate, "success_rate_std": 0.01, "n_episodes": 320} for ts in ("general", "webshop")}
        write_metrics(paths, f"val/{row}", {**run, "seeds": 3})
    assert "| digiq | 35.0 ± 1.0 | 35.0 ± 1.0 |" in validation_markdown(paths)


def test_keep_by_group_pools_seeds_per_task_set_and_kind():
    task_sets = np.array(["webshop"] * 4)
    kinds = np.array(["PRESS_BACK", "PRESS_BACK", "TYPE", "TYPE"])
    kept = np.array([2, 1, 0, 2])  # over 2 seeds
    kept_right = np.array([0, 0, 0, 1])
    out = keep_by_group(kept, kept_right, 2, task_sets, kinds)
    assert out == {"webshop": {"PRESS_BACK": {"kept": 0.75, "expert": 0.0}, "TYPE": {"kept": 0.5, "expert": 0.5}}}


def test_results_chart_is_a_png_with_one_bar_per_policy_and_task_set(tmp_path):
    results = {p: {"general": _result([r, r], "search"), "webshop": _result([r, r + 0.2], "go_to_site")}
               for p, r in (("base", 0.2), ("digiq", 0.6))}  # fmt: skip
    path = save_results_chart(results, tmp_path / "results.png", "test")
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size[0] > 300


def _typed(action: str) -> str:
    return action.split('"typed_text": "')[1].rstrip('"')


_RENAME_IN_A_FRESH_INTERPRETER = """
import random
from digiq.env.actions import format_action, type_text
from digiq.stages.base_policy import randomize_copied_words
from digiq.models.policy_fit import FitRow
goal = 'Go to walmart.com, search for "kindle paperwhite signature edition black"'
row = FitRow("Previous Actions:  Goal: " + goal, "a.png", format_action(type_text("kindle paperwhite signature edition black")))
rng = random.Random(0)
print([randomize_copied_words(row, rng, p=0.5).action for _ in range(30)])
"""


def test_renaming_does_not_depend_on_the_interpreters_string_hashing():
    # Set order follows PYTHONHASHSEED, which Python draws anew per process: stage 00 must not, or every
    # `dvc repro` trains another base policy from the same demonstrations and seed.
    runs = {
        subprocess.run(
            [sys.executable, "-c", _RENAME_IN_A_FRESH_INTERPRETER],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(runs) == 1


def test_copied_words_are_renamed_alike_in_goal_typed_text_and_previous_action():
    goal = 'Go to walmart.com, search for "Kindle paperwhite"'
    typing = FitRow(f"Previous Actions: {format_action(tap(0.1, 0.5))} Goal: {goal}", "a.png",
                    format_action(type_text("kindle paperwhite")))  # fmt: skip
    after = FitRow(f"Previous Actions: {typing.action} Goal: {goal}", "b.png", format_action(press_enter()))
    rng = random.Random(0)
    for _ in range(20):
        new = randomize_copied_words(typing, rng, p=1.0)
        typed = _typed(new.action)
        assert len(typed.split()) == 2 and "kindle" not in typed and "paperwhite" not in typed
        assert new.prompt.endswith(f'search for "{typed.split()[0].capitalize()} {typed.split()[1]}"')
        assert "walmart.com" in new.prompt and new.image_path == "a.png"  # words not typed stay
        assert new.prompt.startswith(f"Previous Actions: {format_action(tap(0.1, 0.5))} Goal: Go to walmart.com")
        nxt = randomize_copied_words(after, rng, p=1.0)
        assert nxt.action == after.action
        assert _typed(nxt.prompt.split(" Goal: ")[0]) in nxt.prompt.split(" Goal: ")[1].lower()
    assert randomize_copied_words(typing, rng, p=0.0) == typing
    no_typing = FitRow(f"Previous Actions:  Goal: {goal}", "c.png", format_action(tap(0.2, 0.3)))
    assert randomize_copied_words(no_typing, rng, p=1.0) == no_typing
    with pytest.raises(ValueError, match="without ' Goal: '"):
        randomize_copied_words(FitRow("Goal missing", "d.png", typing.action), rng)


@pytest.mark.parametrize("rows", [9, 10, 11])
def test_a_policy_fits_any_number_of_steps(rows):
    """One row per step: 10 steps is where torch's one-cycle schedule would divide by zero."""
    tok = train_tokenizer(default_corpus(n_tasks=20, seed=0), vocab_size=300)
    torch.manual_seed(0)
    policy = AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, d_kv=8, image_dim=32, dropout=0.0), tok)
    shots = {"s": torch.zeros(114, 54, 3, dtype=torch.uint8)}
    fit = [FitRow(f"Goal: open app {i}", "s", format_action(press_enter())) for i in range(rows)]
    curve = fit_policy(policy, fit, shots, epochs=1, batch_size=1, lr=3e-3, seed=0)
    assert len(curve) == rows
    assert curve[-1]["loss"] < curve[0]["loss"]


def test_a_fixed_number_of_updates_runs_over_the_rows_as_often_as_it_takes():
    """Stage 06's budget: 7 updates of 2 rows over 5 rows are 3 batches a pass, the passes reshuffled."""
    tok = train_tokenizer(default_corpus(n_tasks=20, seed=0), vocab_size=300)
    torch.manual_seed(0)
    policy = AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, d_kv=8, image_dim=32, dropout=0.0), tok)
    shots = {"s": torch.zeros(114, 54, 3, dtype=torch.uint8)}
    fit = [FitRow(f"Goal: open app {i}", "s", format_action(press_enter())) for i in range(5)]
    curve = fit_policy(policy, fit, shots, updates=7, batch_size=2, lr=3e-3, seed=0)
    assert [p["epoch"] for p in curve] == [0, 0, 0, 1, 1, 1, 2]
    for wrong in ({}, {"epochs": 1, "updates": 7}):
        with pytest.raises(ValueError, match="give epochs or updates"):
            fit_policy(policy, fit, shots, batch_size=2, lr=3e-3, seed=0, **wrong)


def test_a_checkpoint_with_tied_weights_is_the_same_bytes_at_every_save(tmp_path):
    """DVC hashes stage outputs: safetensors' own record of tied names came out in a random order per save."""
    tok = train_tokenizer(default_corpus(n_tasks=20, seed=0), vocab_size=300)
    torch.manual_seed(0)
    policy = AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, d_kv=8, image_dim=32, dropout=0.0), tok)
    for i in range(4):
        policy.save(tmp_path / str(i))
    assert len({(tmp_path / str(i) / "model.safetensors").read_bytes() for i in range(4)}) == 1
    loaded = AutoUIPolicy.load(tmp_path / "0")
    for (name, a), b in zip(policy.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert loaded.t5.lm_head.weight is loaded.t5.shared.weight  # tied again on load


def test_report_puts_the_paper_s_train_columns_beside_the_test_ones(tmp_path):
    paths = Paths(tmp_path)
    write_metrics(paths, "eval", _base_and_digiq())
    write_metrics(paths, "eval_train", {"off": "eval.train_tasks is 0"})
    assert "| policy | General test | Web Shopping test |" in results_markdown(paths)
    train = {"base": {"general": {**_result([0.4, 0.4], "search"), "n_episodes": 50}},
             "digiq": {"general": {**_result([0.7, 0.9], "search"), "n_episodes": 50}}}  # fmt: skip
    write_metrics(paths, "eval_train", train)  # imported data with General trajectories only: no Web Shopping train
    md = results_markdown(paths)
    assert "| policy | General train | General test | Web Shopping test |" in md
    assert "| base | 40.0 ± 0.0 | 25.0 ± 7.1 | 10.0 ± 0.0 |" in md and "| digiq | 80.0 ± 14.1 | 55.0 ± 7.1 |" in md
    assert "train: the tasks of the first 50 trajectories per task set in the offline data" in md
