"""Typed views of the composed Hydra config, validated before any heavy work starts.

The entry points hand over a plain dict (resolved once at the boundary); nothing below this
module sees OmegaConf. Each section becomes a dataclass whose fields are type-checked, so a
value like `optim.lr=abc` is a one-line error rather than a traceback deep in the loop.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields

from gpt.errors import TinyGPTError

_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _key(section: str, name: str) -> str:
    return f"{section}.{name}" if section else name


def check_types(obj, section: str) -> None:
    """Check (and, int -> float, coerce) every field of a settings dataclass against its type."""
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        value, hint = getattr(obj, f.name), hints[f.name]
        allowed = typing.get_args(hint) or (hint,)  # `int | None` -> (int, NoneType)
        if value is None and type(None) in allowed:
            continue
        if float in allowed and isinstance(value, int) and not isinstance(value, bool):
            setattr(obj, f.name, float(value))
            continue
        # bool is a subclass of int; `n_layer=true` is a mistake, not 1.
        if not any(isinstance(value, t) and not (t is int and isinstance(value, bool)) for t in allowed if t is not type(None)):
            want = " or ".join(_NAMES.get(t, "null" if t is type(None) else t.__name__) for t in allowed)
            raise TinyGPTError(f"{_key(section, f.name)} must be {want}, got {value!r}")


def _take(cls, section: str, d: dict):
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise TinyGPTError(f"unknown key(s) {', '.join(_key(section, k) for k in unknown)}; known: {', '.join(sorted(known))}")
    return cls(**d)


def _positive(obj, section: str, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(obj, name) < 1:
            raise TinyGPTError(f"{_key(section, name)} must be a positive integer, got {getattr(obj, name)!r}")


@dataclass
class TrainSettings:
    max_iters: int = 2000
    batch_size: int = 12
    grad_accum_steps: int = 1
    grad_clip: float = 1.0  # 0 disables clipping
    eval_interval: int = 250
    eval_iters: int = 50
    log_interval: int = 50
    sample_tokens: int = 200  # length of the sample printed when training ends (0: none)
    keep_last: int = 2  # step checkpoints kept (best.pt is extra)
    max_bad_steps: int = 5  # stop after this many non-finite steps in a row
    peak_flops: float | None = None  # accelerator peak FLOP/s for MFU (null: look it up)
    eval_sample_tokens: int = 0  # a sample of this length at every eval, in TensorBoard (0: none)
    histogram_every: int = 0  # weight/grad histograms every N evals (0: never)
    attention_every: int = 0  # attention-map images every N evals (0: never; GPT only)

    def __post_init__(self) -> None:
        check_types(self, "train")
        _positive(self, "train", ("max_iters", "batch_size", "grad_accum_steps", "eval_interval", "eval_iters",
                                  "log_interval", "keep_last", "max_bad_steps"))
        if self.grad_clip < 0:
            raise TinyGPTError(f"train.grad_clip must be >= 0 (0 disables it), got {self.grad_clip}")
        for name in ("sample_tokens", "eval_sample_tokens", "histogram_every", "attention_every"):
            if getattr(self, name) < 0:
                raise TinyGPTError(f"train.{name} must be >= 0 (0 turns it off), got {getattr(self, name)}")


@dataclass
class OptimSettings:
    name: str = "adamw"
    lr: float = 1e-3
    min_lr: float = 1e-4
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-8
    warmup_iters: int = 100
    decay_iters: int = 2000
    # optim=muon: Muon for the hidden matrices, AdamW (the settings above) for the rest
    muon_lr: float = 0.02
    momentum: float = 0.95
    ns_steps: int = 5
    ns_dtype: str = "auto"  # Newton-Schulz precision: auto = bfloat16 on CUDA SM >= 80, float32 elsewhere

    def __post_init__(self) -> None:
        check_types(self, "optim")
        if self.name not in ("adamw", "muon"):
            raise TinyGPTError(f"optim.name={self.name!r} is not supported; use optim=adamw or optim=muon")
        if self.muon_lr <= 0 or not 0 <= self.momentum < 1 or self.ns_steps < 1:
            raise TinyGPTError(
                f"need optim.muon_lr > 0, 0 <= optim.momentum < 1 and optim.ns_steps >= 1, "
                f"got {self.muon_lr}, {self.momentum}, {self.ns_steps}"
            )
        if self.ns_dtype not in ("auto", "float32", "bfloat16"):
            raise TinyGPTError(f"optim.ns_dtype={self.ns_dtype!r}: choose auto, float32 or bfloat16")
        if self.lr <= 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise TinyGPTError(f"need 0 <= optim.min_lr <= optim.lr and lr > 0, got lr={self.lr}, min_lr={self.min_lr}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise TinyGPTError(f"optim.beta1 and optim.beta2 must be in [0, 1), got {self.beta1}, {self.beta2}")
        if self.warmup_iters < 0 or self.decay_iters < 1:
            raise TinyGPTError("optim.warmup_iters must be >= 0 and optim.decay_iters >= 1")


@dataclass
class FinetuneSettings:
    block_size: int | None = None  # crop a pretrained model's context (e.g. GPT-2's 1024) to this
    freeze_embeddings: bool = False  # token (+ position) embeddings; with tying, the LM head too
    freeze_layers: int = 0  # freeze the first N transformer blocks
    lora_rank: int = 0  # > 0: train low-rank adapters on the attention and MLP projections only
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    require_init: bool = False  # set by finetune experiments: init_from must be given

    def __post_init__(self) -> None:
        check_types(self, "finetune")
        if self.freeze_layers < 0 or self.lora_rank < 0 or (self.block_size is not None and self.block_size < 1):
            raise TinyGPTError("finetune.freeze_layers and finetune.lora_rank must be >= 0, finetune.block_size positive or null")


@dataclass
class SampleSettings:
    run_dir: str | None = None
    ckpt: str | None = None
    init_from: str | None = None
    prompt: str = "\n"
    prompt_file: str | None = None
    num_samples: int = 3
    max_new_tokens: int = 500
    temperature: float = 0.8
    top_k: int | None = 200
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float = 1.0
    stop: list | str | None = None
    stop_at_eot: bool = True
    seed: int = 1337
    kv_cache: bool = True
    stream: bool = True
    out_file: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    compile: bool = False

    def __post_init__(self) -> None:
        check_types(self, "")
        _positive(self, "", ("num_samples", "max_new_tokens"))
        # stop=END and 'stop=[END,"\n\n"]' both work; the ranges are checked by SamplingConfig
        self.stop = [self.stop] if isinstance(self.stop, str) else [str(x) for x in (self.stop or [])]


def train_settings(cfg: dict) -> TrainSettings:
    return _take(TrainSettings, "train", cfg.get("train", {}))


def optim_settings(cfg: dict) -> OptimSettings:
    return _take(OptimSettings, "optim", cfg.get("optim", {}))


def finetune_settings(cfg: dict) -> FinetuneSettings:
    return _take(FinetuneSettings, "finetune", cfg.get("finetune") or {})


def sample_settings(cfg: dict) -> SampleSettings:
    """sample.yaml is flat: its top-level keys, less the `paths` group, are the settings."""
    return _take(SampleSettings, "", {k: v for k, v in cfg.items() if k != "paths"})
