"""What checkpointing and logging cost per training step, at the quickstart config.

    python benchmarks/overhead.py [--steps 200] [key=value overrides ...]

Builds the quickstart trainer (data from TINYGPT_DATA_DIR or ~/.cache/tinygpt), then times:
a bare training step; one logging event (the loss read-back, TensorBoard scalars, the
metrics.jsonl record and the console line); one checkpoint save (full state + best.pt). The
per-step overhead is each cost divided by its interval (train.log_interval, train.eval_interval).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from gpt.tracking import MetricsFile, TensorBoardTracker, logger
from gpt.trainer import Trainer, train_step

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


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
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = OmegaConf.to_container(compose("config", [f"paths.output_dir={out}", *args.overrides]), resolve=True)
    t = Trainer(cfg)
    ts = t.ts

    def step():
        loss, norm = train_step(t.step_model, t.batches, t.optimizer, t.scaler, t.rt, ts.grad_accum_steps, ts.grad_clip)
        t._apply_or_skip(loss, norm, t.step)
        return loss, norm

    for _ in range(20):  # warm-up
        step()
    t_step = median_time(step, args.steps)

    tracker, metrics = TensorBoardTracker(out / "tb"), MetricsFile(out / "metrics.jsonl")
    loss, norm = step()
    logger.disabled = True  # time the formatting and I/O, not the terminal

    def log_event():
        value = loss.item()
        values = {"loss/train": value, "lr": 1e-3, "grad_norm": norm.item(), "perf/tokens_per_s": 1.0, "perf/ms_per_step": 1.0}
        logger.info(f"step {t.step}/{ts.max_iters}: loss {value:.4f}, lr {1e-3:.2e}, {1.0:.1f} ms/step, {1.0:,.0f} tok/s")
        tracker.scalars(t.step, values)
        metrics.write(kind="train", step=t.step, loss=value, lr=1e-3, ms_per_step=1.0)

    t_log = median_time(log_event, 50)
    t_save = median_time(lambda: t.save(best=True), 5)
    tracker.close()
    metrics.close()

    per_step = t_log / ts.log_interval + t_save / ts.eval_interval
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; model {t.model.num_params():,} params, "
          f"batch {ts.batch_size} x block {t.mcfg.block_size}")
    print(f"{'training step':<28}{t_step * 1000:>10.2f} ms")
    print(f"{'one logging event':<28}{t_log * 1000:>10.2f} ms   every {ts.log_interval} steps -> {t_log / ts.log_interval * 1000:.3f} ms/step")
    print(f"{'one checkpoint save':<28}{t_save * 1000:>10.2f} ms   every {ts.eval_interval} steps -> {t_save / ts.eval_interval * 1000:.3f} ms/step")
    print(f"overhead: {per_step * 1000:.3f} ms/step = {per_step / t_step * 100:.2f}% of a training step")


if __name__ == "__main__":
    main()
