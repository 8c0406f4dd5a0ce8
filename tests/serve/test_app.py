"""gpt/serve/app.py in-process (uvicorn in a thread, a tiny random model): a failure inside the
server reaches the client as one line in OpenAI's error shape, never a traceback, and the server
serves on; the open-streams limit is a 429 with Retry-After; every value is taken only as its
own JSON type, and a body only as JSON. (The real command, the openai client and the other
limits: tests/apps/test_serve.py.) Run: pytest tests/serve/test_app.py"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import typing

import pytest
import torch

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from gpt.chat.template import ChatTokenizer  # noqa: E402
from gpt.config import ServeConfig  # noqa: E402
from gpt.model import GPT, GPTConfig  # noqa: E402
from gpt.serve.app import ServedModel, create_app  # noqa: E402
from gpt.serve.engine import Engine  # noqa: E402
from gpt.tokenizers import ByteTokenizer, CharTokenizer  # noqa: E402

ALPHABET = "\n !',.:;?abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


@pytest.fixture
def served():
    """(port, model) of an app on a free port, with max_streams=1."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=len(ALPHABET), block_size=16, n_layer=1, n_head=2, n_embd=16)).eval()
    yield from _serving(model, CharTokenizer(list(ALPHABET)), ServeConfig(max_streams=1, max_tokens=10**6))


def _serving(model, tok, settings: ServeConfig):
    engine = Engine(model, tok, max_batch=4)
    app = create_app([ServedModel("tiny", engine, tok, model.config.block_size, "memory")], settings)
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


def _post(
    port: int, body: dict, content_type: str | None = "application/json", path: str = "/v1/completions"
) -> tuple[int, bytes, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": content_type} if content_type else {}  # http.client adds none of its own
    conn.request("POST", path, body=json.dumps(body), headers=headers)
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


WRONG_TYPES = [  # (a request's wrong value, the parameter the refusal names)
    ({"stream": "yes"}, "stream"),
    ({"max_tokens": True}, "max_tokens"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"max_tokens": 5.0}, "max_tokens"),  # a JSON number written with a fraction is no integer (nor for OpenAI)
    ({"temperature": "0.5"}, "temperature"),
    ({"temperature": False}, "temperature"),
    ({"n": 1.5}, "n"),
    ({"seed": "7"}, "seed"),
    ({"stop": 5}, "stop"),
    ({"model": 5}, "model"),
    ({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ({"prompt": [True]}, "prompt"),  # true is no token id
    ({"prompt": [1, "5"]}, "prompt"),
    ({"prompt": [[1, True]]}, "prompt"),
    ({"echo": 0}, "echo"),  # OpenAI's unsupported ones too: 0 is not false
    ({"best_of": True}, "best_of"),
    ({"presence_penalty": "0"}, "presence_penalty"),
    ({"top_k": "5"}, "top_k"),
    ({"top_k": True}, "top_k"),
    ({"top_k": 2.0}, "top_k"),
    ({"repetition_penalty": "1.2"}, "repetition_penalty"),
    ({"min_p": 10**400}, "min_p"),  # no float holds it (was a 500)
]


@pytest.mark.parametrize("wrong, param", WRONG_TYPES, ids=[json.dumps(w)[:40] for w, _ in WRONG_TYPES])
def test_a_value_of_the_wrong_json_type_is_refused_naming_its_parameter(served, wrong, param):
    port, _ = served
    status, data, _ = _post(port, {"prompt": "ab", "max_tokens": 3, **wrong})
    error = json.loads(data)["error"]
    assert status == 400 and error["param"] == param and error["code"] == "invalid_type", error
    assert error["message"].startswith(param) and error["type"] == "invalid_request_error", error


def test_every_sampling_control_takes_only_its_own_json_type(served):
    """Each of tinygpt's controls refuses the JSON types its SamplingSettings field does not
    have: the server reads them from there, so a control added later is as strict."""
    from gpt.config import SamplingSettings
    from gpt.serve.schemas import CONTROLS

    port, _ = served
    hints = typing.get_type_hints(SamplingSettings)
    refused = 0
    for name in CONTROLS:
        allowed = {typing.get_origin(k) or k for k in (typing.get_args(hints[name]) or (hints[name],))}
        for wrong in ("5", True, 2.0, [2], {"k": 2}):
            if type(wrong) in allowed:
                continue  # e.g. 2.0 for a number
            status, data, _ = _post(port, {"prompt": "ab", "max_tokens": 3, name: wrong})
            error = json.loads(data)["error"]
            assert status == 400 and error["param"] == name and error["code"] == "invalid_type", (name, wrong, error)
            refused += 1
    assert refused >= 4 * len(CONTROLS)


def test_json_integers_for_numbers_and_nulls_are_taken_as_before(served):
    """JSON has one number type: temperature 1 is 1.0 (as for OpenAI), the same completion. Null
    stays accepted wherever it was, and OpenAI's unsupported parameters at their off value."""
    port, _ = served
    same = {"prompt": "ab", "max_tokens": 5, "seed": 3}
    as_floats = {**same, "temperature": 1.0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0}
    as_ints = {**same, "temperature": 1, "top_p": 1, "min_p": 0, "repetition_penalty": 1, "presence_penalty": 0}
    texts = []
    for body in (as_floats, as_ints):
        status, data, _ = _post(port, body)
        assert status == 200, data
        texts.append(json.loads(data)["choices"][0]["text"])
    assert texts[0] == texts[1] and len(texts[0]) == 5
    nulls = dict.fromkeys(("model", "top_p", "top_k", "min_p", "typical_p", "seed", "stop", "stream_options", "user"))
    nulls.update(dict.fromkeys(("logprobs", "echo", "suffix", "best_of", "logit_bias", "presence_penalty", "frequency_penalty")))
    off = {"echo": False, "best_of": 1, "logit_bias": {}, "frequency_penalty": 0, "stream_options": {"include_usage": False}}
    for body in (nulls, off, {"prompt": [1, 2]}, {"prompt": [[1, 2], [3]]}, {"prompt": ["ab", "c"], "stop": ["x", "y"]}):
        status, data, _ = _post(port, {"prompt": "ab", "max_tokens": 2, **body})
        assert status == 200, (body, data)


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_body_not_sent_as_json_is_415_saying_what_to_send(served, content_type):
    """text/plain, curl -d's default and no header at all: a 415 naming the header to send."""
    port, _ = served
    status, data, _ = _post(port, {"prompt": "ab", "max_tokens": 3}, content_type=content_type)
    error = json.loads(data)["error"]
    assert status == 415 and "Content-Type: application/json" in error["message"], error
    assert error["type"] == "invalid_request_error" and error["code"] == "unsupported_media_type"


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "Application/JSON"])
def test_json_with_parameters_or_in_capitals_is_json(served, content_type):
    port, _ = served
    status, data, _ = _post(port, {"prompt": "ab", "max_tokens": 3}, content_type=content_type)
    assert status == 200 and len(json.loads(data)["choices"][0]["text"]) == 3


@pytest.fixture
def chatting():
    """The port of an app serving a chat model (context 32) that never ends a turn: its LM head
    is zero, so every logit ties and greedy decoding picks id 0, an ordinary byte, each step."""
    tok = ChatTokenizer(ByteTokenizer())
    config = GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16, tie_embeddings=False)
    model = GPT(config).eval()
    torch.nn.init.zeros_(model.lm_head.weight)
    yield from _serving(model, tok, ServeConfig(max_tokens=40))


def test_a_chat_reply_without_max_tokens_fills_the_room_left_in_the_context(chatting):
    """Absent max_tokens (and max_completion_tokens), as OpenAI's: block_size minus the prompt,
    at most the server's limit; never the server's limit past the context, where the window
    would slide the reply's own prompt out. A max given is kept as it is. (A prompt that leaves
    no room: test_a_prompt_that_leaves_no_room_is_context_length_exceeded_not_a_1_token_reply.)"""
    port, _ = chatting

    def chat(text: str, **body) -> dict:
        request = {"messages": [{"role": "user", "content": text}], "temperature": 0, **body}
        status, data, _ = _post(port, request, path="/v1/chat/completions")
        assert status == 200, data
        return json.loads(data)["usage"]

    usage = chat("hi")
    assert usage["prompt_tokens"] < 32 and usage["total_tokens"] == 32, usage  # the context's room, not 40
    full = "x" * (32 - usage["prompt_tokens"] + 2)  # a byte a character: the prompt fills the context
    assert chat(full, max_tokens=5) == {"prompt_tokens": 32, "completion_tokens": 5, "total_tokens": 37}
    assert chat("hi", max_tokens=35)["completion_tokens"] == 35  # given: kept, past the context too
    assert chat("hi", max_completion_tokens=3)["completion_tokens"] == 3
    status, data, _ = _post(
        port, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 41}, path="/v1/chat/completions"
    )
    assert status == 400 and json.loads(data)["error"]["param"] == "max_tokens"


@pytest.fixture
def chatting_long():
    """The chat model of `chatting` served with max_prompt_tokens=64, twice its context: longer
    prompts are taken, keeping their last 32 tokens, as sample.py does."""
    tok = ChatTokenizer(ByteTokenizer())
    config = GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16, tie_embeddings=False)
    model = GPT(config).eval()
    torch.nn.init.zeros_(model.lm_head.weight)
    yield from _serving(model, tok, ServeConfig(max_tokens=40, max_prompt_tokens=64))


def _prompt_tokens(port: int) -> int:
    """The tokens the chat template adds around one user message (a byte a character)."""
    status, data, _ = _post(port, {"messages": [{"role": "user", "content": ""}], "max_tokens": 1}, path="/v1/chat/completions")
    assert status == 200, data
    return json.loads(data)["usage"]["prompt_tokens"]


@pytest.mark.parametrize("over", [0, 2])  # the messages fill the context; they are 2 tokens longer
@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_that_leaves_no_room_is_context_length_exceeded_not_a_1_token_reply(chatting, chatting_long, over, stream):
    """A chat request without max_tokens whose messages fill or pass the model's context is a 400
    with code context_length_exceeded naming the context and the messages' tokens, as OpenAI
    answers (it was a 1-token reply: the room left, at least 1), streaming or not, through the
    openai client too, whatever max_prompt_tokens allows. With max_tokens the reply runs past the
    context, as documented (docs/serving.md); /v1/completions (max_tokens 16 when absent) serves a
    prompt as long as the context, and refuses a longer one in the same words. A prompt over
    max_prompt_tokens names that limit."""
    openai = pytest.importorskip("openai")
    for (port, _), allowed in ((chatting, 32), (chatting_long, 64)):
        template = _prompt_tokens(port)
        messages = [{"role": "user", "content": "x" * (32 - template + over)}]
        request = {"messages": messages, "temperature": 0, "stream": stream}
        status, data, _ = _post(port, request, path="/v1/chat/completions")
        error = json.loads(data)["error"]
        assert status == 400 and error["code"] == "context_length_exceeded" and error["param"] == "messages", error
        assert "maximum context length is 32 tokens" in error["message"], error
        assert f"your messages resulted in {32 + over} tokens" in error["message"], error
        if over and allowed == 32:  # over the server's limit: the messages must shrink
            assert error["message"].endswith("drop older messages"), error
        else:  # within it, but no room for a reply: max_tokens would be served
            assert "leaving no room for a reply" in error["message"] and "pass max_tokens" in error["message"], error
            status, data, _ = _post(port, {**request, "max_tokens": 3}, path="/v1/chat/completions")
            assert status == 200, data
            if not stream:
                assert json.loads(data)["usage"] == {
                    "prompt_tokens": 32 + over,
                    "completion_tokens": 3,
                    "total_tokens": 35 + over,
                }
            else:
                chunks = [json.loads(line[6:]) for line in data.decode().splitlines() if line.startswith("data: {")]
                assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "\0" * 3, data

        api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as refused:
            api.chat.completions.create(model="tiny", messages=messages, temperature=0, stream=stream)
        assert refused.value.code == "context_length_exceeded" and "maximum context length is 32" in refused.value.message

        status, data, _ = _post(port, {"prompt": [0] * (32 + over), "temperature": 0, "stream": stream})
        if over and allowed == 32:
            error = json.loads(data)["error"]
            assert status == 400 and error["code"] == "context_length_exceeded" and error["param"] == "prompt", error
            assert "maximum context length is 32 tokens, but your prompt resulted in 34 tokens" in error["message"], error
        else:
            assert status == 200, data
            if not stream:
                assert json.loads(data)["usage"]["completion_tokens"] == 16  # OpenAI's default max_tokens

    port, _ = chatting_long
    request = {"messages": [{"role": "user", "content": "x" * (65 - template)}], "max_tokens": 3, "stream": stream}
    status, data, _ = _post(port, request, path="/v1/chat/completions")
    error = json.loads(data)["error"]
    assert status == 400 and error["code"] == "context_length_exceeded", error
    limits = "this server takes at most 64 (max_prompt_tokens; this model's maximum context length is 32 tokens)"
    assert error["message"] == f"your messages resulted in 65 tokens; {limits}: drop older messages", error


def test_half_a_surrogate_pair_in_the_json_is_400_not_a_crash(chatting):
    """JSON may escape a lone surrogate ("\\udcff", what Python makes of a byte that is no UTF-8);
    a byte tokenizer cannot encode it: a 400 naming it, and the server serves on."""
    port, _ = chatting
    for path, body in (
        ("/v1/completions", {"prompt": "ab\udcff", "max_tokens": 2}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi\ud800"}], "max_tokens": 2}),
    ):
        status, data, _ = _post(port, body, path=path)
        error = json.loads(data)["error"]
        assert status == 400 and "half of a surrogate pair" in error["message"], (path, error)
    status, _, _ = _post(port, {"prompt": "ab", "max_tokens": 2})
    assert status == 200
