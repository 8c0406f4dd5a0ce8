"""Text generation from a trained checkpoint: the library side of `sample.py`."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from gpt import checkpoint, runtime
from gpt.config import SampleSettings
from gpt.errors import TinyGPTError
from gpt.model import GPT, GPTConfig
from gpt.tokenizer import Tokenizer, tokenizer_from_dict


def load_model(ckpt_path: Path, device: torch.device) -> tuple[GPT, Tokenizer, dict]:
    ckpt = checkpoint.load(ckpt_path, map_location="cpu")
    model = GPT(GPTConfig.from_dict(ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    model.to(device).eval()
    return model, tokenizer_from_dict(ckpt["tokenizer"]), ckpt


def generate_text(
    model: GPT,
    tokenizer: Tokenizer,
    prompt: str,
    num_samples: int,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    seed: int,
    autocast=None,
) -> list[str]:
    """Sample `num_samples` continuations of `prompt`, reproducibly for a given seed."""
    device = next(model.parameters()).device
    if prompt == "":
        raise TinyGPTError("the prompt is empty; give at least one character, e.g. prompt='\\n'")
    ids = tokenizer.encode(prompt)
    if len(ids) > model.config.block_size:
        ids = ids[-model.config.block_size :]  # the model can only see its last block_size tokens
    idx = torch.tensor([ids] * num_samples, dtype=torch.long, device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    was_training = model.training
    model.eval()
    with autocast or contextlib.nullcontext():
        out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k, generator=generator)
    model.train(was_training)
    return [tokenizer.decode(row[len(ids):].tolist()) for row in out]


def read_prompt(s: SampleSettings) -> str:
    if s.prompt_file:
        path = Path(s.prompt_file).expanduser()
        if not path.is_file():
            raise TinyGPTError(f"prompt_file {path} does not exist; check the path or pass prompt='text'")
        return path.read_text(encoding="utf-8")
    return s.prompt


def sample(cfg: dict, s: SampleSettings, print_fn=print) -> list[str]:
    """Entry point of sample.py: find the checkpoint, rebuild model + tokenizer, print samples."""
    ckpt_path = checkpoint.resolve(s.ckpt, s.run_dir, cfg["paths"]["runs_dir"])
    prompt = read_prompt(s)
    rt = runtime.setup(s.device, s.dtype, s.compile)
    model, tokenizer, ckpt = load_model(ckpt_path, rt.device)
    if rt.compile:
        model.compile()  # in place, so model.generate's own forward calls run compiled
    print_fn(f"sampling from {ckpt_path} (step {ckpt.get('step', '?')}, val loss {ckpt.get('best_val_loss', float('nan')):.4f}; {rt.describe()})")
    texts = generate_text(
        model, tokenizer, prompt, s.num_samples, s.max_new_tokens, s.temperature, s.top_k, s.seed, rt.autocast()
    )
    for i, text in enumerate(texts):
        print_fn(f"---------- sample {i + 1}/{len(texts)} ----------")
        print_fn(prompt + text)
    return texts
