"""gpt/model/compute.py and the model's FLOPs formula: FLOPs per token against a count by hand
for two shapes and against torch.utils.flop_counter, the horizon a budget or a tokens-per-
parameter ratio gives (steps counted by hand), and the size knob model.depth.
Run: pytest tests/scaling/test_compute.py"""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from gpt.config import TrainSettings
from gpt.errors import TinyGPTError
from gpt.model import GPT, GPTConfig, compute, registry
from gpt.training import train
from helpers import compose

V = 65

# GPT-2's block: LayerNorm with biases, a GELU MLP of 4d, biases, learned positions, tied head.
GPT2_SHAPE = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=V)
# Llama's: RMSNorm gains only, SwiGLU of hidden 64, no biases, rotary positions, 2 kv heads, untied head.
LLAMA_SHAPE = dict(
    n_layer=3,
    n_head=4,
    n_embd=32,
    block_size=16,
    vocab_size=V,
    n_kv_head=2,
    norm="rmsnorm",
    mlp="swiglu",
    mlp_hidden=64,
    bias=False,
    pos_encoding="rope",
    tie_embeddings=False,
)


def by_hand(shape: dict) -> tuple[int, int]:
    """(N, FLOPs per token) counted from the shape alone: every weight and bias except the
    lookup tables (the position table; the token table unless tied, when it is the LM head)."""
    L, H, d, T = shape["n_layer"], shape["n_head"], shape["n_embd"], shape["block_size"]
    hd = d // H
    if shape.get("mlp") == "swiglu":
        kv, h = shape["n_kv_head"], shape["mlp_hidden"]
        per_layer = 2 * d + d * H * hd + 2 * d * kv * hd + H * hd * d + 3 * d * h  # 2 gains, q, k+v, o, gate+up+down
        n = L * per_layer + d + V * d  # final gain, the untied head
    else:
        per_layer = (
            4 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
        )  # 2 LayerNorms, qkv, proj, fc, proj
        n = L * per_layer + 2 * d + V * d  # final LayerNorm, the tied table as the head
    return n, 6 * n + 12 * L * H * hd * T


@pytest.mark.parametrize("shape", [GPT2_SHAPE, LLAMA_SHAPE], ids=["gpt2-block", "llama-block"])
def test_flops_per_token_is_the_count_by_hand(shape):
    model = GPT(GPTConfig(**shape))
    n, flops = by_hand(shape)
    assert compute.counts(model) == {"params": model.num_params(), "params_non_embedding": n, "flops_per_token": float(flops)}
    # with the lookup tables: GPT-2's position table (its token table is the head), Llama's token table
    tables = shape["block_size"] * shape["n_embd"] if shape is GPT2_SHAPE else V * shape["n_embd"]
    assert model.num_params() == n + tables


@pytest.mark.parametrize("attention", ["manual", "sdpa"])
@pytest.mark.parametrize("shape", [GPT2_SHAPE, LLAMA_SHAPE], ids=["gpt2-block", "llama-block"])
def test_flops_agree_with_torch_flop_counter(shape, attention):
    """flop_counter counts matmuls only (linear layers and attention's QK^T and AV, the full
    T x T grid for a causal mask as for none: the convention of our attention term); our count
    also gives the biases and norm gains 6 FLOPs each. Without those the two agree exactly, the
    forward pass at a third of the training FLOPs and forward + backward at all of them. (torch's
    counter has no formula for the fused CPU attention kernel, aten._scaled_dot_product_flash_
    attention_for_cpu: with attention=sdpa on a CPU it counts the linear layers alone, which
    must then be all the rest.)"""
    model = GPT(GPTConfig(**shape, attention=attention))
    B, T = 3, shape["block_size"]
    idx = torch.randint(0, V, (B, T))
    vectors = sum(p.numel() for p in model.parameters() if p.ndim == 1)
    ours = (model.flops_per_token() - 6 * vectors) * B * T
    if attention == "sdpa":
        c = model.config
        ours -= 12 * c.n_layer * c.n_head * c.head_dim * T * B * T
    with FlopCounterMode(display=False) as forward:
        model(idx)
    assert forward.get_total_flops() == ours / 3
    with FlopCounterMode(display=False) as both:
        _, loss = model(idx, idx)
        loss.backward()
    assert both.get_total_flops() == ours


def test_a_budget_or_a_ratio_sets_the_steps_counted_by_hand(tmp_path, data_root):
    """debug=tiny is gpt-nano's block at 1 layer, 3 heads, 24 dims, context 16; 4 windows a step."""
    root, data_overrides = data_root
    d, T, tokens_per_step = 24, 16, 4 * 16

    def run(name: str, horizon: str) -> dict:
        out = tmp_path / name
        cfg = compose(
            ["debug=tiny", "data=shakespeare_char", *data_overrides, f"paths.data_dir={root}", "train.sample_tokens=0", horizon],
            out,
        )
        train(cfg)
        return json.loads((out / "summary.json").read_text())

    budget = 2e7
    summary = run("budget", f"train.flops_budget={budget:g}")
    vocab = len(json.loads((root / "shakespeare_char" / "meta.json").read_text())["tokenizer"]["chars"])  # the corpus alphabet
    n = (4 * d + 3 * d * d + 3 * d + d * d + d + 4 * d * d + 4 * d + 4 * d * d + d) + 2 * d + vocab * d
    flops_per_token = 6 * n + 12 * 1 * 3 * 8 * T
    steps = math.floor(budget / (flops_per_token * tokens_per_step))
    assert steps >= 2 and summary["step"] == steps and summary["flops_per_token"] == flops_per_token
    assert summary["params_non_embedding"] == n and summary["flops_budget"] == budget
    assert summary["tokens_seen"] == steps * tokens_per_step
    assert (
        summary["flops"] == steps * tokens_per_step * flops_per_token <= budget < (steps + 1) * tokens_per_step * flops_per_token
    )

    summary = run("ratio", "train.tokens_per_param=0.5")
    assert summary["step"] == round(0.5 * n / tokens_per_step) == summary["tokens_seen"] // tokens_per_step


def test_bad_horizons_are_refused():
    for horizon, needle in (
        (dict(flops_budget=0.0), "train.flops_budget must be a number > 0"),
        (dict(tokens_per_param=-1.0), "train.tokens_per_param must be a number > 0"),
        (dict(flops_budget=float("nan")), "train.flops_budget must be a number > 0"),
        (dict(flops_budget=1e12, tokens_per_param=20.0), "give one of them"),
    ):
        with pytest.raises(TinyGPTError, match=needle):
            TrainSettings(**horizon)
    with pytest.raises(TinyGPTError, match=r"less than one step of this model \(1.2e\+06 FLOPs"):
        compute.steps_for(TrainSettings(flops_budget=1e6), 1.2e6 / 64, 1000, 64)
    with pytest.raises(TinyGPTError, match="train.tokens_per_param=0.001 is less than one step"):
        compute.steps_for(TrainSettings(tokens_per_param=0.001), 1e5, 1000, 64)


def test_depth_scales_layers_heads_and_width_together():
    def shape(**kw):
        c = registry.with_vocab(GPTConfig(**kw), V)
        return c.n_layer, c.n_head, c.n_embd, c.head_dim

    assert shape(depth=12) == (12, 12, 768, 64)  # GPT-2 small
    assert shape(depth=3, aspect_ratio=32) == (3, 3, 96, 32)
    assert shape(depth=5, aspect_ratio=32, n_layer=9, n_embd=40) == (5, 5, 160, 32)  # depth decides
    assert shape(n_layer=2) == (2, 4, 128, 32)  # without depth: as given
    for bad in (dict(depth=0), dict(depth=2, aspect_ratio=0)):
        with pytest.raises(TinyGPTError, match="must be a positive integer"):
            shape(**bad)
    with pytest.raises(TinyGPTError, match="head dimension 3 must be even"):
        shape(depth=2, aspect_ratio=3, pos_encoding="rope")


def test_the_start_up_line_names_the_rule_the_model_is_counted_by(tmp_path, data_root, caplog):
    """A transformer's FLOPs a token are 6N + attention; a recurrent model's are 6N (no attention term)."""
    import logging

    root, data_overrides = data_root
    for model, rule in (("lstm", "(6N)"), ("gpt-nano", "(6N + attention)")):
        caplog.clear()
        overrides = ["debug=tiny", f"model={model}", *data_overrides, f"paths.data_dir={root}", "train.max_iters=1"]
        with caplog.at_level(logging.INFO, logger="tinygpt"):
            train(compose([*overrides, "train.sample_tokens=0"], tmp_path / model))
        line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("compute:"))
        assert f"FLOPs/token {rule};" in line, line


def test_the_start_up_line_says_n_counts_the_matmuls_a_tied_table_included():
    """N leaves out the lookup tables only: a tied token table is the LM head's matmul too, so for
    a tied model with rotary positions N is every parameter, and the line says what N is rather
    than 'without embeddings' (which then read as a mistake: 820,736 without, 820,736 in all)."""
    from gpt.model import GPT, GPTConfig
    from gpt.model.compute import counts, describe

    tied = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=8, pos_encoding="rope"))
    figures = counts(tied)
    assert figures["params_non_embedding"] == figures["params"]
    line = describe(figures, 10, 16)
    assert line.startswith(f"compute: N = {figures['params']:,} parameters in matmuls ({figures['params']:,} in all); ")
    assert "without embeddings" not in line
