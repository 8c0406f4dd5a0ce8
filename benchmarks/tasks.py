"""Zero-shot task scoring speed: what `tinygpt eval task=...` and `train.eval_tasks` cost.

    python benchmarks/tasks.py                                   # gpt2 and the quickstart shape
    python benchmarks/tasks.py --shapes gpt2 --items 40 --batch-sizes 16

HellaSwag-shaped items (a context and 4 endings) of random tokens, random weights (speed does
not depend on either), fp32 on CPU: each item is 4 (context, ending) requests through
gpt.evals.scoring.score. Lengths default to HellaSwag's in GPT-2 tokens (a context of ~60, endings of
~25: roughly, the validation split's mean) and, for the character-level quickstart model, ~4
characters per token (240 and 100). Prints items/s per batch size, the median of --repeats.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from gpt.apps.common import compose
from gpt.evals.scoring import score
from gpt.model import registry

# shape -> (model preset, vocabulary, context tokens, ending tokens)
SHAPES = {"gpt2": ("gpt2", 50257, 60, 25), "quickstart": ("gpt-micro", 65, 240, 100)}


def items_per_s(model, vocab: int, context: int, ending: int, items: int, batch_size: int, repeats: int) -> float:
    g = torch.Generator().manual_seed(0)
    requests = []
    for _ in range(items):
        ctx = torch.randint(vocab, (context,), generator=g).tolist()
        requests += [(ctx, torch.randint(vocab, (ending,), generator=g).tolist()) for _ in range(4)]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        score(model, requests, torch.device("cpu"), batch_size)
        times.append(time.perf_counter() - t0)
    return items / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--items", type=int, default=40)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print("| shape | parameters | tokens per item | batch size | items/s | 10,042 items (HellaSwag val) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for shape in args.shapes:
        preset, vocab, context, ending = SHAPES[shape]
        settings = compose("config", [f"model={preset}", "model.dropout=0.0"]).model
        torch.manual_seed(0)
        model = registry.build(registry.with_vocab(settings, vocab)).eval()
        params = sum(p.numel() for p in model.parameters())
        for bs in args.batch_sizes:
            rate = items_per_s(model, vocab, context, ending, args.items, bs, args.repeats)
            print(
                f"| {shape} | {params / 1e6:.1f}M | {context} + 4 x {ending} | {bs} | {rate:.1f} | {10042 / rate / 60:.1f} min |"
            )


if __name__ == "__main__":
    main()
