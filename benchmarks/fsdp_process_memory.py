"""Peak resident memory of every process of real `torchrun train.py` runs, DDP against FSDP2: a
new run (rank 0 builds the model, the other ranks only its shapes), and a resume of the FSDP2
run's sharded checkpoint (every rank builds shapes and reads its own shards). Each run trains 2
steps and saves once (a step checkpoint and best.pt), so the save is inside the peak too.

The model is GPT-2 124M's blocks (12 layers, 768 wide) over Tiny Shakespeare's characters, so
the embedding is small: 85M parameters, 1.36 GB of weights, gradients and AdamW moments in fp32.
Each worker's VmHWM (/proc/<pid>/status: the kernel's high-water mark of its resident memory) is
read every 50 ms while it runs; the last reading before it exits is its peak. Every run is made
twice: with glibc's allocator as it comes, which keeps much of what is freed (FSDP2 frees and
reallocates every block's gathered weights and gradients each step), and with
MALLOC_MMAP_THRESHOLD_=65536, which hands large blocks back to the system when they are freed.

    python benchmarks/fsdp_process_memory.py [--processes 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODEL = ["model=gpt-micro", "model.n_layer=12", "model.n_head=12", "model.n_embd=768", "model.block_size=256"]
RUN = [
    "data=shakespeare_char", "optim=adamw", "dtype=float32", "device=cpu", "threads=1", "train.batch_size=2",
    "train.eval_interval=2", "train.eval_iters=1", "train.sample_tokens=0", "train.eval_sample_tokens=0",
]  # fmt: skip


def _workers(launcher: int) -> dict[int, int]:
    """{pid: rank} of torchrun's workers (its children's children run train.py)."""
    found = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            ppid = int(next(line for line in status.read_text().splitlines() if line.startswith("PPid:")).split()[1])
            pid = int(status.parent.name)
            if ppid == launcher or _parent(ppid) == launcher:
                env = (status.parent / "environ").read_bytes().split(b"\0")
                rank = next((int(e[5:]) for e in env if e.startswith(b"RANK=")), None)
                if rank is not None:
                    found[pid] = rank
        except (OSError, StopIteration, ValueError):
            continue
    return found


def _parent(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return int(next(line for line in text.splitlines() if line.startswith("PPid:")).split()[1])


def _hwm(pid: int) -> int | None:
    try:
        line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) * 1024


def peak_rss(n: int, args: list[str], extra_env: dict[str, str]) -> list[int]:
    """Each rank's peak resident bytes over one `torchrun --nproc_per_node=n train.py args` run."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra_env}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", str(REPO / "train.py")]
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen([*launch, *args], env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        peaks: dict[int, int] = {}
        ranks: dict[int, int] = {}
        while proc.poll() is None:
            ranks.update(_workers(proc.pid))
            for pid, rank in ranks.items():
                hwm = _hwm(pid)
                if hwm is not None:
                    peaks[rank] = max(peaks.get(rank, 0), hwm)
            time.sleep(0.05)
        if proc.returncode != 0:
            log.seek(0)
            raise SystemExit(log.read()[-3000:])
    return [peaks.get(rank, 0) for rank in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--out", default=None, help="where the runs go (default: a temporary folder, removed)")
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(a.out or tmp)
        gib = 1024**3
        rows = [
            ("DDP, new run", [*MODEL, *RUN, "train.max_iters=2"], "ddp"),
            ("FSDP2, new run", [*MODEL, *RUN, "train.max_iters=2", "distributed=fsdp"], "fsdp"),
            ("FSDP2, resumed", [*MODEL, *RUN, "train.max_iters=4", "distributed=fsdp"], "fsdp"),
        ]
        allocators = {"as it comes": {}, "MALLOC_MMAP_THRESHOLD_=65536": {"MALLOC_MMAP_THRESHOLD_": "65536"}}
        ranks = " | ".join(f"rank {r} peak RSS" for r in range(a.processes))
        print(f"| run ({a.processes} processes) | glibc malloc | {ranks} |")
        print("| --- | --- | " + " | ".join("---" for _ in range(a.processes)) + " |")
        for i, (allocator, env) in enumerate(allocators.items()):
            for name, args, folder in rows:
                peaks = peak_rss(a.processes, [*args, f"hydra.run.dir={out / f'{folder}-{i}'}"], env)
                print(f"| {name} | {allocator} | " + " | ".join(f"{p / gib:.2f} GiB" for p in peaks) + " |", flush=True)


if __name__ == "__main__":
    main()
