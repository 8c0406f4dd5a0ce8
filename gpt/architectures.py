"""One place that maps a model config (`model.arch`) to its config class and module, so the
trainer, checkpoints and sampling work the same for a GPT and the recurrent baselines."""

from __future__ import annotations

import torch.nn as nn

from gpt.errors import TinyGPTError
from gpt.model import GPT, GPTConfig
from gpt.rnn import ARCHS as RECURRENT, RecurrentLM, RNNConfig

ARCHS = ("gpt", *RECURRENT)


def config_from_dict(d: dict):
    """GPTConfig or RNNConfig from a model section / checkpoint dict (`arch` picks; default gpt)."""
    arch = d.get("arch", "gpt")
    if arch == "gpt":
        return GPTConfig.from_dict(d)
    if arch in RECURRENT:
        return RNNConfig.from_dict(d)
    raise TinyGPTError(f"model.arch={arch!r} is unknown; use one of {', '.join(ARCHS)}")


def config_to_dict(config) -> dict:
    d = config.to_dict()
    d.setdefault("arch", "gpt")
    return d


def build(config) -> nn.Module:
    return RecurrentLM(config) if isinstance(config, RNNConfig) else GPT(config)


def summary(config) -> str:
    if isinstance(config, RNNConfig):
        return config.summary()
    c = config
    extras = [] if c.pos_encoding == "learned" else [f"{c.pos_encoding} positions"]
    if c.kv_heads != c.n_head:
        extras.append(f"{c.kv_heads} kv heads")
    return f"{c.n_layer}L {c.n_head}H {c.n_embd}D block {c.block_size}" + (f" ({', '.join(extras)})" if extras else "")


def model_from_checkpoint(ckpt: dict, dropout: float | None = None) -> nn.Module:
    """The plain model in a checkpoint; a LoRA finetune's adapters are folded in."""
    from gpt.lora import apply_lora, has_lora, merge_lora

    config = dict(ckpt["model_config"])
    if dropout is not None:
        config["dropout"] = dropout
    model = build(config_from_dict(config))
    if has_lora(ckpt["model"]):
        lora = ckpt.get("lora") or {}
        apply_lora(model, lora.get("rank", 1), lora.get("alpha", 1.0))
        model.load_state_dict(ckpt["model"])
        merge_lora(model)
        for p in model.parameters():
            p.requires_grad_(True)
    else:
        model.load_state_dict(ckpt["model"])
    return model
