"""A VLM judge of task success on real screens, over an OpenAI-compatible chat endpoint.

The simulator knows when a task is done; a real emulator does not. As in the
papers (a VLM judge that sees only the newest screenshot), the judge sends
the task and the current screenshot to a chat model and reads "success" or
"failure". Any server speaking the OpenAI chat-completions protocol works:
a model served locally by ``vllm serve`` or a remote API. The key, if the
endpoint needs one, comes from an environment variable, never from params.

A :class:`VLMJudge` is an :class:`~digiq.env.adb_env.Evaluator`: pass it to
:class:`~digiq.env.backends.EnvFactory` for the ``emulator`` backend.
"""

from __future__ import annotations

import base64
import io
import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

import numpy as np
from PIL import Image

from digiq.config import DeviceConfig, JudgeConfig
from digiq.env.tasks import Task

__all__ = ["JudgeError", "JudgeAuthError", "VLMJudge", "SYSTEM_PROMPT", "evaluator_for"]

SYSTEM_PROMPT = (
    "You check whether a phone agent finished its task. You see the task and the phone's current screen only. "
    "The task is finished when the screen shows its result (for a search: the results of that search; for an "
    "app or setting: that app or setting open). Reply with one word: success or failure."
)
_RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


class JudgeError(RuntimeError):
    """The endpoint could not give a verdict (after retries), or gave a reply that is not one."""


class JudgeAuthError(JudgeError):
    """The endpoint refused the credentials: retrying cannot help."""


class VLMJudge:
    """Success/failure verdicts from a chat VLM for (task, screenshot)."""

    def __init__(self, cfg: JudgeConfig | None = None) -> None:
        self.cfg = cfg or JudgeConfig()
        self.key: str | None = None
        if self.cfg.api_key_env:
            self.key = os.environ.get(self.cfg.api_key_env)
            if not self.key:
                raise JudgeAuthError(f"the judge's endpoint key is read from ${self.cfg.api_key_env}, which is not set "
                                     "(set it, or api_key_env: '' for a local server without keys)")  # fmt: skip

    def __call__(self, link: object, task: Task, screenshot: np.ndarray) -> bool:
        """The :class:`~digiq.env.adb_env.Evaluator` call: only the screen and the task are used."""
        return self.judge(task.instruction, screenshot)

    def judge(self, task: str, screenshot: np.ndarray) -> bool:
        reply = self._post(self._request(task, screenshot))
        try:
            text = reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise JudgeError(f"{self.cfg.base_url} sent no chat answer: {str(reply)[:200]}") from None
        words = str(text).strip().lower()
        if "success" in words and "failure" not in words:
            return True
        if "failure" in words and "success" not in words:
            return False
        raise JudgeError(f"the judge's answer is neither success nor failure: {str(text)[:200]!r}")

    def _request(self, task: str, screenshot: np.ndarray) -> dict[str, Any]:
        image = Image.fromarray(np.asarray(screenshot, np.uint8))
        image.thumbnail((self.cfg.max_image_side, self.cfg.max_image_side))
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
        return {
            "model": self.cfg.model,
            "temperature": 0,
            "max_tokens": 8,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": f"Task: {task}\nIs the task finished?"},
                        {"type": "image_url", "image_url": {"url": url}},
                    ],
                },  # fmt: skip
            ],
        }

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST with retries and exponential backoff on transient failures; auth failures raise at once."""
        url = self.cfg.base_url.rstrip("/") + "/chat/completions"
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        data = json.dumps(body).encode()
        last = ""
        for attempt in range(self.cfg.retries + 1):
            wait = self.cfg.backoff_s * 2**attempt
            try:
                req = urllib.request.Request(url, data=data, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=self.cfg.timeout_s) as resp:
                    return json.loads(resp.read())
            except urllib.error.HTTPError as e:
                detail = e.read()[:200].decode(errors="replace")
                if e.code in (401, 403):
                    raise JudgeAuthError(f"{url} refused the key (HTTP {e.code}: {detail}); check "
                                         f"${self.cfg.api_key_env or '(no key sent)'}") from None  # fmt: skip
                if e.code not in _RETRY_STATUS:
                    raise JudgeError(f"{url} answered HTTP {e.code}: {detail}") from None
                last = f"HTTP {e.code}: {detail}"
                retry_after = e.headers.get("Retry-After")
                if retry_after and retry_after.replace(".", "", 1).isdigit():
                    wait = float(retry_after)
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            except json.JSONDecodeError as e:
                raise JudgeError(f"{url} did not answer JSON: {e}") from None
            if attempt < self.cfg.retries:
                time.sleep(wait)
        raise JudgeError(f"{url} gave no verdict after {self.cfg.retries + 1} tries; last: {last}")


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
