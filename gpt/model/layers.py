"""The pieces a block is made of besides attention: normalisation, the feed-forward network, and
the position tables. Each option of GPTConfig is one small class or branch here."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt.config.model import GPTConfig

# --- normalisation (model.norm) --------------------------------------------------------------


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * g: LayerNorm without the mean and the bias (Llama).
    Computed in float32 and cast back before the gain, as Llama does: under bf16 autocast the
    mean of squares would lose the digits that set the scale."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torch's fused kernel, not the formula spelled out: bitwise the same in float32, and its
        # backward is one kernel instead of five (the quickstart's step: ~7% faster on a CPU)
        h = F.rms_norm(x.float(), (x.size(-1),), eps=self.eps)
        return self.weight * h.to(x.dtype)


def make_norm(config: GPTConfig, dim: int | None = None) -> nn.Module:
    dim = dim or config.n_embd
    if config.norm == "rmsnorm":
        return RMSNorm(dim, config.norm_eps)
    return nn.LayerNorm(dim, eps=config.norm_eps, bias=config.bias)


# --- the feed-forward network (model.mlp) ------------------------------------------------------


class ReLU2(nn.Module):
    """relu(x)^2: as cheap as ReLU, smooth at 0 from the right, and most units exactly 0."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x).square()


class MLP(nn.Module):
    """Position-wise feed-forward network: expand to `hidden` (4 n_embd), a non-linearity,
    project back. GELU (GPT-2), or ReLU squared (relu2: sparse and cheap; modded-nanogpt)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.mlp_hidden, bias=config.bias)
        gelu = nn.GELU(approximate="tanh" if config.activation == "gelu_tanh" else "none")
        self.act = ReLU2() if config.mlp == "relu2" else gelu
        self.c_proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class SwiGLU(nn.Module):
    """Llama's feed-forward network: down(silu(gate(x)) * up(x)). The gate's SiLU decides, per
    hidden unit, how much of the linear `up` path passes."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_gate = nn.Linear(config.n_embd, config.mlp_hidden, bias=config.bias)
        self.c_fc = nn.Linear(config.n_embd, config.mlp_hidden, bias=config.bias)  # up
        self.c_proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=config.bias)  # down
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.silu(self.c_gate(x)) * self.c_fc(x)))


def make_mlp(config: GPTConfig) -> nn.Module:
    return SwiGLU(config) if config.mlp == "swiglu" else MLP(config)


# --- positions (model.pos_encoding) ------------------------------------------------------------


def sinusoidal_table(n_pos: int, dim: int) -> torch.Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/dim)), PE[p, 2i+1] = cos(p / 10000^(2i/dim)): each channel
    pair is a clock of its own frequency, so relative offsets are linear functions of the table.
    Computed in float64, then rounded: in float32 the angle p * freq loses digits as p grows
    (an error of 6.7e-5 at position 1023 of a 768-wide table)."""
    pos = torch.arange(n_pos, dtype=torch.float64)[:, None]
    freq = torch.pow(10000.0, -torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    table = torch.zeros(n_pos, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
    return table.float()


def rope_tables(n_pos: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of angle p * theta^(-2i/head_dim), each (n_pos, head_dim / 2). In float32, as
    Meta's Llama and Hugging Face's compute them: float64 would be closer to the closed form
    (float32's angle is off by ~1e-4 rad at position 4096), but the angles a model was trained
    with are the ones that matter, and a Llama imported from the Hub was trained with these
    (float64 tables moved its logits by 1.1e-5 on a 2-layer model)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    angles = torch.arange(n_pos, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (x_i, x_{i+d/2}) of x (B, H, T, d) by their position's angles. A dot
    product of two rotated vectors depends only on the difference of their positions. (The two
    halves of a head are paired, as in Hugging Face's Llama: Meta's original pairs neighbours,
    and HF's conversion permutes the q and k weights to match.)"""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).type_as(x)
