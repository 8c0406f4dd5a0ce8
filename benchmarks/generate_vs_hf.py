"""tinygpt's decoding against transformers' `generate` on the same weights.

    python benchmarks/generate_vs_hf.py                         # gpt2 shape, batch 1 and 8, greedy and sampled
    python benchmarks/generate_vs_hf.py --shapes gpt-micro-modern gpt2 --batches 1 --new-tokens 256

For each model shape: random weights (seeded; speed does not depend on them), exported with
`gpt.interop.export` to a Hugging Face folder, which transformers loads (GPT2LMHeadModel for the
gpt2 shape). Both decode the same prompts (--batches rows of 16 random token ids below 256, all of
one length, so no padding; prompt + new tokens must fit the shape's context), cache on, fp32, on the
CPU with the same threads, in one process, alternated A B A B (--repeats pairs); the figure is
tokens/s of the new tokens, median of the repeats, prompt included in the time. Three tinygpt modes:
`eager` (sample.py's default, weights re-laid by gpt.generation.input_major as sample.py does on a
CPU; --linear-layout keeps nn.Linear's layout, as before), `compiled` (sample.py compile=true:
gpt.generation.compile_for_generation; its compile time is reported apart, and a warm inductor cache
is what a second run of sample.py gets), and transformers `generate` (greedy: do_sample=False;
sampled: temperature 1, top-k 50, both). Greedy output ids are compared token for token with
transformers'.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from gpt.apps.common import compose
from gpt.config import GPTConfig, SamplingSettings
from gpt.generation import Decoder, compile_for_generation, input_major
from gpt.interop import export
from gpt.model import GPT, registry
from gpt.tokenizers.byte import ByteTokenizer
from gpt.tokenizers.tiktoken import TiktokenTokenizer


def build(shape: str) -> tuple[GPT, object]:
    settings = compose("config", [f"model={shape}", "model.dropout=0.0"]).model
    assert isinstance(settings, GPTConfig)
    tokenizer = TiktokenTokenizer("gpt2") if settings.n_embd >= 768 else ByteTokenizer()
    torch.manual_seed(0)
    return GPT(registry.with_vocab(settings, tokenizer.vocab_size)).eval(), tokenizer


def prompts(batch: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, min(vocab, 256), (batch, 16), generator=g).tolist()


def tinygpt_decode(model: GPT, rows: list[list[int]], new: int, greedy: bool) -> tuple[float, list[list[int]]]:
    cfg = SamplingSettings(max_new_tokens=new, temperature=0.0 if greedy else 1.0, top_k=None if greedy else 50, kv_cache=True)
    t0 = time.perf_counter()
    decoder = Decoder(model, rows, cfg, seeds=list(range(len(rows))))
    out = [decoder.steps(1, vocab_limit=model.config.vocab_size)[0][0] for _ in range(new)]  # as generate() on a CPU
    seconds = time.perf_counter() - t0
    return seconds, [list(col) for col in zip(*out, strict=True)]


def hf_decode(hf, rows: list[list[int]], new: int, greedy: bool) -> tuple[float, list[list[int]]]:
    ids = torch.tensor(rows)
    kwargs = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=1.0, top_k=50)
    t0 = time.perf_counter()
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, use_cache=True, **kwargs)
    seconds = time.perf_counter() - t0
    assert out.size(1) == ids.size(1) + new, "transformers stopped early"
    return seconds, out[:, ids.size(1) :].tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["gpt2"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", nargs="+", default=["greedy", "sampled"], choices=["greedy", "sampled"])
    ap.add_argument("--no-compiled", action="store_true", help="leave out tinygpt's compiled decoding")
    ap.add_argument(
        "--linear-layout",
        action="store_true",
        help="eager decoding with nn.Linear's weight layout (before gpt.generation.input_major)",
    )
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.new_tokens} new tokens, fp32 CPU, cache on")
    print(f"{'shape':<17} {'batch':>5} {'mode':<8} {'tinygpt eager':>14} {'compiled':>9} {'transformers':>13}  ratios (tok/s)")
    for shape in args.shapes:
        model, tokenizer = build(shape)
        if 16 + args.new_tokens > model.config.block_size:
            raise SystemExit(f"{shape}: 16 + --new-tokens must fit its context of {model.config.block_size} tokens")
        folder = tempfile.mkdtemp(prefix="tinygpt-vs-hf-")
        _, cls = export(model, tokenizer, folder)
        hf = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32).eval()
        hf.generation_config.eos_token_id = None  # decode all new tokens, as tinygpt's Decoder does
        hf.generation_config.pad_token_id = 0
        if not args.linear_layout:
            input_major(model)  # as sample.py does for eager decoding on a CPU (after the export, which reads the weights)
        compiled = None
        if not args.no_compiled:
            compiled, _ = build(shape)
            compile_for_generation(compiled)
            t0 = time.perf_counter()
            with torch.inference_mode():
                for b in args.batches:
                    tinygpt_decode(compiled, prompts(b, model.config.vocab_size), 4, True)
            print(
                f"{shape}: compiled decoding's first calls (compile, this process's cache state) {time.perf_counter() - t0:.1f} s"
            )
        with torch.inference_mode():
            for b in args.batches:
                rows = prompts(b, model.config.vocab_size)
                tinygpt_decode(model, rows, 4, True), hf_decode(hf, rows, 4, True)  # warm-up
                for mode in args.modes:
                    greedy = mode == "greedy"
                    times: dict[str, list[float]] = {"eager": [], "compiled": [], "hf": []}
                    outs = {}
                    for _ in range(args.repeats):
                        times["eager"].append((r := tinygpt_decode(model, rows, args.new_tokens, greedy))[0])
                        outs["eager"] = r[1]
                        if compiled is not None:
                            times["compiled"].append((r := tinygpt_decode(compiled, rows, args.new_tokens, greedy))[0])
                            outs["compiled"] = r[1]
                        times["hf"].append((r := hf_decode(hf, rows, args.new_tokens, greedy))[0])
                        outs["hf"] = r[1]
                    rate = {k: b * args.new_tokens / statistics.median(v) for k, v in times.items() if v}
                    same = ""
                    if greedy:
                        same = " greedy ids " + ", ".join(
                            f"{k}{'=' if outs[k] == outs['hf'] else '!='}transformers" for k in ("eager", "compiled") if k in outs
                        )
                    compiled_rate = f"{rate['compiled']:>9.1f}" if "compiled" in rate else f"{'-':>9}"
                    ratios = f"eager {rate['eager'] / rate['hf']:.2f}x" + (
                        f", compiled {rate['compiled'] / rate['hf']:.2f}x" if "compiled" in rate else ""
                    )
                    print(
                        f"{shape:<17} {b:>5} {mode:<8} {rate['eager']:>14.1f} {compiled_rate} {rate['hf']:>13.1f}  {ratios};{same}",
                        flush=True,
                    )
        print(f"{shape}: exported as {cls}; {model.num_params() / 1e6:.1f}M parameters")


if __name__ == "__main__":
    main()
