"""The Q/V viewers on a small real dataset: expert rollouts, candidates, feature files, a critic checkpoint."""

import base64
import io
import shutil

import numpy as np
import pytest
from conftest import TAP  # candidate 1 of every state taps here
from PIL import Image

from digiq.env.actions import parse_action
from digiq.viz.values import load_values
from digiq.viz.viewers import ActionViewer, TrajectoryViewer


@pytest.fixture(scope="module")
def data(values_root):
    return load_values(values_root)


def test_load_values_scores_every_step_and_candidate(data):
    assert len(data.candidates) == 3 * len(data.steps) and data.gamma == 0.9
    assert np.allclose(data.steps.q - data.steps.v, data.steps.advantage, atol=1e-5)
    first = data.step_candidates(0, 0)
    assert first.q.is_monotonic_decreasing
    chosen = first[first.chosen]
    assert len(chosen) == 1 and chosen.valid.all()  # Best-of-N never picks the invalid candidate 2
    assert chosen.advantage.iloc[0] == first[first.valid].advantage.max()
    with pytest.raises(KeyError, match="no trajectory 99"):
        data.trajectory(99)


def test_trajectory_viewer_draws_the_step_and_filters(data):
    v = TrajectoryViewer(data)
    assert len(v.traj.options) == 5 and v.image is not None
    for traj_id in data.steps.traj_id.unique():
        steps = data.trajectory(traj_id)
        taps = [i for i, a in enumerate(steps.action) if parse_action(a).is_tap]
        if taps:
            break
    v.traj.value = traj_id
    v.step.value = taps[0]
    ty, tx = parse_action(steps.action.iloc[taps[0]]).touch
    w, h = v.image.size
    r = max(3, w // 30)
    assert tuple(np.asarray(v.image)[int(ty * h), int(tx * w) + r - 1]) == (230, 30, 60)  # the ring's right edge
    assert list(v.table["V(s)"]) == pytest.approx(list(steps.v)) and list(v.table.step) == list(range(len(steps)))
    assert "background" in v.values.value  # the current step is highlighted
    failed = int((v.trajectories.reward == 0).sum())
    v.outcome.value = "failure"
    assert len(v.traj.options) == failed
    v.outcome.value = "all"
    v.text.value = "zzzz no such task"
    assert v.traj.options == () and v.image is None
    v.text.value = ""
    assert len(v.figure().axes) == len(data.trajectory(v.traj.value))


def test_action_viewer_sorts_by_q_and_marks_best_of_n(data):
    v = ActionViewer(data, oracle=True)
    t = v.table
    assert list(t.Q) == sorted(t.Q, reverse=True) and sorted(t["#"]) == [0, 1, 2]
    assert (t["Best-of-N"] != "").sum() == 1 and t[t["#"] == 2]["Best-of-N"].iloc[0] == ""
    assert set(t["VLM: changes screen?"]) <= {"Yes", "No"} and t["oracle value"].between(0, 1).all()
    w, h = v.image.size
    r = max(3, w // 30)
    y, x = TAP
    assert tuple(np.asarray(v.image)[int(y * h), int(x * w) + r - 1]) == (30, 120, 230)  # candidate #1's colour
    v.step.value = 1
    assert v.table is not t and len(v.figure().axes) == 2


@pytest.mark.parametrize("viewer", [TrajectoryViewer, ActionViewer])
def test_a_viewer_displays_as_its_widget_with_a_picture_beside_it(data, viewer):
    v = viewer(data)
    bundle = v._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == v.widget.model_id
    picture = Image.open(io.BytesIO(base64.b64decode(bundle["image/png"])))
    assert picture.format == "PNG" and min(picture.size) > 100


def test_action_viewer_says_unknown_for_imported_features_without_p_yes(values_root, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(values_root, root)
    p_yes = root / "data" / "features" / "finetuned" / "p_yes.npy"
    np.save(p_yes, np.full(np.load(p_yes).shape, np.nan, np.float32))  # as `digiq.data start-at critic` writes
    t = ActionViewer(load_values(root), oracle=False).table
    assert set(t["VLM: changes screen?"]) == {"?"} and t["P(Yes)"].isna().all()
