"""The screen as text: uiautomator hierarchies, the listing a policy reads, and prompts that carry it."""

import re
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest

from digiq.config import BasePolicyConfig, CollectConfig, EnvConfig
from digiq.data import TrajectoryStore
from digiq.data.trajectories import DataError
from digiq.env import AndroidSimEnv, Dynamics, generate_tasks, parse_task
from digiq.env import actions as A
from digiq.env.device import SimDevice
from digiq.env.expert import Expert
from digiq.env.hierarchy import DUMP_TRAILER, Tapped, describe, hierarchy_xml, strip_dump_trailer, tapped_elements
from digiq.env.screens import NOOP
from digiq.env.state import Page
from digiq.env.ui import Widget
from digiq.io import StageError
from digiq.models.policy import AutoUIPolicy
from digiq.paths import Paths
from digiq.rollout import ExpertPolicy, episode_seed, rollout
from digiq.stages.base_policy import run_base_policy
from digiq.stages.collect import run_collect

# Stage 01 on each of its few train tasks once, rather than the released episode counts drawn from them.
EACH_TASK_ONCE = {"episodes_general": None, "episodes_webshop": None}

ENTRY = re.compile(r"^(.+) (\d\.\d\d) (\d\.\d\d)$")


def entries(text: str) -> list[tuple[str, float, float]]:
    out = []
    for part in text.split(" ; "):
        m = ENTRY.match(part)
        assert m, part
        out.append((m.group(1), float(m.group(2)), float(m.group(3))))
    return out


def labels(xml: str, points: list[tuple[float, float]]) -> list[str]:
    return [hit.label for hit in tapped_elements(xml, points)]


def centre(w: Widget) -> tuple[float, float]:
    return w.center[1] / 2280, w.center[0] / 1080


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


def test_a_tap_lands_on_the_element_the_device_taps():
    """tapped_elements names what the simulator's own tap handling would touch, a dialog included."""
    dev = SimDevice(Dynamics.calm(), 108)
    dev.reset(0)
    xml = hierarchy_xml(dev.screen().widgets)
    clock = next(w for w in dev.screen().widgets if w.label == "Clock")
    x, y = clock.center
    points = [(y / 2280, x / 1080), (y / 2280, (clock.box[2] - 1) / 1080), (0.995, 0.01), (0.02, 0.5)]
    centre, off_centre, back, status = labels(xml, points)
    assert centre == off_centre == "Clock"  # anywhere inside the box
    assert back != ""  # the navigation bar's Back: a tap of its own
    assert status == ""  # the status bar does nothing
    assert labels(xml, points[::-1]) == [status, back, off_centre, centre]  # one label per point, in order
    assert tapped_elements(xml, []) == []
    dev = SimDevice(replace(Dynamics.calm(), popup_rate=1.0), 108)  # every app opens behind a dialog
    dev.reset(0)
    dev.step(A.tap(y / 2280, x / 1080))
    assert dev.state.popup is not None
    shown = dev.screen().widgets
    xml = hierarchy_xml(shown)
    ids = [n.get("resource-id") for n in ET.fromstring(xml).iter("node") if n.get("resource-id")]
    assert ids and all(i.startswith(("popup", "nav")) for i in ids)
    behind = [w for w in shown if not w.id.startswith(("popup", "nav")) and w.intent not in (None, NOOP) and w.label]
    assert behind  # the clock app's own buttons, which the dialog blocks
    hits = labels(xml, [(w.center[1] / 2280, w.center[0] / 1080) for w in behind])
    assert all(hit != w.label for hit, w in zip(hits, behind, strict=True))
    later = next(w for w in shown if w.id == "popup.later")
    assert labels(xml, [(later.center[1] / 2280, later.center[0] / 1080)]) == ["Not now"]


def test_a_lists_entries_are_one_containers_children_and_a_tap_knows_which():
    """The first product of a results page is entry 0 of its list, whatever the sponsored entry above it."""
    dev = SimDevice(Dynamics.calm(), 108)
    dev.reset(0)
    dev.state.page, dev.state.ad = Page("chrome", "site_results", query="dell xps", site="ebay"), True
    widgets = dev.screen().widgets
    products = [w for w in widgets if w.id.startswith("product:")]
    ad = next(w for w in widgets if w.id == "ad")
    assert len(products) > 3 and ad.box[3] <= products[0].box[1]  # the ad is drawn first, above the list
    root = ET.fromstring(hierarchy_xml(widgets))
    (box,) = [n for n in root.iter("node") if n.get("resource-id") == "product.list"]
    assert box.get("class") == "androidx.recyclerview.widget.RecyclerView" and box.get("clickable") == "false"
    assert [(n.get("index"), n.get("resource-id")) for n in box] == [
        (str(k), f"product:{k}") for k in range(len(products))
    ]
    hits = tapped_elements(hierarchy_xml(widgets), [centre(w) for w in [*products, ad]])
    assert [hit.entry for hit in hits] == [*range(len(products)), -1]
    assert all(" ".join(w.label.split()).startswith(hit.label) and hit.label for w, hit in zip(products, hits))
    assert hits[-1].label.startswith("Ad")
    dev.step(A.tap(*centre(products[0])))
    assert dev.state.page.name == "product" and dev.state.page.index == 0  # what the sim means by the first entry


def test_the_nested_dump_is_hit_as_the_device_taps_on_every_screen_of_many_episodes():
    """Nesting the lists keeps the drawing order: each tappable widget's centre names that widget and its place in its list."""
    checked = entries_seen = 0
    for task_set in ("general", "webshop"):
        env = AndroidSimEnv(dynamics=Dynamics(), width=108)
        for i, text in enumerate(generate_tasks(task_set, "train", 10, seed=3)):
            task = parse_task(text, task_set)
            env.reset(seed=i, options={"task": task})
            expert = Expert(0.3, i)
            for _ in range(task.max_steps):
                widgets = env.device.screen().widgets
                xml = hierarchy_xml(widgets)
                shown = [w for w in widgets if env.device.state.popup is None or w.id.startswith(("popup", "nav"))]
                for w, hit in zip(shown, tapped_elements(xml, [centre(w) for w in shown]), strict=True):
                    x, y = w.center
                    top = (
                        next(v for v in reversed(shown) if v.intent is not None and v.contains(x, y))
                        if any(v.intent is not None and v.contains(x, y) for v in shown)
                        else None
                    )
                    if top is None or top.intent == NOOP:
                        continue
                    name, _, k = top.id.rpartition(":")
                    same = [v for v in shown if v.id.rpartition(":")[0] == name] if k.isdigit() else []
                    assert hit == Tapped(hit.label, same.index(top) if same else -1), (text, top.id, hit)
                    assert " ".join(top.label.split()).startswith(hit.label), (text, top.id, hit)
                    checked += 1
                    entries_seen += hit.entry >= 0
                _, _, done, _, _ = env.step(expert.act(env.device, task))
                if done:
                    break
    assert checked > 500 and entries_seen > 50


def test_a_devices_list_entry_is_its_rows_place_wherever_inside_the_row_the_tap_lands():
    row = (
        '<node class="android.widget.LinearLayout" clickable="true" bounds="[0,{y0}][1080,{y1}]">'
        '<node class="android.widget.TextView" text="{name}" clickable="false" bounds="[40,{y0}][700,{y1}]"/>'
        '<node class="android.widget.Button" text="Add" clickable="true" bounds="[800,{y0}][1040,{y1}]"/></node>'
    )
    rows = "".join(row.format(y0=400 + 200 * k, y1=600 + 200 * k, name=f"Item {k}") for k in range(3))
    xml = ('<hierarchy rotation="0"><node class="android.widget.FrameLayout" bounds="[0,0][1080,2280]">'
           '<node class="android.widget.Button" text="Filter" clickable="true" bounds="[0,200][1080,400]"/>'
           '<node class="android.widget.FrameLayout" bounds="[0,400][1080,1000]">'
           f'<node class="androidx.recyclerview.widget.RecyclerView" bounds="[0,400][1080,1000]">{rows}</node>'
           "</node></node></hierarchy>")  # fmt: skip
    y = lambda k: (500 + 200 * k) / 2280  # noqa: E731
    hits = tapped_elements(xml, [(y(0), 0.2), (y(2), 0.2), (y(1), 0.85), (0.13, 0.5), (0.9, 0.5)])
    assert hits == [Tapped("Item 0 Add", 0), Tapped("Item 2 Add", 2), Tapped("Add", 1), Tapped("Filter"), Tapped("")]


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
    with pytest.raises(ValueError, match="not well-formed"):
        tapped_elements("<hierarchy><node", [(0.5, 0.5)])
    with pytest.raises(ValueError, match=r"bounds '\[0,0\]', expected"):
        tapped_elements('<hierarchy><node clickable="true" text="OK" bounds="[0,0]"/></hierarchy>', [(0.5, 0.5)])


def test_typed_control_characters_are_dumped_and_read_as_dots():
    # A policy typed "\x07 charge" into a search field (seen in a pipeline run): XML cannot hold \x07 even escaped.
    field = Widget("site.search", "input", (0, 200, 1080, 300), "\x07 charge\x1f", intent=("focus",))
    xml = hierarchy_xml([field])
    assert ET.fromstring(xml).find(".//node[@resource-id='site.search']").get("text") == ". charge."
    assert labels(xml, [(250 / 2280, 0.5)]) == [". charge."]
    # A dump stored before the writer replaced them (or from another tool) is read the same way.
    raw = xml.replace(". charge.", "\x07 charge\x1f")
    assert labels(raw, [(250 / 2280, 0.5)]) == [". charge."]


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
    """``base_policy.screen_text``: demonstrations, the checkpoint and the collected data all carry the screen.

    Collection rolls out the train tasks after the demonstrated ones (``collect.skip_demonstrated``).
    """
    paths = Paths(tmp_path)
    lists = {ts: generate_tasks(ts, "train", 4, seed=3) for ts in ("general", "webshop")}
    for ts, lines in lists.items():
        paths.task_list(ts, "train").parent.mkdir(parents=True, exist_ok=True)
        paths.task_list(ts, "train").write_text("\n".join(lines) + "\n")
    cfg = BasePolicyConfig(demo_tasks=2, d_model=32, num_layers=1, epochs=1, vocab_size=400,
                           screen_text=True)  # fmt: skip
    run_base_policy(cfg, EnvConfig(width=108), paths)
    model = AutoUIPolicy.load(paths.base_policy)
    assert model.cfg.screen_text and model.cfg.max_input_tokens == 320
    assert TrajectoryStore(paths.demos).read().to_pandas().observation.str.contains(" Screen:").all()
    assert set(TrajectoryStore(paths.demos).read().to_pandas().task) == set(lists["general"][:2] + lists["webshop"][:2])
    with pytest.raises(StageError, match=r"tasks_per_set 3 after the 2 the base policy was demonstrated needs 5"):
        run_collect(CollectConfig(tasks_per_set=3, n_envs=2, **EACH_TASK_ONCE), EnvConfig(width=108), paths)
    metrics = run_collect(CollectConfig(tasks_per_set=2, n_envs=2, **EACH_TASK_ONCE), EnvConfig(width=108), paths)
    collected = TrajectoryStore(paths.offline).read().to_pandas()
    assert collected.observation.str.contains(" Screen:").all()
    assert metrics["first_train_task"] == {"general": 2, "webshop": 2}  # collect starts past each set's demonstrations
    assert set(collected.task) == set(lists["general"][2:] + lists["webshop"][2:])
    with pytest.raises(ValueError, match="trained on prompts without the screen"):
        BasePolicyConfig(checkpoint="autoui", blip2="blip2", screen_text=True)


def test_rollout_stores_each_screens_hierarchy_beside_its_screenshot(tmp_path):
    tasks = [parse_task(t, "general") for t in generate_tasks("general", "train", 3, seed=2)]
    store = TrajectoryStore(tmp_path / "data")
    rollout(ExpertPolicy(0.0), tasks, n_envs=3, width=108, store=store, seed=4, hierarchies=True)
    steps = store.read().to_pandas()
    images = sorted(set(steps.image_path) | set(steps.next_image_path))
    assert len(list(store.images.glob("*.hierarchy.json"))) == len(images)  # every screen, the last ones too
    env = AndroidSimEnv(width=108)
    first = steps[steps.step_id == 0].iloc[0]
    env.reset(seed=episode_seed(4, int(first.traj_id)), options={"task": tasks[int(first.traj_id)]})
    assert store.load_hierarchy(first.image_path) == (env.view_hierarchy(), (1080, 2280))
    env.step(first.action)
    assert store.load_hierarchy(first.next_image_path)[0] == env.view_hierarchy()
    plain = TrajectoryStore(tmp_path / "plain")
    rollout(ExpertPolicy(0.0), tasks[:1], n_envs=1, width=108, store=plain, seed=4)
    with pytest.raises(DataError, match="collect.view_hierarchy: true"):
        plain.load_hierarchy(plain.read().to_pandas().image_path.iat[0])
    (store.root / store.hierarchy_name(first.image_path)).write_text("{broken")
    with pytest.raises(DataError, match="cannot read view hierarchy .*000000_00"):
        store.load_hierarchy(first.image_path)
