"""Which tokenizer for which text: bytes per token and bits per byte after a fixed training budget,
for char, byte, GPT-2's BPE and BPEs trained on the corpus, on Tiny Shakespeare and on German.

    python benchmarks/tokenization.py                               # both corpora, 500 steps each
    python benchmarks/tokenization.py --corpora german --steps 200 --bpe-sizes 1024

Each run: the corpus as one document, its last 10% held out; the quickstart model (gpt-micro:
4 layers, 128 dims, context 64, batch 12: 768 tokens a step) for --steps steps (AdamW, lr 2e-3,
seed 1337); then bits per byte over the whole held-out text (every token scored once, context
up to 64 tokens). Tokens per step are fixed, so a tokenizer with more bytes per token also sees
more text per step and more text per context window. The German text is generated
(benchmarks/german.py, seeded); Tiny Shakespeare comes from the data root (downloaded once).
Offline, --ranks-file points at GPT-2's r50k_base.tiktoken.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from german import german_text  # benchmarks/ is on the path when this file is run

from gpt import train
from gpt.apps.eval import evaluate
from gpt.config import EvalConfig, PathsSettings


def corpus_file(name: str, root: Path) -> Path:
    if name == "german":
        path = root / "tokenizer-bench" / "german.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.write_text(german_text(1_100_000, seed=0), encoding="utf-8")
        return path
    from gpt.data.download import ensure_file

    return ensure_file(
        "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
        root / "tinyshakespeare" / "input.txt",
        "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
    )


def tokenizer_overrides(kind: str, ranks_file: str | None) -> list[str]:
    if kind.startswith("bpe"):
        return ["data.tokenizer.kind=bpe", f"data.tokenizer.vocab_size={kind[3:]}"]
    if kind == "gpt2":
        return ["data.tokenizer.kind=tiktoken", "data.tokenizer.name=gpt2"] + [f"data.tokenizer.ranks_file={ranks_file}"] * bool(
            ranks_file
        )
    return [f"data.tokenizer.kind={kind}"]


def run(corpus: str, kind: str, steps: int, root: Path, out: Path, ranks_file: str | None) -> dict:
    path = corpus_file(corpus, root)
    overrides = [
        "data=local",
        f"data.source.path={path}",
        f"data.name=bench_{corpus}_{kind}",
        "data.split_by=tail",
        *tokenizer_overrides(kind, ranks_file),
        "model=gpt-micro",
        "optim=adamw",
        "optim.lr=2e-3",
        f"train.max_iters={steps}",
        f"train.eval_interval={steps}",
        "train.eval_iters=20",
        "train.sample_tokens=0",
        "train.eval_sample_tokens=0",
        f"paths.data_dir={root}",
        f"paths.output_dir={out / f'{corpus}_{kind}'}",
        "resume=false",
    ]
    summary = train(overrides)
    r = evaluate(EvalConfig(run_dir=summary["run_dir"], paths=PathsSettings(data_dir=str(root)), device="cpu"))
    return {"bytes_per_token": r["bytes"] / r["tokens"], "bits_per_byte": r["bits_per_byte"], "wall_s": summary["wall_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpora", nargs="+", default=["shakespeare", "german"], choices=["shakespeare", "german"])
    parser.add_argument("--kinds", nargs="+", default=None, help="char byte gpt2 bpe<size> ... (default: all)")
    parser.add_argument("--bpe-sizes", type=int, nargs="+", default=[1024, 4096, 8192])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--ranks-file", default=None, help="GPT-2's r50k_base.tiktoken, offline")
    args = parser.parse_args()
    kinds = args.kinds or ["char", "byte", "gpt2", *(f"bpe{n}" for n in args.bpe_sizes)]
    root = Path(os.environ.get("TINYGPT_DATA_DIR") or PathsSettings().data_root())
    rows = []
    with tempfile.TemporaryDirectory() as runs:
        for corpus in args.corpora:
            for kind in kinds:
                rows.append((corpus, kind, run(corpus, kind, args.steps, root, Path(runs), args.ranks_file)))
    print(f"\n| corpus | tokenizer | bytes per token | bits per byte after {args.steps} steps | train wall time |")
    print("| --- | --- | --- | --- | --- |")
    for corpus, kind, r in rows:
        print(f"| {corpus} | {kind} | {r['bytes_per_token']:.2f} | {r['bits_per_byte']:.3f} | {r['wall_s']:.0f} s |")


if __name__ == "__main__":
    main()
