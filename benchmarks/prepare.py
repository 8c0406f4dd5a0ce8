"""Data preparation speed: GPT-2 BPE over >= 50 MB of text, with 1 process and with all cores.

    python benchmarks/prepare.py [--mb 50] [--procs 1 2]

The corpus is Tiny Shakespeare (from TINYGPT_DATA_DIR / ~/.cache/tinygpt, or ../shared) repeated
with numbered variations until it reaches --mb megabytes, one document per paragraph, written
as .txt files into a temporary folder. Needs GPT-2's BPE: tiktoken's cache, or --ranks-file.
Prints tokens/s of the tokenizing pass and the whole preparation for each process count.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from gpt.config import DataSettings, from_dict
from gpt.data import load_data

REPO = Path(__file__).resolve().parent.parent


def find_text() -> Path:
    root = Path(os.environ.get("TINYGPT_DATA_DIR", "~/.cache/tinygpt")).expanduser()
    for candidate in (root / "tinyshakespeare" / "input.txt", REPO.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"):
        if candidate.is_file():
            return candidate
    raise SystemExit("error: no Tiny Shakespeare found; run `python train.py train.max_iters=1` once to download it")


def build_corpus(folder: Path, mb: float) -> tuple[int, int]:
    paragraphs = [p for p in find_text().read_text().split("\n\n") if p.strip()]
    folder.mkdir(parents=True)
    size, docs, copy = 0, 0, 0
    while size < mb * 1e6:
        text = "\n\n".join(f"{p}\n[{copy}.{i}]" for i, p in enumerate(paragraphs))  # every copy differs
        (folder / f"part{copy:03d}.txt").write_text(text)
        size += len(text.encode())
        docs += len(paragraphs)
        copy += 1
    return size, docs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=50)
    ap.add_argument("--procs", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    ap.add_argument("--ranks-file", default=None, help="GPT-2 r50k_base.tiktoken (offline)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tinygpt-prep-"))
    try:
        size, docs = build_corpus(work / "corpus", args.mb)
        print(f"corpus: {size / 1e6:.1f} MB, {docs:,} documents (paragraphs), GPT-2 BPE; {os.cpu_count()} CPUs")
        source = {"kind": "local", "path": str(work / "corpus"), "doc_unit": "paragraph"}
        tokenizer = {"kind": "tiktoken", "name": "gpt2", "ranks_file": args.ranks_file}
        # Read the files once so that the timed runs measure tokenizing, not the text builder's cache.
        warm = {"name": "warm", "tokenizer": {"kind": "byte"}, "source": source, "max_docs": 10, "num_proc": 1}
        load_data(from_dict(DataSettings, warm), work / "root", log=lambda *a: None)
        rates = {}
        print(f"{'processes':>9} {'tokens':>12} {'tokenize s':>10} {'tokens/s':>12} {'total s':>8}")
        for n in args.procs:
            cfg = {"name": f"p{n}", "tokenizer": tokenizer, "source": source, "val_fraction": 0.005, "num_proc": n}
            t0 = time.time()
            meta = load_data(from_dict(DataSettings, cfg), work / "root", log=lambda *a: None).meta
            total = time.time() - t0
            tokens = sum(meta["tokens"].values())
            rates[n] = tokens / meta["tokenize_seconds"]
            print(f"{n:>9} {tokens:>12,} {meta['tokenize_seconds']:>10.2f} {rates[n]:>12,.0f} {total:>8.2f}", flush=True)
        if len(rates) > 1:
            lo, hi = min(rates), max(rates)
            print(f"scaling {lo} -> {hi} processes: {rates[hi] / rates[lo]:.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
