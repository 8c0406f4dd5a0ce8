"""Typed views of the composed Hydra config, validated before any heavy work starts.

The entry points hand over a plain dict (resolved once at the boundary); nothing below this
module sees OmegaConf.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from gpt.errors import TinyGPTError


def _take(cls, section: str, d: dict):
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise TinyGPTError(f"unknown key(s) {', '.join(section + '.' + k for k in unknown)}; known: {', '.join(sorted(known))}")
    return cls(**d)


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

    def __post_init__(self) -> None:
        for name in ("max_iters", "batch_size", "grad_accum_steps", "eval_interval", "eval_iters", "log_interval"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise TinyGPTError(f"train.{name} must be a positive integer, got {value!r}")
        if self.grad_clip < 0:
            raise TinyGPTError(f"train.grad_clip must be >= 0 (0 disables it), got {self.grad_clip}")
        if self.sample_tokens < 0:
            raise TinyGPTError(f"train.sample_tokens must be >= 0, got {self.sample_tokens}")


@dataclass
class SampleSettings:
    run_dir: str | None = None
    ckpt: str | None = None
    prompt: str = "\n"
    prompt_file: str | None = None
    num_samples: int = 3
    max_new_tokens: int = 500
    temperature: float = 0.8
    top_k: int | None = 200
    seed: int = 1337
    device: str = "auto"
    dtype: str = "auto"
    compile: bool = False

    def __post_init__(self) -> None:
        if self.num_samples < 1 or self.max_new_tokens < 1:
            raise TinyGPTError("num_samples and max_new_tokens must be positive integers")
        if self.temperature < 0:
            raise TinyGPTError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise TinyGPTError(f"top_k must be a positive integer or null, got {self.top_k}")


def train_settings(cfg: dict) -> TrainSettings:
    return _take(TrainSettings, "train", cfg.get("train", {}))


def sample_settings(cfg: dict) -> SampleSettings:
    keys = {f.name for f in fields(SampleSettings)}
    return _take(SampleSettings, "sample", {k: v for k, v in cfg.items() if k in keys})
