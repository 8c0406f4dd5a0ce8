"""sample.py's library side: find a checkpoint, rebuild model + tokenizer, generate, print."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from gpt import checkpoint, runtime
from gpt.config import SampleSettings
from gpt.errors import TinyGPTError
from gpt.generation import SamplingConfig, generate, stream
from gpt import architectures
from gpt.tokenizer import Tokenizer, tokenizer_from_dict


def load_model(ckpt_path: Path, device: torch.device) -> tuple[torch.nn.Module, Tokenizer, dict]:
    ckpt = checkpoint.load(ckpt_path, map_location="cpu")
    model = architectures.model_from_checkpoint(ckpt)
    model.to(device).eval()
    return model, tokenizer_from_dict(ckpt["tokenizer"]), ckpt


def read_prompts(s: SampleSettings, stdin=None) -> list[str]:
    """The prompt(s): `prompt` as typed, `prompt=-` for stdin, or `prompt_file` (a .jsonl file
    holds one prompt per line, as a string or {"prompt": ...}; any other file is one prompt)."""
    if s.prompt_file:
        path = Path(s.prompt_file).expanduser()
        if not path.is_file():
            raise TinyGPTError(f"prompt_file {path} does not exist; check the path or pass prompt='text'")
        text = path.read_text(encoding="utf-8")
        if path.suffix != ".jsonl":
            return [text]
        prompts = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError:
                raise TinyGPTError(f"{path}:{n} is not valid JSON; write one JSON string or {{\"prompt\": ...}} per line") from None
            prompts.append(item["prompt"] if isinstance(item, dict) and "prompt" in item else item)
            if not isinstance(prompts[-1], str):
                raise TinyGPTError(f"{path}:{n} holds no prompt string; write one JSON string or {{\"prompt\": ...}} per line")
        if not prompts:
            raise TinyGPTError(f"{path} holds no prompts")
        return prompts
    if s.prompt == "-":
        return [(stdin or sys.stdin).read()]
    return [s.prompt]


def sampling_config(s: SampleSettings) -> SamplingConfig:
    return SamplingConfig(
        max_new_tokens=s.max_new_tokens,
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p,
        min_p=s.min_p,
        repetition_penalty=s.repetition_penalty,
        stop=tuple(s.stop),
        stop_at_eot=s.stop_at_eot,
        seed=s.seed,
        use_cache=s.kv_cache,
    )


def sample(cfg: dict, s: SampleSettings, out=None, stdin=None) -> list[list[str]]:
    """Entry point of sample.py. Streams each sample to `out` as it is generated (stream=true),
    or generates all prompts as one batch and prints them at the end."""
    out = out or sys.stdout
    gen_cfg = sampling_config(s)  # validates the sampling controls before any loading
    prompts = read_prompts(s, stdin)
    rt = runtime.setup(s.device, s.dtype, s.compile)
    if s.init_from:  # a pretrained model as it is, e.g. init_from=gpt2
        from gpt.pretrained import load_initial

        model, tokenizer_spec = load_initial(s.init_from, dropout=0.0)
        tokenizer = tokenizer_from_dict(tokenizer_spec)
        model.to(rt.device).eval()
        ckpt_path, ckpt = s.init_from, {}
    else:
        ckpt_path = checkpoint.resolve(s.ckpt, s.run_dir, cfg["paths"]["runs_dir"])
        model, tokenizer, ckpt = load_model(ckpt_path, rt.device)
    if hasattr(tokenizer, "unknown_chars"):  # fail before any output, not mid-way
        for p in prompts:
            tokenizer.encode(p)
    if rt.compile:
        model.compile()  # in place, so the decoder's forward calls run compiled
    print(f"sampling from {ckpt_path} (step {ckpt.get('step', '?')}, val loss {ckpt.get('best_val_loss', float('nan')):.4f}; "
          f"{rt.describe()})", file=sys.stderr)

    results: list[list[str]] = [[] for _ in prompts]
    t0 = time.time()
    with rt.autocast():
        if s.stream:
            for i, prompt in enumerate(prompts):
                for j in range(s.num_samples):
                    print(f"---------- sample {i * s.num_samples + j + 1}/{len(prompts) * s.num_samples} ----------", file=out)
                    print(prompt, end="", file=out, flush=True)
                    text = ""
                    for piece in stream(model, tokenizer, prompt, gen_cfg, sample_index=j):
                        text += piece
                        print(piece, end="", file=out, flush=True)
                    print(file=out)
                    results[i].append(text)
        else:
            results = generate(model, tokenizer, prompts, gen_cfg, num_samples=s.num_samples)
            for i, prompt in enumerate(prompts):
                for j, text in enumerate(results[i]):
                    print(f"---------- sample {i * s.num_samples + j + 1}/{len(prompts) * s.num_samples} ----------", file=out)
                    print(prompt + text, file=out)
    n_chars = sum(len(t) for r in results for t in r)
    print(f"generated {n_chars} characters in {time.time() - t0:.1f} s", file=sys.stderr)

    if s.out_file:
        write_jsonl(Path(s.out_file).expanduser(), prompts, results, gen_cfg, ckpt_path)
    return results


def write_jsonl(path: Path, prompts: list[str], results: list[list[str]], gen_cfg: SamplingConfig, ckpt_path: Path) -> None:
    settings = {k: (list(v) if isinstance(v, tuple) else v) for k, v in gen_cfg.__dict__.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:  # append: earlier samples are kept
        for prompt, texts in zip(prompts, results):
            for j, text in enumerate(texts):
                record = {"checkpoint": str(ckpt_path), "prompt": prompt, "sample": j, "text": text, "settings": settings}
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
