"""Generation speed with and without the KV cache.

    python benchmarks/generate.py                              # baby-gpt and gpt2 shapes, 500 tokens
    python benchmarks/generate.py --shapes gpt2 --repeats 1 --modes cache

Random weights (speed does not depend on them), batch 1, a one-token prompt, greedy decoding,
fp32 on CPU. Prints tokens/s and the time to first token (prompt encoding + one step); timings
are the median of --repeats runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from gpt.apps.common import compose, config_dir
from gpt.config import GPTConfig, SamplingSettings
from gpt.generation import Decoder
from gpt.model import GPT, registry

# The transformer presets: the KV cache vs recompute comparison is theirs (recurrent models carry a state).
GPT_SHAPES = sorted(p.stem for p in (config_dir() / "model").glob("*.yaml") if "schema_gpt" in p.read_text())


def build(shape: str, char_vocab: int = 65) -> GPT:
    settings = compose("config", [f"model={shape}", "model.dropout=0.0"]).model
    assert isinstance(settings, GPTConfig)
    torch.manual_seed(0)
    return GPT(registry.with_vocab(settings, char_vocab)).eval()


def run_once(model: GPT, new_tokens: int, use_cache: bool) -> tuple[float, float]:
    """(seconds to the first token, seconds for all new_tokens)."""
    cfg = SamplingSettings(max_new_tokens=new_tokens, temperature=0.0, kv_cache=use_cache)
    decoder = Decoder(model, [[0]], cfg, seeds=[0])
    t0 = time.perf_counter()
    decoder.step()
    first = time.perf_counter() - t0
    for _ in range(new_tokens - 1):
        decoder.step()
    return first, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--shapes", nargs="+", default=["baby-gpt", "gpt2"], help="model presets from configs/model", choices=GPT_SHAPES
    )
    ap.add_argument("--new-tokens", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", nargs="+", default=["cache", "nocache"], choices=["cache", "nocache"])
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.new_tokens} new tokens, batch 1, fp32 CPU")
    print(f"{'shape':<10} {'params':>8} {'block':>6} {'mode':<8} {'tokens/s':>9} {'first token ms':>15} {'total s':>8}")
    rates = {}
    with torch.inference_mode():
        for shape in args.shapes:
            model = build(shape)
            run_once(model, 5, True)  # warm-up: allocator, kernels
            for mode in args.modes:
                runs = [run_once(model, args.new_tokens, mode == "cache") for _ in range(args.repeats)]
                first = statistics.median(r[0] for r in runs)
                total = statistics.median(r[1] for r in runs)
                rates[shape, mode] = args.new_tokens / total
                print(
                    f"{shape:<10} {model.num_params() / 1e6:>7.1f}M {model.config.block_size:>6} {mode:<8} "
                    f"{rates[shape, mode]:>9.1f} {first * 1000:>15.1f} {total:>8.1f}",
                    flush=True,
                )
            if ("cache" in args.modes) and ("nocache" in args.modes):
                print(f"{shape:<10} speed-up with the cache: {rates[shape, 'cache'] / rates[shape, 'nocache']:.1f}x", flush=True)


if __name__ == "__main__":
    main()
