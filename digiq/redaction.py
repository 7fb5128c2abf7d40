"""Secrets kept out of every message, file and log line: the endpoint's key and the emulator console's token.

A secret is removed from a text **before** anything cuts, formats or logs it:
a reply cut to 200 characters after redaction can no longer keep half a key.
What is removed is not only the secret whole but every run of
:data:`MIN_RUN` or more of its characters, in any case: an echo that
upper-cases the key, splits it over two fields or is itself cut shows
nothing a reader could piece the key together from. The secret's URL-quoted
and JSON-escaped spellings are covered too.

Log records are cleaned as they are made (:func:`protect`): the HTTP
libraries log response headers at DEBUG level (a redirect's ``Location``
may carry the key), and a filter on their loggers alone would miss their
child loggers and any other library's.
"""

from __future__ import annotations

import json
import logging
import threading
import traceback
from urllib.parse import quote

__all__ = ["MIN_RUN", "REDACTED", "redact_secrets", "protect"]

MIN_RUN = 8  # the shortest run of a secret's characters that is removed wherever it appears
REDACTED = "[redacted]"

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")  # length-preserving


def _spellings(secret: str) -> set[str]:
    """How a secret shows in text: as it is, URL-quoted and JSON-escaped, each lower-cased."""
    return {s.translate(_ASCII_LOWER) for s in (secret, quote(secret, safe=""), json.dumps(secret)[1:-1])}


def redact_secrets(text: str, secrets: tuple[str, ...] | list[str] = ()) -> str:
    """``text`` with every run of :data:`MIN_RUN` or more characters of any of ``secrets`` (any case) replaced by
    :data:`REDACTED`; a secret shorter than that is replaced where it appears whole."""
    spelled = {s for secret in secrets if secret for s in _spellings(secret)}
    if not spelled or not text:
        return text
    low = text.translate(_ASCII_LOWER)
    hidden = bytearray(len(text))
    runs = {s[i : i + MIN_RUN] for s in spelled if len(s) >= MIN_RUN for i in range(len(s) - MIN_RUN + 1)}
    if runs:
        for i in range(len(low) - MIN_RUN + 1):
            if low[i : i + MIN_RUN] in runs:
                hidden[i : i + MIN_RUN] = b"\1" * MIN_RUN
    for short in (s for s in spelled if len(s) < MIN_RUN):
        start = low.find(short)
        while start >= 0:
            hidden[start : start + len(short)] = b"\1" * len(short)
            start = low.find(short, start + 1)
    out, i = [], 0
    while i < len(text):
        j = i
        while j < len(text) and hidden[j] == hidden[i]:
            j += 1
        out.append(REDACTED if hidden[i] else text[i:j])
        i = j
    return "".join(out)


_PROTECTED: set[str] = set()
_LOCK = threading.Lock()
_make_record = None


def protect(secret: str) -> None:
    """Keep ``secret`` out of every log record this process makes from now on (message, arguments, traceback).

    Installs, once, a log record factory that redacts each record as it is
    made, before any handler formats, cuts or writes it. A secret shorter
    than :data:`MIN_RUN` is left to the messages' own redaction: in every
    log line it would blank common words.
    """
    global _make_record
    if len(secret) < MIN_RUN:  # a shorter "secret" is no key (a placeholder, a test's): it would blank common words
        return
    with _LOCK:
        _PROTECTED.add(secret)
        if _make_record is None:
            _make_record = logging.getLogRecordFactory()
            logging.setLogRecordFactory(_redacted_record)


def _redacted_record(*args: object, **kwargs: object) -> logging.LogRecord:
    assert _make_record is not None
    record: logging.LogRecord = _make_record(*args, **kwargs)
    secrets = tuple(_PROTECTED)
    try:
        message = record.getMessage()
    except (TypeError, ValueError):  # arguments that do not fit the format: logging would print both raw
        message = f"{record.msg} {record.args}"
    record.msg, record.args = redact_secrets(message, secrets), ()
    if record.exc_info and record.exc_info[0] is not None:
        # A formatter prints exc_text when it is set: the traceback, cleaned, in place of the exception's own text.
        record.exc_text = redact_secrets("".join(traceback.format_exception(*record.exc_info)).rstrip("\n"), secrets)
    if record.stack_info:
        record.stack_info = redact_secrets(record.stack_info, secrets)
    return record
