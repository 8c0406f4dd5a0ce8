"""Optimizer construction and learning-rate schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from gpt.config import OptimSettings


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


def build_optimizer(model: nn.Module, settings: OptimSettings, device: torch.device) -> torch.optim.Optimizer:
    # The fused kernel does the whole update in one launch; only CUDA has it everywhere.
    return torch.optim.AdamW(
        param_groups(model, settings.weight_decay),
        lr=settings.lr,
        betas=(settings.beta1, settings.beta2),
        eps=settings.eps,
        fused=device.type == "cuda",
    )


@dataclass
class CosineSchedule:
    """Linear warmup from 0 to `lr`, then cosine decay to `min_lr` at `decay_iters`, then flat."""

    lr: float
    min_lr: float
    warmup_iters: int
    decay_iters: int

    @classmethod
    def from_settings(cls, s: OptimSettings) -> "CosineSchedule":
        # A warmup as long as the whole schedule (a 20-step smoke run of a recipe that warms up
        # for 100) would never reach the peak: warm up for a tenth of the schedule instead.
        warmup = s.warmup_iters if s.warmup_iters < s.decay_iters else s.decay_iters // 10
        return cls(lr=s.lr, min_lr=s.min_lr, warmup_iters=warmup, decay_iters=s.decay_iters)

    def __call__(self, step: int) -> float:
        if step < self.warmup_iters:
            return self.lr * (step + 1) / (self.warmup_iters + 1)
        if step >= self.decay_iters:
            return self.min_lr
        progress = (step - self.warmup_iters) / max(1, self.decay_iters - self.warmup_iters)
        return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (self.lr - self.min_lr)
