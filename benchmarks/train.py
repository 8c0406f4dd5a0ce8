"""Training speed and memory for any config, and time to a target validation loss.

    python benchmarks/train.py                                   # quickstart: throughput, median of 3
    python benchmarks/train.py --steps 50 experiment=shakespeare_char device=cuda
    python benchmarks/train.py --target 1.89                     # wall time until an eval reaches val <= 1.89
    python benchmarks/train.py --target 1.89 --repeats 3 optim.lr=3e-3

Throughput: the run is built from the composed config (same overrides as train.py), warmed up
for 10 steps, then --steps optimizer steps (`Trainer.step`: forward, backward, clip, update; the
loop's logging and evals excluded) are timed, --repeats times; the table shows the median. Peak memory is
the process's peak RSS on CPU, or torch's peak allocation on CUDA.

Time to target: the whole `python train.py` path in-process (data, model, training, evals),
clocked from before the trainer is built until the first eval whose val loss <= --target.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time

import torch

from gpt.apps.common import compose, guard
from gpt.tracking import logger
from gpt.training import Trainer, build_run, train


class TargetReached(Exception):
    pass


def settings(overrides: list[str]):
    """train.py's settings for these overrides (its checks and one-line errors), in a scratch run dir."""
    out = tempfile.mkdtemp(prefix="tinygpt-bench-")
    return compose("config", [f"paths.output_dir={out}", "train.sample_tokens=0", *overrides], "python benchmarks/train.py")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def throughput(overrides: list[str], steps: int) -> dict:
    trainer = Trainer(build_run(settings(overrides)))
    run, dev = trainer.run, trainer.run.rt.device
    for _ in range(10):
        trainer.step()
    sync(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        loss, _ = trainer.step()
    loss.item()
    sync(dev)
    dt = (time.perf_counter() - t0) / steps
    peak = (
        torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    tok_s = run.tokens_per_step / dt
    mfu = run.model.flops_per_token() * tok_s / trainer.peak_flops if trainer.peak_flops else None
    return {
        "ms_per_step": dt * 1000,
        "tokens_per_s": tok_s,
        "peak_mb": peak / 2**20,
        "mfu": mfu,
        "model": run.model.num_params(),
        "tokens_per_step": run.tokens_per_step,
        "device": str(dev),
    }


def time_to_target(overrides: list[str], target: float) -> tuple[float | None, int | None, float]:
    t0 = time.time()
    reached, best = {}, [float("inf")]

    def on_eval(step: int, losses: dict) -> None:
        best[0] = min(best[0], losses["val"])
        if losses["val"] <= target:
            reached.update(seconds=time.time() - t0, step=step, val=losses["val"])
            raise TargetReached

    try:
        train(settings(overrides), on_eval=on_eval)
    except TargetReached:
        pass
    return reached.get("seconds"), reached.get("step"), reached.get("val", best[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--target", type=float, default=None, help="measure the time to this val loss instead")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    guard(lambda: settings(args.overrides))  # train.py's one-line errors for the overrides (model=gpt5, optim.lr=fast)
    guard(lambda: run(args))


def run(args: argparse.Namespace) -> None:
    logger.disabled = True  # the table is the output
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads; overrides: {' '.join(args.overrides) or '(quickstart)'}"
    )
    if args.target is not None:
        rows = [time_to_target(args.overrides, args.target) for _ in range(args.repeats)]
        print(f"{'run':>4} {'seconds to val<=' + str(args.target):>22} {'at step':>8} {'val':>8}")
        for i, (sec, step, val) in enumerate(rows, 1):
            print(f"{i:>4} {sec if sec is not None else float('nan'):>22.1f} {step if step is not None else '-':>8} {val:>8.4f}")
        done = [r[0] for r in rows if r[0] is not None]
        if done:
            print(f"median: {statistics.median(done):.1f} s ({len(done)}/{len(rows)} runs reached the target)")
        return
    rows = [throughput(args.overrides, args.steps) for _ in range(args.repeats)]
    r0 = rows[0]
    print(
        f"model {r0['model']:,} parameters on {r0['device']}, {r0['tokens_per_step']:,} tokens/step, {args.steps} timed steps x {args.repeats}"
    )
    print(f"{'run':>4} {'ms/step':>9} {'tokens/s':>10} {'peak MB':>8} {'MFU':>6}")
    for i, r in enumerate(rows, 1):
        mfu = f"{r['mfu'] * 100:.1f}%" if r["mfu"] else "-"
        print(f"{i:>4} {r['ms_per_step']:>9.2f} {r['tokens_per_s']:>10,.0f} {r['peak_mb']:>8.0f} {mfu:>6}")
    med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
    print(f"median: {med('ms_per_step'):.2f} ms/step, {med('tokens_per_s'):,.0f} tokens/s, peak {med('peak_mb'):.0f} MB")


if __name__ == "__main__":
    main()
