"""Start-up to the first training step on a prepared corpus of 1 GB of shards against a 1 MB one.

    python benchmarks/startup.py [--gigabytes 1.0] [--repeats 3] [--keep DIR]

Prepares a ~1 MB text (Tiny Shakespeare from TINYGPT_DATA_DIR when it is there, else a
generated one) twice with the char tokenizer: once as it is, once with its train split replaced
by shards of random tokens that add up to `--gigabytes` (meta.json rewritten to match, so it is
prepared data like any other). Then times `python train.py` from launch to its `step 1/1` line
(median of `--repeats` starts, each into a new run directory):

  1 MB                        the small corpus
  1 GB, first start           no stamps yet: every shard's CRC-32 is read once (then stamped)
  1 GB                        a later start: the stamps vouch for the shards, nothing is read
  1 GB, data.verify=true      every shard's CRC-32 at every start (what every start did before)
  ..., not in the page cache  the same two with the shards evicted from the page cache first
                              (posix_fadvise DONTNEED), so that what is read comes from the disk

The 1 MB, 1 GB and data.verify=true starts are alternated, `--repeats` rounds.

Run it with nothing else running (two torch processes on 2 cores distort every figure).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SHARD_TOKENS = 50_000_000  # 100 MB shards of uint16


def corpus(folder: Path) -> Path:
    """~1 MB of text: Tiny Shakespeare when the data root has it, else generated."""
    shared = Path(os.environ.get("TINYGPT_DATA_DIR", Path.home() / ".cache" / "tinygpt")) / "tinyshakespeare" / "input.txt"
    text = shared.read_text(encoding="utf-8") if shared.is_file() else ("To be, or not to be: that is the question.\n" * 25_000)
    path = folder / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    return path


def train_command(root: Path, text: Path, name: str, run_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(REPO / "train.py"),
        "data=local",
        f"data.source.path={text}",
        f"data.name={name}",
        "data.split_by=tail",
        "data.tokenizer.kind=char",
        f"paths.data_dir={root}",
        f"hydra.run.dir={run_dir}",
        "train.max_iters=1",
        "train.log_interval=1",
        "train.eval_iters=1",
        "train.sample_tokens=0",
        "train.eval_sample_tokens=0",
        *extra,
    ]


def first_step_seconds(cmd: list[str]) -> float:
    """From launch to the line that reports the first training step."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen = None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("step 1/1") and seen is None:
            seen = time.perf_counter() - t0
    if proc.wait() != 0 or seen is None:
        raise SystemExit("training failed:\n" + "".join(lines[-20:]))
    return seen


def inflate(prepared: Path, gigabytes: float) -> int:
    """Replace the train split of prepared data with random-token shards of `gigabytes` in all;
    the meta keeps its fingerprint (what decides reuse) and records the new shards' sizes and
    CRC-32s. Returns the bytes of shards written."""
    meta = json.loads((prepared / "meta.json").read_text())
    vocab = len(meta["tokenizer"]["chars"])
    dtype = np.dtype(meta["dtype"])
    for old in prepared.glob("train-*.bin"):
        old.unlink()
    (prepared / "verified.json").unlink(missing_ok=True)
    total = int(gigabytes * 1e9) // dtype.itemsize
    rng = np.random.default_rng(0)
    sizes, sums, i = [], [], 0
    while total > 0:
        n = min(SHARD_TOKENS, total)
        tokens = rng.integers(0, vocab, n, dtype=dtype)
        (prepared / f"train-{i:04d}.bin").write_bytes(tokens.tobytes())
        sizes.append(n)
        sums.append(zlib.crc32(tokens.tobytes()))
        total, i = total - n, i + 1
    meta["shards"]["train"], meta["crc32"]["train"] = sizes, sums
    meta["tokens"]["train"] = sum(sizes)
    (prepared / "meta.json").write_text(json.dumps(meta))
    return sum(sizes) * dtype.itemsize


def evict(prepared: Path) -> None:
    """Drop the shards from the page cache, so the next read comes from the disk."""
    for path in prepared.glob("*.bin"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gigabytes", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keep", type=Path, help="work folder to keep (default: a temporary one, removed)")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="tinygpt-startup-"))
    work.mkdir(parents=True, exist_ok=True)
    root, text = work / "data", corpus(work)
    runs = iter(range(10**6))

    def start(name: str, *extra: str) -> float:
        return first_step_seconds(train_command(root, text, name, work / "runs" / f"{name}-{next(runs)}", *extra))

    start("small")  # prepares both copies (and warms the interpreter's file cache)
    start("big")
    written = inflate(root / "big", args.gigabytes)
    os.sync()  # the shards on disk: no write-back competes with the timed starts
    small_bytes = sum(p.stat().st_size for p in (root / "small").glob("*.bin"))
    size = f"{written / 1e9:.1f} GB"
    first = [start("big")]
    small, big, verify = [], [], []
    for _ in range(args.repeats):  # alternated, so that a drift of the machine hits each alike
        small.append(start("small"))
        big.append(start("big"))
        verify.append(start("big", "data.verify=true"))
    cold, cold_verify = [], []
    for _ in range(args.repeats):
        evict(root / "big")
        cold.append(start("big"))
        evict(root / "big")
        cold_verify.append(start("big", "data.verify=true"))
    rows = [
        (f"{small_bytes / 1e6:.1f} MB", small),
        (f"{size}, first start (no stamps yet)", first),
        (size, big),
        (f"{size}, data.verify=true", verify),
        (f"{size}, shards not in the page cache", cold),
        (f"{size}, data.verify=true, shards not in the page cache", cold_verify),
    ]
    base = statistics.median(rows[0][1])
    print(f"launch to the first training step ({os.cpu_count()} CPUs; median of {args.repeats} where repeated):")
    for label, times in rows:
        median = statistics.median(times)
        print(f"  {label:<55} {median:6.2f} s  ({median - base:+.2f} s)  [{', '.join(f'{t:.2f}' for t in times)}]")
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
