"""An OpenAI-compatible chat endpoint: the one client every caller of a served model shares.

The VLM judge (:mod:`digiq.judge`) and the LLM task proposer
(:mod:`digiq.pae.propose_llm`) talk to the same kind of server (``vllm serve``
locally, or a remote API) with the same care:

- the key comes from an environment variable, never from params, and a server
  without keys gets vLLM's placeholder key, never ``$OPENAI_API_KEY``;
- redirects are not followed, so the key never goes to another host;
- rate limits, server errors, dropped connections and time-outs are retried
  with the openai client's backoff (a server's ``Retry-After`` when it sends
  one), and every try has one deadline for the whole exchange, the wait
  before it included: a server that trickles its answer or asks to be
  retried later cannot hold a caller past ``timeout_s`` a try, and a
  ``Retry-After`` longer than that is not waited for;
- the key is kept out of everything written: every message an error carries
  has the key (and any run of 8 of its characters, in any case) and any
  echoed credential replaced by ``[redacted]`` before it is cut or formatted
  (:func:`redact`), and log records, the HTTP libraries' DEBUG lines
  included, are cleaned as they are made (:func:`digiq.redaction.protect`).

What goes wrong is told apart by what it means: :class:`EndpointAuthError`
(no key, or a refused one) and a redirect (:class:`EndpointError`) stop the
caller; :class:`NoAnswer` (no answer within the retries, a request refused as
it is, a reply that is no chat completion) is one request's failure.
"""

from __future__ import annotations

import email.utils
import json
import math
import os
import random
import re
import threading
import time
from typing import Any

import httpcore
import httpx
import openai

from digiq.config import JudgeConfig
from digiq.redaction import REDACTED, protect, redact_secrets

__all__ = ["NO_KEY", "REDACTED", "ChatEndpoint", "EndpointAuthError", "EndpointError", "NoAnswer", "redact"]

NO_KEY = "EMPTY"
SHOWN_CHARS = 200  # the most of a server's reply an error message shows (after redaction)

# Credentials as servers echo them: an Authorization-like header or field and its value (with or without a
# scheme word), a bare "Bearer <token>", and a URL's user:password@.
_CREDENTIALS = re.compile(
    r"""(?P<field>(?:proxy-)?authorization|x-api-key|api[-_]?key)(?P<sep>["']?\s*[:=]\s*["']?)"""
    r"""(?:(?:bearer|basic|token)\s+)?[^\s"',;}\]]+"""
    r"""|(?P<scheme>\bbearer\s+)[^\s"',;}\]]+"""
    r"""|(?P<userinfo>//)[^/\s@"']+@""",
    re.IGNORECASE,
)


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """``text`` with ``secrets`` (whole, or any run of 8 of their characters, in any case) and any credential an
    echoed request carries replaced by [redacted]."""
    text = redact_secrets(text, secrets)

    def hide(m: re.Match[str]) -> str:
        if m["field"]:
            return f"{m['field']}{m['sep']}{REDACTED}"
        return f"{m['scheme']}{REDACTED}" if m["scheme"] else f"//{REDACTED}@"

    return _CREDENTIALS.sub(hide, text)


class EndpointError(RuntimeError):
    """The endpoint cannot be used as configured: the caller cannot go on."""


class EndpointAuthError(EndpointError):
    """No key, or the endpoint refused it: retrying cannot help."""


class NoAnswer(EndpointError):
    """No answer to this one request (none in time, refused as it is, or not a chat completion)."""


class ChatEndpoint:
    """Chat completions from ``cfg``'s endpoint; safe to share between threads.

    ``who`` names the caller in the key's error message ("the judge's", "the proposer's").

    Raises:
        EndpointAuthError: ``cfg.api_key_env`` names a variable that is not set.
    """

    def __init__(self, cfg: JudgeConfig, who: str = "the judge's") -> None:
        self.cfg = cfg
        key = None
        if cfg.api_key_env:
            key = os.environ.get(cfg.api_key_env)
            if not key:
                raise EndpointAuthError(f"{who} endpoint key is read from ${cfg.api_key_env}, which is not set "
                                        "(set it, or api_key_env: '' for a local server without keys)")  # fmt: skip
            protect(key)
        self.secrets = (key,) if key else ()
        self.transport = _DeadlineTransport(cfg.timeout_s)
        http = httpx.Client(transport=self.transport, follow_redirects=False, timeout=cfg.timeout_s)
        # Retries are ours (:meth:`_complete`): the client's own would wait out a Retry-After past the deadline.
        self.client = openai.OpenAI(base_url=cfg.base_url, api_key=key or NO_KEY, timeout=cfg.timeout_s,
                                    max_retries=0, http_client=http)  # fmt: skip

    def complete(self, messages: list[dict[str, Any]], model: str | None = None) -> str:
        """The first choice's text for ``messages``, asked of ``model`` (by default ``cfg.model``) with the
        configured reply length and temperature; the key, were it echoed in it, redacted.

        Raises:
            NoAnswer: no chat answer to this request.
            EndpointAuthError: the endpoint refused the key.
            EndpointError: the endpoint redirects elsewhere.
        """
        try:
            return self._complete(messages, model or self.cfg.model)
        except EndpointError as e:  # every message was built from redacted parts; the URL's user:password too now
            e.args = (redact(str(e), self.secrets),)
            raise

    def shown(self, text: object) -> str:
        """A server's text as an error message may show it: redacted first, then cut to :data:`SHOWN_CHARS`."""
        return redact(str(text), self.secrets)[:SHOWN_CHARS]

    def _complete(self, messages: list[dict[str, Any]], model: str) -> str:
        limits: dict[str, Any] = {}
        if self.cfg.max_completion_tokens:
            limits["max_completion_tokens"] = self.cfg.max_completion_tokens
        if self.cfg.temperature is not None:
            limits["temperature"] = self.cfg.temperature
        url = self.cfg.base_url.rstrip("/") + "/chat/completions"
        tries = self.cfg.retries + 1
        for attempt in range(tries):
            try:
                reply = self.client.chat.completions.create(model=model, messages=messages, **limits)
                break
            except (openai.AuthenticationError, openai.PermissionDeniedError) as e:
                raise EndpointAuthError(f"{url} refused the key (HTTP {e.status_code}: {self._detail(e)}); check "
                                        f"${self.cfg.api_key_env or '(no key sent)'}") from None  # fmt: skip
            except openai.APIStatusError as e:
                if 300 <= e.status_code < 400:
                    raise EndpointError(f"{url} redirects (HTTP {e.status_code}) to "
                                        f"{self.shown(e.response.headers.get('location'))!r}; set judge.base_url to "
                                        "the endpoint itself (redirects are not followed, so the key never goes to "
                                        "another host)") from None  # fmt: skip
                last = f"HTTP {e.status_code}: {self._detail(e)}"
                if not _retried(e.response):  # refused as it is: 400, 404, 422, ...
                    raise NoAnswer(f"{url} answered {last}") from None
                wait = _retry_after(e.response.headers)
            except openai.APIConnectionError as e:  # time-outs included
                last, wait = self._cause(e), None
            except (openai.APIResponseValidationError, json.JSONDecodeError) as e:
                raise NoAnswer(f"{url} sent no chat answer: {self.shown(e)}") from None
            if attempt == tries - 1:
                raise NoAnswer(f"{url} gave no answer (up to {tries} tries); last: {last}")
            if wait is None:  # our own backoff leaves the try at least half its deadline
                wait = min(_backoff(attempt), self.cfg.timeout_s / 2)
            elif wait > self.cfg.timeout_s:
                raise NoAnswer(f"{url} gave no answer: asked to retry in {wait:g} s, past the request's deadline of "
                               f"{self.cfg.timeout_s:g} s; last: {last}")  # fmt: skip
            self.transport.deadline.start_wait()
            time.sleep(wait)
        text = _answer(reply)
        if text is None:  # a 200 with an HTML page or other JSON: the client hands it over unchecked
            raise NoAnswer(f"{url} sent no chat completion: {self.shown(reply)!r}")
        return redact_secrets(text, self.secrets)  # an echoing proxy's answer goes on into faults, proposals, logs

    def _detail(self, e: openai.APIStatusError) -> str:
        return self.shown(e.body if e.body is not None else e.message)

    def _cause(self, e: openai.APIConnectionError) -> str:
        """What went wrong under a connection error: the transport's own exception, named."""
        cause = e.__cause__ or e
        return self.shown(f"{type(cause).__name__}: {cause}")


def _answer(reply: object) -> str | None:
    """The text of a chat completion's first choice; None for anything that is not a chat completion."""
    choices = getattr(reply, "choices", None)
    if not isinstance(choices, list) or not choices:
        return None
    content = getattr(getattr(choices[0], "message", None), "content", None)
    return content if isinstance(content, str) else None


def _retried(response: httpx.Response) -> bool:
    """Whether an error answer is worth another try, as the openai client decides: a server's ``x-should-retry``
    first, then time-outs (408), conflicts (409), rate limits (429) and server errors (5xx)."""
    said = response.headers.get("x-should-retry")
    if said in ("true", "false"):
        return said == "true"
    return response.status_code in (408, 409, 429) or response.status_code >= 500


def _retry_after(headers: httpx.Headers) -> float | None:
    """The wait a server asks for: ``retry-after-ms``, or ``Retry-After`` in seconds or as an HTTP date."""
    for name, unit in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / unit
        except ValueError:
            if name == "retry-after-ms":
                continue
            when = email.utils.parsedate_tz(value)
            if when is None:
                return None
            seconds = email.utils.mktime_tz(when) - time.time()
        return max(seconds, 0.0) if math.isfinite(seconds) else math.inf
    return None


def _backoff(attempt: int) -> float:
    """The openai client's wait before retry ``attempt + 1`` when the server names none: 0.5 s doubling up to 8 s,
    less up to a quarter at random (so many callers do not retry in step)."""
    return min(0.5 * 2.0**attempt, 8.0) * (1 - 0.25 * random.random())


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
        """Start this thread's deadline for the request being sent, unless :meth:`start_wait` started it already."""
        if not getattr(self.local, "waited", False):
            self.local.end = time.monotonic() + self.seconds
        self.local.waited = False

    def start_wait(self) -> None:
        """Start the next request's deadline now, before the wait for its try: the wait counts inside it."""
        self.local.end, self.local.waited = time.monotonic() + self.seconds, True

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
            raise RuntimeError(f"httpx {httpx.__version__} keeps no connection pool where digiq.endpoint expects one")
        self._pool = httpcore.ConnectionPool(ssl_context=httpx.create_ssl_context(), max_connections=100,
                                             max_keepalive_connections=20, keepalive_expiry=5.0,
                                             network_backend=self.deadline)  # fmt: skip

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.deadline.start()  # the body is read later on this same thread, under the same deadline
        return super().handle_request(request)
