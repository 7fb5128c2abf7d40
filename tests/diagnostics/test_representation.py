"""Linear probes of the VLMs' (state, action) features: AUROC, the probe, its labels, its control and the stage."""

import itertools
import shutil
from pathlib import Path

import numpy as np
import pytest

from digiq.config import DiagnosticsConfig, load_settings
from digiq.data import TrajectoryStore
from digiq.data.features import load_features
from digiq.data.picks import EXPERT_MATRIX, Picks, critic_scores_name, stored_path, write_picks, write_stored
from digiq.data.trajectories import DataError
from digiq.diagnostics.representation import (
    CONTROL_WORDS,
    GRID,
    auroc,
    control_features,
    labels_at,
    linear_probe,
    named_in_goal,
    probe_table,
    representation_probes,
)
from digiq.env.actions import ActionType, press_home, tap
from digiq.io import StageError
from digiq.models.critic import Critic
from digiq.models.vlm import effect_label
from digiq.paths import Paths
from digiq.stages import diagnostics
from digiq.stages.actor import ScoreJob, score_job
from digiq.stages.diagnostics import run_diagnostics


def _pairwise_auroc(scores, labels):
    """The definition: over every (positive, negative) pair, 1 if the positive scores higher, 1/2 on a tie."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    return np.mean([1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg)])


def test_auroc_of_perfect_reversed_and_tied_scores():
    labels = np.array([0, 0, 1, 1])
    assert auroc(np.array([0.1, 0.2, 0.8, 0.9]), labels) == 1.0
    assert auroc(np.array([0.9, 0.8, 0.2, 0.1]), labels) == 0.0
    assert auroc(np.full(4, 0.3), labels) == 0.5  # every pair tied
    # positives 0.5 and 0.9 against negatives 0.5 and 0.2: a tie counts half, (0.5 + 1 + 1 + 1) / 4
    assert auroc(np.array([0.5, 0.5, 0.2, 0.9]), np.array([1, 0, 0, 1])) == 0.875
    assert auroc(np.array([0.1, 0.2]), np.array([1, 1])) is None  # one class: undefined
    rng = np.random.default_rng(0)
    scores, labels = rng.integers(0, 5, 60).astype(float), rng.random(60) < 0.4  # many ties
    assert auroc(scores, labels) == pytest.approx(_pairwise_auroc(scores, labels))


def test_the_linear_probe_separates_a_separable_set_held_out_and_not_noise():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2000, 10)) * rng.uniform(0.1, 10, 10)  # scales apart: standardisation evens them
    y = (x / x.std(0)) @ rng.normal(size=10) > 0.3
    r = linear_probe(x[:1400], y[:1400], x[1400:], y[1400:])
    assert r["auroc"] > 0.98 and r["accuracy"] > 0.95
    assert (r["n_train"], r["n_test"]) == (1400, 600) and r["positive_rate"] == round(float(y[1400:].mean()), 4)
    assert linear_probe(x[:1400], y[:1400], x[1400:], y[1400:]) == r  # nothing random: the same fit again
    noise = rng.random(2000) < 0.5
    assert abs(linear_probe(x[:1400], noise[:1400], x[1400:], noise[1400:])["auroc"] - 0.5) < 0.06
    with pytest.raises(ValueError, match="needs train and test rows, got 1400 and 0"):
        linear_probe(x[:1400], y[:1400], x[:0], y[:0])


# A screen 1000 x 2000: a full-screen layout without a label, a Clock icon (its name as content-desc), a
# Camera icon, and a labelled list row with a smaller labelled button inside it.
HIERARCHY = (
    "<?xml version='1.0' encoding='UTF-8' standalone='yes' ?><hierarchy rotation=\"0\">"
    '<node text="" class="android.widget.FrameLayout" bounds="[0,0][1000,2000]">'
    '<node text="" content-desc="Clock" bounds="[100,100][300,300]" />'
    '<node text="" content-desc="Camera" bounds="[400,100][600,300]" />'
    '<node text="Alarm 7:00 AM" bounds="[0,1000][1000,1200]">'
    '<node text="Delete" bounds="[800,1050][950,1150]" /></node>'
    "</node></hierarchy>"
)


def test_the_element_under_a_tap_and_whether_the_goal_names_it():
    points = [(0.1, 0.2), (0.1, 0.5), (0.8, 0.5), (0.55, 0.2), (0.55, 0.9)]  # (y, x)
    assert labels_at(HIERARCHY, points, (1000, 2000)) == ["Clock", "Camera", "", "Alarm 7:00 AM", "Delete"]
    goal = "Open the clock app"
    assert [named_in_goal(label, goal) for label in labels_at(HIERARCHY, points[:3], (1000, 2000))] == [
        True,  # on the element the goal names
        False,  # on another element
        False,  # outside every labelled element
    ]
    assert named_in_goal("Play Store", "install it from the play store!")
    assert named_in_goal("ebay.com", "Go to eBay.com")
    assert not named_in_goal("Store Play", "open the play store")  # its words, but not in its order
    assert not named_in_goal("Clock", "Open the clockwork app")  # whole words, not a substring
    assert not named_in_goal(":", "Set an alarm: 7:00")  # a label without words names nothing
    with pytest.raises(ValueError, match="not well-formed"):
        labels_at("<hierarchy>", points, (1000, 2000))


def test_control_features_hold_the_goal_words_and_where_the_tap_lands():
    goals = ["Open the Clock app", "open the clock app", "Open the Camera app", "Open the Clock app"]
    actions = [tap(0.1, 0.2), tap(0.1, 0.2), tap(0.1, 0.2), press_home()]
    x = control_features(goals, actions)
    words, kinds = x[:, :CONTROL_WORDS], list(ActionType)
    cells = x[:, CONTROL_WORDS + len(kinds) + 2 : CONTROL_WORDS + len(kinds) + 2 + GRID * GRID]
    assert np.array_equal(x[0], x[1])  # case is ignored
    assert words[0].sum() == 4 and (words[0] != words[2]).sum() == 2  # "camera" for "clock"
    assert cells[0].argmax() == 0 * GRID + 1 and cells[0].sum() == 1 and cells[3].sum() == 0  # Home lands nowhere
    assert x[3, CONTROL_WORDS + kinds.index(ActionType.PRESS_HOME)] == 1.0
    assert tuple(x[3, CONTROL_WORDS + len(kinds) : CONTROL_WORDS + len(kinds) + 2]) == (-1.0, -1.0)
    # Which place a word goes with, no screen needed: a tap on the app the goal names, a launcher of fixed places.
    rng = np.random.default_rng(2)
    apps = {"clock": (0.1, 0.2), "camera": (0.1, 0.5), "maps": (0.3, 0.2), "gmail": (0.3, 0.5)}
    names = rng.choice(list(apps), 1200)
    taps = rng.choice(list(apps), 1200)
    y = names == taps
    x = control_features([f"open {n}" for n in names], [tap(*apps[t]) for t in taps])
    assert linear_probe(x[:800], y[:800], x[800:], y[800:])["auroc"] > 0.99


@pytest.fixture(scope="module")
def probe_root(values_root, tmp_path_factory) -> Paths:
    """The tiny pipeline root with three VLMs' features: the fixture's (noise), another noise, and a "blind"
    one whose data's-action feature holds the changes-the-screen label in its first dimension."""
    root = tmp_path_factory.mktemp("probes") / "root"
    shutil.copytree(values_root, root)
    paths = Paths(root)
    steps = TrajectoryStore(paths.offline).read().to_pandas()
    store = TrajectoryStore(paths.offline)
    changed = [effect_label(store.load_image(a), store.load_image(b), 30.0)
               for a, b in zip(steps.image_path, steps.next_image_path, strict=True)]  # fmt: skip
    rng = np.random.default_rng(3)
    for vlm in ("untuned", "blind"):
        shutil.copytree(paths.features(), paths.features(vlm))
        c = rng.normal(size=np.load(paths.features(vlm) / "candidates.npy").shape).astype(np.float32)
        if vlm == "blind":
            c[:, 0, 0] = np.array(changed, np.float32) * 10
        np.save(paths.features(vlm) / "candidates.npy", c)
    return paths


def _stage_07_outputs(paths: Paths) -> None:
    """What stage 08 reads of stage 07's: the picks (the data's own action everywhere) and seed 0's critic scores."""
    steps = TrajectoryStore(paths.offline).read().to_pandas()
    write_picks(paths, {("digiq", 0): Picks.taken(np.arange(len(steps)))})
    write_stored(paths, critic_scores_name("digiq", 0), steps,
                 score_job(ScoreJob(paths, "digiq", 0, steps.task_set.to_numpy())))  # fmt: skip


def test_the_diagnostics_stage_probes_every_feature_folder(probe_root):
    paths = probe_root
    settings = load_settings(Path(paths.root) / "params.yaml")
    S = len(load_features(paths)["state"])
    _stage_07_outputs(paths)
    cfg = DiagnosticsConfig(oracle_states=2, oracle_rollouts=1, behaviour_rollouts=0)
    m = run_diagnostics(cfg, paths, seeds=1, env=settings.env, policies=["digiq"],
                        collect=settings.collect, threshold=30.0)  # fmt: skip
    probes = m["probes"]
    assert set(probes) == {"blind", "finetuned", "untuned", "control"}
    rows = {name: {probe: (r[probe]["n_train"], r[probe]["n_test"]) for probe in r} for name, r in probes.items()}
    assert all(r == rows["control"] for r in rows.values())  # every one on the same split of the same rows
    assert sum(rows["control"]["changes_screen"]) == S and min(rows["control"]["tap_on_goal_element"]) > 0
    assert probes["blind"]["changes_screen"]["auroc"] == 1.0  # the label it was given, on the rows it belongs to
    assert probes["untuned"]["changes_screen"]["auroc"] < 0.9  # noise
    taps = probes["control"]["tap_on_goal_element"]
    assert 0 < taps["positive_rate"] < 1  # taps on the named element and elsewhere
    assert m["part_time_s"]["representation_probes"] >= 0
    if m["expert_pick"]["informative_states"]:  # the critic's margin over the same held-out states
        assert m["critic_pick_margin"]["all"]["units"] == m["expert_pick"]["informative_states"]
    table = probe_table(probes)
    assert list(table.index) == list(probes) and table.loc["blind", ("changes_screen", "auroc")] == 1.0


def test_the_diagnostics_stage_judges_the_scores_and_the_expert_matrix_stage_07_stored(probe_root, tmp_path,
                                                                                       monkeypatch):  # fmt: skip
    """Every critic's Q as stage 07 stored it, and the expert's matrix where stage 07 computed it: neither is
    computed again. The stored ones here are what no critic and no simulator would give: the tap (column 1) first
    at every state, and the tap the expert's action everywhere, of a kind of its own."""
    root = tmp_path / "root"
    shutil.copytree(probe_root.root, root)
    paths = Paths(root)
    settings = load_settings(root / "params.yaml")
    steps = TrajectoryStore(paths.offline).read().to_pandas()
    S = len(steps)
    write_picks(paths, {("digiq", 0): Picks.taken(np.arange(S))})
    write_stored(paths, critic_scores_name("digiq", 0), steps,
                 {"q": np.tile(np.float32([0.0, 1.0, 0.0]), (S, 1)), "v": np.zeros(S, np.float32)})  # fmt: skip
    right = np.zeros((S, 3), bool)
    right[:, 1] = True
    write_stored(paths, EXPERT_MATRIX, steps, {"right": right, "kinds": np.full(S, "STORED_KIND")})
    # A second critic row whose stored pick (column 0) is never right: Digi-Q's leads it at every state.
    for folder in (paths.critics / "seed0" / "digiq").iterdir():
        shutil.copytree(folder, paths.critics / "seed0" / "digiq_frozen_text" / folder.name)
    write_stored(paths, critic_scores_name("digiq_frozen_text", 0), steps,
                 {"q": np.tile(np.float32([1.0, 0.0, 0.0]), (S, 1)), "v": np.zeros(S, np.float32)})  # fmt: skip

    def computed_again(*args, **kwargs):
        raise AssertionError("computed again what stage 07 stored")

    monkeypatch.setattr(Critic, "advantage", computed_again)
    monkeypatch.setattr(diagnostics, "expert_matrix", computed_again)
    cfg = DiagnosticsConfig(oracle_states=2, oracle_rollouts=1, behaviour_rollouts=0)
    m = run_diagnostics(cfg, paths, seeds=1, env=settings.env, policies=["digiq"],
                        collect=settings.collect, threshold=30.0)  # fmt: skip
    for part in ("expert_pick", "expert_pick_train"):  # the stored tap, always picked, always right
        assert m[part]["informative_states"] > 0 and m[part]["hit_rate"]["critic_digiq"] == 1.0, part
    assert {kind for by_kind in m["expert_support_by_kind"].values() for kind in by_kind} == {"STORED_KIND"}
    assert m["rows_expert_share"]["digiq"]["general"] == 0.0  # the data's own actions: never the stored tap
    lead = m["critic_pick_lead"]["digiq_frozen_text"]
    assert lead["all"]["all"]["diff"] == 100.0 and set(lead["all"]) == {"all", "other"}  # paired, state by state
    assert "digiq" not in m["critic_pick_lead"]

    write_stored(paths, critic_scores_name("digiq", 0), steps.iloc[1:], {"q": np.zeros((S - 1, 3), np.float32),
                                                                          "v": np.zeros(S - 1, np.float32)})  # fmt: skip
    with pytest.raises(DataError, match="critic_digiq_seed0.npz are not the stored steps"):
        run_diagnostics(cfg, paths, seeds=1, env=settings.env, policies=["digiq"],
                        collect=settings.collect, threshold=30.0)  # fmt: skip
    stored_path(paths, critic_scores_name("digiq", 0)).unlink()
    with pytest.raises(StageError, match=r"stage diagnostics: missing input .*critic_digiq_seed0\.npz"):
        run_diagnostics(cfg, paths, seeds=1, env=settings.env, policies=["digiq"],
                        collect=settings.collect, threshold=30.0)  # fmt: skip


def test_without_stored_hierarchies_the_goal_element_probe_is_absent(probe_root, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(probe_root.root, root)
    paths = Paths(root)
    for p in (paths.offline / "images").glob("*.hierarchy.json"):
        p.unlink()
    probes = representation_probes(paths, ["finetuned"], threshold=30.0, seed=5)
    for name in ("finetuned", "control"):
        assert "no view hierarchy stored" in probes[name]["tap_on_goal_element"]["absent"]
        assert probes[name]["changes_screen"]["n_test"] > 0
