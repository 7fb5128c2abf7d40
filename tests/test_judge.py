"""The VLM judge against a real HTTP server on loopback that speaks the chat-completions protocol."""

import base64
import io
import json
import time
from urllib.parse import quote

import numpy as np
import pytest
from PIL import Image

from digiq.config import CollectConfig, DeviceConfig, EnvConfig, JudgeConfig, load_settings
from digiq.env import AndroidSimEnv, parse_task
from digiq.judge import (
    NO_KEY,
    REPLY_FORMAT,
    JudgeAuthError,
    JudgeError,
    NoVerdict,
    VLMJudge,
    evaluator_for,
    read_examples,
    redact,
    verdict,
)
from digiq.rollout import FAULTS_FILE
from digiq.stages.collect import run_collect

# Stage 01 on each of its few train tasks once, rather than the released episode counts drawn from them.
EACH_TASK_ONCE = {"episodes_general": None, "episodes_webshop": None}


SCREEN = np.zeros((2280, 1080, 3), np.uint8)


def _judge(server, **kw) -> VLMJudge:
    return VLMJudge(JudgeConfig(base_url=server.url, model="served-vlm", api_key_env="DIGIQ_TEST_KEY", **kw))


def _png(data_url: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(data_url.removeprefix("data:image/png;base64,"))))


def test_verdicts_and_what_the_request_carries(serve, monkeypatch):
    monkeypatch.setenv("DIGIQ_TEST_KEY", "sk-test")
    reasoned = "Expected: the settings app open\nSeen: the home screen, so not yet\nStatus: **failure**"
    server = serve((200, "Success", {}), (200, reasoned, {}))
    judge = _judge(server)
    assert judge(None, parse_task("Open the settings"), SCREEN) is True
    assert judge.judge("Open the settings", SCREEN) is False
    path, headers, body = server.requests[0]
    assert path == "/v1/chat/completions" and headers["authorization"] == "Bearer sk-test"
    assert body["model"] == "served-vlm" and body["temperature"] == 0 and body["max_completion_tokens"] == 2048
    assert "max_tokens" not in body  # reasoning models refuse it
    image, text = body["messages"][1]["content"]
    assert text["text"] == f"Task: Open the settings\n{REPLY_FORMAT}"
    assert _png(image["image_url"]["url"]).size == (485, 1024)  # downscaled, aspect kept


# Replies and the verdict each gives; the negations first: none of them may ever read as a success.
VERDICTS = [
    ("Status: unsuccessful", None),
    ("Status: not success", None),
    ("Status: not a success", None),
    ("Status: no success", None),
    ("The task was not a success.", None),
    ("The agent was unsuccessful.", None),
    ("The task was not successful", None),
    ("not a success, not a failure", None),
    ("Status: success or failure", None),  # the format echoed
    ("Status: success? No.", None),
    ("Status: success (partly)", None),
    ("Expected: results\nSeen: results\nStatus: success\nStatus: unclear", None),  # the last Status line counts
    ("Status:", None),
    ("maybe", None),
    ("", None),
    ("Status: fail", False),
    ("Status: failed", False),
    ("Status: **failure**", False),
    ("Status: success? No.\nStatus: Failure", False),
    ("failure.", False),
    ("Expected: the settings open\nSeen: the home screen\nStatus: failure", False),
    ("Expected: results\nSeen: results for x\nStatus: success", True),
    ("**Status:** Success.", True),
    ("- status = successful", True),
    ("Success", True),
    ("Status: success\r\n", True),  # a CRLF reply
    ("Expected: results\r\nSeen: results\r\nStatus: failure \r\n\r\n", False),
    ("\n  Success \t\n", True),
    ("Status:\u00a0success\u00a0", True),
]


@pytest.mark.parametrize(("reply", "expected"), VERDICTS)
def test_a_verdict_is_a_status_line_or_a_lone_word_and_nothing_else(reply, expected):
    assert verdict(reply) is expected


def test_limits_a_reasoning_model_refuses_are_not_sent(serve):
    server = serve((200, "Status: success", {}))
    VLMJudge(JudgeConfig(base_url=server.url, api_key_env="", max_completion_tokens=0, temperature=None)).judge(
        "Open the settings", SCREEN
    )
    body = server.requests[0][2]
    assert not {"temperature", "max_tokens", "max_completion_tokens"} & set(body)
    assert server.requests[0][1]["authorization"] == f"Bearer {NO_KEY}"  # never $OPENAI_API_KEY


def _examples(tmp_path, lines=None):
    folder = tmp_path / "judge_examples"
    folder.mkdir()
    env = AndroidSimEnv(width=108)
    for name, task in (("home.png", "Open the settings"), ("settings.png", "Open the settings")):
        env.reset(seed=0, options={"task": parse_task(task)})
        if name == "settings.png":
            env.step('Action Decision: "action_type": "PRESS_HOME", "touch_point": "[-1.0, -1.0]", '
                     '"lift_point": "[-1.0, -1.0]", "typed_text": ""')  # fmt: skip
        Image.fromarray(env.render()).save(folder / name)
    lines = lines or [
        {
            "image": "home.png",
            "task": "Open the settings",
            "answer": "Expected: Settings open\nSeen: home\nStatus: failure",
        },
        {
            "image": "settings.png",
            "task": "Open the settings",
            "answer": "Expected: Settings\nSeen: it\nStatus: success",
        },
    ]
    (folder / "examples.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return folder / "examples.jsonl"


def test_few_shot_shows_the_worked_examples_before_the_question(serve, tmp_path):
    server = serve((200, "Expected: x\nSeen: y\nStatus: success", {}))
    judge = VLMJudge(JudgeConfig(base_url=server.url, api_key_env="", few_shot=str(_examples(tmp_path))))
    assert judge.judge("Search for jazz", SCREEN) is True
    content = server.requests[0][2]["messages"][1]["content"]
    kinds = [c["type"] for c in content]
    assert kinds == ["text", "text", "image_url", "text", "text", "image_url", "text", "text", "image_url", "text"]
    assert content[3]["text"].endswith("Status: failure") and content[6]["text"].endswith("Status: success")
    assert content[-1]["text"] == f"Task: Search for jazz\n{REPLY_FORMAT}"
    assert _png(content[2]["image_url"]["url"]).size == (108, 228) and _png(content[-2]["image_url"]["url"]).size == (
        485,
        1024,
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"image": "home.png", "task": "t"}, r"examples.jsonl:1: needs string keys .* \['answer'\]"),
        (
            {"image": "gone.png", "task": "t", "answer": "Status: success"},
            r"examples.jsonl:1: image 'gone.png' not found",
        ),
        (
            {"image": "home.png", "task": "t", "answer": "it worked"},
            r"examples.jsonl:1: the answer must end in 'Status",
        ),
    ],
)
def test_few_shot_file_errors_name_the_line(tmp_path, line, message):
    with pytest.raises(ValueError, match=message):
        read_examples(_examples(tmp_path, [line]))


def test_rate_limits_are_retried_with_backoff(serve, monkeypatch):
    monkeypatch.setenv("DIGIQ_TEST_KEY", "sk-test")
    server = serve((429, "slow down", {"Retry-After": "0.01"}), (503, "busy", {"Retry-After": "0.01"}),
                   (200, "Status: success", {}))  # fmt: skip
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


def test_gives_up_after_its_retries_as_the_steps_fault(serve):
    server = serve(*[(503, "down", {"Retry-After": "0.01"})] * 3)
    judge = VLMJudge(JudgeConfig(base_url=server.url, api_key_env="", retries=2))
    with pytest.raises(NoVerdict, match=r"up to 3 tries\); last: HTTP 503"):
        judge.judge("Open the settings", SCREEN)
    assert len(server.requests) == 3


def test_a_redirect_is_not_followed_and_the_key_stays_home(serve, monkeypatch):
    monkeypatch.setenv("DIGIQ_TEST_KEY", "sk-secret")
    elsewhere = serve((200, "Status: success", {}))
    server = serve((307, "moved", {"Location": elsewhere.url + "/chat/completions"}))
    with pytest.raises(JudgeError, match=r"redirects \(HTTP 307\) to .*set judge.base_url") as caught:
        _judge(server).judge("Open the settings", SCREEN)
    assert not isinstance(caught.value, NoVerdict) and elsewhere.requests == []  # no key, no verdict from there


def test_a_long_retry_after_is_not_waited_for(serve):
    server = serve((429, "slow down", {"Retry-After": "3600"}), (200, "Status: success", {}))
    judge, start = VLMJudge(JudgeConfig(base_url=server.url, api_key_env="")), time.monotonic()
    with pytest.raises(NoVerdict, match="asked to retry in 3600 s, past the request's deadline.*HTTP 429"):
        judge.judge("Open the settings", SCREEN)  # this step's fault, at once
    assert time.monotonic() - start < 5 and judge.judge("Open the settings", SCREEN) is True


@pytest.mark.parametrize("retry_after", [{"Retry-After": "2"}, {"retry-after-ms": "2000"}])
def test_a_retry_after_wait_counts_inside_the_deadline(serve, retry_after):
    """Each try has ``timeout_s`` from the wait before it to its last byte: waits of 2 s and a 3 s deadline leave
    a try 1 s, so a server that then trickles its answer is cut there, not after 3 s more."""
    server = serve(*[(503, "busy", retry_after)] * 2, ("trickle", "Status: success", {}))
    judge = VLMJudge(JudgeConfig(base_url=server.url, api_key_env="", timeout_s=3, retries=2))
    start = time.monotonic()
    with pytest.raises(NoVerdict, match=r"up to 3 tries\); last: ReadTimeout"):
        judge.judge("Open the settings", SCREEN)
    took = time.monotonic() - start
    assert len(server.requests) == 3 and 4.5 < took < 6.5  # two waits of 2 s, then 1 s of trickling
    server = serve(*[(503, "busy", {"Retry-After": "4"})] * 2)
    judge = VLMJudge(JudgeConfig(base_url=server.url, api_key_env="", timeout_s=3, retries=5))
    start = time.monotonic()
    with pytest.raises(NoVerdict, match="asked to retry in 4 s, past the request's deadline of 3 s"):
        judge.judge("Open the settings", SCREEN)
    assert time.monotonic() - start < 1 and len(server.requests) == 1


@pytest.mark.parametrize(
    ("misbehaviour", "message"),
    [
        ("trickle", r"ReadTimeout: no whole answer within 0.5 s"),
        ("stall", r"ReadTimeout"),
        ("garbage", r"RemoteProtocolError"),
    ],  # fmt: skip
)
def test_a_server_that_trickles_stalls_or_speaks_no_http_costs_one_deadline_per_try(serve, misbehaviour, message):
    server = serve(*[(misbehaviour, "Status: success", {})] * 2)
    judge = VLMJudge(JudgeConfig(base_url=server.url, api_key_env="", timeout_s=0.5, retries=1))
    start = time.monotonic()
    with pytest.raises(NoVerdict, match=rf"up to 2 tries\); last: .*{message}"):
        judge.judge("Open the settings", SCREEN)
    assert time.monotonic() - start < 6 and len(server.requests) == 2


@pytest.mark.parametrize("bad_reply", ["retry", "fail"])
def test_a_bad_reply_is_the_episodes_fault_until_too_many_come_in_a_row(serve, bad_reply):
    """HTTP 400 (a setting the model refuses) or an answer with no verdict: the episode's fault, not the stage's."""
    server = serve((400, "max_tokens is not supported", {}), (200, "maybe", {}), (200, "Status: success", {}),
                   *[(200, "", {})] * 3)  # fmt: skip
    judge = VLMJudge(JudgeConfig(base_url=server.url, api_key_env="", max_bad_in_a_row=3, bad_reply=bad_reply))
    with pytest.raises(NoVerdict, match="HTTP 400: .*max_tokens is not supported") as caught:
        judge.judge("Open the settings", SCREEN)
    assert caught.value.count_failed is (bad_reply == "fail")
    with pytest.raises(NoVerdict, match="gives no Status"):
        judge.judge("Open the settings", SCREEN)
    assert judge.judge("Open the settings", SCREEN) is True  # a verdict resets the count
    for _ in range(2):
        with pytest.raises(NoVerdict):
            judge.judge("Open the settings", SCREEN)
    with pytest.raises(JudgeError, match="last 3 replies were no verdicts") as caught:
        judge.judge("Open the settings", SCREEN)
    assert not isinstance(caught.value, NoVerdict) and len(server.requests) == 6


def test_unreachable_endpoint_is_named():
    judge = VLMJudge(JudgeConfig(base_url="http://127.0.0.1:9/v1", api_key_env="", retries=1))
    with pytest.raises(
        NoVerdict, match=r"127.0.0.1:9/v1/chat/completions gave no answer \(up to 2 tries\); last: Conn"
    ):
        judge.judge("Open the settings", SCREEN)


@pytest.mark.parametrize(
    "bad",
    [
        {"retries": -1},
        {"timeout_s": 0.0},
        {"max_image_side": 0},
        {"max_completion_tokens": -1},
        {"bad_reply": "ignore"},
        {"max_bad_in_a_row": 0},
    ],  # fmt: skip
)
def test_config_rejects_impossible_settings(bad):
    with pytest.raises(ValueError, match=r"must be >= 0|must be > 0|must be >= 1|bad_reply must be"):
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
    assert load_settings().judge == JudgeConfig()  # params.yaml's group holds the defaults


def test_collect_stage_asks_the_judge_from_params(serve, collect_root):
    """Stage 01 on adb-sim phones with ``judge.on_adb_sim``: the served VLM's verdicts are the rewards."""
    paths = collect_root
    server = serve(*[(200, "success", {})] * 4)
    devices = DeviceConfig(backend="adb-sim", adb_port=0, sim_devices=2)
    judge = JudgeConfig(base_url=server.url, model="served-vlm", api_key_env="", on_adb_sim=True)
    metrics = run_collect(
        CollectConfig(tasks_per_set=2, n_envs=2, **EACH_TASK_ONCE), EnvConfig(width=108), paths, devices, judge
    )
    # An untrained policy finishes nothing; the judge said "success" after every first step.
    assert metrics["transitions"] == metrics["trajectories"] == 4
    assert metrics["success_rate_by_task_set"] == {"general": 1.0, "webshop": 1.0}
    assert len(server.requests) == 4 and all(r[2]["model"] == "served-vlm" for r in server.requests)


@pytest.mark.parametrize("bad_reply", ["retry", "fail"])
def test_collect_stage_takes_a_bad_reply_as_one_episodes_fault(serve, collect_root, bad_reply):
    """One HTTP 400 during stage 01: that episode starts again or ends failed; the stage goes on and logs it."""
    paths = collect_root
    server = serve((400, "unsupported parameter", {}), *[(200, "Status: success", {})] * 4)
    devices = DeviceConfig(backend="adb-sim", adb_port=0, sim_devices=1)
    judge = JudgeConfig(base_url=server.url, api_key_env="", on_adb_sim=True, bad_reply=bad_reply)
    metrics = run_collect(
        CollectConfig(tasks_per_set=2, n_envs=1, **EACH_TASK_ONCE), EnvConfig(width=108), paths, devices, judge
    )
    faults = [json.loads(line) for line in (paths.offline / FAULTS_FILE).read_text().splitlines()]
    assert len(faults) == 1 and "judge: " in faults[0]["fault"] and "HTTP 400" in faults[0]["fault"]
    assert metrics["trajectories"] == 4
    if bad_reply == "retry":  # the first episode ran again and was judged a success like the others
        assert faults[0]["then"] == "restarted" and len(server.requests) == 5
        assert metrics["success_rate_by_task_set"] == {"general": 1.0, "webshop": 1.0}
    else:  # the first episode ended failed at its first step
        assert faults[0]["then"] == "counted failed" and len(server.requests) == 4
        assert metrics["success_rate_by_task_set"] == {"general": 0.5, "webshop": 1.0}


def test_a_server_trickling_its_headers_is_held_to_the_deadline(serve):
    """The deadline covers the headers too: 200-odd header bytes at 20 a second would otherwise hold 10 s a try."""
    server = serve(*[("trickle_headers", "Status: success", {"X-Padding": "x" * 120})] * 2)
    judge = VLMJudge(JudgeConfig(base_url=server.url, api_key_env="", timeout_s=0.5, retries=1))
    start = time.monotonic()
    with pytest.raises(NoVerdict, match=r"up to 2 tries\); last: .*no whole answer within 0.5 s"):
        judge.judge("Open the settings", SCREEN)
    assert time.monotonic() - start < 6 and len(server.requests) == 2


@pytest.mark.parametrize(
    ("status", "answer"),
    [("html", "Service temporarily unavailable"), ("json", {"detail": "ok"}), ("json", {"choices": "none"}),
     ("json", {"choices": [{"message": {"content": ["not", "text"]}}]})],
)  # fmt: skip
def test_a_reply_that_is_no_chat_completion_is_the_episodes_fault(serve, status, answer):
    server = serve((status, answer, {}), (200, "Status: success", {}))
    judge = VLMJudge(JudgeConfig(base_url=server.url, api_key_env=""))
    with pytest.raises(NoVerdict, match="sent no chat completion"):
        judge.judge("Open the settings", SCREEN)
    assert judge.judge("Open the settings", SCREEN) is True


KEY = "sk-live-0123456789abcdef"


def _echo(headers):
    """What an echoing proxy says: the request's headers as it saw them."""
    return f"upstream said no; your request: {json.dumps(headers)} Authorization: {headers['authorization']}"


def test_an_echoed_key_is_redacted_from_every_message(serve, monkeypatch):
    monkeypatch.setenv("DIGIQ_TEST_KEY", KEY)
    server = serve((400, _echo, {}), (503, _echo, {"Retry-After": "0.01"}), (503, _echo, {"Retry-After": "0.01"}),
                   (200, _echo, {}), ("html", _echo, {}), (401, _echo, {}))  # fmt: skip
    judge = _judge(server, retries=1)
    messages = []
    for error in (NoVerdict, NoVerdict, NoVerdict, NoVerdict, JudgeAuthError):
        with pytest.raises(error) as caught:
            judge.judge("Open the settings", SCREEN)
        messages.append(str(caught.value))
    assert all("[redacted]" in m for m in messages), messages
    assert not any(KEY in m or KEY[3:12] in m for m in messages), messages
    assert server.requests[0][1]["authorization"] == f"Bearer {KEY}"  # the request itself still carries it


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ('{"authorization": "Bearer abc.def"}', '{"authorization": "[redacted]"}'),
        ("Authorization: Basic dXNlcjpwYXNz rest", "Authorization: [redacted] rest"),
        ("token was bearer xyz123, sorry", "token was bearer [redacted], sorry"),
        ("x-api-key=k-1; api_key: 'k-2'", "x-api-key=[redacted]; api_key: '[redacted]'"),
        ("http://user:pw@host/v1", "http://[redacted]@host/v1"),
        ("the key sk-123 leaked", "the key [redacted] leaked"),
    ],
)
def test_redact_hides_credentials_as_servers_echo_them(text, shown):
    assert redact(text, ("sk-123",)) == shown


def test_a_run_against_an_echoing_endpoint_writes_no_key(serve, collect_root, monkeypatch, caplog, capfd):
    """Stage 01 with every reply echoing the key, whole, upper-cased, split, or straddling the cut of a message:
    faults are logged and stored, and no 8 of the key's characters are in any file, the log or stderr."""
    monkeypatch.setenv("DIGIQ_TEST_KEY", KEY)
    paths = collect_root
    faulty = [(400, _echo_at(200 - len(KEY) // 2, ECHOES["upper-cased"]), {}),
              (200, _echo_at(150, ECHOES["split over two fields"]), {})]  # fmt: skip
    server = serve(*faulty, *[(200, lambda h: _echo(h) + "\nStatus: success", {})] * 6)
    devices = DeviceConfig(backend="adb-sim", adb_port=0, sim_devices=1)
    judge = JudgeConfig(base_url=server.url, api_key_env="DIGIQ_TEST_KEY", on_adb_sim=True)
    with caplog.at_level("DEBUG"):
        metrics = run_collect(
            CollectConfig(tasks_per_set=2, n_envs=1, **EACH_TASK_ONCE), EnvConfig(width=108), paths, devices, judge
        )
    faults = (paths.offline / FAULTS_FILE).read_text()
    assert len(faults.splitlines()) == 2 and faults.count("[redacted]") >= 2 and metrics["trajectories"] == 4
    written = [p for p in paths.root.rglob("*") if p.is_file()]
    assert [p for p in written if _runs_of(KEY, p.read_bytes().decode("latin-1"))] == []
    out, err = capfd.readouterr()
    assert _runs_of(KEY, caplog.text + out + err + json.dumps(metrics)) == []


def _runs_of(key: str, text: str) -> list[str]:
    """The runs of 8 of ``key``'s characters that ``text`` holds, in any case."""
    low = text.lower()
    return [key[i : i + 8] for i in range(len(key) - 7) if key[i : i + 8].lower() in low]


def _echo_at(offset: int, spell=lambda key: key):
    """A reply that holds the key (as ``spell`` writes it) ``offset`` characters in: where a cut to 200 falls."""
    return lambda headers: "x" * offset + spell(headers["authorization"].removeprefix("Bearer ")) + " trailing words"


ECHOES = {
    "whole": lambda key: key,
    "upper-cased": str.upper,
    "split over two fields": lambda key: f'{{"key_a": "{key[:12]}", "key_b": "{key[12:]}"}}',
    "url-quoted in a link": lambda key: f"see https://proxy/err?key={quote(key, safe='')}",
}


@pytest.mark.parametrize("spell", ECHOES.values(), ids=ECHOES.keys())
def test_no_run_of_the_key_at_any_cut_offset(serve, monkeypatch, caplog, capfd, spell):
    """A reply is cut to 200 characters for a message: wherever the key falls against the cut, and however it
    is echoed, no 8 of its characters reach a message, the log or stderr."""
    monkeypatch.setenv("DIGIQ_TEST_KEY", KEY)
    offsets = range(200 - len(KEY) - 10, 201)
    script = [(status, _echo_at(k, spell), {}) for k in offsets for status in (400, 200, "html")]
    script += [(401, _echo_at(k, spell), {}) for k in offsets]
    server = serve(*script)
    judge = _judge(server, retries=0, max_bad_in_a_row=10_000)
    messages = []
    with caplog.at_level("DEBUG"):
        for _ in range(3 * len(offsets)):
            with pytest.raises(NoVerdict) as caught:
                judge.judge("Open the settings", SCREEN)
            messages.append(str(caught.value))
        for _ in offsets:
            with pytest.raises(JudgeAuthError) as caught:
                judge.judge("Open the settings", SCREEN)
            messages.append(str(caught.value))
    out, err = capfd.readouterr()
    assert [m for m in messages if _runs_of(KEY, m)] == []
    assert _runs_of(KEY, caplog.text + out + err) == []


def test_a_redirect_carrying_the_key_is_not_logged_even_at_debug(serve, monkeypatch, caplog, capfd):
    """The HTTP libraries log response headers at DEBUG: a Location with the key in it stays out of the log."""
    monkeypatch.setenv("DIGIQ_TEST_KEY", KEY)
    server = serve((302, "moved", {"Location": f"https://elsewhere/v1?api_key={KEY}&k2={KEY.upper()}"}))
    with caplog.at_level("DEBUG"), pytest.raises(JudgeError, match="redirects") as caught:
        _judge(server).judge("Open the settings", SCREEN)
    out, err = capfd.readouterr()
    assert "location" in caplog.text.lower()  # the header was logged, and cleaned
    assert _runs_of(KEY, caplog.text + out + err + str(caught.value)) == []


def test_redact_removes_every_run_of_eight_in_any_case():
    key = "sk-live-0123456789abcdef"
    assert redact(f"a {key[5:13]} b {key[:7]} c", (key,)) == f"a [redacted] b {key[:7]} c"  # 7: not a run
    assert redact(key.upper() + "!", (key,)) == "[redacted]!"
    assert redact(f"{key[:12]}|{key[12:]}", (key,)) == "[redacted]|[redacted]"
    assert redact("no key here", (key,)) == "no key here" and redact("ab", ("ab",)) == "[redacted]"
