"""The GPU path, measured: GPT-2 124M shape throughput/MFU, and the baby GPT's time to val 1.47.

    python benchmarks/gpu.py                       # both parts (needs a CUDA GPU)
    python benchmarks/gpu.py --part throughput --peak-flops 790e12
    python benchmarks/gpu.py --part baby --target 1.47
    python benchmarks/gpu.py --optim muon          # Muon (bf16 Newton-Schulz) for the matrices

throughput: GPT-2 124M shape (vocab 50304, block 1024), bf16 autocast, torch.compile, flash
attention (SDPA), fused AdamW; finds the largest micro-batch that fits (halving from --max-batch
on out-of-memory), then times --steps steps, median of --repeats. Synthetic tokens: speed does
not depend on the data. MFU uses 6N + 12LCT FLOPs per token against --peak-flops (default: the
table in gpt/runtime/devices.py).
baby: `experiment=shakespeare_char` (6L/6H/384D, block 256, batch 64) with evals every 100
steps, clocked (startup, compile and evals included) until val <= --target; median of --repeats.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpt.config import OPTIMIZERS  # noqa: E402
from gpt.model import GPT, GPTConfig  # noqa: E402
from gpt.runtime import devices  # noqa: E402
from gpt.training.optim import build_optimizer  # noqa: E402
from train import time_to_target  # noqa: E402


def _training_step(cfg: GPTConfig, rt, optim: str, batch: int):
    """The model and a function that takes one compiled bf16 training step on a fixed batch."""
    model = GPT(cfg).to(rt.device)
    opt = build_optimizer(model, OPTIMIZERS[optim](lr=6e-4, min_lr=6e-5, weight_decay=0.1, beta2=0.95), rt.device)
    step_model = torch.compile(model)
    x = torch.randint(0, 50257, (batch, 1024), device=rt.device)
    y = torch.randint(0, 50257, (batch, 1024), device=rt.device)

    def step():
        with rt.autocast():
            _, loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, step


def gpt2_throughput(max_batch: int, steps: int, repeats: int, peak: float | None, optim: str) -> None:
    rt = devices.setup("cuda", "auto", True)
    print(rt.describe())
    cfg = GPTConfig(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768, activation="gelu_tanh")
    peak = peak or devices.peak_flops(rt.device)
    batch = max_batch
    while batch >= 1:
        try:
            torch.cuda.empty_cache()
            model, step = _training_step(cfg, rt, optim, batch)
            for _ in range(5):  # compile and warm up
                step()
            torch.cuda.synchronize()
            break
        except torch.OutOfMemoryError:
            model = step = None  # free the failed attempt before the next
            batch //= 2
            print(f"out of memory; micro-batch {batch}")
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / steps)
    dt = statistics.median(times)
    tok_s = batch * 1024 / dt
    mfu = model.flops_per_token(1024) * tok_s / peak if peak else float("nan")
    print(
        f"GPT-2 124M ({optim}), micro-batch {batch} x 1024: {dt * 1000:.1f} ms/step, {tok_s:,.0f} tokens/s, MFU {mfu * 100:.1f}% "
        f"of {peak / 1e12:.0f} TFLOP/s, peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["throughput", "baby", "both"], default="both")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--peak-flops", type=float, default=None)
    ap.add_argument("--target", type=float, default=1.47)
    ap.add_argument("--optim", choices=["adamw", "muon"], default="adamw")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: no CUDA GPU here; this benchmark measures the GPU path")
    if args.part in ("throughput", "both"):
        gpt2_throughput(args.max_batch, args.steps, args.repeats, args.peak_flops, args.optim)
    if args.part in ("baby", "both"):
        overrides = [
            "experiment=shakespeare_char",
            "train.eval_interval=100",
            "train.eval_iters=50",
            "device=cuda",
            f"optim={args.optim}",
        ]
        reached = []
        for i in range(args.repeats):
            sec, step, val = time_to_target(overrides, args.target)
            print(
                f"baby GPT ({args.optim}) run {i + 1}: val {val:.4f} "
                + (f"<= {args.target} at step {step} after {sec:.1f} s" if sec else f"never <= {args.target}")
            )
            if sec:
                reached.append(sec)
        if reached:
            print(
                f"baby GPT median: {statistics.median(reached):.1f} s to val <= {args.target} ({len(reached)}/{args.repeats} runs)"
            )


if __name__ == "__main__":
    main()
