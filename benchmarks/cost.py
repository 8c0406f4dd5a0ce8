"""How the cost of training and generating grows with the work, on this machine.

    python benchmarks/cost.py [--out docs/img/cost.png] [--steps 5]

Three series, each point the median of --steps timed steps after two warm-up steps, fp32 (Muon's
Newton-Schulz as `optim.ns_dtype=auto` picks: bf16 on CPUs with AVX-512 BF16 or AMX), the
default threads, the quickstart's block (RMSNorm, RoPE, QK-norm, no biases) and optimizer (Muon
+ AdamW) with its byte vocabulary (257 tokens), on random tokens (speed does not depend on them):

  1. a training step (forward, backward, optimizer) as the model grows, context 64, batch 12:
     tokens/s and achieved FLOP/s (the model's 6N + attention FLOPs per token, as the trainer
     counts them) against the cores' fp32 matmul rate, measured here on a 1024^3 matmul;
  2. the same at the quickstart's size (4L/128D) as the context grows from 64 to 1024, with the
     batch shrunk to keep 4,096 tokens a step;
  3. generation at the baby GPT shape (6L/384D) with a 1024-token context, batch 1: the time of
     the step that reads the L-th token and predicts the next, with the KV cache (holding the
     first L - 1: one position of work) and without it (the plain forward over all L).

Prints the tables, and draws the three panels to --out.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from overhead import median_time  # benchmarks/overhead.py: this folder is the script's first path

from gpt.config import GPTConfig
from gpt.config.run import MuonSettings
from gpt.model import GPT
from gpt.model.cache import KVCache
from gpt.training.optim import build_optimizer

BLOCK = dict(norm="rmsnorm", pos_encoding="rope", qk_norm=True, bias=False, dropout=0.0, vocab_size=257)
SIZES = [(4, 128, 4), (4, 256, 4), (6, 384, 6), (8, 512, 8), (12, 768, 12)]  # (layers, width, heads)
CONTEXTS = [64, 128, 256, 512, 1024]
GEN_LENGTHS = [16, 64, 256, 512, 1023]


def median_seconds(fn, steps: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    return median_time(fn, steps)


def matmul_peak() -> float:
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    return 2 * 1024**3 / median_seconds(lambda: a @ b, 20)


def train_step_time(cfg: GPTConfig, batch: int, steps: int) -> tuple[float, GPT]:
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = build_optimizer(model, MuonSettings(), torch.device("cpu"))
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size))

    def step():
        _, loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return median_seconds(step, steps), model


@torch.inference_mode()
def token_time(model: GPT, length: int, cache: bool, steps: int) -> float:
    ids = torch.randint(0, model.config.vocab_size, (1, length))
    if not cache:
        return median_seconds(lambda: model(ids, last_only=True), steps)

    def one_token():  # a cache holding the first length - 1 tokens, then the last as the new position
        kv = KVCache(model.config.n_layer, model.config.block_size, torch.zeros(1, dtype=torch.long))
        model(ids[:, :-1], cache=kv, last_only=True)
        t0 = time.perf_counter()
        model(ids[:, -1:], cache=kv, last_only=True)
        return time.perf_counter() - t0

    for _ in range(2):
        one_token()
    return statistics.median(one_token() for _ in range(steps))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default=None, help="where to draw the three panels (png)")
    args = ap.parse_args()
    peak = matmul_peak()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; fp32 matmul 1024^3: {peak / 1e9:.0f} GFLOP/s")

    print("\n1. training step, context 64, batch 12 (768 tokens)")
    print(f"{'shape':<12} {'params':>8} {'ms/step':>9} {'tokens/s':>9} {'GFLOP/s':>8} {'of matmul rate':>15}")
    sizes = []
    for n_layer, n_embd, n_head in SIZES:
        cfg = GPTConfig(n_layer=n_layer, n_embd=n_embd, n_head=n_head, block_size=64, **BLOCK)
        seconds, model = train_step_time(cfg, 12, args.steps)
        flops = model.flops_per_token() * 768 / seconds
        sizes.append((model.num_params(), 768 / seconds, flops))
        print(
            f"{n_layer}L/{n_embd}D{'':<4} {model.num_params() / 1e6:>7.1f}M {seconds * 1e3:>9.1f} {768 / seconds:>9,.0f} "
            f"{flops / 1e9:>8.1f} {flops / peak:>14.0%}",
            flush=True,
        )

    print("\n2. training step, 4L/128D, 4,096 tokens a step")
    print(f"{'context':>8} {'batch':>6} {'ms/step':>9} {'tokens/s':>9} {'GFLOP/s':>8}")
    contexts = []
    for T in CONTEXTS:
        cfg = GPTConfig(n_layer=4, n_embd=128, n_head=4, block_size=T, **BLOCK)
        seconds, model = train_step_time(cfg, 4096 // T, args.steps)
        flops = model.flops_per_token() * 4096 / seconds
        contexts.append((T, 4096 / seconds))
        print(f"{T:>8} {4096 // T:>6} {seconds * 1e3:>9.1f} {4096 / seconds:>9,.0f} {flops / 1e9:>8.1f}", flush=True)

    print("\n3. one new token after L tokens, 6L/384D, context 1024, batch 1")
    print(f"{'L':>6} {'cache ms':>9} {'no cache ms':>12}")
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=6, n_embd=384, n_head=6, block_size=1024, **BLOCK)).eval()
    gen = []
    for L in GEN_LENGTHS:
        with_cache, without = token_time(model, L, True, args.steps), token_time(model, L, False, args.steps)
        gen.append((L, with_cache, without))
        print(f"{L:>6} {with_cache * 1e3:>9.2f} {without * 1e3:>12.2f}", flush=True)

    if args.out:
        draw(args.out, peak, sizes, contexts, gen)
        print(f"\nwrote {args.out}")


def draw(out: str, peak: float, sizes, contexts, gen) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    ax[0].plot([p / 1e6 for p, _, _ in sizes], [f / 1e9 for _, _, f in sizes], "o-", label="training step")
    ax[0].axhline(peak / 1e9, color="gray", ls="--", label="fp32 matmul 1024^3")
    ax[0].set(xscale="log", xlabel="parameters (millions)", ylabel="GFLOP/s achieved", title="Training: size (context 64)")
    for p, tps, f in sizes:
        ax[0].annotate(
            f"{tps:,.0f} tok/s", (p / 1e6, f / 1e9), textcoords="offset points", xytext=(0, -12), fontsize=7, ha="center"
        )
    ax[0].set_ylim(bottom=0)
    ax[0].legend(loc="lower right")
    ax[1].plot([t for t, _ in contexts], [r for _, r in contexts], "o-")
    ax[1].set_ylim(bottom=0)
    ax[1].set(xscale="log", xlabel="context (tokens)", ylabel="tokens/s", title="Training: context (4L/128D, 4,096 tokens/step)")
    ax[2].plot([L for L, _, _ in gen], [c * 1e3 for _, c, _ in gen], "o-", label="KV cache")
    ax[2].plot([L for L, _, _ in gen], [n * 1e3 for _, _, n in gen], "o-", label="no cache")
    ax[2].set(
        xscale="log",
        yscale="log",
        xlabel="tokens before the new one",
        ylabel="ms per new token",
        title="Generation (6L/384D, batch 1)",
    )
    ax[2].legend()
    fig.suptitle(f"tinygpt on this CPU ({torch.get_num_threads()} threads, fp32)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
