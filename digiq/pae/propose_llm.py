"""A chat LLM as the task proposer, asked as PAE asks: once per app, before any practice.

For each app the crawl reached, the model is told the app's name and what
its screens hold (the crawl's paths, buttons, text fields and switches), and
asked for tasks a likely user would give the phone in that app: varied in the
skill they need and in their wording, with one clear end that the last
screens show, a few steps long, needing no account. It thinks first, then
writes ``Output:`` and one JSON object per line, ``{"task": "..."}``. Lines
after the last ``Output:`` that are not such an object are dropped, as PAE
drops them; the rest are proposals in the same format as the built-in
proposer's (:mod:`digiq.pae.proposals`), cited to the model.

The endpoint is the judge's (``judge.base_url``, its key variable, time-outs
and retries: :class:`digiq.endpoint.ChatEndpoint`); a model of its own may be
named. A run writes its proposals once, as a DVC output, so a rerun of the
practice needs no endpoint.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from digiq.config import JudgeConfig
from digiq.endpoint import ChatEndpoint, EndpointError
from digiq.pae.context import HOME, DeviceContext, ScreenRecord
from digiq.pae.proposals import Proposal

__all__ = ["SYSTEM_PROMPT", "ProposerError", "app_prompt", "parse_reply", "propose_with_llm"]

SYSTEM_PROMPT = (
    "You write tasks for a phone assistant to practise on. Each task is one instruction a likely user would "
    "give: it asks for one clear result that the phone's last screens and the assistant's answer show, takes "
    "about 3 to 7 taps or typed entries, and needs no account, sign-in or payment."
)
OUTPUT = "Output:"


class ProposerError(EndpointError):
    """The LLM proposer could not write an app's tasks: the stage stops, naming the app."""


def _screen_line(record: ScreenRecord) -> str:
    parts = [f"buttons: {', '.join(record.buttons)}" if record.buttons else "",
             f"text fields: {', '.join(record.inputs)}" if record.inputs else "",
             f"switches: {', '.join(record.switches)}" if record.switches else ""]  # fmt: skip
    return f"- {' > '.join(record.path)}: " + "; ".join(p for p in parts if p)


def app_prompt(app: str, screens: Sequence[ScreenRecord], n: int) -> str:
    """The request for ``app``'s tasks: its screens as the crawl found them, then what to write and how."""
    return (
        f"App: {app}\n"
        "Screens reached from the home screen (the taps that lead there, then what the screen holds):\n"
        + "\n".join(_screen_line(s) for s in screens)
        + f"\n\nWrite {n} tasks a likely user would give the phone in this app. Vary the skills they need and "
        "how they are worded. Each must be objective: someone looking at the last three screens and the "
        "assistant's answer can tell whether it was done. Each takes 3 to 7 steps and needs no sign-in.\n"
        f"First think about what the app is for and what its users want. Then write a line '{OUTPUT}' and "
        'after it one JSON object per line, {"task": "the instruction"}, and nothing else.'
    )


def parse_reply(reply: str) -> list[str]:
    """The tasks of a reply: each line after its last ``Output:`` that is a JSON object with a non-empty
    ``task`` string; every other line is dropped."""
    at = reply.rfind(OUTPUT)
    if at < 0:
        return []
    tasks = []
    for line in reply[at + len(OUTPUT) :].splitlines():
        try:
            row = json.loads(line.strip().rstrip(","))
        except json.JSONDecodeError:
            continue
        task = row.get("task") if isinstance(row, dict) else None
        if isinstance(task, str) and task.strip():
            tasks.append(" ".join(task.split()))
    return tasks


def propose_with_llm(context: DeviceContext, cfg: JudgeConfig, per_app: int = 25,
                     model: str = "") -> list[Proposal]:  # fmt: skip
    """Up to ``per_app`` distinct tasks for each app the crawl reached (not the home screen), in crawl order.

    ``model`` overrides ``cfg.model``. A task proposed twice (for any app) is kept once.

    Raises:
        ProposerError: no key, a refused one, or no answer for an app (after the endpoint's retries).
        ValueError: ``per_app`` is below 1.
    """
    if per_app < 1:
        raise ValueError(f"per_app must be >= 1, got {per_app}")
    try:
        endpoint = ChatEndpoint(cfg, who="the task proposer's")
    except EndpointError as e:
        raise ProposerError(str(e)) from None
    name = model or cfg.model
    out: list[Proposal] = []
    seen: set[str] = set()
    for app, screens in context.apps.items():
        if app == HOME:
            continue
        messages = [{"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": app_prompt(app, screens, per_app)}]  # fmt: skip
        try:
            reply = endpoint.complete(messages, name)
        except EndpointError as e:
            raise ProposerError(f"proposing tasks for {app!r}: {e}") from None
        where = tuple(" > ".join(s.path) for s in screens)
        for task in parse_reply(reply)[:per_app]:
            if task.lower() not in seen:
                seen.add(task.lower())
                out.append(Proposal(task, "general", app, f"llm:{name}", where))
    return out
