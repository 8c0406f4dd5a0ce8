"""One place that maps a model config (`model.arch`) to its config class and module, so the
trainer, checkpoints and sampling work the same for a GPT and the recurrent baselines."""

from __future__ import annotations

from dataclasses import fields

import torch.nn as nn

from gpt.errors import TinyGPTError
from gpt.model import GPT, GPTConfig
from gpt.model.rnn import ARCHS as RECURRENT
from gpt.model.rnn import RecurrentLM, RNNConfig

ARCHS = ("gpt", *RECURRENT)


def config_from_dict(d: dict):
    """GPTConfig or RNNConfig from a model section / checkpoint dict (`arch` picks; default gpt)."""
    arch = d.get("arch", "gpt")
    if arch == "gpt":
        return GPTConfig.from_dict(d)
    if arch in RECURRENT:
        return RNNConfig.from_dict(d)
    raise TinyGPTError(f"model.arch={arch!r} is unknown; use one of {', '.join(ARCHS)}")


def config_from_settings(settings, vocab_size: int | None = None):
    """The model's own config from its settings section (gpt.config.GPTSettings or
    RNNSettings): the one conversion between the two. `vocab_size` fills a null one."""
    d = {f.name: getattr(settings, f.name) for f in fields(settings)}
    if d.get("vocab_size") is None:
        d["vocab_size"] = vocab_size
    depth, aspect_ratio = d.pop("depth", None), d.pop("aspect_ratio", None)
    if depth is not None:
        d.update(depth_shape(depth, aspect_ratio))
    return config_from_dict(d)


def depth_shape(depth, aspect_ratio) -> dict:
    """The shape `model.depth` names: depth layers of depth heads, each head aspect_ratio wide
    (n_embd = depth * aspect_ratio). One knob that grows width with depth at a fixed ratio, as
    nanochat's does, so a scaling study walks model sizes with one setting; depth=12 with the
    default 64 is GPT-2 small's 12 layers, 12 heads, 768 dims."""
    for name, value in (("depth", depth), ("aspect_ratio", aspect_ratio)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TinyGPTError(f"model.{name} must be a positive integer, got {value!r}")
    return {"n_layer": depth, "n_head": depth, "n_embd": depth * aspect_ratio}


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
    extras += [c.norm] * (c.norm != "layernorm") + [f"{c.mlp} {c.hidden}"] * (c.mlp != "gelu")
    extras += ["qk-norm"] * c.qk_norm + ["untied head"] * (not c.tie_embeddings) + ["no bias"] * (not c.bias)
    if c.logit_softcap:
        extras.append(f"softcap {c.logit_softcap:g}")
    return f"{c.n_layer}L {c.n_head}H {c.n_embd}D block {c.block_size}" + (f" ({', '.join(extras)})" if extras else "")
