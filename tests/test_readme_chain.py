"""The README's newcomer path, executed (not only composed) in the order it is printed: the
quickstart, sample, curves, training on, export, a chat file, SFT from the quickstart's run,
`tinygpt chat`, serve (through the official openai client), eval; then transformers on the
exported folders. Each command runs as a user types it, through the real CLI (`python train.py`,
`python -m gpt <command>` for `tinygpt <command>`), in a temporary directory, on a tiny model of
the quickstart's block: the test appends only size settings (layers, steps, tokens) to what the
README prints, and checks that the README prints these commands, in this order.
Run: pytest tests/test_readme_chain.py  (slow: ~3 min on 2 CPU cores)
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import REPO, Server, run_script

transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers")

# A tiny model of the quickstart's block (context 32), trained a few steps: what the chain needs
# is that each command works on what the one before made, not a good model.
TINY = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.block_size=32", "train.batch_size=4"]
SHORT = ["train.eval_interval=10", "train.eval_iters=2", "train.log_interval=5", "train.sample_tokens=20", "threads=1"]

# The chain as the README prints it, and what the test appends to each command to keep it small;
# a command with `&&` has a list for each part; SERVE starts the server and asks it through the openai client.
SERVE = "tinygpt serve run_dir=outputs/runs/<sft stamp>"
CHAIN: list[tuple[str, list]] = [
    ("python train.py && python sample.py", [[*TINY, *SHORT, "train.max_iters=20"], ["max_new_tokens=40", "threads=1"]]),
    ("tinygpt plot", []),
    ('python sample.py prompt="ROMEO:" temperature=0 max_new_tokens=200 num_samples=1', ["threads=1"]),
    ("python train.py hydra.run.dir=outputs/runs/<stamp> train.max_iters=3000", [*TINY, *SHORT, "train.max_iters=30"]),
    ("tinygpt export run_dir=outputs/runs/<stamp> out=hf_model", []),
    ("python -m gpt.chat.synthetic chats", ["--train", "400", "--test", "20"]),
    (
        "tinygpt train experiment=sft init_from=outputs/runs/<stamp> data=local data.source.path=chats/train.jsonl data.name=chats",
        [*SHORT, "train.max_iters=10", "train.batch_size=8"],
    ),
    ("tinygpt chat run_dir=outputs/runs/<sft stamp>", ["max_new_tokens=16", "threads=1"]),
    (SERVE, []),
    ("tinygpt eval run_dir=outputs/runs/<sft stamp> task=chat task.path=chats/test.jsonl", ["threads=1"]),
    ("tinygpt eval run_dir=outputs/runs/<stamp>", ["threads=1"]),
    ("tinygpt export run_dir=outputs/runs/<sft stamp> out=hf_chat", []),
]
PROMPTS = ["ROMEO:", "First Citizen:\nBefore", "O"]


def _readme_commands() -> list[str]:
    """The README's bash blocks, comments dropped, continued lines joined: one command a line."""
    text = (REPO / "README.md").read_text()
    lines = [
        re.sub(r"\s+#.*$", "", line).rstrip()
        for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S)
        for line in block.splitlines()
    ]
    out, joined = [], ""
    for line in lines:
        joined += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            out.append(re.sub(r"\s+", " ", joined).strip())
            joined = ""
    return out


def test_the_readme_prints_the_chain_in_this_order():
    printed = _readme_commands()
    at = 0
    for command, _ in CHAIN:
        assert command in printed[at:], f"the README no longer prints `{command}` after its line {at}; update CHAIN to match"
        at = printed.index(command, at)


def _run(command: str, extra: list[str], cwd: Path, root: Path, stamps: dict, stdin: str | None = None):
    """One printed command with `extra` appended, as a user types it."""
    for name, stamp in stamps.items():
        command = command.replace(f"<{name}>", stamp)
    words = shlex.split(command)
    if words[:2] == ["python", "-m"]:  # a module of the package (python -m gpt.chat.synthetic)
        env = {**os.environ, "PYTHONPATH": str(REPO), "TINYGPT_DATA_DIR": str(root)}
        proc = subprocess.run([sys.executable, *words[1:], *extra], cwd=cwd, env=env, capture_output=True, text=True)
    else:  # python train.py / sample.py (the checkout's shims), tinygpt <command> as python -m gpt <command>
        script, args = (words[1], words[2:])
        proc = run_script(script, [*args, *extra], cwd, root, timeout=600, stdin=stdin)
    assert proc.returncode == 0, f"`{command}` exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_the_readme_chain_runs_in_order(tmp_path, data_root):
    root, data_overrides = data_root
    cwd = tmp_path / "clone"
    cwd.mkdir()
    stamps: dict[str, str] = {}
    out: dict[str, str] = {}

    def newest_run() -> Path:
        return max((cwd / "outputs" / "runs").iterdir())  # run folders are named by their start time

    for command, extra in CHAIN:
        if command == SERVE:
            _served_chat_equals_the_terminals(cwd, root, stamps["sft stamp"])
            continue
        parts = command.split(" && ")
        extras = extra if len(parts) > 1 else [extra]
        stdin = "What is 12 + 30?\nSpell 'cat' letter by letter.\n" if command.startswith("tinygpt chat") else None
        for part, more in zip(parts, extras):
            if part.startswith("python train.py"):
                more = [*more, *data_overrides]  # the stand-in corpus's checksum, where there is no real one
            out[part] = _run(part, more, cwd, root, stamps, stdin).stdout
            if part == "python train.py":
                stamps["stamp"] = newest_run().name
        if command.startswith("tinygpt train experiment=sft"):
            stamps["sft stamp"] = newest_run().name

    run_dir = cwd / "outputs" / "runs" / stamps["stamp"]
    sft_dir = cwd / "outputs" / "runs" / stamps["sft stamp"]
    assert (run_dir / "curves.png").stat().st_size > 10_000
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 30 and summary["status"] == "finished"  # trained on from 20 to 30
    assert json.loads((sft_dir / "summary.json").read_text())["chat"] is True
    assert "context 32 -> 256" in out[CHAIN[6][0]]  # the quickstart's RoPE base, extended for the conversations
    assert len(out[CHAIN[7][0]].split("\n")) >= 3  # two replies, a line (or more) each
    assert "acc" in out[CHAIN[9][0]] and "perplexity" in out[CHAIN[10][0]]
    _transformers_equals_tinygpt(cwd, root, run_dir)
    _transformers_chats_as_tinygpt(cwd / "hf_chat", sft_dir)


def _served_chat_equals_the_terminals(cwd: Path, root: Path, sft_stamp: str) -> None:
    """`tinygpt serve` on the SFT run, asked through the openai client: its greedy reply equals
    `tinygpt chat`'s greedy reply to the same message."""
    openai = pytest.importorskip("openai")
    server = Server([f"run_dir=outputs/runs/{sft_stamp}"], cwd, root)
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
        reply = client.chat.completions.create(
            model=client.models.list().data[0].id,
            messages=[{"role": "user", "content": "What is 12 + 30?"}],
            max_tokens=16,
            temperature=0,
        )
        served = reply.choices[0].message.content
    finally:
        server.stop()
    terminal = run_script(
        "chat",
        [f"run_dir=outputs/runs/{sft_stamp}", "temperature=0", "max_new_tokens=16", "threads=1"],
        cwd,
        root,
        stdin="What is 12 + 30?\n",
    )
    assert terminal.returncode == 0, terminal.stderr
    # scripted chat prints each reply, then a newline (read back in text mode: \r becomes \n)
    assert terminal.stdout == (served + "\n").replace("\r\n", "\n").replace("\r", "\n")


def _transformers_equals_tinygpt(cwd: Path, root: Path, run_dir: Path) -> None:
    """The export of the quickstart's run: AutoModelForCausalLM + AutoTokenizer give tinygpt's
    logits (1e-5) and `python sample.py temperature=0`'s text, past the context too."""
    from gpt.checkpoints import loading

    tok = transformers.AutoTokenizer.from_pretrained(cwd / "hf_model", trust_remote_code=True)
    hf = transformers.AutoModelForCausalLM.from_pretrained(cwd / "hf_model", trust_remote_code=True).eval()
    ours = loading.load(str(run_dir)).model.eval()
    idx = torch.randint(0, 256, (2, 32))
    with torch.no_grad():
        assert (ours(idx)[0] - hf(idx).logits).abs().max().item() <= 1e-5
    for prompt in PROMPTS:
        sample = run_script(
            "sample.py",
            [f"run_dir={run_dir}", f"prompt={prompt}", "temperature=0", "max_new_tokens=60", "num_samples=1", "threads=1"],
            cwd,
            root,
        )
        assert sample.returncode == 0, sample.stderr
        ids = tok(prompt, return_tensors="pt").input_ids
        text = tok.decode(hf.generate(ids, max_new_tokens=60, do_sample=False)[0], skip_special_tokens=True)
        assert text in sample.stdout, (text, sample.stdout)


def _transformers_chats_as_tinygpt(folder: Path, sft_run: Path) -> None:
    """The SFT run's export: apply_chat_template gives tinygpt's prompt ids and the
    text-generation pipeline replies what tinygpt's generation replies (greedy)."""
    from gpt.checkpoints import loading
    from gpt.config import SamplingSettings
    from gpt.generation import generate

    loaded = loading.load(str(sft_run))
    tok = loaded.tokenizer()
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 12 + 30?"}]
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    rendered = hf_tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    assert list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered) == tok.prompt(messages)
    chat = transformers.pipeline("text-generation", model=str(folder), trust_remote_code=True, device="cpu")
    reply = chat(messages, max_new_tokens=12, do_sample=False)[0]["generated_text"][-1]["content"]
    want = generate(loaded.model.eval(), tok, [tok.prompt(messages)], SamplingSettings(max_new_tokens=12, temperature=0))[0][0]
    assert reply == want


@pytest.mark.slow
def test_the_documented_eval_tasks_command_runs_on_the_default_data(tmp_path, data_root):
    """docs/evaluation.md's `python train.py train.eval_tasks=[hellaswag] train.eval_task_limit=200`
    on the quickstart's data (bytes: any item's text encodes), offline with the task's file where
    the docs say to put it; the char data refuses it in one line, naming the characters."""
    from test_tasks import HELLASWAG

    from helpers import assert_one_line_error

    root, data_overrides = data_root
    command = "python train.py train.eval_tasks=[hellaswag] train.eval_task_limit=200"
    assert command in (REPO / "docs" / "evaluation.md").read_text()
    own = tmp_path / "root"
    (own / "tasks").mkdir(parents=True)
    # as real HellaSwag items do, one holds digits and brackets, which Tiny Shakespeare's 65 characters lack
    rows = [*HELLASWAG, dict(HELLASWAG[0], ind=99, ctx_a="Mix 2 cups (about 500 ml) of flour = 1 bowl.")]
    (own / "tasks" / "hellaswag.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (own / "tinyshakespeare").symlink_to(root / "tinyshakespeare")
    small = [*TINY, *SHORT, "train.max_iters=10", *data_overrides]
    proc = run_script("train.py", [*shlex.split(command)[2:], *small], tmp_path, own)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = max((tmp_path / "outputs" / "runs").iterdir())
    tasks = json.loads((run / "summary.json").read_text())["tasks"]
    assert set(tasks["hellaswag"]) == {"acc", "acc_norm", "step"} and tasks["hellaswag"]["step"] == 10
    chars = run_script("train.py", [*shlex.split(command)[2:], *small, "data=shakespeare_char"], tmp_path, own)
    assert_one_line_error(chars, "hellaswag", "characters")
