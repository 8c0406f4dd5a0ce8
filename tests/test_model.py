"""Model behaviour: shapes, causality, attention paths, weight tying, init, parameter counts.
Run: pytest tests/test_model.py"""

import math

import pytest
import torch

from gpt.errors import TinyGPTError
from gpt.model import GPT, GPTConfig, KVCache


def tiny(**kw) -> GPTConfig:
    base = dict(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.0)
    return GPTConfig(**{**base, **kw})


def test_forward_shapes_and_loss():
    model = GPT(tiny())
    idx = torch.randint(0, 64, (3, 10))
    logits, loss = model(idx)
    assert logits.shape == (3, 10, 64) and loss is None
    logits, loss = model(idx, idx)
    assert loss.ndim == 0
    # At init the prediction is near uniform, so the loss is close to ln(vocab).
    assert abs(loss.item() - math.log(64)) < 0.3


def test_sequence_longer_than_block_is_rejected():
    with pytest.raises(ValueError, match="block_size"):
        GPT(tiny())(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("attention", ["sdpa", "manual"])
def test_causality(attention):
    model = GPT(tiny(attention=attention)).eval()
    idx = torch.randint(0, 64, (2, 16))
    changed = idx.clone()
    t = 7
    changed[:, t + 1] = (changed[:, t + 1] + 1) % 64
    a, _ = model(idx)
    b, _ = model(changed)
    assert torch.equal(a[:, : t + 1], b[:, : t + 1])  # past positions untouched
    assert not torch.allclose(a[:, t + 1], b[:, t + 1])  # the changed position does differ


@pytest.mark.parametrize("T", [5, 16])
def test_manual_attention_matches_sdpa(T):
    torch.manual_seed(1)
    sdpa = GPT(tiny(attention="sdpa")).eval()
    manual = GPT(tiny(attention="manual")).eval()
    manual.load_state_dict(sdpa.state_dict())
    idx = torch.randint(0, 64, (4, T))
    diff = (sdpa(idx)[0] - manual(idx)[0]).abs().max().item()
    assert diff <= 1e-5


def test_lm_head_is_tied_to_token_embedding():
    model = GPT(tiny())
    assert model.lm_head.weight is model.transformer.wte.weight
    # the shared matrix is counted once
    with_duplicates = sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
    assert model.num_params() == with_duplicates - 64 * 16


def test_gpt2_init_scales_residual_projections():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=256, block_size=32, n_layer=8, n_head=4, n_embd=256))
    block = model.transformer.h[0]
    for w in (block.mlp.c_fc.weight, block.attn.c_attn.weight, model.transformer.wte.weight, model.transformer.wpe.weight):
        assert abs(w.std().item() - 0.02) < 0.002
    for w in (block.mlp.c_proj.weight, block.attn.c_proj.weight):
        assert abs(w.std().item() - 0.02 / math.sqrt(16)) < 0.001
    assert all(b.abs().max() == 0 for n, b in model.named_parameters() if n.endswith(".bias") and "ln_" not in n)


def test_flops_per_token_for_gpt2_shape():
    # nanoGPT's MFU estimate for GPT-2 124M at T=1024: N = 123.65M non-embedding-table params,
    # 6N + 12*L*C*T = 741.9M + 113.2M FLOPs per token.
    with torch.device("meta"):
        model = GPT(GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768))
    assert model.num_params(non_embedding=True) == 123_653_376
    assert model.flops_per_token() == 6 * 123_653_376 + 12 * 12 * 768 * 1024


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(n_embd=30, n_head=4), "not divisible"),
        (dict(attention="flash3"), "attention"),
        (dict(dropout=1.5), "dropout"),
        (dict(n_layer=0), "n_layer"),
    ],
)
def test_invalid_config(kw, match):
    with pytest.raises(TinyGPTError, match=match):
        tiny(**kw)


def test_overfits_one_batch():
    torch.manual_seed(0)
    model = GPT(tiny(n_embd=32, n_head=4))
    x = torch.randint(0, 64, (4, 16))
    y = torch.roll(x, -1, dims=1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(300):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05


def test_kv_cache_prefill_and_steps_match_full_forward():
    model = GPT(tiny()).eval()
    idx = torch.randint(0, 64, (2, 12))
    full, _ = model(idx)
    cache = KVCache(n_layer=2, max_len=16, pad=torch.zeros(2, dtype=torch.long))
    first, _ = model(idx[:, :7], cache=cache)
    rest = [model(idx[:, t : t + 1], cache=cache)[0] for t in range(7, 12)]
    stepped = torch.cat([first, *rest], dim=1)
    assert cache.length == 12
    assert (stepped - full).abs().max().item() < 1e-5


def test_left_padding_is_invisible():
    """A left-padded row gives the logits it would give alone (pad tokens are masked out and
    positions start at its first real token)."""
    model = GPT(tiny(attention="manual")).eval()
    short = torch.randint(0, 64, (1, 5))
    alone, _ = model(short)
    padded = torch.cat([torch.full((1, 3), 7), short], dim=1)
    cache = KVCache(n_layer=2, max_len=8, pad=torch.tensor([3]))
    batched, _ = model(padded, cache=cache)
    assert (batched[:, 3:] - alone).abs().max().item() < 1e-5
