"""gpt/apps/serve.py + gpt/serve/app.py: `python serve.py` started as a user starts it, on a free
127.0.0.1 port, called with the official openai client and plain HTTP: completions equal to
sample.py's, streaming and not; bad requests answered with OpenAI-shaped errors while the server
keeps serving; concurrent streams; a full queue; a client that disconnects frees its slot; a
SIGTERM or Ctrl-C answers the stream in flight and exits 0.
Run: pytest tests/apps/test_serve.py"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from helpers import REPO, Server, assert_one_line_error, chromium, free_port, relaid, run_script  # noqa: E402

KEY = "test-key"


@pytest.fixture(scope="module")
def server(trained_run, data_root):
    cwd, run_dir, _ = trained_run
    s = Server([f"run_dir={run_dir}", f"api_key={KEY}", "max_tokens=1000", "max_n=8", "max_batch=16"], cwd, data_root[0])
    yield s
    log = s.stop()
    assert "Traceback" not in log, log  # nothing unexpected happened inside, either


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)


def sample_py(trained_run, data_root, *args: str) -> list[str]:
    cwd, run_dir, _ = trained_run
    out = cwd / "serve_samples.jsonl"
    out.unlink(missing_ok=True)
    proc = run_script("sample.py", [f"run_dir={run_dir}", f"out_file={out}", *args], cwd, data_root[0])
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line)["text"] for line in out.read_text().splitlines()]


def test_openai_client_matches_sample_py_streaming_and_not(server, trained_run, data_root):
    api = client(server)
    model = api.models.list().data[0].id
    assert model == trained_run[1].name

    greedy = sample_py(trained_run, data_root, "prompt=ROMEO:", "temperature=0", "max_new_tokens=60", "num_samples=1")
    got = api.completions.create(model=model, prompt="ROMEO:", max_tokens=60, temperature=0)
    assert got.choices[0].text == greedy[0] and got.choices[0].finish_reason == "length"
    assert got.usage.prompt_tokens == 6 and got.usage.completion_tokens == 60

    pieces, reasons = [], []
    for chunk in api.completions.create(model=model, prompt="ROMEO:", max_tokens=60, temperature=0, stream=True):
        for choice in chunk.choices:
            pieces.append(choice.text)
            reasons.append(choice.finish_reason)
    assert "".join(pieces) == greedy[0] and len(pieces) == 60  # streamed token by token, also under load
    assert [r for r in reasons if r] == ["length"]

    seeded = sample_py(
        trained_run, data_root, "prompt=JULIET:", "temperature=0.9", "top_k=20", "seed=7", "max_new_tokens=50", "num_samples=3"
    )
    three = api.completions.create(
        model=model, prompt="JULIET:", max_tokens=50, temperature=0.9, n=3, seed=7, extra_body={"top_k": 20}
    )
    assert [c.text for c in sorted(three.choices, key=lambda c: c.index)] == seeded
    assert len(set(seeded)) == 3

    streamed = [""] * 3
    for chunk in api.completions.create(
        model=model, prompt="JULIET:", max_tokens=50, temperature=0.9, n=3, seed=7, stream=True, extra_body={"top_k": 20}
    ):
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == seeded


def test_stop_strings_prompt_lists_and_extra_controls(server, trained_run, data_root):
    api = client(server)
    free = sample_py(trained_run, data_root, "prompt=KING:", "temperature=0", "max_new_tokens=60", "num_samples=1")[0]
    stop = free[20:22]
    got = api.completions.create(
        model=api.models.list().data[0].id, prompt=["KING:", "ROMEO:"], max_tokens=60, temperature=0, stop=[stop]
    )
    first = next(c for c in got.choices if c.index == 0)
    assert first.text == free[: free.index(stop)] and first.finish_reason == "stop"
    assert len(got.choices) == 2
    penalised = sample_py(
        trained_run,
        data_root,
        "prompt=KING:",
        "temperature=0.7",
        "top_k=null",
        "top_p=0.9",
        "min_p=0.05",
        "repetition_penalty=1.3",
        "seed=3",
        "max_new_tokens=40",
        "num_samples=1",
    )
    got = api.completions.create(
        model=api.models.list().data[0].id,
        prompt="KING:",
        max_tokens=40,
        temperature=0.7,
        top_p=0.9,
        seed=3,
        extra_body={"min_p": 0.05, "repetition_penalty": 1.3},
    )
    assert got.choices[0].text == penalised[0]


def test_every_earlier_request_shape_works_through_the_openai_client(server):
    """What the openai client sends for each parameter, at each type and null it took before
    requests were strictly typed: still served."""
    api = client(server)
    model = api.models.list().data[0].id
    off = dict(logprobs=None, echo=False, best_of=1, logit_bias={}, presence_penalty=0, frequency_penalty=0, suffix=None)
    shapes = [
        dict(prompt="ROMEO:"),  # OpenAI's defaults: 16 tokens at temperature 1
        dict(prompt=["KING:", "ROMEO:"], max_tokens=4, stop="\n", n=2, user="someone"),
        dict(prompt=[1, 2, 3], max_tokens=4, temperature=0, top_p=1, seed=0),  # token ids; integers for numbers
        dict(prompt=[[1, 2], [3]], max_tokens=4, temperature=0.5, top_p=0.9, seed=None, stop=None),
        dict(prompt="ROMEO:", max_tokens=4, model=None, **off),
        dict(prompt="ROMEO:", max_tokens=4, extra_body={"top_k": None, "min_p": 0, "typical_p": 1, "repetition_penalty": 1}),
        dict(prompt="ROMEO:", max_tokens=4, extra_body={"top_k": 5, "min_p": 0.1, "typical_p": 0.9, "repetition_penalty": 1.2}),
    ]
    for shape in shapes:
        got = api.completions.create(**{"model": model, **shape})
        prompt = shape["prompt"]
        prompts = len(prompt) if isinstance(prompt, list) and not isinstance(prompt[0], int) else 1
        assert len(got.choices) == prompts * shape.get("n", 1), shape
    chunks = list(
        api.completions.create(model=model, prompt="ROMEO:", max_tokens=4, stream=True, stream_options={"include_usage": True})
    )
    assert chunks[-1].usage.completion_tokens == 4


@pytest.mark.parametrize(
    "body, status, needle",
    [
        (b"{not json", 400, "not valid JSON"),
        ([1, 2], 400, "JSON object"),
        ({"prompt": "a", "max_tokens": -1}, 400, "max_tokens"),
        ({"prompt": "a", "max_tokens": 10**9}, 400, "max_tokens"),
        ({"prompt": "a", "n": 10000}, 400, "limit of 8"),
        ({"prompt": "a", "temperature": -1}, 400, "temperature"),
        ({"prompt": "a", "top_p": 0}, 400, "top_p"),
        ({"prompt": "a", "model": "../../etc/passwd"}, 404, "not served here"),
        ({"prompt": "a" * 5000}, 400, "maximum context length is 16 tokens, but your prompt resulted in 5000 tokens"),
        ({"prompt": "a", "max_token": 5}, 400, "unknown parameter 'max_token'"),
        ({"prompt": "a", "logprobs": 3}, 400, "not supported"),
        ({"prompt": "\u2603"}, 400, "outside this char-level vocabulary"),
        ({"prompt": [10**6]}, 400, "token ids"),
        ({"prompt": []}, 400, "empty list"),
        ({"prompt": "a", "stop": [""]}, 400, "empty"),
        # controls that would overflow the logits (each used to fail every request in the batch)
        ({"prompt": "a", "temperature": 1e-300}, 400, "at least 0.001"),
        ({"prompt": "a", "repetition_penalty": 1e-300}, 400, "repetition_penalty"),
        (b'{"prompt": "a", "temperature": Infinity}', 400, "temperature"),
        # a stop string matched against the text at every token of the shared batch
        ({"prompt": "a", "stop": ["q" * 257]}, 400, "at most 256 characters"),
        (b"[" * 100000 + b"]" * 100000, 400, "nested too deeply"),
        # a value of another JSON type is refused, not converted (tests/serve/test_app.py: the rest)
        ({"prompt": "a", "stream": "yes"}, 400, "stream must be a boolean"),
        ({"prompt": "a", "max_tokens": True}, 400, "max_tokens must be an integer"),
        ({"prompt": "a", "max_tokens": "5"}, 400, "max_tokens must be an integer"),
        ({"prompt": "a", "temperature": "0.5"}, 400, "temperature must be a number"),
        ({"prompt": "a", "n": 1.5}, 400, "n must be an integer"),
        ({"prompt": "a", "top_k": "5"}, 400, "top_k must be an integer or null"),
    ],
)
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server, body, status, needle):
    raw = body if isinstance(body, bytes) else None
    code, answer, _ = server.post(body, {"Authorization": f"Bearer {KEY}"}, raw=raw)
    assert code == status, answer
    assert set(answer["error"]) >= {"message", "type", "param", "code"}
    assert needle in answer["error"]["message"], answer
    assert "Traceback" not in json.dumps(answer)
    ok, answer, _ = server.post({"prompt": "ROMEO:", "max_tokens": 3}, {"Authorization": f"Bearer {KEY}"})
    assert ok == 200 and len(answer["choices"][0]["text"]) == 3


def test_api_key_body_size_content_type_and_unknown_routes(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        code, answer, _ = server.post({"prompt": "a"}, headers)
        assert code == 401 and answer["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).models.list()
    big = json.dumps({"prompt": "a" * 10_000_000}).encode()  # 10 MB
    code, answer, _ = server.post(None, {"Authorization": f"Bearer {KEY}"}, raw=big)
    assert code == 413 and "body" in answer["error"]["message"]
    code, answer, _ = server.post({"prompt": "a"}, {"Authorization": f"Bearer {KEY}", "Content-Type": "text/plain"})
    assert code == 415 and "Content-Type: application/json" in answer["error"]["message"]
    code, answer, _ = server.post({}, {"Authorization": f"Bearer {KEY}"}, path="/v1/nothing")
    assert code == 404 and "error" in answer
    assert server.health()["status"] == "ok"  # no key needed for the health check
    with urllib.request.urlopen(f"{server.url}/", timeout=5) as page:
        assert b"tinygpt playground" in page.read()


def test_concurrent_streams_are_batched_and_each_equals_its_text_alone(server):
    api = client(server)
    model = api.models.list().data[0].id
    prompts = [f"ROMEO {letter}:" for letter in "abcdefghijkl"]
    results: dict[int, str] = {}

    def stream(i: int) -> None:
        text = ""
        for chunk in api.completions.create(model=model, prompt=prompts[i], max_tokens=80, temperature=1.0, seed=i, stream=True):
            text += "".join(c.text for c in chunk.choices)
        results[i] = text

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(prompts))]
    steps_before = server.health()["models"][model]["steps"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    steps = server.health()["models"][model]["steps"] - steps_before
    assert len(results) == len(prompts) and all(len(t) == 80 for t in results.values())
    assert steps < len(prompts) * 80 / 2  # decoded together, not one after another
    for i in (0, 5, 11):  # the same text as alone (seeded)
        alone = api.completions.create(model=model, prompt=prompts[i], max_tokens=80, temperature=1.0, seed=i)
        assert alone.choices[0].text == results[i]


def test_a_full_queue_is_503_and_a_disconnected_stream_frees_its_slot(trained_run, data_root):
    cwd, run_dir, _ = trained_run
    server = Server([f"run_dir={run_dir}", "max_batch=1", "max_queue=1", "max_tokens=1000000"], cwd, data_root[0])
    try:
        # An endless stream holds the only slot; read a little of it, then hang up.
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        body = {"prompt": "ROMEO:", "max_tokens": 1000000, "stream": True}
        conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200 and response.readline().startswith(b"data: ")

        waiting: dict = {}
        queued = threading.Thread(target=lambda: waiting.update(r=server.post({"prompt": "KING:", "max_tokens": 5})))
        queued.start()
        deadline = time.time() + 30
        while server.health()["models"][run_dir.name]["queued"] < 1 and time.time() < deadline:
            time.sleep(0.05)
        code, answer, headers = server.post({"prompt": "JULIET:", "max_tokens": 5})
        assert code == 503 and headers.get("retry-after") == "1" and "busy" in answer["error"]["message"]

        response.close()  # the client goes away mid-generation
        conn.close()
        queued.join(60)  # served: the abandoned stream (a million tokens) gave up its slot
        code, answer, _ = waiting["r"]
        assert code == 200 and len(answer["choices"][0]["text"]) == 5
        load = server.health()["models"][run_dir.name]
        assert load["cancelled"] == 1 and load["active_rows"] == 0

        # A plain (not streaming) request abandoned mid-generation frees its slot as well.
        payload = json.dumps({"prompt": "ROMEO:", "max_tokens": 1000000}).encode()
        head = f"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(head.encode() + payload)
        deadline = time.time() + 30
        while server.health()["models"][run_dir.name]["active_rows"] < 1 and time.time() < deadline:
            time.sleep(0.05)
        sock.close()
        code, answer, _ = server.post({"prompt": "KING:", "max_tokens": 5})
        assert code == 200 and len(answer["choices"][0]["text"]) == 5
        load = server.health()["models"][run_dir.name]
        assert load["cancelled"] == 2 and load["active_rows"] == 0
    finally:
        log = server.stop()
    assert "Traceback" not in log, log


def test_serve_refuses_mistakes_in_one_line(trained_run, data_root):
    cwd, run_dir, _ = trained_run
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        taken = run_script("serve.py", [f"run_dir={run_dir}", f"port={busy.getsockname()[1]}"], cwd, data_root[0])
    finally:
        busy.close()
    assert_one_line_error(taken, "cannot serve on 127.0.0.1")
    assert_one_line_error(run_script("serve.py", ["max_batch=0"], cwd, data_root[0]), "max_batch must be a positive integer")
    assert_one_line_error(run_script("serve.py", ["models=[nowhere]"], cwd, data_root[0]), "models=nowhere")
    helped = run_script("serve", ["--help"], cwd, data_root[0])
    assert helped.returncode == 0 and "max_batch" in helped.stdout and "/v1/completions" in helped.stdout


def test_served_models_decode_with_weights_laid_out_for_the_cpu(trained_run, monkeypatch):
    """Each model the server batches has its linear weights stored input-major on a CPU
    (gpt/generation/layout.py); the tests above check its completions equal sample.py's."""
    import uvicorn

    import gpt.serve.app as serve_app
    from gpt.apps.serve import main

    _, run_dir, _ = trained_run
    served, real = [], serve_app.create_app
    monkeypatch.setattr(serve_app, "create_app", lambda models, *a: served.extend(models) or real(models, *a))
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: None)  # built, not started
    main([f"run_dir={run_dir}", f"port={free_port()}", "device=cpu"])
    assert len(served) == 1 and relaid(served[0].engine.model)


def test_compile_true_compiles_every_served_model_before_serving(trained_run, monkeypatch, capsys):
    """compile=true: each model is compiled for decoding (a counting backend stands in for
    inductor) and warmed up at start-up, all of its graphs (6 in fp32: Engine.warm_up), for two
    models too: their forwards are one function to torch.compile, whose default limit of 8
    variants the two would share."""
    import torch
    import uvicorn

    import gpt.generation as generation
    import gpt.serve.app as serve_app
    from gpt.apps.serve import main

    _, run_dir, _ = trained_run
    graphs, served, real_compile, real_app = [], [], generation.compile_for_generation, serve_app.create_app
    monkeypatch.setattr(
        generation,
        "compile_for_generation",
        lambda model, **kw: real_compile(model, **kw, backend=lambda gm, _: graphs.append(gm) or gm.forward),
    )
    monkeypatch.setattr(serve_app, "create_app", lambda models, *a: served.extend(models) or real_app(models, *a))
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: None)  # built, not started
    torch.compiler.reset()
    try:
        main([f"models=[{run_dir},{run_dir}]", f"port={free_port()}", "device=cpu", "compile=true"])
    finally:
        torch.compiler.reset()
    log = capsys.readouterr().err
    assert len(served) == 2 and len(graphs) == 2 * 6, (len(graphs), log)
    assert log.count(" s\n") >= 2 and "compiled in" in log and "compile on" in log, log
    assert all(m.engine.load()["jobs"] == 0 for m in served)


def test_playground_streams_a_completion_in_a_headless_browser(server, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select, WebDriverWait

    browser = chromium()
    shot = Path(os.environ.get("TINYGPT_TEST_ARTIFACTS") or tmp_path) / "playground.png"
    try:
        browser.get(f"{server.url}/")
        browser.find_element(By.ID, "api_key").send_keys(KEY, Keys.TAB)  # the key fetches the model list
        WebDriverWait(browser, 30).until(lambda b: Select(b.find_element(By.ID, "model")).options)
        set_slider = (
            "const e = document.getElementById(arguments[0]); e.value = arguments[1]; e.dispatchEvent(new Event('input'));"
        )
        browser.execute_script(set_slider, "temperature", "0.8")  # top-k stays at the page's 50
        browser.execute_script(set_slider, "max_tokens", "300")
        browser.find_element(By.ID, "seed").send_keys("7")
        browser.find_element(By.ID, "prompt").send_keys("ROMEO:")
        browser.find_element(By.ID, "generate").click()
        seen, status = set(), ""
        deadline = time.time() + 60
        while not status.startswith("done") and time.time() < deadline:
            status = browser.find_element(By.ID, "status").text
            seen.add(len(browser.find_element(By.ID, "output").text))
        text = browser.find_element(By.ID, "output").get_attribute("textContent")
        browser.save_screenshot(str(shot))
        print(f"playground screenshot: {shot}")
        assert status.startswith("done (length)") and "tokens/s" in status, status
        want = client(server).completions.create(
            model=None, prompt="ROMEO:", max_tokens=300, temperature=0.8, top_p=1, seed=7, extra_body={"top_k": 50}
        )
        assert len(set(want.choices[0].text)) > 5  # visible text, not a run of blanks
        assert text == "ROMEO:" + want.choices[0].text
        assert len(seen) > 2  # the text grew piece by piece, not at once

        browser.execute_script(set_slider, "max_tokens", "1000")
        browser.find_element(By.ID, "seed").clear()
        browser.find_element(By.ID, "generate").click()
        WebDriverWait(browser, 30).until(lambda b: b.find_element(By.ID, "status").text.startswith(("generating", "done")))
        browser.find_element(By.ID, "stop-button").click()
        WebDriverWait(browser, 30).until(lambda b: b.find_element(By.ID, "status").text.startswith(("stopped", "done")))
    finally:
        browser.quit()
    assert shot.is_file() and shot.stat().st_size > 1000


def test_several_models_each_picked_by_its_id(trained_run, data_root):
    from gpt.apps.serve import model_sources
    from gpt.config import PathsSettings, ServeConfig

    cwd, run_dir, _ = trained_run
    ckpt = run_dir / "checkpoints" / "ckpt-0000020.pt"
    named = model_sources(
        ServeConfig(models=[str(run_dir), str(ckpt), str(run_dir)], paths=PathsSettings(runs_dir=str(cwd / "outputs")))
    )
    assert [n for n, _ in named] == [run_dir.name, f"{run_dir.name}/ckpt-0000020", f"{run_dir.name}-2"]
    everything = model_sources(ServeConfig(models="all", paths=PathsSettings(runs_dir=str(cwd / "outputs"))))
    assert [n for n, _ in everything] == [run_dir.name]

    server = Server([f"models=[{run_dir},{ckpt}]"], cwd, data_root[0])
    try:
        api = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)  # no key set: any is fine
        ids = [m.id for m in api.models.list().data]
        assert ids == [run_dir.name, f"{run_dir.name}/ckpt-0000020"]
        for model in ids:
            got = api.completions.create(model=model, prompt="ROMEO:", max_tokens=20, temperature=0)
            assert got.model == model and len(got.choices[0].text) == 20
        assert server.health()["models"][ids[1]]["jobs"] == 1
    finally:
        server.stop()


def test_a_recurrent_model_is_refused_in_one_line(tmp_path, data_root):
    from gpt.apps.common import compose
    from gpt.checkpoints import checkpoint
    from gpt.checkpoints.checkpoint import Checkpoint
    from gpt.model import registry
    from gpt.tokenizers import CharTokenizer

    config = registry.with_vocab(compose("config", ["model=lstm"]).model, 8)
    path = tmp_path / "lstm.pt"
    model = registry.build(config)
    checkpoint.save(
        path, Checkpoint(model.state_dict(), registry.config_to_dict(config), CharTokenizer(list("abcdefgh")).to_dict())
    )
    refused = run_script("serve.py", [f"ckpt={path}", f"port={free_port()}"], tmp_path, data_root[0])
    assert_one_line_error(refused, "recurrent model", "tinygpt sample")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_clean_stop_answers_the_request_in_flight_and_exits_0(trained_run, data_root, sig):
    """What systemd, docker and Kubernetes send to stop a service, SIGTERM, ends `tinygpt serve`
    with status 0 once the stream in flight is answered, saying so once (uvicorn raised the signal
    again after its graceful shutdown: killed by it, status 143, a failed service); a Ctrl-C
    (SIGINT, as a terminal sends it) stops as cleanly, status 0, nothing said."""
    cwd, run_dir, _ = trained_run
    port = free_port()
    env = {**os.environ, "TINYGPT_DATA_DIR": str(data_root[0]), "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "serve.py"), f"run_dir={run_dir}", f"port={port}", "threads=1"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # A terminal's Ctrl-C reaches a process whose SIGINT is not ignored, which a test's parent
        # (a background job) may have left it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None and time.time() < deadline, "the server did not start"
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                body = {"prompt": "ROMEO:", "max_tokens": 300, "temperature": 0, "stream": True}
                conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
                response = conn.getresponse()
                break
            except OSError:
                time.sleep(0.2)
        assert response.status == 200 and response.readline().startswith(b"data: {")
        proc.send_signal(sig)
        rest = response.read().decode()
        conn.close()
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    chunks = [json.loads(line[6:]) for line in rest.splitlines() if line.startswith("data: {")]
    assert rest.rstrip().endswith("data: [DONE]") and chunks[-1]["choices"][0]["finish_reason"] == "length", rest[-500:]
    assert proc.returncode == 0, out
    said = "stopped (SIGTERM): requests in flight were answered first"
    assert out.count(said) == (1 if sig == signal.SIGTERM else 0), out
    assert "Traceback" not in out and "interrupted" not in out, out
