"""Autoregressive generation with a KV cache and the usual sampling controls.

    sampling.py  logits -> the next token under the controls (next_tokens)
    decoder.py   token-level decoding of a batch of prompts (Decoder)
    text.py      a prompt's ids, and a row's text as it is generated: stops, end of text (TextStream)
    compiled.py  torch.compile for decoding (compile_for_generation)
    layout.py    weights re-laid for decoding on a CPU (input_major)

No I/O and no Hydra: `generate` and `stream` here are what the trainer, sample.py, `tinygpt chat`
and notebooks share (the server's engine batches rows itself, with the same pieces). The controls are the fields of
`gpt.config.SamplingSettings`; sample.py's settings extend that class and the server builds
one per request, so a new control is a field there and its use in `next_tokens`.

Longer than the context: a transformer sees at most block_size tokens, so once prompt +
generated text outgrow it, each new token is predicted from the last block_size tokens,
re-encoded at positions 0..block_size-1 (exactly what generation without a cache does). The
cache then cannot be reused: every cached key was computed at a position that has since
shifted (learned or sinusoidal tables, and the absolute rotation angles of RoPE too), and with
several layers a key also depends on the dropped tokens; past that point each step recomputes
the window. Recurrent models carry a fixed-size state and have no such limit.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import torch

from gpt.config import SamplingSettings
from gpt.generation.compiled import compile_for_generation
from gpt.generation.decoder import Decoder, decode_kernels
from gpt.generation.layout import input_major
from gpt.generation.sampling import draw, filter_logits, keep_typical, next_tokens, not_finite, penalize_repeats
from gpt.generation.text import TextStream, decode_safe, encode_prompt, stop_ids, utf8
from gpt.model import GPT

__all__ = [
    "Decoder",
    "decode_kernels",
    "TextStream",
    "compile_for_generation",
    "decode_safe",
    "draw",
    "encode_prompt",
    "utf8",
    "filter_logits",
    "generate",
    "input_major",
    "keep_typical",
    "next_tokens",
    "not_finite",
    "penalize_repeats",
    "ready_to_decode",
    "stop_ids",
    "stream",
]


def ready_to_decode(model, compile: bool, graphs: int | None = None) -> None:
    """What sample.py, `tinygpt chat` and `tinygpt serve` do to a model before decoding with it,
    in place: torch.compile for decoding (compile=true; `graphs`: see compile_for_generation),
    else, on a CPU, its linear weights laid out input-major (layout.py)."""
    if compile:
        compile_for_generation(model, graphs=graphs)  # the decoder's forward calls then run compiled
    else:
        input_major(model)


def _generate_rows(
    model, tokenizer, prompts: list[str | list[int]], cfg: SamplingSettings, num_samples: int, device=None, lockstep=False
) -> Iterator[tuple[int, str]]:
    """Yield (row, new text) pieces as rows progress. Row r is sample r % num_samples of prompt
    r // num_samples and draws from seed cfg.seed + r % num_samples, so results do not depend
    on how prompts are batched."""
    # Recurrent models read prompts of any length; a transformer sees its last block_size tokens.
    block = None if getattr(model, "recurrent", False) else model.config.block_size
    encoded = [encode_prompt(tokenizer, p, block) for p in prompts]
    row_prompts = [ids for ids in encoded for _ in range(num_samples)]
    seeds = [cfg.seed + s for _ in encoded for s in range(num_samples)]
    decoder = Decoder(model, row_prompts, cfg, seeds, device, lockstep)
    rows = [TextStream(tokenizer, cfg.stop, cfg.stop_at_eot) for _ in row_prompts]

    was_training = model.training
    model.eval()
    every = read_every(decoder.device)
    try:
        left = cfg.max_new_tokens
        while left > 0:
            chunk = decoder.steps(min(every, left), vocab_limit=tokenizer.vocab_size)
            left -= len(chunk)
            for next_ids, finite in chunk:
                if not finite:
                    raise not_finite()
                for r, (row, tok) in enumerate(zip(rows, next_ids)):
                    if not row.done and (piece := row.push(tok)):
                        yield r, piece
                if all(row.done for row in rows):  # the steps after this one are not used
                    left = 0
                    break
        for r, row in enumerate(rows):  # flush what was held back, now that nothing follows
            if not row.done and (piece := row.flush()):
                yield r, piece
    finally:
        model.train(was_training)


def read_every(device: torch.device) -> int:
    """Decoding steps between two reads of the sampled tokens (and of the finite check) back to
    the host. Each read makes the host wait until the device has caught up, so that it queues
    nothing meanwhile; on a GPU, reading every 8 steps keeps it queueing ahead (the cost: text
    arrives 8 tokens at a time, and up to 7 steps decode past the end of the last row to end).
    A CPU has nothing to wait for: every step."""
    return 1 if device.type == "cpu" else 8


@torch.no_grad()
def generate(
    model: GPT,
    tokenizer,
    prompts: list[str | list[int]],
    cfg: SamplingSettings,
    num_samples: int = 1,
    device: torch.device | None = None,
    lockstep: bool = False,
) -> list[list[str]]:
    """Continuations of each prompt (text, or ids): result[i][j] is sample j of prompts[i].
    `device`: where the model computes, where that is not where its weights are (FSDP2 with CPU
    offload keeps them in host memory); by default, its weights' device. `lockstep`: every
    process of a sharded model decodes together, taking rank 0's tokens (gpt.training.parallel)."""
    texts = [""] * (len(prompts) * num_samples)
    for r, piece in _generate_rows(model, tokenizer, prompts, cfg, num_samples, device, lockstep):
        texts[r] += piece
    return [texts[i * num_samples : (i + 1) * num_samples] for i in range(len(prompts))]


@torch.no_grad()
def stream(model: GPT, tokenizer, prompt: str | list[int], cfg: SamplingSettings, sample_index: int = 0) -> Iterator[str]:
    """Yield the continuation of one prompt piece by piece, as it is generated. Gives the same
    text as sample `sample_index` of `generate` with the same config."""
    cfg = replace(cfg, seed=cfg.seed + sample_index)
    for _, piece in _generate_rows(model, tokenizer, [prompt], cfg, 1):
        yield piece
