"""A VLM judge of task success on real screens, over an OpenAI-compatible chat endpoint.

The simulator knows when a task is done; a real emulator does not. As in the
papers (a VLM judge that sees only the newest screenshot), the judge sends
the task and the current screenshot to a chat model and reads its verdict
from a reasoned reply that ends in ``Status: success`` or ``Status: failure``.
With ``judge.few_shot`` it first shows worked examples (screenshot, task,
reasoned answer), as the papers' judge did; without, it asks zero-shot.

Requests go through the ``openai`` client, so any server speaking the
chat-completions protocol works (``vllm serve`` locally, or a remote API) and
rate limits, server errors, dropped connections and time-outs are retried
with the client's exponential backoff (honouring ``Retry-After``). The key,
if the endpoint needs one, comes from an environment variable, never from
params.

What goes wrong is told apart by what it means for the run:

- the endpoint refuses the key (:class:`JudgeAuthError`) or redirects
  elsewhere (the key is never sent to another host): the stage stops,
  naming why;
- a step that gets no verdict (:class:`NoVerdict`): an HTTP 400 for a
  setting the model rejects, an empty or unparsable answer, or no answer
  within the retries and each request's deadline. It is a fault of that
  episode only: the episode starts again or counts as failed
  (``judge.bad_reply``) and the fault is logged in ``faults.jsonl``. Only
  ``judge.max_bad_in_a_row`` of them in a row, which say the endpoint or its
  settings are wrong, stop the stage.

Every request has a deadline of ``judge.timeout_s`` as a whole, body
included: a server that trickles its answer cannot hold a device forever.
The client's waits are capped: a ``Retry-After`` above a minute is not
waited for, and that step gets no verdict at once.

A :class:`VLMJudge` is an :class:`~digiq.env.adb_env.Evaluator`: pass it to
:class:`~digiq.env.backends.EnvFactory` for the ``emulator`` backend.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
from PIL import Image

from digiq.config import DeviceConfig, JudgeConfig
from digiq.env.adb_env import VerdictError
from digiq.env.tasks import Task

__all__ = [
    "JudgeError", "JudgeAuthError", "NoVerdict", "VLMJudge", "Example", "read_examples", "verdict",
    "SYSTEM_PROMPT", "REPLY_FORMAT", "NO_KEY", "evaluator_for",
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
NO_KEY = "EMPTY"
_STATUS = re.compile(r"status\W*(success|failure)\b", re.IGNORECASE)


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
    """The verdict a reply gives: its last Status line, else a reply naming one outcome only; None if neither."""
    statuses = _STATUS.findall(reply)
    if statuses:
        return statuses[-1].lower() == "success"
    words = reply.lower()
    if ("success" in words) != ("failure" in words):
        return "success" in words
    return None


class VLMJudge:
    """Success/failure verdicts from a chat VLM for (task, screenshot); safe to share between device threads."""

    def __init__(self, cfg: JudgeConfig | None = None) -> None:
        self.cfg = cfg or JudgeConfig()
        key = None
        if self.cfg.api_key_env:
            key = os.environ.get(self.cfg.api_key_env)
            if not key:
                raise JudgeAuthError(f"the judge's endpoint key is read from ${self.cfg.api_key_env}, which is not set "
                                     "(set it, or api_key_env: '' for a local server without keys)")  # fmt: skip
        # A server without keys gets vLLM's placeholder key, never $OPENAI_API_KEY (the client's own default).
        # Redirects are not followed: a redirected request would carry the key to, and take a verdict from, another host.
        http = httpx.Client(transport=_Deadline(httpx.HTTPTransport(), self.cfg.timeout_s), follow_redirects=False,
                            timeout=self.cfg.timeout_s)  # fmt: skip
        self.client = openai.OpenAI(base_url=self.cfg.base_url, api_key=key or NO_KEY, timeout=self.cfg.timeout_s,
                                    max_retries=self.cfg.retries, http_client=http)  # fmt: skip
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
            reply = self._ask(task, screenshot)
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
                       {"type": "text", "text": "Your turn. Screen:"}, _image_part(screenshot, self.cfg.max_image_side),
                       *question]  # fmt: skip
        else:
            content = [_image_part(screenshot, self.cfg.max_image_side), *question]
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": content}]

    def _shown(self, example: Example) -> list[dict[str, Any]]:
        with Image.open(example.image) as im:
            image = np.asarray(im.convert("RGB"))
        return [{"type": "text", "text": "Screen:"}, _image_part(image, self.cfg.max_image_side),
                {"type": "text", "text": f"Task: {example.task}\n{example.answer}"}]  # fmt: skip

    def _ask(self, task: str, screenshot: np.ndarray) -> bool:
        limits: dict[str, Any] = {}
        if self.cfg.max_completion_tokens:
            limits["max_completion_tokens"] = self.cfg.max_completion_tokens
        if self.cfg.temperature is not None:
            limits["temperature"] = self.cfg.temperature
        url = self.cfg.base_url.rstrip("/") + "/chat/completions"
        try:
            reply = self.client.chat.completions.create(
                model=self.cfg.model, messages=self.messages(task, screenshot), **limits
            )
        except (openai.AuthenticationError, openai.PermissionDeniedError) as e:
            raise JudgeAuthError(f"{url} refused the key (HTTP {e.status_code}: {_detail(e)}); check "
                                 f"${self.cfg.api_key_env or '(no key sent)'}") from None  # fmt: skip
        except (openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError) as e:
            last = f"HTTP {e.status_code}: {_detail(e)}" if isinstance(e, openai.APIStatusError) else _cause(e)
            raise NoVerdict(f"{url} gave no verdict (up to {self.cfg.retries + 1} tries); last: {last}",
                            count_failed=self.cfg.bad_reply == "fail") from None  # fmt: skip
        except openai.APIStatusError as e:
            if 300 <= e.status_code < 400:
                raise JudgeError(f"{url} redirects (HTTP {e.status_code}) to {e.response.headers.get('location')!r}; "
                                 "set judge.base_url to the endpoint itself (redirects are not followed, so the "
                                 "key never goes to another host)") from None  # fmt: skip
            # The request was refused as it is: 400, 404, 422, ...
            raise NoVerdict(f"{url} answered HTTP {e.status_code}: {_detail(e)}",
                                  count_failed=self.cfg.bad_reply == "fail") from None  # fmt: skip
        except (openai.APIResponseValidationError, json.JSONDecodeError) as e:
            raise NoVerdict(f"{url} sent no chat answer: {e}", count_failed=self.cfg.bad_reply == "fail") from None
        text = reply.choices[0].message.content if reply.choices else None
        found = verdict(text) if text else None
        if found is None:
            raise NoVerdict(f"the judge's answer gives no Status: success or failure: {str(text)[:200]!r}",
                                  count_failed=self.cfg.bad_reply == "fail")  # fmt: skip
        return found


def _image_part(screenshot: np.ndarray, max_side: int) -> dict[str, Any]:
    image = Image.fromarray(np.asarray(screenshot, np.uint8))
    image.thumbnail((max_side, max_side))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()},
    }


def _detail(e: openai.APIStatusError) -> str:
    return str(e.body if e.body is not None else e.message)[:200]


def _cause(e: openai.APIConnectionError) -> str:
    """What went wrong under a connection error: the transport's own exception, named."""
    cause = e.__cause__ or e
    return f"{type(cause).__name__}: {cause}"[:200]


class _Deadline(httpx.BaseTransport):
    """An httpx transport whose requests end after ``seconds`` in all, the body's reading included.

    httpx's time-outs bound each wait for bytes, not the whole request, so a
    server sending one byte at a time would never time out. Past the
    deadline the reading stops with :class:`httpx.ReadTimeout`, which the
    openai client retries as it retries any time-out.
    """

    def __init__(self, inner: httpx.BaseTransport, seconds: float) -> None:
        self.inner, self.seconds = inner, seconds

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        end = time.monotonic() + self.seconds
        response = self.inner.handle_request(request)
        response.stream = _DeadlineStream(response.stream, end, request, self.seconds)
        return response

    def close(self) -> None:
        self.inner.close()


class _DeadlineStream(httpx.SyncByteStream):
    def __init__(self, inner: Any, end: float, request: httpx.Request, seconds: float) -> None:
        self.inner, self.end, self.request, self.seconds = inner, end, request, seconds

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.inner:
            if time.monotonic() > self.end:
                raise httpx.ReadTimeout(f"no whole answer within {self.seconds} s", request=self.request)
            yield chunk

    def close(self) -> None:
        self.inner.close()


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
