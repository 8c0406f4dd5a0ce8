"""The GPT-2 124M recipes for GPUs (configs/experiment/gpt2_124m.yaml and speedrun_124m.yaml)
compose and say what they claim: GPT-2 small's shape with its vocabulary padded to a multiple of
64, ~0.5M tokens a step on one GPU and under torchrun, nanoGPT's optimizer settings, 10B tokens,
and ~124M parameters (counted on the meta device: no memory, no GPU). Compose only, ~5 s on 2
CPU cores. Run: pytest tests/test_gpu_recipes.py

Tests that need `model.vocab_multiple` (GPTConfig.padded_vocab_size) and
`model.activation_checkpointing`: test_padded_vocabulary_is_a_multiple_of_64,
test_gpt2_124m_has_gpt2_smalls_parameters, test_speedrun_124m_is_the_modern_block_at_124m and
test_recipes_keep_every_activation.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from gpt.apps.common import compose
from gpt.config import AdamWSettings, GPTConfig, MuonSettings, RunConfig
from gpt.model import registry
from gpt.training.optim import CosineSchedule

RECIPES = ("gpt2_124m", "speedrun_124m")
GPT2_VOCAB = 50257  # tiktoken gpt2: 50,256 merges and bytes + <|endoftext|>
HALF_MILLION = 2**19  # 524,288 tokens a step, GPT-2's ~0.5M


def recipe(name: str, *overrides: str) -> RunConfig:
    return compose("config", [f"experiment={name}", *overrides])


def tokens_per_step(s: RunConfig, processes: int = 1) -> int:
    return s.train.batch_size * s.model.block_size * s.train.grad_accum_steps * processes


def gpt2_small_params(vocab_rows: int, n_layer=12, n_embd=768, block=1024) -> int:
    """GPT-2 small's parameters, by hand: token table (tied with the head) + position table +
    per block 12 C^2 + 13 C (qkv 3C^2+3C, proj C^2+C, fc 4C^2+4C, proj 4C^2+C, two LayerNorms
    2C each) + the final LayerNorm."""
    C = n_embd
    return vocab_rows * C + block * C + n_layer * (12 * C * C + 13 * C) + 2 * C


@pytest.mark.parametrize("name", RECIPES)
def test_recipes_compose_for_one_gpu(name):
    s = recipe(name)
    assert isinstance(s, RunConfig) and isinstance(s.model, GPTConfig)
    assert (s.device, s.dtype, s.compile) == ("cuda", "bfloat16", "true")
    assert (s.model.n_layer, s.model.n_embd, s.model.block_size) == (12, 768, 1024)
    # FineWeb-Edu's 10B-token sample (a parquet config datasets 4.x reads: no loading script), GPT-2's BPE
    assert (s.data.source.kind, s.data.source.path, s.data.source.config) == ("hub", "HuggingFaceFW/fineweb-edu", "sample-10BT")
    assert (s.data.tokenizer.kind, s.data.tokenizer.name) == ("tiktoken", "gpt2")
    assert s.train.grad_clip == 1.0 and s.model.vocab_size in (None, GPT2_VOCAB)  # null: the tokenizer's 50257


@pytest.mark.parametrize("name", RECIPES)
def test_padded_vocabulary_is_a_multiple_of_64(name):
    model = registry.with_vocab(recipe(name).model, GPT2_VOCAB)
    assert model.vocab_multiple == 64
    assert model.vocab_size == GPT2_VOCAB  # the tokenizer's true size stays
    assert model.padded_vocab_size == math.ceil(GPT2_VOCAB / 64) * 64 == 50304
    assert model.padded_vocab_size % 64 == 0


@pytest.mark.parametrize("name", RECIPES)
@pytest.mark.parametrize(("processes", "accum"), [(1, None), (8, 4), (4, 8), (2, 16)])
def test_global_batch_is_half_a_million_tokens(name, processes, accum):
    """One GPU as composed; under torchrun with the accumulation the header comment says."""
    s = recipe(name, *([f"train.grad_accum_steps={accum}"] if accum else []))
    assert abs(tokens_per_step(s, processes) - HALF_MILLION) <= 0.1 * HALF_MILLION
    assert tokens_per_step(s, processes) == HALF_MILLION  # exactly 2^19 with these divisions


def test_gpt2_124m_is_nanogpts_optimizer_and_horizon():
    s = recipe("gpt2_124m")
    o = s.optim
    assert isinstance(o, AdamWSettings) and not isinstance(o, MuonSettings)
    assert (o.lr, o.beta1, o.beta2, o.weight_decay) == (6e-4, 0.9, 0.95, 0.1)
    schedule = CosineSchedule.from_settings(o, s.train.max_iters)
    assert schedule.warmup_iters in (700, 715)  # llm.c's, build-nanogpt's
    assert schedule.min_lr == pytest.approx(0.1 * 6e-4)  # cosine to 10% of the peak
    assert schedule.decay_iters == s.train.max_iters == 19073
    assert tokens_per_step(s) * s.train.max_iters == pytest.approx(10e9, rel=1e-3)  # 10B tokens, one pass
    # GPT-2's block as OpenAI's (the weights of init_from=gpt2 load into it)
    m = s.model
    assert (m.n_head, m.norm, m.pos_encoding, m.mlp, m.activation, m.bias, m.tie_embeddings) == (
        12,
        "layernorm",
        "learned",
        "gelu",
        "gelu_tanh",
        True,
        True,
    )
    # an eval every 250 steps (~77 in the run), each under 1% of the training between two:
    # 2 splits x 80 forward passes against 250 x 32 forward + backward passes (~3 forwards each)
    ts = s.train
    assert ts.eval_interval == 250 and 2 * ts.eval_iters / (ts.eval_interval * ts.grad_accum_steps * 3) < 0.01


def test_gpt2_124m_has_gpt2_smalls_parameters():
    """GPT-2 small is 124,439,808 parameters with its 50,257-token table (tied head); padded to
    50,304 rows it is 47 x 768 = 36,096 more. Counted on the meta device."""
    assert gpt2_small_params(GPT2_VOCAB) == 124_439_808
    assert gpt2_small_params(50304) == 124_475_904 == 124_439_808 + 47 * 768
    config = registry.with_vocab(recipe("gpt2_124m").model, GPT2_VOCAB)
    with torch.device("meta"):
        padded = registry.build(config)
        unpadded = registry.build(replace(config, vocab_multiple=1))
    assert padded.lm_head.weight is padded.transformer.wte.weight
    assert padded.transformer.wte.weight.shape == (50304, 768)
    assert padded.num_params() == gpt2_small_params(50304) == 124_475_904
    assert unpadded.num_params() == gpt2_small_params(GPT2_VOCAB) == 124_439_808
    # 6N + 12 L H d T FLOPs a token (gpt.model.compute): what the header's time estimate uses
    assert padded.flops_per_token() == pytest.approx(855e6, rel=0.01)


def test_speedrun_124m_is_the_modern_block_at_124m():
    s = recipe("speedrun_124m")
    m = s.model
    assert (m.norm, m.pos_encoding, m.qk_norm, m.bias, m.mlp) == ("rmsnorm", "rope", True, False, "relu2")
    assert m.tie_embeddings is False and m.logit_softcap == 30.0
    assert (m.n_layer, m.n_head, m.head_dim, m.n_embd, m.mlp_hidden) == (12, 6, 128, 768, 3072)
    assert isinstance(s.optim, MuonSettings) and s.optim.beta2 == 0.95
    gpt2 = recipe("gpt2_124m")
    assert s.train.max_iters < gpt2.train.max_iters / 3  # Muon's shorter horizon: 2.67B tokens
    assert tokens_per_step(s) * s.train.max_iters == pytest.approx(2.67e9, rel=0.01)
    assert (s.data.name, s.data.source.config) == (gpt2.data.name, gpt2.data.source.config)  # the same tokens
    config = registry.with_vocab(m, GPT2_VOCAB)
    with torch.device("meta"):
        model = registry.build(config)
    C, rows = 768, 50304
    # untied: the table and the head each 50304 x 768; no position table (RoPE), no biases
    assert model.lm_head.weight is not model.transformer.wte.weight
    assert model.num_params(non_embedding=True) == pytest.approx(124e6, rel=0.01)  # the "124M"
    assert model.num_params() - model.num_params(non_embedding=True) == rows * C
    assert model.flops_per_token() == pytest.approx(855e6, rel=0.01)


@pytest.mark.parametrize("name", RECIPES)
def test_recipes_keep_every_activation(name):
    """Activation checkpointing is off: 16 x 1024 tokens of a 124M model fit an 80 GB GPU without
    it; model.activation_checkpointing=true is the switch for a smaller one."""
    s = recipe(name)
    assert s.model.activation_checkpointing is False
    assert recipe(name, "model.activation_checkpointing=true").model.activation_checkpointing is True
