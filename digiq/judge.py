"""A VLM judge of task success on real screens, over an OpenAI-compatible chat endpoint.

The simulator knows when a task is done; a real emulator does not. As in the
papers (a VLM judge that sees only the newest screenshot), the judge sends
the task and the current screenshot to a chat model and reads its verdict
from a reasoned reply that ends in ``Status: success`` or ``Status: failure``.
With ``judge.few_shot`` it first shows worked examples (screenshot, task,
reasoned answer), as the papers' judge did; without, it asks zero-shot.

Requests go through :class:`digiq.endpoint.ChatEndpoint`, so any server
speaking the chat-completions protocol works (``vllm serve`` locally, or a
remote API); it retries rate limits, server errors, dropped connections and
time-outs, follows no redirect, and reads the key, if the endpoint needs one,
from an environment variable, never from params.

The verdict is read from the reply's last ``Status:`` line, or from a reply
that is nothing but the word (:func:`verdict`); a negation, an echo of the
format or anything else is no verdict, never a success.

What goes wrong is told apart by what it means for the run:

- the endpoint refuses the key (:class:`JudgeAuthError`) or redirects
  elsewhere (the key is never sent to another host): the stage stops,
  naming why;
- a step that gets no verdict (:class:`NoVerdict`): an HTTP 400 for a
  setting the model rejects, an empty or unparsable answer, or no answer
  within the retries and each request's deadline, or a reply that is no
  chat completion (an HTML page, other JSON). It is a fault of that
  episode only: the episode starts again or counts as failed
  (``judge.bad_reply``) and the fault is logged in ``faults.jsonl``. Only
  ``judge.max_bad_in_a_row`` of them in a row, which say the endpoint or its
  settings are wrong, stop the stage.

Every try has a deadline of ``judge.timeout_s`` as a whole, from the wait
before it (a server's ``Retry-After``, or the backoff) to the body's last
byte: a server that trickles its headers or its answer, or asks to be asked
again later, cannot hold a device for more than that a try. A
``Retry-After`` longer than the deadline is not waited for: that step gets
no verdict at once.

No secret is ever written: every message the judge raises, which the
rollout copies into ``faults.jsonl`` and the log, has the key (whole, or any
run of 8 of its characters, in any case), any ``Authorization``/``Bearer``
material and a URL's user and password replaced by ``[redacted]``
(:func:`redact`) before any of it is cut to length, since many proxies echo
the request's headers in their error bodies; log records are cleaned as they
are made, the HTTP libraries' own DEBUG lines included.

A :class:`VLMJudge` is an :class:`~digiq.env.adb_env.Evaluator`: pass it to
:class:`~digiq.env.backends.EnvFactory` for the ``emulator`` backend.
"""

from __future__ import annotations

import base64
import io
import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from digiq.config import DeviceConfig, JudgeConfig
from digiq.endpoint import NO_KEY, REDACTED, ChatEndpoint, EndpointAuthError, EndpointError, NoAnswer, redact
from digiq.env.adb_env import VerdictError
from digiq.env.tasks import Task

__all__ = [
    "JudgeError", "JudgeAuthError", "NoVerdict", "VLMJudge", "Example", "read_examples", "verdict",
    "SYSTEM_PROMPT", "REPLY_FORMAT", "NO_KEY", "REDACTED", "redact", "evaluator_for", "image_part",
]  # fmt: skip

SYSTEM_PROMPT = (
    "You check whether a phone agent finished its task. You see the task and the phone's screen after the "
    "agent's last action, nothing else. The task is finished when the screen shows its result (for a search: "
    "the results of that search; for an app or a setting: that app or setting open)."
)
REPLY_FORMAT = (
    "Answer in three lines:\n"
    "Expected: what the screen would show if the task were finished\n"
    "Seen: what this screen shows, and whether that is it\n"
    "Status: success or failure"
)

# The words that are a verdict, and nothing else: "unsuccessful", "not success" or "success or failure" are none.
_VERDICT_WORDS = {"success": True, "successful": True, "failure": False, "failed": False, "fail": False}
# A Status line: "Status: failure", "**Status:** success", "- status = Failure." (markdown and a final stop allowed).
_STATUS_LINE = re.compile(r"^[\s*_#>`-]*status[\s*_`]*[:=-](?P<value>.*)$", re.IGNORECASE | re.MULTILINE)
# Around a verdict word: markdown, quotes, a final stop, and any white space (a "\r" of a CRLF reply, say).
_DECORATION = re.compile(r"^[\s*_`'\".!]+|[\s*_`'\".!]+$")


class JudgeError(RuntimeError):
    """The judge cannot work: the stage cannot go on."""


class JudgeAuthError(JudgeError):
    """The endpoint refused the credentials: retrying cannot help."""


class NoVerdict(JudgeError, VerdictError):
    """No verdict for this step (a bad reply, or none in time): a fault of the episode being judged, not of the stage."""


@dataclass(frozen=True)
class Example:
    """A worked example for the few-shot prompt: a screen, a task, and the reasoned answer for them."""

    image: Path
    task: str
    answer: str


def read_examples(path: Path | str) -> list[Example]:
    """The examples of a JSONL file, one ``{"image", "task", "answer"}`` object per line.

    ``image`` is relative to the file; ``answer`` is written as the judge
    should reply (:data:`REPLY_FORMAT`) and must end in a Status line.

    Raises:
        ValueError: naming the file and line of a missing key, image or Status line.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"judge.few_shot: no file {path}")
    examples = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e})") from None
        missing = [k for k in ("image", "task", "answer") if not isinstance(row.get(k), str)]
        if missing:
            raise ValueError(f"{where}: needs string keys image, task and answer; missing or not text: {missing}")
        image = path.parent / row["image"]
        if not image.is_file():
            raise ValueError(f"{where}: image {row['image']!r} not found as {image}")
        if verdict(row["answer"]) is None:
            raise ValueError(f"{where}: the answer must end in 'Status: success' or 'Status: failure'")
        examples.append(Example(image, row["task"], row["answer"]))
    if not examples:
        raise ValueError(f"{path}: no examples")
    return examples


def verdict(reply: str) -> bool | None:
    """The verdict a reply gives, or None.

    Its last ``Status:`` line decides when it has one: the line must hold a
    verdict word alone (``success``/``successful``, ``failure``/``failed``/
    ``fail``, any case, markdown, white space and a final stop allowed). Without a Status
    line, the whole reply must be such a word. Anything else (a negation
    such as ``not success`` or ``unsuccessful``, the format echoed, a
    sentence) is no verdict: reading one into it would store a failed
    episode with reward 1.
    """
    statuses = _STATUS_LINE.findall(reply)
    return _VERDICT_WORDS.get(_DECORATION.sub("", statuses[-1] if statuses else reply).lower())


class VLMJudge:
    """Success/failure verdicts from a chat VLM for (task, screenshot); safe to share between device threads."""

    def __init__(self, cfg: JudgeConfig | None = None) -> None:
        self.cfg = cfg or JudgeConfig()
        try:
            self.endpoint = ChatEndpoint(self.cfg)
        except EndpointAuthError as e:
            raise JudgeAuthError(str(e)) from None
        self.examples = read_examples(self.cfg.few_shot) if self.cfg.few_shot else []
        self._example_content = [part for ex in self.examples for part in self._shown(ex)]
        self._lock = threading.Lock()
        self._bad_in_a_row = 0

    def __call__(self, link: object, task: Task, screenshot: np.ndarray) -> bool:
        """The :class:`~digiq.env.adb_env.Evaluator` call: only the screen and the task are used."""
        return self.judge(task.instruction, screenshot)

    def judge(self, task: str, screenshot: np.ndarray) -> bool:
        """The verdict for ``task`` on ``screenshot``.

        Raises:
            NoVerdict: no verdict for this step (the episode's fault).
            JudgeError: a refused key, a redirect, or too many steps without a verdict in a row (the stage's end).
        """
        try:
            try:
                reply = self._ask(task, screenshot)
            except JudgeError as e:  # the one place every message passes on its way to faults.jsonl and the log
                e.args = (redact(str(e), self.endpoint.secrets),)
                raise
        except NoVerdict as e:
            with self._lock:
                self._bad_in_a_row += 1
                if self._bad_in_a_row >= self.cfg.max_bad_in_a_row:
                    raise JudgeError(f"the judge's last {self._bad_in_a_row} replies were no verdicts, the last: {e} "
                                     "(check judge.model, max_completion_tokens and temperature)") from None  # fmt: skip
            raise
        with self._lock:
            self._bad_in_a_row = 0
        return reply

    def messages(self, task: str, screenshot: np.ndarray) -> list[dict[str, Any]]:
        """The chat: the instructions, then any worked examples, then this screen and task."""
        question = [{"type": "text", "text": f"Task: {task}\n{REPLY_FORMAT}"}]
        if self.examples:
            content = [{"type": "text", "text": "Worked examples:"}, *self._example_content,
                       {"type": "text", "text": "Your turn. Screen:"}, image_part(screenshot, self.cfg.max_image_side),
                       *question]  # fmt: skip
        else:
            content = [image_part(screenshot, self.cfg.max_image_side), *question]
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": content}]

    def _shown(self, example: Example) -> list[dict[str, Any]]:
        with Image.open(example.image) as im:
            image = np.asarray(im.convert("RGB"))
        return [{"type": "text", "text": "Screen:"}, image_part(image, self.cfg.max_image_side),
                {"type": "text", "text": f"Task: {example.task}\n{example.answer}"}]  # fmt: skip

    def _ask(self, task: str, screenshot: np.ndarray) -> bool:
        count_failed = self.cfg.bad_reply == "fail"
        try:
            text = self.endpoint.complete(self.messages(task, screenshot))
        except EndpointAuthError as e:
            raise JudgeAuthError(str(e)) from None
        except NoAnswer as e:
            raise NoVerdict(str(e), count_failed=count_failed) from None
        except EndpointError as e:
            raise JudgeError(str(e)) from None
        found = verdict(text)
        if found is None:
            raise NoVerdict(f"the judge's answer gives no Status: success or failure: {self.endpoint.shown(text)!r}",
                            count_failed=count_failed)  # fmt: skip
        return found


def image_part(screenshot: np.ndarray, max_side: int) -> dict[str, Any]:
    """A screenshot as a chat message's image part: a PNG data URL, downscaled to fit ``max_side``."""
    image = Image.fromarray(np.asarray(screenshot, np.uint8))
    image.thumbnail((max_side, max_side))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()},
    }


def evaluator_for(devices: DeviceConfig, judge: JudgeConfig) -> VLMJudge | None:
    """The success judge that collect and eval hand to their devices: params decide, not code.

    A real emulator has no ground truth, so it is always judged by the VLM.
    Simulated phones keep the simulator's exact check unless ``judge.on_adb_sim``
    asks for the VLM on ``adb-sim`` too, which measures a judge against ground
    truth on the same screens.
    """
    if devices.backend == "emulator" or (devices.backend == "adb-sim" and judge.on_adb_sim):
        return VLMJudge(judge)
    return None
