"""LoRA (Hu et al., 2021): finetune a frozen model through low-rank updates W + (alpha/r) B A of
chosen Linear layers, then fold them into W for export (merged and unmerged give the same
outputs).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

DEFAULT_TARGETS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_gate", "mlp.c_proj")  # c_gate: SwiGLU's


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0):
        super().__init__()
        self.base = base
        self.scale = alpha / rank
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, device=base.weight.device))
        self.lora_B = nn.Parameter(torch.empty(base.out_features, rank, device=base.weight.device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        nn.init.zeros_(
            self.lora_B
        )  # starts as a no-op (torch.nn.init's fill: skipped on the meta device, gpt.model.meta.building)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (self.dropout(x) @ self.lora_A.T @ self.lora_B.T) * self.scale

    def merged(self) -> nn.Linear:
        if self.base.weight.is_meta:  # shapes only: nothing to fold (and a meta matmul imports torch._dynamo)
            return self.base
        with torch.no_grad():
            self.base.weight += (self.lora_B @ self.lora_A) * self.scale
        return self.base


def apply_lora(model: nn.Module, rank: int, alpha: float, dropout: float = 0.0, targets=DEFAULT_TARGETS) -> int:
    """Wrap every Linear whose name ends with a target; freeze everything else. Returns how many."""
    for p in model.parameters():
        p.requires_grad_(False)
    wrapped = 0
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and name.endswith(tuple(targets)):
            parent, attr = model.get_submodule(name.rsplit(".", 1)[0]), name.rsplit(".", 1)[1]
            setattr(parent, attr, LoRALinear(module, rank, alpha, dropout))
            wrapped += 1
    if not wrapped:
        from gpt.errors import TinyGPTError

        raise TinyGPTError(f"LoRA found no layer named like {', '.join(targets)} in this model (LoRA is for GPT models)")
    return wrapped


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its base weight, in place; the model is a plain one again."""
    for name, module in list(model.named_modules()):
        if isinstance(module, LoRALinear):
            parent, attr = model.get_submodule(name.rsplit(".", 1)[0]), name.rsplit(".", 1)[1]
            setattr(parent, attr, module.merged())
    return model


def merged_state_dict(model: nn.Module, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The state dict the merged model would have, without touching the model: adapters folded
    into their base weights, `.base.` dropped from the keys, adapter tensors left out. `state`:
    the model's state dict when taken already (gathered whole from a sharded model)."""
    scales = {name: m.scale for name, m in model.named_modules() if isinstance(m, LoRALinear)}
    state = model.state_dict() if state is None else state
    out = {}
    for key, value in state.items():
        if ".lora_" in key:
            continue
        if ".base." in key:
            owner, leaf = key.split(".base.")
            if leaf == "weight":
                value = value + (state[f"{owner}.lora_B"] @ state[f"{owner}.lora_A"]) * scales[owner]
            key = f"{owner}.{leaf}"
        out[key] = value
    return out
