"""The LLM proposer against a real HTTP server on loopback that speaks the chat-completions protocol."""

from __future__ import annotations

import json

import pytest

from digiq.config import JudgeConfig
from digiq.pae.context import HOME, DeviceContext, ScreenRecord
from digiq.pae.propose_llm import ProposerError, app_prompt, parse_reply, propose_with_llm

CONTEXT = DeviceContext({
    HOME: [ScreenRecord((), ("Maps", "Clock"), ("Search",), ())],
    "Maps": [ScreenRecord(("Maps",), (), ("Search Maps",), ())],
    "Clock": [ScreenRecord(("Clock",), ("+",), (), ()), ScreenRecord(("Clock", "+"), ("1", "2"), (), ())],
}, depth=2)  # fmt: skip


def _reply(*tasks: str, thoughts: str = "People use this app to find places.") -> str:
    return thoughts + "\nOutput:\n" + "\n".join(json.dumps({"task": t}) for t in tasks)


def _cfg(server, **kw) -> JudgeConfig:
    return JudgeConfig(base_url=server.url, model="served-llm", api_key_env="DIGIQ_TEST_KEY", **kw)


def test_each_app_is_asked_once_with_its_screens_and_its_answer_parsed_as_pae_parses(serve, monkeypatch):
    monkeypatch.setenv("DIGIQ_TEST_KEY", "sk-test")
    maps = _reply("Find bakeries near the river", "Find bakeries near the river", "Show me parks")
    clock = (
        "I think.\nOutput: ignored\n"
        + _reply("Set an alarm for 6:40am", thoughts="Output: was a draft")
        + ('\nnot json\n{"task": ""}\n["a list"]\n{"name": "no task key"}\n{"task": "Delete the alarm"},')
    )
    server = serve((200, maps, {}), (200, clock, {}))
    proposals = propose_with_llm(CONTEXT, _cfg(server), per_app=5, model="proposer-llm")
    assert [(p.app, p.instruction) for p in proposals] == [
        ("Maps", "Find bakeries near the river"), ("Maps", "Show me parks"),
        ("Clock", "Set an alarm for 6:40am"), ("Clock", "Delete the alarm")]  # fmt: skip
    assert {p.proposer for p in proposals} == {"llm:proposer-llm"}
    assert proposals[-1].context == ("Clock", "Clock > +") and proposals[-1].task_set == "general"
    assert len(server.requests) == 2  # the home screen is no app
    body = server.requests[0][2]
    assert body["model"] == "proposer-llm" and server.requests[0][1]["authorization"] == "Bearer sk-test"
    assert body["messages"][1]["content"] == app_prompt("Maps", CONTEXT.apps["Maps"], 5)
    assert "- Maps: text fields: Search Maps" in body["messages"][1]["content"]


def test_at_most_per_app_tasks_are_kept():
    reply = _reply(*(f"Task {i}" for i in range(9)))
    assert parse_reply(reply)[:3] == ["Task 0", "Task 1", "Task 2"] and len(parse_reply(reply)) == 9
    assert parse_reply("no output line at all") == []


def test_an_endpoint_that_gives_no_answer_stops_the_proposer_naming_the_app(serve):
    server = serve((200, _reply("Show me parks"), {}), (400, "model not found", {}))
    with pytest.raises(ProposerError, match=r"proposing tasks for 'Clock': .*answered HTTP 400"):
        propose_with_llm(CONTEXT, JudgeConfig(base_url=server.url, api_key_env=""), per_app=2)


def test_a_missing_key_is_named_before_any_request(monkeypatch):
    monkeypatch.delenv("DIGIQ_TEST_KEY", raising=False)
    with pytest.raises(ProposerError, match=r"the task proposer's endpoint key is read from \$DIGIQ_TEST"):
        propose_with_llm(CONTEXT, JudgeConfig(base_url="http://127.0.0.1:9/v1", api_key_env="DIGIQ_TEST_KEY"))


def test_a_proxy_echoing_the_key_into_the_answer_leaves_it_in_no_proposal(serve, monkeypatch):
    key = "sk-live-0123456789abcdef"
    monkeypatch.setenv("DIGIQ_TEST_KEY", key)
    echo = _reply(f"Search for {key}", f"Search for {key.upper()[:12]} and {key[12:]}")
    server = serve((200, echo, {}), (200, _reply("Set an alarm for 6:40am"), {}))
    proposals = propose_with_llm(CONTEXT, _cfg(server), per_app=5)
    written = json.dumps([p.instruction for p in proposals])
    assert "[redacted]" in written and not any(key[i : i + 8].lower() in written.lower() for i in range(17))
