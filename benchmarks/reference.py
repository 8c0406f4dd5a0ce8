"""tinygpt against a plain-PyTorch reference, measured side by side on this machine, now.

Absolute times drift between machines and between hours on one machine; a claim of speed is a
ratio measured in one run. Two comparisons:

    python benchmarks/reference.py step [--steps 200] [--repeats 3] [--optim adamw]
        One process: the reference step and tinygpt's step alternated A B A B (--repeats pairs,
        --steps timed steps each after 10 warm-up steps), same model shape and block (GPT-2's:
        model=gpt-micro), fp32 both (dtype=float32), same data, same threads. Prints each block,
        the medians, the ratio, and the user / system CPU seconds per step of each (getrusage:
        all threads of the process).

    python benchmarks/reference.py e2e [--repeats 3] [--target 1.89] [tinygpt overrides ...]
        Whole processes alternated: the reference recipe (`reference.py run`) then `python
        train.py` (the quickstart, model=gpt-micro-modern, unless overrides say otherwise), --repeats times; each is
        timed from its start until its first eval with val <= --target (then stopped), with the
        CPU time its process used (user / system).

    python benchmarks/reference.py e2e --to-end [--repeats 3] [tinygpt overrides ...]
        The same pairs, each run to its end (2000 steps, every eval, tinygpt's checkpoints
        and logs): wall time of the whole process, at equal steps.

    python benchmarks/reference.py run [--iters 2000] [--target 1.89]
        The reference recipe alone (what e2e starts): nanoGPT's CPU recipe for Tiny Shakespeare
        chars (4 layers, 4 heads, 128 dims, block 64, batch 12, AdamW lr 1e-3 -> 1e-4 cosine,
        warm-up 100, beta2 0.99, dropout 0; every 250 iterations an eval of 20 batches of each
        split and a checkpoint when val improved; a loss line every iteration).

The reference is written here, from the textbook: nn.Linear q/k/v in one matrix, torch's
scaled_dot_product_attention, GELU MLP, pre-LayerNorm blocks, a tied LM head, torch.optim.AdamW
with its defaults (foreach), batches drawn as index windows from the same prepared tokens that
tinygpt reads (data=shakespeare_char, prepared on first use). No tinygpt code runs in its step.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
SHAPE = dict(n_layer=4, n_head=4, n_embd=128, block_size=64)
BATCH = 12


# --- the reference: a textbook GPT and its loop ----------------------------------------------


class Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).contiguous().view(b, t, d))


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(d), Attention(d, heads), nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ReferenceGPT(nn.Module):
    def __init__(self, vocab: int, n_layer: int, n_head: int, n_embd: int, block_size: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, n_embd), nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab, bias=False)
        self.head.weight = self.tok.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1)))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def reference_optimizer(model: nn.Module, lr: float) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99))


def batch(tokens: np.ndarray, rng: np.random.Generator, block: int = SHAPE["block_size"]):
    starts = rng.integers(0, len(tokens) - block - 1, BATCH)
    x = torch.stack([torch.from_numpy(tokens[s : s + block].astype(np.int64)) for s in starts])
    y = torch.stack([torch.from_numpy(tokens[s + 1 : s + 1 + block].astype(np.int64)) for s in starts])
    return x, y


def reference_step(model, optimizer, tokens, rng) -> torch.Tensor:
    x, y = batch(tokens, rng)
    loss = model(x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss


def prepared_tokens():
    """Tiny Shakespeare chars as tinygpt prepares them (train, val, vocab size)."""
    from gpt.apps.common import compose
    from gpt.data import load_data

    # nanoGPT's recipe is characters: the 65-character vocabulary, whatever the quickstart's default
    cfg = compose("config", ["data=shakespeare_char"], "python benchmarks/reference.py")
    data = load_data(cfg.data, cfg.paths.data_root(), log=lambda *a: None)
    return np.concatenate(data.train), np.concatenate(data.val), data.tokenizer.vocab_size


# --- step: A B A B in one process ----------------------------------------------------------------


def _cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def _timed(step, steps: int) -> dict:
    for _ in range(10):
        step()
    u0, s0 = _cpu()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    float(loss.detach())
    wall = time.perf_counter() - t0
    u1, s1 = _cpu()
    return {"ms": wall / steps * 1000, "user_ms": (u1 - u0) / steps * 1000, "sys_ms": (s1 - s0) / steps * 1000}


def compare_steps(args) -> None:
    from gpt.apps.common import compose
    from gpt.tracking import logger
    from gpt.training import Trainer, build_run

    logger.disabled = True
    # model=gpt-micro: the reference's own block (GPT-2's), and fp32 as the reference computes
    # (dtype=auto would train in bf16 on a CPU with native bf16), so a step compares like with like
    overrides = [
        "model=gpt-micro",
        "dtype=float32",
        f"optim={args.optim}",
        "train.sample_tokens=0",
        f"paths.output_dir={REPO / 'outputs' / 'bench-reference'}",
    ]
    trainer = Trainer(build_run(compose("config", overrides, "python benchmarks/reference.py")))
    threads = torch.get_num_threads()  # what tinygpt chose; the reference runs with the same
    train_tokens, _, vocab = prepared_tokens()
    torch.manual_seed(0)
    model = ReferenceGPT(vocab, **SHAPE)
    optimizer = reference_optimizer(model, 1e-3)
    rng = np.random.default_rng(0)
    sides = {"reference": lambda: reference_step(model, optimizer, train_tokens, rng), "tinygpt": lambda: trainer.step()[0]}
    print(
        f"torch {torch.__version__}, {threads} threads, {SHAPE['n_layer']}L/{SHAPE['n_head']}H/{SHAPE['n_embd']}D block "
        f"{SHAPE['block_size']} batch {BATCH}; tinygpt optim={args.optim}; {args.steps} steps per block"
    )
    rows = {name: [] for name in sides}
    for i in range(args.repeats):
        for name, step in sides.items():
            r = _timed(step, args.steps)  # (not torch.set_num_threads: calling it at all costs, see gpt/runtime/threads.py)
            rows[name].append(r)
            print(
                f"  pair {i + 1} {name:>9}: {r['ms']:6.1f} ms/step (user {r['user_ms']:5.1f}, system {r['sys_ms']:5.1f} ms CPU)"
            )
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in rows.items()}
    for name, m in med.items():
        print(f"median {name:>9}: {m['ms']:6.1f} ms/step, CPU user {m['user_ms']:.1f} + system {m['sys_ms']:.1f} ms per step")
    print(f"ratio: tinygpt is {med['reference']['ms'] / med['tinygpt']['ms']:.2f}x the reference's speed per step")


# --- run: the reference recipe, and e2e: whole processes alternated -------------------------------


def reference_run(args) -> None:
    """nanoGPT's CPU recipe as its train.py runs it: at every eval the train and val losses (20
    batches each, `estimate_loss`), a checkpoint (model and optimizer) whenever val improves after
    step 0 (the recipe's always_save_checkpoint=False), and a line with the loss read back at every
    step (log_interval=1)."""
    torch.manual_seed(1337)
    train_tokens, val_tokens, vocab = prepared_tokens()
    model = ReferenceGPT(vocab, **SHAPE)
    optimizer = reference_optimizer(model, 1e-3)
    rng = np.random.default_rng(1337)
    lr, min_lr, warmup = 1e-3, 1e-4, 100
    out_dir = Path(tempfile.mkdtemp(prefix="reference-run-"))
    best = math.inf

    @torch.no_grad()
    def estimate_loss() -> dict[str, float]:
        model.eval()
        out = {}
        for split, tokens, seed in (("train", train_tokens, 1), ("val", val_tokens, 0)):
            eval_rng = np.random.default_rng(seed)  # val's draw as before train was evaluated too
            out[split] = sum(float(model(*batch(tokens, eval_rng))) for _ in range(20)) / 20
        model.train()
        return out

    try:
        for it in range(args.iters + 1):
            if it % 250 == 0 or it == args.iters:
                losses = estimate_loss()
                print(f"eval step {it}: train {losses['train']:.4f}, val {losses['val']:.4f}", flush=True)
                if losses["val"] < best:
                    best = losses["val"]
                    if it > 0:
                        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": it}
                        torch.save(state, out_dir / "ckpt.pt")
                if losses["val"] <= args.target or it == args.iters:
                    return
            ratio = min(1.0, (it - warmup) / (args.iters - warmup)) if it >= warmup else 0.0
            now = lr * (it + 1) / warmup if it < warmup else min_lr + 0.5 * (1 + math.cos(math.pi * ratio)) * (lr - min_lr)
            for group in optimizer.param_groups:
                group["lr"] = now
            t0 = time.perf_counter()
            loss = reference_step(model, optimizer, train_tokens, rng)
            print(f"iter {it}: loss {loss.item():.4f}, time {(time.perf_counter() - t0) * 1000:.2f}ms")
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def _to_target(cmd: list[str], target: float | None) -> dict:
    """Start `cmd`, read its output until an eval line shows val <= target; then stop it (target
    None: until it ends, with its last eval). Wall seconds from start, and the CPU time of the
    process (children rusage)."""
    import re
    import signal

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    reached = None
    for line in proc.stdout:
        m = re.search(r"eval step (\d+):.*val (\d+\.\d+)", line)
        if m and target is None:
            reached = {"step": int(m.group(1)), "val": float(m.group(2))}
        elif m and float(m.group(2)) <= target:
            reached = {"seconds": time.perf_counter() - t0, "step": int(m.group(1)), "val": float(m.group(2))}
            proc.send_signal(signal.SIGTERM)
            break
    proc.stdout.read()
    proc.wait()
    if target is None and reached:
        reached["seconds"] = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reached = reached or {"seconds": math.nan, "step": None, "val": math.nan}
    return {**reached, "user": after.ru_utime - before.ru_utime, "sys": after.ru_stime - before.ru_stime}


def compare_e2e(args) -> None:
    sides = {
        "reference": [
            sys.executable,
            str(REPO / "benchmarks" / "reference.py"),
            "run",
            f"--target={-1 if args.to_end else args.target}",
            f"--iters={args.iters}",
        ],
        "tinygpt": [sys.executable, str(REPO / "train.py"), "train.sample_tokens=0", *args.overrides],
    }
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    rows = {name: [] for name in sides}
    target = None if args.to_end else args.target
    if args.to_end:
        print(f"wall time of whole runs (the reference's {args.iters} steps, tinygpt's train.max_iters; every eval)")
    else:
        print(f"wall time from process start to the first eval with val <= {args.target} (then stopped)")
    for i in range(args.repeats):
        for name, cmd in sides.items():
            cmd = (
                [*cmd, f"hydra.run.dir={REPO / 'outputs' / 'bench-e2e' / f'{name}-{i}-{time.time_ns()}'}"]
                if name == "tinygpt"
                else cmd
            )
            r = _to_target(cmd, target)
            rows[name].append(r)
            print(
                f"  pair {i + 1} {name:>9}: {r['seconds']:6.1f} s (step {r['step']}, val {r['val']:.4f}; "
                f"CPU user {r['user']:.1f} s, system {r['sys']:.1f} s)"
            )
    med = {name: statistics.median(r["seconds"] for r in rs) for name, rs in rows.items()}
    for name, rs in rows.items():
        sys_share = statistics.median(r["sys"] / max(r["user"] + r["sys"], 1e-9) for r in rs)
        print(f"median {name:>9}: {med[name]:.1f} s ({sys_share * 100:.0f}% of its CPU time in the kernel)")
    what = "runs to its end" if args.to_end else f"reaches val <= {args.target}"
    print(f"ratio: tinygpt {what} {med['reference'] / med['tinygpt']:.2f}x as fast as the reference")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("step", "e2e", "run"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--optim", default="adamw")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--target", type=float, default=1.89)
    ap.add_argument("--to-end", action="store_true", help="e2e: whole runs, not stopped at the target")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_intermixed_args()  # overrides before or after the options
    {"step": compare_steps, "e2e": compare_e2e, "run": reference_run}[args.mode](args)


if __name__ == "__main__":
    main()
