"""The learning-rate schedule every optimizer group follows: linear warmup, cosine decay, a floor."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gpt.config import AdamWSettings


@dataclass
class CosineSchedule:
    """Linear warmup from 0 to `lr`, then cosine decay to `min_lr` at `decay_iters`, then flat."""

    lr: float
    min_lr: float
    warmup_iters: int
    decay_iters: int

    @classmethod
    def from_settings(cls, s: AdamWSettings, max_iters: int) -> CosineSchedule:
        """Decay over `optim.decay_iters`, or over the whole run (`max_iters`) when that is null,
        down to `optim.min_lr`, or to lr * `optim.min_lr_ratio` when that is null."""
        decay = s.decay_iters or max_iters
        # A warmup as long as the whole schedule (a 20-step smoke run of a recipe that warms up
        # for 100) would never reach the peak: warm up for a tenth of the schedule instead.
        warmup = s.warmup_iters if s.warmup_iters < decay else decay // 10
        floor = s.min_lr if s.min_lr is not None else s.lr * s.min_lr_ratio
        return cls(lr=s.lr, min_lr=floor, warmup_iters=warmup, decay_iters=decay)

    def __call__(self, step: int) -> float:
        if step < self.warmup_iters:
            return self.lr * (step + 1) / (self.warmup_iters + 1)
        if step >= self.decay_iters:
            return self.min_lr
        progress = (step - self.warmup_iters) / max(1, self.decay_iters - self.warmup_iters)
        return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (self.lr - self.min_lr)

    def set_lr(self, optimizer: torch.optim.Optimizer, step: int) -> float:
        """Every group follows the same curve, scaled to its own peak (Muon's is higher).
        Returns the AdamW learning rate, the one logged."""
        lr = self(step)
        for group in optimizer.param_groups:
            group["lr"] = group["base_lr"] * lr / self.lr
        return lr
