"""Supervised finetuning on a CPU, end to end, as the README's first hour does it: the quickstart
(`tinygpt train`, bytes, 2000 steps), the synthetic conversation suite (gpt/chat/synthetic.py),
SFT from the quickstart's run, and held-out exact-match accuracy per skill before and after.

    python benchmarks/chat.py [--base-iters 2000 | --base RUN] [--sft-iters 3000] [--sft-batch 64] [--train 60000] [--test 500] [--out DIR]

Every step is the command a user types: `tinygpt train` (the quickstart, no overrides beyond
--base-iters), `python -m gpt.chat.synthetic`, `tinygpt train experiment=sft init_from=<base>
data=local data.source.path=train.jsonl data.name=chats optim=muon optim.lr=3e-3
train.max_iters=3000 train.batch_size=64` (Muon on the matrices, as the base was trained; AdamW
on the rest; the context extended from 64 to 256 by experiment=sft), then `tinygpt eval
task=chat task.path=test.jsonl`. "Before" is the model SFT starts from: the base with the
template's tokens added (their rows at the mean embedding), scored the same way. The training
clock is each run's own elapsed_s (set-up and evals included). Run it with nothing else running:
two torch processes on 2 cores distort every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED_TEXT = REPO.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"


def tinygpt(*args: str, env: dict) -> str:
    proc = subprocess.run([sys.executable, "-m", "gpt", *args], cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"failed: tinygpt {' '.join(args)}\n{proc.stderr[-3000:]}")
    return proc.stdout


def before_sft(base: Path, test: Path) -> dict:
    """The model SFT starts from, as experiment=sft builds it (gpt.training.finetune.initial_model):
    the template's tokens added, the context extended to finetune.min_block_size, nothing trained."""
    import torch

    from gpt.apps.common import compose
    from gpt.chat.template import ChatTokenizer
    from gpt.checkpoints import loading
    from gpt.config import TaskSettings
    from gpt.evals.chat import evaluate_chat
    from gpt.evals.tasks import examples
    from gpt.training.finetune import initial_model

    ft = compose("config", ["experiment=sft", f"init_from={base}"]).finetune
    loaded = loading.load(str(base), dropout=0.0)
    tok = ChatTokenizer(loaded.tokenizer())
    model = initial_model(str(base), tok, ft, dropout=0.0, log=lambda *a: None, loaded=loaded)
    items = examples(TaskSettings("chat", path=str(test)), test.parent)
    with torch.no_grad():
        return evaluate_chat(model.eval(), tok, items, torch.device("cpu"), batch_size=50)


def scores(line: str) -> dict:
    """{"acc": ..., "acc/<skill>": ...} from `tinygpt eval task=chat`'s result line."""
    figures = line.split("): ", 1)[1].split(", ")
    return {k: float(v) for k, v in (f.rsplit(" ", 1) for f in figures)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-iters", type=int, default=2000)
    parser.add_argument("--sft-iters", type=int, default=3000)
    parser.add_argument("--sft-batch", type=int, default=64, help="conversations per SFT step")
    parser.add_argument("--train", type=int, default=60000, help="train conversations in the suite")
    parser.add_argument("--test", type=int, default=500, help="held-out conversations")
    parser.add_argument("--out", type=Path, default=None, help="where runs and data go (default: a temporary folder)")
    parser.add_argument("--base", type=Path, default=None, help="a quickstart run to start from (default: train one)")
    args = parser.parse_args()

    from gpt.chat.synthetic import write_suite

    work = args.out or Path(tempfile.mkdtemp(prefix="tinygpt-chat-"))
    data = work / "data"
    if SHARED_TEXT.is_file() and not (data / "tinyshakespeare" / "input.txt").is_file():
        (data / "tinyshakespeare").mkdir(parents=True, exist_ok=True)
        (data / "tinyshakespeare" / "input.txt").write_bytes(SHARED_TEXT.read_bytes())
    env = {**os.environ, "TINYGPT_DATA_DIR": str(data), "PYTHONUNBUFFERED": "1"}
    train, test = write_suite(work / "suite", args.train, args.test)
    base, sft = args.base or work / "base", work / "sft"
    t0 = time.time()
    if args.base is None:
        base_args = [f"train.max_iters={args.base_iters}"] if args.base_iters != 2000 else []
        tinygpt("train", *base_args, f"paths.output_dir={base}", env=env)
    before = before_sft(base, test)
    tinygpt(
        "train", "experiment=sft", f"init_from={base}", "data=local", f"data.source.path={train}", "data.name=chats",
        "optim=muon", "optim.lr=3e-3", f"train.max_iters={args.sft_iters}", f"train.batch_size={args.sft_batch}",
        f"paths.output_dir={sft}", env=env,
    )  # fmt: skip
    after = scores(tinygpt("eval", f"run_dir={sft}", "task=chat", f"task.path={test}", env=env).strip().splitlines()[-1])
    wall = time.time() - t0
    seconds = {name: json.loads((run / "summary.json").read_text())["elapsed_s"] for name, run in (("base", base), ("sft", sft))}
    skills = sorted(k for k in after if k.startswith("acc/"))
    print(f"\nbase {args.base_iters} steps in {seconds['base']:.0f} s; SFT {args.sft_iters} steps in {seconds['sft']:.0f} s; "
          f"training {(seconds['base'] + seconds['sft']) / 60:.1f} min in all ({wall / 60:.1f} min with data and evals); {work}")  # fmt: skip
    print("\n| skill | base (before SFT) | after SFT |\n|---|---|---|")
    for key in [*skills, "acc"]:
        name = key.split("/", 1)[1] if "/" in key else "all"
        print(f"| {name} | {before[key] * 100:.1f}% | {after[key] * 100:.1f}% |")


if __name__ == "__main__":
    main()
