"""The pause a checkpoint puts into training, written in the background against blocking.

    python benchmarks/checkpoint_pause.py [--saves 4] [--every 10] [--out DIR]

Trains the GPT-2 124M shape (`model=gpt2 optim=adamw`, GPT-2 BPE on Tiny Shakespeare: 1.5 GB of
weights and moments per checkpoint) one short step at a time (batch 1 of 64 tokens: the state is
what matters, not the step), with an eval and a checkpoint every `--every` steps (enough for a
write to finish before the next save, as a real run's 250 steps are), once with
`train.async_save=true` and once with `false`, each in a process of its own. For every save it
reports the time the step loop stood still in `Trainer.save` (the pause), and for the
background run the wait at the end for its last write (the run is not done before its last
checkpoint is on disk). The pause of a background save is the copy of the state into buffers
kept from the first save; the blocking one is torch.save and fsync of the file.

Run it with nothing else running (two torch processes on 2 cores distort every figure).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def measure(async_save: bool, saves: int, every: int, out: Path) -> dict:
    """In this process: train and time every Trainer.save and the final wait."""
    sys.path.insert(0, str(REPO))
    from gpt.apps.common import compose
    from gpt.training import loop, saving, train

    pauses, flushes = [], []
    real_save, real_flush = loop.Trainer.save, saving.flush

    def timed_save(self, best=False):
        t = time.perf_counter()
        try:
            return real_save(self, best)
        finally:
            pauses.append(time.perf_counter() - t)

    def timed_flush(run, writer):
        t = time.perf_counter()
        try:
            return real_flush(run, writer)
        finally:
            flushes.append(time.perf_counter() - t)

    loop.Trainer.save, saving.flush = timed_save, timed_flush
    overrides = [
        "model=gpt2",
        "optim=adamw",
        "data=shakespeare",
        "model.block_size=64",
        "train.batch_size=1",
        f"train.max_iters={every * saves}",
        f"train.eval_interval={every}",
        "train.eval_iters=1",
        f"train.log_interval={every}",
        "train.sample_tokens=0",
        "train.eval_sample_tokens=0",
        f"train.keep_last={saves}",
        f"train.async_save={str(async_save).lower()}",
        "device=cpu",
        f"paths.output_dir={out}",
    ]
    train(compose("config", overrides))
    size = sum(p.stat().st_size for p in (out / "checkpoints").glob("ckpt-*.pt")) / saves
    return {"async_save": async_save, "pauses_s": pauses, "final_wait_s": flushes[-1] if flushes else None, "file_bytes": size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saves", type=int, default=4)
    parser.add_argument("--every", type=int, default=10, help="steps between saves")
    parser.add_argument("--out", type=Path, help="where the runs and report.json go (default: a temporary folder)")
    parser.add_argument("--one", choices=["true", "false"], help=argparse.SUPPRESS)  # a child process's mode
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="checkpoint-pause-"))
    if args.one is not None:
        print(json.dumps(measure(args.one == "true", args.saves, args.every, out)))
        return
    results = {}
    for mode in ("false", "true"):
        run = out / f"async-{mode}"
        proc = subprocess.run(
            [sys.executable, __file__, "--one", mode, "--saves", str(args.saves), "--every", str(args.every), "--out", str(run)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        if proc.returncode != 0:
            sys.exit(f"the {mode} run failed:\n{proc.stderr[-3000:]}")
        results[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    blocking, background = results["false"], results["true"]
    # the first save of each is shown, not counted: the blocking one's first write also
    # creates the folder; the background one's first copy may meet buffers still being allocated
    b, a = statistics.median(blocking["pauses_s"][1:]), statistics.median(background["pauses_s"][1:])
    report = {
        "shape": "gpt2 124M, AdamW, CPU",
        "steps_between_saves": args.every,
        "checkpoint_bytes": blocking["file_bytes"],
        "blocking_pauses_s": blocking["pauses_s"],
        "background_pauses_s": background["pauses_s"],
        "background_final_wait_s": background["final_wait_s"],
        "median_blocking_s": b,
        "median_background_s": a,
        "ratio": a / b,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    print(f"pause at a save: {a:.3f} s in the background against {b:.3f} s blocking ({100 * a / b:.1f}%)")


if __name__ == "__main__":
    main()
