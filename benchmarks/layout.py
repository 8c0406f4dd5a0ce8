"""The products of a decoding step with each weight layout (gpt/generation/layout.py), on the CPU.

    python benchmarks/layout.py [--rows 1 2 8 16 64 256] [--repeats 3]

Every linear weight of the GPT-2 124M shape (12 blocks of qkv 2304x768, projection 768x768, MLP
3072x768 and 768x3072, and the 50257x768 head), random fp32 values, each its own tensor so that
the 0.5 GB stream from memory as in a real step and nothing stays in cache: F.linear of `rows`
input rows through all of them (the head takes the last row only, as a decoding step does), with
nn.Linear's layout (output-major) and the same weights stored input-major, alternated A B A B
(--repeats pairs of timed blocks, each block as many passes as take ~1 s). Prints milliseconds per
pass, medians, and the ratio. Run it with nothing else running.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = [(2304, 768), (768, 768), (3072, 768), (768, 3072)]


def one_pass(blocks: list[list[torch.Tensor]], head: torch.Tensor, x: torch.Tensor, h: torch.Tensor) -> None:
    for block in blocks:
        for w in block:
            F.linear(h if w.shape[1] == h.shape[1] else x, w)
    F.linear(x[-1:], head)


def timed(fn, passes: int) -> float:
    t0 = time.perf_counter()
    for _ in range(passes):
        fn()
    return (time.perf_counter() - t0) / passes * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 2, 8, 16, 64, 256])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    blocks = [[torch.randn(shape) for shape in SHAPES] for _ in range(12)]
    head = torch.randn(50257, 768)
    relaid = [[w.t().contiguous().t() for w in block] for block in blocks]
    head_relaid = head.t().contiguous().t()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ms per pass over the 124M shape's weights")
    print(f"{'rows':>5} {'output-major':>13} {'input-major':>12} {'ratio':>6}")
    with torch.no_grad():
        for rows in args.rows:
            x, h = torch.randn(rows, 768), torch.randn(rows, 3072)
            runs = {
                "output-major": lambda x=x, h=h: one_pass(blocks, head, x, h),
                "input-major": lambda x=x, h=h: one_pass(relaid, head_relaid, x, h),
            }
            for fn in runs.values():  # warm-up, and how many passes take ~1 s
                fn()
            passes = max(2, round(1e3 / timed(runs["output-major"], 2)))
            times: dict[str, list[float]] = {name: [] for name in runs}
            for _ in range(args.repeats):
                for name, fn in runs.items():
                    times[name].append(timed(fn, passes))
            a, b = (statistics.median(times[name]) for name in runs)
            print(f"{rows:>5} {a:>13.1f} {b:>12.1f} {a / b:>5.2f}x", flush=True)


if __name__ == "__main__":
    main()
