"""Per-process training state under DDP and FSDP2 (distributed=fsdp): bytes of parameters,
gradients and AdamW's two moments that each process holds, for the GPT-2 124M shape and the
SmolLM2-360M and 1.7B shapes, at 2 and 4 processes (and 8 for 1.7B).

Counted from the tensors themselves: the model is built, sharded by the same code as a training
run (gpt.training.parallel.shard), and each process sums the bytes of its own shards. Shapes a
CPU cannot hold several times over are built on the meta device (no memory, real shard shapes).
The GPT-2 124M shape at 2 processes is also trained for one real step on the CPU (batch 1 x 64
tokens), where what the tensors hold and each process's peak resident memory are measured too.

    python benchmarks/fsdp_memory.py                       # the table (starts torchrun per cell)
    torchrun --nproc_per_node=2 benchmarks/fsdp_memory.py --cell gpt2-124m fsdp real   # one cell
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import torch

from gpt.model import GPT, GPTConfig

MODERN = dict(norm="rmsnorm", mlp="swiglu", pos_encoding="rope", bias=False, vocab_size=49152, block_size=2048)
SHAPES = {
    "gpt2-124m": GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304),
    "smollm2-360m": GPTConfig(n_layer=32, n_head=15, n_kv_head=5, n_embd=960, mlp_hidden=2560, rope_theta=100000.0, **MODERN),
    "smollm2-1.7b": GPTConfig(n_layer=24, n_head=32, n_kv_head=32, n_embd=2048, mlp_hidden=8192, rope_theta=130000.0, **MODERN),
}
WORLDS = {"gpt2-124m": (2, 4), "smollm2-360m": (2, 4), "smollm2-1.7b": (2, 4, 8)}  # 8: a node of 8 GPUs
FP32 = 4


def cell(shape: str, mode: str, real: bool) -> None:
    """One cell's figures (under torchrun, in every process): rank 0 prints its own as a CELL line,
    with the highest peak RSS of all processes."""
    import torch.distributed as dist

    from gpt.runtime import devices
    from gpt.training import parallel

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    with torch.device("cpu" if real else "meta"):
        model = GPT(SHAPES[shape])
    rt = devices.Runtime(torch.device("cpu"), torch.float32, compile=False)
    if mode == "fsdp":
        model = parallel.shard(model, rt)
    params = sum(parallel.local(p).numel() for p in model.parameters())
    largest = 0
    if mode == "fsdp":
        # FSDP2's unsharded working set: the largest unit's weights gathered whole for its forward
        # and backward, and its gradients whole until reduce-scattered (a block, or the root's own
        # embedding, head and final norm)
        block = sum(p.numel() for p in model.transformer.h[0].parameters())
        root = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("transformer.h."))
        largest = max(block, root)
    out = {
        "shape": shape,
        "mode": mode,
        "world": dist.get_world_size(),
        "params_total": sum(p.numel() for p in model.parameters()),
        "state_bytes": params * FP32 * 4,  # weights + gradients + AdamW's exp_avg and exp_avg_sq, fp32
        "working_bytes": 2 * largest * FP32 if mode == "fsdp" else 0,
    }
    if real:
        from gpt.config import AdamWSettings
        from gpt.training.optim import build_optimizer

        if mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            step_model = DDP(model, gradient_as_bucket_view=True, broadcast_buffers=False)
        else:
            step_model = model
        opt = build_optimizer(model, AdamWSettings(), torch.device("cpu"))
        x = torch.randint(0, 50257, (1, 64))
        _, loss = step_model(x, x)
        loss.backward()
        opt.step()
        held = sum(parallel.local(p).numel() for p in model.parameters())
        held += sum(parallel.local(p.grad).numel() for p in model.parameters() if p.grad is not None)
        held += sum(parallel.local(v).numel() for s in opt.state.values() for v in s.values() if v.dim() > 0)
        out["held_bytes"] = held * FP32  # counted after a real step: what the tensors hold
        out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, out)
    rank = dist.get_rank()
    dist.destroy_process_group()
    if rank == 0:
        print("CELL " + json.dumps(gathered[0] | {"peak_rss_max_bytes": max(g.get("peak_rss_bytes", 0) for g in gathered)}))


def main() -> None:
    rows = []
    for shape in SHAPES:
        for mode in ("ddp", "fsdp"):
            for world in WORLDS[shape]:
                # a real step at 2 processes only: 4 gloo processes of the 124M model on this 2-core
                # machine stalled in DDP's start-up broadcast (2026-12-03, not investigated)
                real = shape == "gpt2-124m" and world == 2
                cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}"]
                cmd += [__file__, "--cell", shape, mode, "real" if real else "meta"]
                env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
                line = next((s for s in proc.stdout.splitlines() if s.startswith("CELL ")), None)
                if line is None:
                    sys.exit(f"{shape} {mode} x{world} failed:\n{proc.stderr[-3000:]}")
                rows.append(json.loads(line[5:]))
    gib = 2**30
    print(
        "| shape | params | processes | DDP state / process | FSDP2 state / process | FSDP2 unsharded working set | held after a real step (DDP / FSDP2) | peak RSS (DDP / FSDP2) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for shape in SHAPES:
        for world in WORLDS[shape]:
            ddp, fsdp = (
                next(r for r in rows if r["shape"] == shape and r["mode"] == m and r["world"] == world) for m in ("ddp", "fsdp")
            )
            held = (
                f"{ddp['held_bytes'] / gib:.2f} / {fsdp['held_bytes'] / gib:.2f} GiB" if "held_bytes" in ddp else "meta (not run)"
            )
            rss = (
                f"{ddp['peak_rss_max_bytes'] / gib:.2f} / {fsdp['peak_rss_max_bytes'] / gib:.2f} GiB"
                if "held_bytes" in ddp
                else "-"
            )
            print(
                f"| {shape} | {ddp['params_total'] / 1e6:,.0f}M | {world} | {ddp['state_bytes'] / gib:.2f} GiB | "
                f"{fsdp['state_bytes'] / gib:.2f} GiB | {fsdp['working_bytes'] / gib:.2f} GiB | {held} | {rss} |"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", nargs=3, metavar=("SHAPE", "MODE", "REAL"))
    args = parser.parse_args()
    if args.cell:
        cell(args.cell[0], args.cell[1], args.cell[2] == "real")
    else:
        main()
