"""The screen as text: uiautomator hierarchies, the listing a policy reads, and prompts that carry it."""

import re

import pytest

from digiq.config import BasePolicyConfig, CollectConfig, EnvConfig
from digiq.data import TrajectoryStore
from digiq.env import AndroidSimEnv, Dynamics, generate_tasks, parse_task
from digiq.env import actions as A
from digiq.env.device import SimDevice
from digiq.env.hierarchy import DUMP_TRAILER, describe, hierarchy_xml, strip_dump_trailer
from digiq.models.policy import AutoUIPolicy
from digiq.paths import Paths
from digiq.rollout import ExpertPolicy, rollout
from digiq.train.base_policy import run_base_policy
from digiq.train.collect import run_collect

ENTRY = re.compile(r"^(.+) (\d\.\d\d) (\d\.\d\d)$")


def entries(text: str) -> list[tuple[str, float, float]]:
    out = []
    for part in text.split(" ; "):
        m = ENTRY.match(part)
        assert m, part
        out.append((m.group(1), float(m.group(2)), float(m.group(3))))
    return out


def test_tapping_a_listed_element_taps_that_element():
    """Each listed position lies on the widget of that label: a policy can copy it into its tap."""
    dev = SimDevice(Dynamics.calm(), 108)
    dev.reset(0)
    listed = entries(describe(hierarchy_xml(dev.screen().widgets)))
    names = [label for label, _, _ in listed]
    assert {"Clock", "Settings", "Chrome"} <= set(names)
    label, y, x = next(e for e in listed if e[0] == "Clock")
    dev.step(A.tap(y, x))
    assert dev.state.page.app == "clock"


def test_every_listed_point_hits_its_widget_on_many_screens():
    env = AndroidSimEnv(dynamics=Dynamics(), width=108)
    tasks = [parse_task(t, "general") for t in generate_tasks("general", "train", 12, seed=1)]
    checked = 0
    for i, task in enumerate(tasks):
        env.reset(seed=i, options={"task": task})
        for action in ("tap", "home"):
            widgets = env.device.screen().widgets
            for label, y, x in entries(describe(hierarchy_xml(widgets))):
                hit = [w for w in widgets if w.contains(x * 1080, y * 2280) and w.label.startswith(label[:3])]
                assert hit, (task.instruction, label, y, x)
                checked += 1
            env.step(A.press_home() if action == "home" else A.tap(0.2, 0.5))
    assert checked > 100


def test_a_device_hierarchy_is_read_like_android_writes_it():
    xml = (
        "<?xml version='1.0' encoding='UTF-8' standalone='yes' ?><hierarchy rotation=\"0\">"
        '<node class="android.widget.FrameLayout" clickable="false" bounds="[0,0][1080,2280]">'
        '<node class="android.widget.TextView" package="com.android.systemui" text="12:00" clickable="true" '
        'bounds="[0,0][200,60]"/>'
        '<node class="android.widget.LinearLayout" clickable="true" bounds="[0,400][1080,600]">'
        '<node class="android.widget.TextView" text="Wi-Fi" clickable="false" bounds="[40,420][400,480]"/>'
        '<node class="android.widget.TextView" text="Connected to home network" clickable="false" '
        'bounds="[40,500][800,560]"/></node>'
        '<node class="android.widget.Switch" text="" content-desc="Bluetooth" checkable="true" checked="true" '
        'clickable="true" bounds="[900,700][1040,800]"/>'
        '<node class="android.widget.EditText" text="" content-desc="" clickable="false" bounds="[0,900][1080,1000]"/>'
        '<node class="android.widget.EditText" text="search here" clickable="false" bounds="[0,1000][1080,1100]"/>'
        '<node class="android.widget.Button" text="Off screen" clickable="true" bounds="[0,2400][100,2500]"/>'
        "</node></hierarchy>"
    )
    assert describe(xml) == "Wi-Fi Connected to home 0.22 0.50 ; Bluetooth on 0.33 0.90 ; search here 0.46 0.50"
    # Pixels of another screen size are normalised by it.
    assert describe(xml, (2160, 4560)).startswith("Wi-Fi Connected to home 0.11 0.25")


def test_dump_output_and_broken_hierarchies():
    xml = hierarchy_xml(())
    assert strip_dump_trailer(f"{xml}{DUMP_TRAILER}\n") == xml
    assert describe(xml) == ""
    with pytest.raises(ValueError, match="not a uiautomator dump"):
        strip_dump_trailer("ERROR: could not get idle state.")
    with pytest.raises(ValueError, match="not well-formed"):
        describe("<hierarchy><node")
    with pytest.raises(ValueError, match="expected a <hierarchy>"):
        describe("<html/>")
    with pytest.raises(ValueError, match=r"bounds '\[0,0\]', expected"):
        describe('<hierarchy><node clickable="true" text="OK" bounds="[0,0]"/></hierarchy>')


def test_rollout_prompts_carry_the_screen_when_asked(tmp_path):
    tasks = [parse_task(t, "general") for t in generate_tasks("general", "train", 3, seed=2)]
    plain, read = TrajectoryStore(tmp_path / "plain"), TrajectoryStore(tmp_path / "screen")
    a = rollout(ExpertPolicy(0.0), tasks, n_envs=3, width=108, store=plain, seed=4)
    b = rollout(ExpertPolicy(0.0), tasks, n_envs=3, width=108, store=read, seed=4, screen_text=True)
    assert a == b  # the same episodes: only the prompts differ
    ta, tb = plain.read().to_pandas(), read.read().to_pandas()
    assert not ta.observation.str.contains(" Screen: ").any()
    for col in ("observation", "next_observation"):
        assert (tb[col].str.replace(r" Screen:.*$", "", regex=True) == ta[col]).all()
        assert tb[col].str.contains(" Screen:").all()
    listed = [entries(o.split(" Screen: ")[1]) for o in tb.observation if not o.endswith(" Screen:")]
    assert len(listed) > len(tb) / 2 and any(label == "Clock" for e in listed for label, _, _ in e)


def test_a_base_policy_that_reads_the_screen_is_collected_with_it(tmp_path):
    """``base_policy.screen_text``: demonstrations, the checkpoint and the collected data all carry the screen."""
    paths = Paths(tmp_path)
    for ts in ("general", "webshop"):
        paths.task_list(ts, "train").parent.mkdir(parents=True, exist_ok=True)
        paths.task_list(ts, "train").write_text("\n".join(generate_tasks(ts, "train", 2, seed=3)) + "\n")
    cfg = BasePolicyConfig(demo_tasks=2, d_model=32, num_layers=1, epochs=1, vocab_size=400, screen_text=True)
    run_base_policy(cfg, EnvConfig(width=108), paths)
    model = AutoUIPolicy.load(paths.base_policy)
    assert model.cfg.screen_text and model.cfg.max_input_tokens == 320
    assert TrajectoryStore(paths.demos).read().to_pandas().observation.str.contains(" Screen:").all()
    run_collect(CollectConfig(tasks_per_set=2, n_envs=2), EnvConfig(width=108), paths)
    assert TrajectoryStore(paths.offline).read().to_pandas().observation.str.contains(" Screen:").all()
    with pytest.raises(ValueError, match="trained on prompts without the screen"):
        BasePolicyConfig(checkpoint="autoui", blip2="blip2", screen_text=True)
