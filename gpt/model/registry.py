"""One place that maps a model config (`model.arch`) to its module, so the trainer, checkpoints
and sampling work the same for a GPT and the recurrent baselines."""

from __future__ import annotations

from dataclasses import replace

import torch.nn as nn

from gpt.config.model import ARCHS, GPTConfig, RNNConfig, config_from_dict, depth_shape
from gpt.errors import TinyGPTError
from gpt.model import GPT

__all__ = ["ARCHS", "build", "config_from_dict", "config_to_dict", "depth_shape", "summary", "with_vocab"]


def with_vocab(config: GPTConfig | RNNConfig, vocab_size: int) -> GPTConfig | RNNConfig:
    """The config with its vocabulary set: a null one is the tokenizer's; one given must hold the
    tokenizer's every token (it may be larger)."""
    if config.vocab_size is None:
        return replace(config, vocab_size=vocab_size)
    if config.vocab_size < vocab_size:
        raise TinyGPTError(
            f"model.vocab_size={config.vocab_size} is smaller than the tokenizer's {vocab_size} tokens; "
            f"set model.vocab_size=null to take it from the data"
        )
    return config


def config_to_dict(config: GPTConfig | RNNConfig) -> dict:
    """A config's record (what checkpoints hold): every field, `arch` included."""
    return config.to_dict()


def build(config: GPTConfig | RNNConfig) -> nn.Module:
    if isinstance(config, RNNConfig):
        from gpt.model.rnn import RecurrentLM  # (a GPT's run never reads the recurrent models)

        return RecurrentLM(config)
    return GPT(config)


def summary(config: GPTConfig | RNNConfig) -> str:
    if isinstance(config, RNNConfig):
        return config.summary()
    c = config
    extras = [] if c.pos_encoding == "learned" else [f"{c.pos_encoding} positions"]
    if c.n_kv_head != c.n_head:
        extras.append(f"{c.n_kv_head} kv heads")
    extras += [c.norm] * (c.norm != "layernorm") + [f"{c.mlp} {c.mlp_hidden}"] * (c.mlp != "gelu")
    extras += ["qk-norm"] * c.qk_norm + ["untied head"] * (not c.tie_embeddings) + ["no bias"] * (not c.bias)
    if c.logit_softcap:
        extras.append(f"softcap {c.logit_softcap:g}")
    return f"{c.n_layer}L {c.n_head}H {c.n_embd}D block {c.block_size}" + (f" ({', '.join(extras)})" if extras else "")
