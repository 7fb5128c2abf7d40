"""The VLM judge against a real HTTP server on loopback that speaks the chat-completions protocol."""

import base64
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch
from PIL import Image

from digiq.config import CollectConfig, DeviceConfig, EnvConfig, JudgeConfig, load_section
from digiq.env import generate_tasks, parse_task
from digiq.judge import JudgeAuthError, JudgeError, VLMJudge, evaluator_for
from digiq.models.policy import AutoUIPolicy, PolicyConfig
from digiq.models.tokenizer import default_corpus, train_tokenizer
from digiq.paths import Paths
from digiq.stages.collect import run_collect


class ChatServer:
    """Answers each POST with the next scripted (status, reply text or body, headers); records the requests."""

    def __init__(self, script):
        self.script, self.requests = list(script), []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                owner.requests.append(
                    (self.path, dict(self.headers), json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                )
                status, answer, headers = owner.script.pop(0)
                body = json.dumps(
                    {"choices": [{"message": {"role": "assistant", "content": answer}}]}
                    if status == 200
                    else {"error": answer}
                ).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers = []

    def start(*script):
        servers.append(ChatServer(script))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


SCREEN = np.zeros((2280, 1080, 3), np.uint8)


def _judge(server, **kw) -> VLMJudge:
    return VLMJudge(
        JudgeConfig(base_url=server.url, model="served-vlm", api_key_env="DIGIQ_TEST_KEY", backoff_s=0.01, **kw)
    )


def test_verdicts_and_what_the_request_carries(serve, monkeypatch):
    monkeypatch.setenv("DIGIQ_TEST_KEY", "sk-test")
    server = serve((200, "Success", {}), (200, " failure.", {}))
    judge = _judge(server)
    assert judge(None, parse_task("Open the settings"), SCREEN) is True
    assert judge.judge("Open the settings", SCREEN) is False
    path, headers, body = server.requests[0]
    assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer sk-test"
    assert body["model"] == "served-vlm" and body["temperature"] == 0
    text, image = body["messages"][1]["content"]
    assert "Open the settings" in text["text"]
    png = base64.b64decode(image["image_url"]["url"].removeprefix("data:image/png;base64,"))
    assert Image.open(io.BytesIO(png)).size == (485, 1024)  # downscaled, aspect kept


def test_rate_limits_are_retried_with_backoff(serve, monkeypatch):
    monkeypatch.setenv("DIGIQ_TEST_KEY", "sk-test")
    server = serve((429, "slow down", {"Retry-After": "0"}), (503, "busy", {}), (200, "success", {}))
    assert _judge(server).judge("Open the settings", SCREEN) is True
    assert len(server.requests) == 3


def test_auth_failure_is_not_retried_and_says_where_the_key_comes_from(serve, monkeypatch):
    monkeypatch.setenv("DIGIQ_TEST_KEY", "sk-wrong")
    server = serve((401, "invalid key", {}), (200, "success", {}))
    with pytest.raises(JudgeAuthError, match=r"HTTP 401.*DIGIQ_TEST_KEY"):
        _judge(server).judge("Open the settings", SCREEN)
    assert len(server.requests) == 1


def test_missing_key_fails_before_any_request(monkeypatch):
    monkeypatch.delenv("DIGIQ_TEST_KEY", raising=False)
    with pytest.raises(JudgeAuthError, match=r"\$DIGIQ_TEST_KEY, which is not set"):
        VLMJudge(JudgeConfig(api_key_env="DIGIQ_TEST_KEY"))


def test_gives_up_after_its_retries_and_rejects_non_answers(serve):
    server = serve(*[(503, "down", {})] * 3, (200, "maybe", {}))
    no_key = VLMJudge(JudgeConfig(base_url=server.url, api_key_env="", retries=2, backoff_s=0.01))
    with pytest.raises(JudgeError, match=r"after 3 tries; last: HTTP 503"):
        no_key.judge("Open the settings", SCREEN)
    assert "Authorization" not in server.requests[0][1]
    with pytest.raises(JudgeError, match="neither success nor failure"):
        no_key.judge("Open the settings", SCREEN)


def test_unreachable_endpoint_is_named():
    judge = VLMJudge(JudgeConfig(base_url="http://127.0.0.1:9/v1", api_key_env="", retries=1, backoff_s=0.01))
    with pytest.raises(JudgeError, match=r"127.0.0.1:9/v1/chat/completions gave no verdict after 2 tries"):
        judge.judge("Open the settings", SCREEN)


@pytest.mark.parametrize("bad", [{"retries": -1}, {"timeout_s": 0.0}, {"backoff_s": -1.0}, {"max_image_side": 0}])
def test_config_rejects_impossible_settings(bad):
    with pytest.raises(ValueError, match="need retries >= 0"):
        JudgeConfig(**bad)


def test_params_choose_the_judge_per_backend(monkeypatch):
    monkeypatch.setenv("DIGIQ_TEST_KEY", "k")
    judge = JudgeConfig(api_key_env="DIGIQ_TEST_KEY")
    assert isinstance(evaluator_for(DeviceConfig(backend="emulator"), judge), VLMJudge)
    assert evaluator_for(DeviceConfig(backend="sim"), judge) is None
    assert evaluator_for(DeviceConfig(backend="adb-sim", adb_port=0), judge) is None
    on_sim = JudgeConfig(api_key_env="DIGIQ_TEST_KEY", on_adb_sim=True)
    assert isinstance(evaluator_for(DeviceConfig(backend="adb-sim", adb_port=0), on_sim), VLMJudge)
    monkeypatch.delenv("DIGIQ_TEST_KEY")
    with pytest.raises(JudgeAuthError, match="DIGIQ_TEST_KEY"):  # the missing key stops the stage before any episode
        evaluator_for(DeviceConfig(backend="emulator"), judge)
    assert load_section(JudgeConfig, "judge") == JudgeConfig()  # params.yaml's group holds the defaults


def test_collect_stage_asks_the_judge_from_params(serve, tmp_path):
    """Stage 01 on adb-sim phones with ``judge.on_adb_sim``: the served VLM's verdicts are the rewards."""
    paths = Paths(tmp_path)
    for ts in ("general", "webshop"):
        paths.task_list(ts, "train").parent.mkdir(parents=True, exist_ok=True)
        paths.task_list(ts, "train").write_text("\n".join(generate_tasks(ts, "train", 2, seed=3)) + "\n")
    tok = train_tokenizer(default_corpus(n_tasks=50), vocab_size=400)
    torch.manual_seed(0)
    AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, num_layers=1, image_dim=32), tok).save(paths.base_policy)
    server = serve(*[(200, "success", {})] * 4)
    devices = DeviceConfig(backend="adb-sim", adb_port=0, sim_devices=2)
    judge = JudgeConfig(base_url=server.url, model="served-vlm", api_key_env="", on_adb_sim=True)
    metrics = run_collect(CollectConfig(tasks_per_set=2, n_envs=2), EnvConfig(width=108), paths, devices, judge)
    # An untrained policy finishes nothing; the judge said "success" after every first step.
    assert metrics["transitions"] == metrics["trajectories"] == 4
    assert metrics["success_rate_by_task_set"] == {"general": 1.0, "webshop": 1.0}
    assert len(server.requests) == 4 and all(r[2]["model"] == "served-vlm" for r in server.requests)
