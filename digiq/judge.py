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

Every request has a deadline of ``judge.timeout_s`` as a whole, from the
connection to the body's last byte: a server that trickles its headers or
its answer cannot hold a device forever. The client's waits are capped: a
``Retry-After`` above a minute is not waited for, and that step gets no
verdict at once.

No secret is ever written: every message the judge raises, which the
rollout copies into ``faults.jsonl`` and the log, has the key's value, any
``Authorization``/``Bearer`` material and a URL's user and password
replaced by ``[redacted]`` (:func:`redact`), since many proxies echo the
request's headers in their error bodies.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpcore
import httpx
import numpy as np
import openai
from PIL import Image

from digiq.config import DeviceConfig, JudgeConfig
from digiq.env.adb_env import VerdictError
from digiq.env.tasks import Task

__all__ = [
    "JudgeError", "JudgeAuthError", "NoVerdict", "VLMJudge", "Example", "read_examples", "verdict",
    "SYSTEM_PROMPT", "REPLY_FORMAT", "NO_KEY", "REDACTED", "redact", "evaluator_for",
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
REDACTED = "[redacted]"

# The words that are a verdict, and nothing else: "unsuccessful", "not success" or "success or failure" are none.
_VERDICT_WORDS = {"success": True, "successful": True, "failure": False, "failed": False, "fail": False}
# A Status line: "Status: failure", "**Status:** success", "- status = Failure." (markdown and a final stop allowed).
_STATUS_LINE = re.compile(r"^[\s*_#>`-]*status[\s*_`]*[:=-](?P<value>.*)$", re.IGNORECASE | re.MULTILINE)
_DECORATION = " \t*_`'\".!"

# Credentials as servers echo them: an Authorization-like header or field and its value (with or without a
# scheme word), a bare "Bearer <token>", and a URL's user:password@.
_CREDENTIALS = re.compile(
    r"""(?P<field>(?:proxy-)?authorization|x-api-key|api[-_]?key)(?P<sep>["']?\s*[:=]\s*["']?)"""
    r"""(?:(?:bearer|basic|token)\s+)?[^\s"',;}\]]+"""
    r"""|(?P<scheme>\bbearer\s+)[^\s"',;}\]]+"""
    r"""|(?P<userinfo>//)[^/\s@"']+@""",
    re.IGNORECASE,
)


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
    ``fail``, any case, markdown and a final stop allowed). Without a Status
    line, the whole reply must be such a word. Anything else (a negation
    such as ``not success`` or ``unsuccessful``, the format echoed, a
    sentence) is no verdict: reading one into it would store a failed
    episode with reward 1.
    """
    statuses = _STATUS_LINE.findall(reply)
    return _VERDICT_WORDS.get((statuses[-1] if statuses else reply).strip(_DECORATION).lower())


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """``text`` with each of ``secrets`` and any credential an echoed request carries replaced by [redacted]."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)

    def hide(m: re.Match[str]) -> str:
        if m["field"]:
            return f"{m['field']}{m['sep']}{REDACTED}"
        return f"{m['scheme']}{REDACTED}" if m["scheme"] else f"//{REDACTED}@"

    return _CREDENTIALS.sub(hide, text)


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
        self._secrets = (key,) if key else ()
        # A server without keys gets vLLM's placeholder key, never $OPENAI_API_KEY (the client's own default).
        # Redirects are not followed: a redirected request would carry the key to, and take a verdict from, another host.
        http = httpx.Client(transport=_DeadlineTransport(self.cfg.timeout_s), follow_redirects=False,
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
            try:
                reply = self._ask(task, screenshot)
            except JudgeError as e:  # the one place every message passes on its way to faults.jsonl and the log
                e.args = (redact(str(e), self._secrets),)
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
        count_failed = self.cfg.bad_reply == "fail"
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
                            count_failed=count_failed) from None  # fmt: skip
        except openai.APIStatusError as e:
            if 300 <= e.status_code < 400:
                raise JudgeError(f"{url} redirects (HTTP {e.status_code}) to {e.response.headers.get('location')!r}; "
                                 "set judge.base_url to the endpoint itself (redirects are not followed, so the "
                                 "key never goes to another host)") from None  # fmt: skip
            # The request was refused as it is: 400, 404, 422, ...
            raise NoVerdict(f"{url} answered HTTP {e.status_code}: {_detail(e)}", count_failed=count_failed) from None
        except (openai.APIResponseValidationError, json.JSONDecodeError) as e:
            raise NoVerdict(f"{url} sent no chat answer: {e}", count_failed=count_failed) from None
        text = _answer(reply)
        if text is None:  # a 200 with an HTML page or other JSON: the client hands it over unchecked
            raise NoVerdict(f"{url} sent no chat completion: {str(reply)[:200]!r}", count_failed=count_failed)
        found = verdict(text)
        if found is None:
            raise NoVerdict(f"the judge's answer gives no Status: success or failure: {text[:200]!r}",
                            count_failed=count_failed)  # fmt: skip
        return found


def _answer(reply: object) -> str | None:
    """The text of a chat completion's first choice; None for anything that is not a chat completion."""
    choices = getattr(reply, "choices", None)
    if not isinstance(choices, list) or not choices:
        return None
    content = getattr(getattr(choices[0], "message", None), "content", None)
    return content if isinstance(content, str) else None


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


class _RequestDeadline(httpcore.NetworkBackend):
    """Sockets whose every connect, send and receive waits at most what is left of the request's deadline.

    httpx's time-outs bound each wait for bytes, not the whole request, so a
    server sending its headers or its answer one byte at a time would never
    time out. Here each thread's request has one deadline (:meth:`start`)
    that covers the connection, the headers and the body alike; past it,
    the socket operation ends with a time-out, which the openai client
    retries as it retries any time-out.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds, self.inner, self.local = seconds, httpcore.SyncBackend(), threading.local()

    def start(self) -> None:
        self.local.end = time.monotonic() + self.seconds

    def left(self, timeout: float | None) -> float:
        """The wait allowed now: ``timeout``, cut to the time left before the deadline."""
        left = getattr(self.local, "end", time.monotonic() + self.seconds) - time.monotonic()
        if left <= 0:
            raise httpcore.ReadTimeout(f"no whole answer within {self.seconds} s")
        return left if timeout is None else min(timeout, left)

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Any = None) -> httpcore.NetworkStream:  # fmt: skip
        stream = self.inner.connect_tcp(host, port, self.left(timeout), local_address, socket_options)
        return _DeadlineStream(stream, self)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Any = None) -> httpcore.NetworkStream:  # fmt: skip
        return _DeadlineStream(self.inner.connect_unix_socket(path, self.left(timeout), socket_options), self)

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream, deadline: _RequestDeadline) -> None:
        self.inner, self.deadline = inner, deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            return self.inner.read(max_bytes, self.deadline.left(timeout))
        except httpcore.ReadTimeout:
            self.deadline.left(None)  # a wait cut short by the deadline is named as the deadline
            raise

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.inner.write(buffer, self.deadline.left(timeout))

    def close(self) -> None:
        self.inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:  # fmt: skip
        return _DeadlineStream(self.inner.start_tls(ssl_context, server_hostname, self.deadline.left(timeout)),
                               self.deadline)  # fmt: skip

    def get_extra_info(self, info: str) -> Any:
        return self.inner.get_extra_info(info)


class _DeadlineTransport(httpx.HTTPTransport):
    """httpx's own transport over sockets that keep one deadline per request (:class:`_RequestDeadline`)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.deadline = _RequestDeadline(seconds)
        # httpx takes no network backend, so its pool is rebuilt over ours, with httpx's default limits.
        if not isinstance(getattr(self, "_pool", None), httpcore.ConnectionPool):
            raise RuntimeError(f"httpx {httpx.__version__} keeps no connection pool where the judge expects one")
        self._pool = httpcore.ConnectionPool(ssl_context=httpx.create_ssl_context(), max_connections=100,
                                             max_keepalive_connections=20, keepalive_expiry=5.0,
                                             network_backend=self.deadline)  # fmt: skip

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.deadline.start()  # the body is read later on this same thread, under the same deadline
        return super().handle_request(request)


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
