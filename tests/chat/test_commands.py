"""Chat end to end, as a user types it: a base model trained on text, `tinygpt train
experiment=sft` on a .jsonl of conversations, `tinygpt chat` scripted through stdin, and
/v1/chat/completions through the official openai client giving the same greedy replies,
streamed and not; `tinygpt eval task=chat`; and the refusals, each one line.
Run: python -m pytest tests/chat/test_commands.py"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from gpt.chat.synthetic import suite
from gpt.checkpoints import checkpoint
from gpt.checkpoints.runs import latest
from helpers import REPO, TEXT, assert_one_line_error, relaid, run_script

QUESTIONS = ["What is 12 + 30?", "Who are you?", "Reverse the word 'stone'."]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(work dir, data root, base run, SFT run, SFT stdout, test .jsonl)."""
    cwd = tmp_path_factory.mktemp("chat")
    root = cwd / "data"
    (cwd / "corpus.txt").write_text(TEXT)
    train, test = suite(400, 40, seed=1)
    long = {"messages": [{"role": "user", "content": "why? " * 60}, {"role": "assistant", "content": "because"}]}
    train += [long] * 3  # longer than the context: left out, and said so
    chats, held_out = write_jsonl(cwd / "chats.jsonl", train), write_jsonl(cwd / "test.jsonl", test)
    base = cwd / "base"
    proc = run_script(
        "train",
        [
            "debug=tiny",
            "data=local",
            f"data.source.path={cwd / 'corpus.txt'}",
            "data.name=corpus",
            "data.tokenizer.kind=byte",
            "data.split_by=tail",
            "model.block_size=256",
            f"paths.output_dir={base}",
        ],
        cwd,
        root,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    sft = cwd / "sft"
    proc = run_script(
        "train",
        [
            "experiment=sft",
            f"init_from={base}",
            "data=local",
            f"data.source.path={chats}",
            "data.name=chats",
            "train.max_iters=30",
            "train.eval_interval=15",
            "train.eval_iters=2",
            "train.batch_size=8",
            "train.sample_tokens=20",
            f"paths.output_dir={sft}",
        ],
        cwd,
        root,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cwd, root, base, sft, proc.stdout, held_out


def test_sft_adds_the_template_trains_replies_and_records_it(runs):
    cwd, root, base, sft, stdout, _ = runs
    assert "conversations are tokenized with the model's tokenizer (init_from's" in stdout
    assert "chat template: 4 special tokens added (ids 257-260), initialised to the mean embedding" in stdout
    assert "are left out:" in stdout  # the long ones: said, with counts
    assert "<|user|>" in stdout and "<|assistant|>" in stdout  # the final sample is a reply to a conversation
    assert "global batch of 8 conversations/step" in stdout
    ckpt = checkpoint.load(sft / "checkpoints" / "best.pt")
    assert ckpt.tokenizer["chat"]["template"] == "tinygpt-v1" and ckpt.model_config["vocab_size"] == 261
    summary = json.loads((sft / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["final_val_loss"] is not None and summary["chat"] is True
    assert f"chat with: tinygpt chat run_dir={sft}" in stdout


def chat_cli(runs, *args, stdin: str):
    cwd, root, _, sft, _, _ = runs
    return run_script("chat", [f"run_dir={sft}", "temperature=0", "max_new_tokens=24", *args], cwd, root, stdin=stdin)


def test_chat_reads_one_message_per_line_and_keeps_the_history(runs):
    proc = chat_cli(runs, stdin="\n".join(QUESTIONS) + "\n")
    assert proc.returncode == 0, proc.stderr
    replies = proc.stdout.split("\n")[:-1]
    assert len(replies) == 3 and "chatting with" in proc.stderr
    again = chat_cli(runs, stdin="\n".join(QUESTIONS) + "\n")
    assert again.stdout == proc.stdout  # greedy: the same replies every time
    alone = chat_cli(runs, stdin=QUESTIONS[2] + "\n")
    cleared = chat_cli(runs, stdin=f"{QUESTIONS[0]}\n/clear\n{QUESTIONS[2]}\n")
    assert cleared.stdout.split("\n")[1] == alone.stdout.split("\n")[0]  # /clear: the third question alone
    ended = chat_cli(runs, stdin=f"{QUESTIONS[0]}\n/exit\n{QUESTIONS[1]}\n")
    assert ended.stdout.count("\n") == 1
    # a piped line that is not UTF-8 (byte 0xff): one line after the replies before it
    cwd, root, _, sft, _, _ = runs
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "gpt", "chat", f"run_dir={sft}", "temperature=0", "max_new_tokens=24"]
    bad = subprocess.run(command, cwd=cwd, env=env, input=f"{QUESTIONS[0]}\n".encode() + b"2 + 2\xff?\n", capture_output=True)
    assert bad.returncode == 2 and bad.stdout.decode() == proc.stdout.split("\n")[0] + "\n"
    assert bad.stderr.decode().strip().splitlines()[-1].startswith("error: the message is not UTF-8 text (byte 0xff")


def test_chat_decodes_with_weights_laid_out_for_the_cpu(runs):
    """tinygpt chat's model has its linear weights stored input-major (gpt/generation/layout.py);
    the replies above are decoded with it."""
    from gpt.apps.chat import load_chat_model
    from gpt.config import ChatConfig

    model, _, rt = load_chat_model(ChatConfig(run_dir=str(runs[3]), device="cpu"))
    assert rt.device.type == "cpu" and relaid(model)


def test_chat_compile_true_compiles_once_for_the_conversation_and_replies_as_eager(runs, monkeypatch):
    """compile=true: the model is compiled before the first reply (a counting backend stands in
    for inductor), a few graphs serve every turn of a growing conversation, not one per token
    or per turn, and the replies are eager's (which has the weights input-major instead)."""
    import io

    import torch

    import gpt.generation as generation
    from gpt.apps.chat import chat
    from gpt.config import ChatConfig

    graphs, real = [], generation.compile_for_generation
    monkeypatch.setattr(
        generation,
        "compile_for_generation",
        lambda model, **kw: real(model, **kw, backend=lambda gm, _: graphs.append(gm) or gm.forward),
    )
    replies = {}
    torch.compiler.reset()
    try:
        for compile in (False, True):
            s = ChatConfig(run_dir=str(runs[3]), temperature=0.0, max_new_tokens=24, device="cpu", threads=1, compile=compile)
            out, status = io.StringIO(), io.StringIO()
            chat(s, stdin=io.StringIO("\n".join(QUESTIONS) + "\n"), out=out, status=status)
            replies[compile] = out.getvalue()
            assert ("compile on" in status.getvalue()) == compile, status.getvalue()
    finally:
        torch.compiler.reset()
    assert replies[True] == replies[False] and replies[True].count("\n") == 3
    assert 1 <= len(graphs) <= 4, len(graphs)


def test_chat_completions_equal_the_chat_command_streamed_and_not(runs):
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    from helpers import Server

    cwd, root, base, sft, _, _ = runs
    replies = chat_cli(runs, stdin="\n".join(QUESTIONS) + "\n").stdout.split("\n")[:-1]
    system_reply = chat_cli(runs, "system=Answer briefly.", stdin=QUESTIONS[0] + "\n").stdout.split("\n")[0]
    server = Server([f"models=[{sft},{base}]"], cwd, root)
    try:
        api = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        messages = []
        for question, reply in zip(QUESTIONS, replies):
            messages.append({"role": "user", "content": question})
            got = api.chat.completions.create(model=sft.name, messages=messages, temperature=0, max_tokens=24)
            assert got.choices[0].message.content == reply and got.choices[0].message.role == "assistant"
            assert got.choices[0].finish_reason in ("stop", "length") and got.usage.completion_tokens >= 1
            streamed, reasons = "", []
            for chunk in api.chat.completions.create(
                model=sft.name,
                messages=messages,
                temperature=0,
                max_tokens=24,
                stream=True,
                stream_options={"include_usage": True},
            ):
                for choice in chunk.choices:
                    streamed += choice.delta.content or ""
                    reasons.append(choice.finish_reason)
            assert streamed == reply and [r for r in reasons if r] == [got.choices[0].finish_reason]
            messages.append({"role": "assistant", "content": reply})
        with_system = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": QUESTIONS[0]}]
        got = api.chat.completions.create(model=sft.name, messages=with_system, temperature=0, max_tokens=24)
        assert got.choices[0].message.content == system_reply

        status, body, _ = server.post(
            {"model": base.name, "messages": [{"role": "user", "content": "hi"}]}, path="/v1/chat/completions"
        )
        assert (
            status == 400 and "has no chat template" in body["error"]["message"] and body["error"]["code"] == "no_chat_template"
        )
        bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
        status, body, _ = server.post({"model": sft.name, "messages": bad}, path="/v1/chat/completions")
        assert status == 400 and "two user turns in a row" in body["error"]["message"] and body["error"]["param"] == "messages"
        status, body, _ = server.post(
            {"model": sft.name, "messages": [{"role": "tool", "content": "x"}]}, path="/v1/chat/completions"
        )
        assert status == 400 and "unknown role 'tool'" in body["error"]["message"]
    finally:
        log = server.stop()
    assert "Traceback" not in log, log


def test_eval_task_chat_scores_replies_per_skill(runs):
    cwd, root, _, sft, _, held_out = runs
    proc = run_script("eval", [f"run_dir={sft}", "task=chat", f"task.path={held_out}"], cwd, root)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip().splitlines()[-1]
    assert "on chat (40 items): acc " in line
    for skill in ("arithmetic", "count", "name", "reverse", "spell"):
        assert f"acc/{skill} " in line


def test_eval_scores_a_chat_finetune_on_its_own_data_and_prepare_takes_conversations(runs, tmp_path):
    """`tinygpt eval run_dir=<sft run>` reads the conversations the finetune trained on, tokenized
    with its model's tokenizer (not data.tokenizer's default, which it refused as another's data),
    and scores them as it trained on them (each whole, its replies only: not the prompts),
    and `tinygpt prepare` on a .jsonl of conversations says what it prepared (was a KeyError)."""
    cwd, root, _, sft, _, held_out = runs
    data = {p.name: p.read_bytes() for p in (root / "chats").iterdir()}
    proc = run_script("eval", [f"run_dir={sft}"], cwd, root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "on chats val:" in proc.stdout and "perplexity" in proc.stdout
    assert {p.name: p.read_bytes() for p in (root / "chats").iterdir()} == data
    # scored as the finetune trains: whole conversations that fit its context, their replies only
    import numpy as np

    from gpt.data.chat import open_chat_split

    val = open_chat_split(root / "chats", json.loads((root / "chats" / "meta.json").read_text()), "val")
    block = checkpoint.load(latest(sft)).model_config["block_size"]
    fits = [i for i, n in enumerate(val.lengths()) if n <= block + 1]
    replies = sum(int(np.sum(val.conversation(i)[1][1:])) for i in fits)
    assert 0 < replies < sum(len(val.conversation(i)[0]) - 1 for i in fits)
    assert f"on chats val: {replies:,} reply tokens scored in {len(fits):,} conversations (" in proc.stdout, proc.stdout
    proc = run_script(
        "prepare",
        ["data=local", f"data.source.path={held_out}", "data.name=held_out", "data.tokenizer.kind=byte"],
        cwd,
        tmp_path / "data",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "held_out: 40 conversations," in proc.stdout + proc.stderr


def test_refusals_are_one_line_and_leave_prepared_data_alone(runs, tmp_path):
    cwd, root, base, sft, _, held_out = runs
    proc = run_script("chat", [f"run_dir={base}"], cwd, root, stdin="hi\n")
    assert_one_line_error(proc, "has no chat template", "experiment=sft")
    proc = run_script("eval", [f"run_dir={base}", "task=chat", f"task.path={held_out}"], cwd, root)
    assert_one_line_error(proc, "needs a chat model")
    before = {p.name: p.read_bytes() for p in (root / "chats").iterdir()}
    records = [json.loads(line) for line in (cwd / "chats.jsonl").read_text().splitlines()]
    records[9] = {
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "assistant", "content": "c"},
        ]
    }
    bad = write_jsonl(tmp_path / "bad.jsonl", records)
    proc = run_script(
        "train", ["experiment=sft", f"init_from={base}", "data=local", f"data.source.path={bad}", "data.name=chats"], cwd, root
    )
    assert_one_line_error(proc, "record 10, message 3: two assistant turns in a row")
    assert {p.name: p.read_bytes() for p in (root / "chats").iterdir()} == before
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    proc = run_script(
        "train",
        [
            "experiment=sft",
            f"init_from={base}",
            "data=local",
            f"data.source.path={empty}",
            "data.name=nothing",
            "data.format=chat",
        ],
        cwd,
        root,
    )
    assert_one_line_error(proc, "holds no conversations")
    proc = run_script("train", ["experiment=sft", "data=local", f"data.source.path={bad}", "data.name=x"], cwd, root)
    assert_one_line_error(proc, "needs a model to start from")
    # a finetune resumed by its folder, without init_from, twice: its conversations keep the
    # model's tokenizer (not data.tokenizer's default, GPT-2's BPE), the prepared data stays
    copy = tmp_path / "sft"
    shutil.copytree(sft, copy)
    data = {p.name: p.read_bytes() for p in (root / "chats").iterdir()}
    resumed = ["experiment=sft", "data=local", f"data.source.path={cwd / 'chats.jsonl'}", "data.name=chats"]
    for steps in (31, 32):
        proc = run_script("train", [*resumed, f"train.max_iters={steps}", f"paths.output_dir={copy}"], cwd, root)
        assert proc.returncode == 0, proc.stderr[-2000:]
        line = next(line for line in proc.stdout.splitlines() if line.startswith("resuming from"))
        assert f"at step {steps - 1}" in line and "init_from" not in line  # kept, not "changed"
    assert checkpoint.load(latest(copy)).step == 32
    assert {p.name: p.read_bytes() for p in (root / "chats").iterdir()} == data


def test_playground_chat_mode_in_a_headless_browser(runs, tmp_path):
    """The page opens a chat model in chat mode; a message streams its reply (the one `tinygpt
    chat` gives), the history carries to the next turn, Stop ends a reply, Clear empties the list."""
    import os
    from pathlib import Path

    pytest.importorskip("fastapi")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    from helpers import Server, chromium

    cwd, root, base, sft, _, _ = runs
    browser = chromium()  # first: a skip for want of a browser must not leave a server running
    replies = chat_cli(runs, "system=Answer briefly.", stdin="\n".join(QUESTIONS[:2]) + "\n").stdout.split("\n")[:-1]
    server = Server([f"run_dir={sft}"], cwd, root)
    shot = Path(os.environ.get("TINYGPT_TEST_ARTIFACTS") or tmp_path) / "playground-chat.png"
    try:
        browser.get(f"{server.url}/")
        WebDriverWait(browser, 30).until(lambda b: Select(b.find_element(By.ID, "model")).options)
        assert Select(browser.find_element(By.ID, "mode")).first_selected_option.get_attribute("value") == "chat"
        assert browser.find_element(By.ID, "send").is_displayed() and not browser.find_element(By.ID, "generate").is_displayed()
        set_slider = (
            "const e = document.getElementById(arguments[0]); e.value = arguments[1]; e.dispatchEvent(new Event('input'));"
        )
        browser.execute_script(set_slider, "temperature", "0")
        browser.execute_script(set_slider, "max_tokens", "24")
        browser.find_element(By.ID, "system").send_keys("Answer briefly.")

        def say(text: str) -> str:
            browser.find_element(By.ID, "message").send_keys(text)
            browser.find_element(By.ID, "send").click()
            WebDriverWait(browser, 60).until(lambda b: b.find_element(By.ID, "status").text.startswith("done"))
            return browser.find_elements(By.CSS_SELECTOR, "#messages .assistant")[-1].get_attribute("textContent")

        assert [say(q) for q in QUESTIONS[:2]] == replies  # the second turn is answered with the first in its history
        assert len(browser.find_elements(By.CSS_SELECTOR, "#messages .message")) == 4
        browser.save_screenshot(str(shot))
        print(f"playground chat screenshot: {shot}")

        browser.execute_script(set_slider, "max_tokens", "1000")
        browser.execute_script(set_slider, "temperature", "1.5")
        browser.find_element(By.ID, "message").send_keys("Tell me a long story")
        browser.find_element(By.ID, "send").click()
        browser.find_element(By.ID, "stop-button").click()
        WebDriverWait(browser, 30).until(lambda b: b.find_element(By.ID, "status").text.startswith(("stopped", "done")))
        browser.find_element(By.ID, "clear").click()
        assert browser.find_elements(By.CSS_SELECTOR, "#messages .message") == []
        # the context (256 bytes) caps max tokens; a conversation outgrowing it drops its oldest turns, said once
        assert browser.find_element(By.ID, "max_tokens").get_attribute("max") == "256"
        browser.execute_script(set_slider, "max_tokens", "8")
        browser.execute_script(set_slider, "temperature", "0")
        for _ in range(4):
            say("Spell " + "abcdefgh " * 10)
            assert browser.find_element(By.ID, "status").text.startswith("done")  # every turn answered
        assert browser.find_elements(By.CSS_SELECTOR, "#messages .dropped")
        assert "no longer fit" in browser.find_element(By.ID, "notice").text
    finally:
        browser.quit()
        log = server.stop()
    assert "Traceback" not in log, log
    assert shot.is_file() and shot.stat().st_size > 1000


@pytest.mark.parametrize("lora", [0, 4])
def test_sft_resumes_bitwise_full_and_lora(runs, tmp_path, lora):
    """A finetune stopped by SIGTERM after step 6 and resumed gives the uninterrupted run's loss at
    every step, bit for bit: the conversation draw resumes with its generator; under LoRA the
    token table trains too (the template's new rows must learn) and resumes alike."""
    import torch

    from helpers import compose, train_recording_losses

    cwd, root, base, *_ = runs
    overrides = [
        "experiment=sft", f"init_from={base}", "data=local", f"data.source.path={cwd / 'chats.jsonl'}", "data.name=chats",
        "train.max_iters=10", "train.eval_interval=5", "train.eval_iters=1", "train.batch_size=4", "train.sample_tokens=0",
        "threads=1", f"paths.data_dir={root}", f"finetune.lora_rank={lora}",
    ]  # fmt: skip
    full = train_recording_losses(compose(overrides, tmp_path / "full"))
    first = train_recording_losses(compose(overrides, tmp_path / "split"), stop_after=6)
    rest = train_recording_losses(compose(overrides, tmp_path / "split"))
    assert sorted(first) == list(range(1, 7)) and sorted(rest) == list(range(7, 11))
    assert {**first, **rest} == full
    a, b = (checkpoint.load(latest(tmp_path / d)).model for d in ("full", "split"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    start = checkpoint.load(base / "checkpoints" / "best.pt").model["transformer.wte.weight"]
    trained = a["transformer.wte.weight"]
    assert not torch.equal(trained[257:], trained[257:].mean(0).expand(4, -1))  # the new rows moved apart
    assert trained.shape[0] == start.shape[0] + 4
