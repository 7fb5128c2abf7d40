"""The crawl and the built-in proposer: what they read, what they write, and that nothing of the task lists leaks in."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace

import pytest

from digiq.env.gym_env import AndroidSimEnv
from digiq.env.state import Dynamics
from digiq.env.taskgen import POOLS, TEMPLATES
from digiq.pae.context import HOME, DeviceContext
from digiq.pae.crawl import crawl
from digiq.pae.lexicon import DEFAULT_LEXICON, Lexicon
from digiq.pae.proposals import Proposal, Slot, read_proposals, write_proposals
from digiq.pae.propose import FRAMES, GROUPS, propose
from digiq.stages.pae import practice_task, proposal_pools


@pytest.fixture(scope="module")
def context() -> DeviceContext:
    return crawl(lambda: AndroidSimEnv(dynamics=Dynamics()))


@pytest.fixture(scope="module")
def proposals(context: DeviceContext) -> list[Proposal]:
    return propose(context, Lexicon.read())


def _words(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


# ---------------------------------------------------------------- the crawl


def test_the_crawl_finds_apps_their_fields_and_the_screens_behind_them(context):
    home = context.apps[HOME][0]
    assert {"Chrome", "Maps", "Settings", "Clock"} <= set(home.buttons)
    assert any(s.inputs for s in context.apps["Maps"])  # the search field
    settings = {" > ".join(s.path): s for s in context.apps["Settings"]}
    assert "Clock" in settings["Settings > Apps & notifications"].buttons  # the list of apps, three taps deep
    assert all(len(s.path) <= context.depth for s in context.screens())


def test_the_crawl_is_repeatable_and_round_trips_through_its_file(context, tmp_path):
    again = crawl(lambda: AndroidSimEnv(dynamics=Dynamics()))
    assert again == context
    context.save(tmp_path / "crawl.json")
    assert DeviceContext.load(tmp_path / "crawl.json") == context


def test_the_crawl_never_types_and_only_taps():
    class Watched(AndroidSimEnv):
        actions: list[str] = []

        def step(self, action):
            Watched.actions.append(action.type.value)
            return super().step(action)

    crawl(Watched, depth=2)
    assert Watched.actions and set(Watched.actions) == {"DUAL_POINT"}


def test_a_deeper_crawl_sees_more(context):
    shallow = crawl(lambda: AndroidSimEnv(dynamics=Dynamics()), depth=1)
    assert len(shallow.screens()) < len(context.screens())
    assert all(len(s.path) <= 1 for s in shallow.screens())


def test_bad_crawl_settings_and_files_are_named(tmp_path):
    with pytest.raises(ValueError, match="depth >= 1"):
        crawl(AndroidSimEnv, depth=0)
    (tmp_path / "x.json").write_text('{"apps": 3}')
    with pytest.raises(ValueError, match="x.json is not a saved crawl"):
        DeviceContext.load(tmp_path / "x.json")


# ---------------------------------------------------------------- the lexicon


def test_the_lexicon_shares_no_entity_with_the_task_generator():
    lexicon = Lexicon.read()
    written = {e.value.lower() for kind, entries in lexicon.kinds.items() if kind not in ("purpose", "site")
               for e in entries}  # fmt: skip
    pooled = {v.lower() for pool, values in POOLS.items() if pool != "site" for v in values}
    assert written and not written & pooled
    assert {e.value for e in lexicon["site"]} == set(POOLS["site"])  # the shared five, and nothing else


def test_a_malformed_lexicon_is_named_with_its_line(tmp_path):
    path = tmp_path / "lex.txt"
    path.write_text("# comment\nKyoto\n")
    with pytest.raises(ValueError, match=r"lex.txt:2: the value 'Kyoto' comes before any \[kind\]"):
        Lexicon.read(path)
    path.write_text("[place]\nKyoto\nkyoto\n")
    with pytest.raises(ValueError, match="lex.txt:3: 'kyoto' is written twice"):
        Lexicon.read(path)
    path.write_text("[purpose]\nMaps places\n")
    with pytest.raises(ValueError, match="lex.txt:2: a \\[purpose\\] line is 'app: purpose'"):
        Lexicon.read(path).purposes()


# ---------------------------------------------------------------- the proposals


def test_every_group_is_proposed_from_the_default_device(proposals):
    assert {p.app for p in proposals} >= {"Chrome", "Maps", "YouTube", "Play Store", "Settings", "Clock", HOME}
    assert len({p.instruction.lower() for p in proposals}) == len(proposals)
    assert {p.task_set for p in proposals} == {"general", "webshop"}


def test_every_value_in_a_proposal_is_traced_to_a_screen_or_a_lexicon_line(context, proposals):
    lines = DEFAULT_LEXICON.read_text().splitlines()
    screens = {" > ".join(s.path) or HOME: s for s in context.screens()}
    for p in proposals:
        assert p.proposer == "builtin" and p.context
        filled = p.frame
        for slot in p.slots:
            if slot.source == "lexicon":
                name, line = slot.where.rsplit(":", 1)
                assert name == "digiq/pae/lexicon.txt" and lines[int(line) - 1].strip() == slot.value
            else:
                assert slot.source == "screen" and slot.where in p.context
                labels = {label.lower() for label in screens[slot.where].labels}
                assert slot.value.lower() in labels, (p.instruction, slot)
            filled = filled.replace("{" + slot.name + "}", slot.value, 1)
        assert filled == p.instruction  # the frame and its slots, nothing else


def test_no_proposal_copies_a_template_of_the_task_generator(proposals):
    patterns = [re.compile("^" + re.sub(r"\\\{\w+\\\}", ".+", re.escape(_words_keep_slots(t))) + "$")
                for family in TEMPLATES.values() for t in family]  # fmt: skip
    for text in [p.instruction for p in proposals] + [f for frames in FRAMES.values() for f in frames]:
        assert not any(rx.match(_words_keep_slots(text)) for rx in patterns), text


def _words_keep_slots(text: str) -> str:
    """Lower case, punctuation and quotes dropped, so that a copy differing only in them still counts as one."""
    return " ".join(re.findall(r"\{\w+\}|[a-z0-9]+", text.lower()))


def test_the_parser_measures_proposals_without_deciding_them(proposals):
    families = {p.instruction: practice_task(p).family for p in proposals}
    assert {"search", "maps", "youtube", "notifications", "alarm", "open_app", "install_app"} <= set(families.values())
    assert {"go_to_site", "site_search", "select_first"} <= set(families.values())  # the shopping group's three
    # A proposal no family matches is practised all the same, on a device with no check for it.
    odd = replace(proposals[0], instruction="Tidy up the home screen")
    pools = proposal_pools([*proposals, odd])
    assert sum(map(len, pools.values())) == len(proposals) + 1
    assert [t.family for t in pools[odd.task_set] if t.instruction == odd.instruction] == ["unchecked"]


def test_proposals_round_trip_and_bad_lines_are_named(proposals, tmp_path):
    path = tmp_path / "proposals.jsonl"
    write_proposals(path, proposals)
    assert read_proposals(path) == proposals
    path.write_text(json.dumps({"instruction": "x", "task_set": "weekly", "app": "a", "proposer": "p",
                                "context": []}) + "\n")  # fmt: skip
    with pytest.raises(ValueError, match="proposals.jsonl:1: not a proposal .*task_set must be one of"):
        read_proposals(path)
    with pytest.raises(ValueError, match="slot sources"):
        Proposal("Launch Maps", "general", HOME, "builtin", (HOME,), slots=(Slot("icon", "Maps", "memory", ""),))


def test_the_proposer_follows_its_seed_and_group_size(context):
    lexicon = Lexicon.read()
    assert propose(context, lexicon, seed=1) != propose(context, lexicon, seed=0)
    small = propose(context, lexicon, per_group=3)
    assert len(small) <= 3 * len(GROUPS) and {p.frame for p in small} >= {FRAMES["alarms"][0], FRAMES["alarms"][1]}
    with pytest.raises(ValueError, match="per_group must be >= 1"):
        propose(context, lexicon, per_group=0)


def test_a_group_whose_needs_the_crawl_did_not_see_is_not_proposed(context):
    without_maps_field = DeviceContext({app: [s for s in screens if not (app == "Maps" and s.inputs)]
                                        for app, screens in context.apps.items()})  # fmt: skip
    apps = {p.app for p in propose(without_maps_field, Lexicon.read())}
    assert "Maps" not in apps and "YouTube" in apps


def test_the_proposer_imports_nothing_of_the_device_the_task_lists_or_the_parser():
    code = ("import sys, digiq.pae.propose, digiq.pae.propose_llm; "
            "print([m for m in sys.modules if m.startswith('digiq.') and not m.startswith('digiq.pae')])")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    imported = eval(out)
    assert not [m for m in imported if m.startswith(("digiq.env", "digiq.stages", "digiq.data", "digiq.judge"))], out
