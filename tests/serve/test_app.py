"""gpt/serve/app.py in-process (uvicorn in a thread, a tiny random model): a failure inside the
server reaches the client as one line in OpenAI's error shape, never a traceback, and the server
serves on; the open-streams limit is a 429 with Retry-After. (The real command, the openai
client and the other limits: tests/apps/test_serve.py.) Run: pytest tests/serve/test_app.py"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest
import torch

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from gpt.config import ServeConfig  # noqa: E402
from gpt.model import GPT, GPTConfig  # noqa: E402
from gpt.serve.app import ServedModel, create_app  # noqa: E402
from gpt.serve.engine import Engine  # noqa: E402
from gpt.tokenizer import CharTokenizer  # noqa: E402

ALPHABET = "\n !',.:;?abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


@pytest.fixture
def served():
    """(port, model) of an app on a free port, with max_streams=1."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=len(ALPHABET), block_size=16, n_layer=1, n_head=2, n_embd=16)).eval()
    tok = CharTokenizer(list(ALPHABET))
    engine = Engine(model, tok, max_batch=4)
    app = create_app([ServedModel("tiny", engine, tok, 16, "memory")], ServeConfig(max_streams=1, max_tokens=10**6))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    yield port, model
    server.should_exit = True
    thread.join(10)
    engine.close()


def _post(port: int, body: dict) -> tuple[int, bytes, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data, dict(response.getheaders())


def test_a_failure_inside_is_one_json_line_and_the_server_serves_on(served, monkeypatch):
    port, model = served

    def broken(*args, **kwargs):
        raise RuntimeError("secret internals /home/user/model.py line 12")

    with monkeypatch.context() as m:
        m.setattr(model, "forward", broken)
        status, data, _ = _post(port, {"prompt": "ab", "max_tokens": 5})
        assert status == 500
        error = json.loads(data)["error"]
        assert error["type"] == "server_error" and "secret" not in data.decode() and "Traceback" not in data.decode()
        status, data, _ = _post(port, {"prompt": "ab", "max_tokens": 5, "stream": True})
        assert status == 200  # the stream had started: the error comes as its last event
        events = [line[6:] for line in data.decode().splitlines() if line.startswith("data: ")]
        assert "error" in json.loads(events[-2]) and events[-1] == "[DONE]" and "secret" not in data.decode()
    status, data, _ = _post(port, {"prompt": "ab", "max_tokens": 5})
    assert status == 200 and len(json.loads(data)["choices"][0]["text"]) == 5


def test_more_open_streams_than_allowed_is_429_with_retry_after(served):
    port, _ = served
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = json.dumps({"prompt": "ab", "max_tokens": 10**6, "stream": True})
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200 and response.readline().startswith(b"data: ")
    status, data, headers = _post(port, {"prompt": "ab", "max_tokens": 5, "stream": True})
    assert status == 429 and headers.get("retry-after") == "1" and json.loads(data)["error"]["type"] == "rate_limit_error"
    status, _, _ = _post(port, {"prompt": "ab", "max_tokens": 5})  # not a stream: served
    assert status == 200
    response.close()
    conn.close()


def test_every_sampling_control_is_served_and_checked_by_its_rules(served):
    """The server takes its extra controls from SamplingSettings: typical_p, added there and in
    gpt.generation only, is accepted, and refused by SamplingSettings' own rule."""
    from gpt.config import SamplingSettings
    from gpt.serve.schemas import CONTROLS

    port, _ = served
    assert set(CONTROLS) == set(SamplingSettings().controls()) - {"temperature", "top_p"}
    assert "typical_p" in CONTROLS and CONTROLS["top_k"] is None  # OpenAI's default: no top-k
    status, data, _ = _post(port, {"prompt": "ab", "max_tokens": 5, "typical_p": 0.5, "seed": 1})
    assert status == 200 and len(json.loads(data)["choices"][0]["text"]) == 5
    status, data, _ = _post(port, {"prompt": "ab", "max_tokens": 5, "typical_p": 1.5})
    error = json.loads(data)["error"]
    assert status == 400 and "typical_p must be in (0, 1]" in error["message"] and error["param"] == "typical_p"
    status, data, _ = _post(port, {"prompt": "ab", "typical_q": 0.5})
    assert status == 400 and json.loads(data)["error"]["message"] == "unknown parameter 'typical_q'"
