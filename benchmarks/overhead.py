"""What logging, progress reporting and checkpointing cost per training step, at the
quickstart config.

    python benchmarks/overhead.py [--steps 200] [key=value overrides ...]

Builds the quickstart trainer (data from TINYGPT_DATA_DIR or ~/.cache/tinygpt), then times
(medians): a bare training step; a progress-bar update (every step); one logging event (loss
read-back, TensorBoard scalars, metrics.jsonl record, console line; every train.log_interval
steps); the logging done at an eval (the TensorBoard sample of train.eval_sample_tokens tokens,
hparams scalars, summary.json; every train.eval_interval steps); one checkpoint save (full state
+ best.pt; every eval). Each cost is divided by its interval and compared to the step time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

from gpt.apps.common import compose
from gpt.tracking import logger
from gpt.tracking.records import MetricsFile, RunSummary
from gpt.tracking.tensorboard import TensorBoardTracker
from gpt.training import Trainer, build_run


def median_time(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="tinygpt-overhead-"))
    t = Trainer(build_run(compose("config", [f"paths.output_dir={out}", *args.overrides], "python benchmarks/overhead.py")))
    run, ts = t.run, t.ts

    for _ in range(20):  # warm-up
        t.step()
    t_step = median_time(t.step, args.steps)

    tracker, metrics = TensorBoardTracker(out / "tb"), MetricsFile(out / "metrics.jsonl")
    loss, norm = t.step()
    logger.disabled = True  # time the formatting and I/O, not the terminal
    step = run.progress.step

    def log_event():
        value = loss.item()
        values = {"loss/train": value, "lr": 1e-3, "grad_norm": norm.item(), "perf/tokens_per_s": 1.0, "perf/ms_per_step": 1.0}
        logger.info(f"step {step}/{ts.max_iters}: loss {value:.4f}, lr {1e-3:.2e}, {1.0:.1f} ms/step, {1.0:,.0f} tok/s")
        tracker.scalars(step, values)
        metrics.write(kind="train", step=step, loss=value, lr=1e-3, ms_per_step=1.0)

    t_log = median_time(log_event, 50)
    summary = RunSummary(out / "summary.json", params=run.model.num_params())

    def eval_logging():
        if ts.eval_sample_tokens:
            tracker.text("samples", t.sample(ts.eval_sample_tokens), step)
        tracker.scalars(step, {"hparams/best_val_loss": 1.0, "hparams/final_val_loss": 1.0})
        summary.update(step=step, best_val_loss=1.0, final_val_loss=1.0)

    t_eval_log = median_time(eval_logging, 5)
    with open(os.devnull, "w") as sink:
        bar = tqdm(total=10**9, file=sink, dynamic_ncols=True)  # as on a terminal, minus the terminal
        t_bar = median_time(lambda: bar.update(1), 2000)
        bar.close()
    t_save = median_time(lambda: t.save(best=True), 5)
    tracker.close()
    metrics.close()

    logging_cost = t_bar + t_log / ts.log_interval + t_eval_log / ts.eval_interval
    ckpt_cost = t_save / ts.eval_interval
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; model {run.model.num_params():,} params, "
        f"batch {ts.batch_size} x block {run.model_config.block_size}"
    )
    rows = [
        ("training step", t_step, 1),
        ("progress-bar update", t_bar, 1),
        ("logging event", t_log, ts.log_interval),
        ("eval-time logging", t_eval_log, ts.eval_interval),
        ("checkpoint save", t_save, ts.eval_interval),
    ]
    for name, cost, every in rows:
        print(f"{name:<22}{cost * 1000:>10.3f} ms  every {every:>4} step(s) -> {cost / every * 1000:>7.3f} ms/step")
    print(f"logging + progress: {logging_cost * 1000:.3f} ms/step = {logging_cost / t_step * 100:.2f}% of a training step")
    print(f"checkpointing:      {ckpt_cost * 1000:.3f} ms/step = {ckpt_cost / t_step * 100:.2f}% of a training step")


if __name__ == "__main__":
    main()
