"""Optimizer construction and learning-rate schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from gpt.errors import TinyGPTError


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay only matrices (Linear weights, embeddings); biases and LayerNorm gains stay free,
    since shrinking them towards zero only hurts."""
    decay, no_decay = [], []
    for p in model.parameters():  # .parameters() yields a tied weight once
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, optim_cfg: dict, device: torch.device) -> torch.optim.Optimizer:
    name = optim_cfg.get("name", "adamw")
    if name != "adamw":
        raise TinyGPTError(f"optim.name={name!r} is not supported; use optim=adamw")
    # The fused kernel does the whole update in one launch; only CUDA has it everywhere.
    fused = device.type == "cuda"
    return torch.optim.AdamW(
        param_groups(model, float(optim_cfg["weight_decay"])),
        lr=float(optim_cfg["lr"]),
        betas=(float(optim_cfg["beta1"]), float(optim_cfg["beta2"])),
        eps=float(optim_cfg.get("eps", 1e-8)),
        fused=fused,
    )


@dataclass
class CosineSchedule:
    """Linear warmup from 0 to `lr`, then cosine decay to `min_lr` at `decay_iters`, then flat."""

    lr: float
    min_lr: float
    warmup_iters: int
    decay_iters: int

    def __post_init__(self) -> None:
        if self.warmup_iters < 0 or self.decay_iters < 1:
            raise TinyGPTError("optim.warmup_iters must be >= 0 and optim.decay_iters >= 1")
        if self.min_lr > self.lr:
            raise TinyGPTError(f"optim.min_lr={self.min_lr} exceeds optim.lr={self.lr}; set min_lr <= lr")

    def __call__(self, step: int) -> float:
        if step < self.warmup_iters:
            return self.lr * (step + 1) / (self.warmup_iters + 1)
        if step >= self.decay_iters:
            return self.min_lr
        progress = (step - self.warmup_iters) / max(1, self.decay_iters - self.warmup_iters)
        return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (self.lr - self.min_lr)
