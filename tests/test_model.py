"""gpt/model/: shapes, causality, attention against a NumPy reference of the formulas,
positional encodings, grouped-query attention, weight tying, init, parameter counts, KV cache.
Run: pytest tests/test_model.py"""

import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gpt.config import SamplingSettings
from gpt.errors import TinyGPTError
from gpt.generation import Decoder
from gpt.model import GPT, CausalSelfAttention, GPTConfig, KVCache, apply_rope, rope_tables, sinusoidal_table
from gpt.runtime import devices


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


@pytest.mark.parametrize("T, fp32", [(8, True), (255, True), (256, False)])
def test_short_attention_runs_in_fp32_under_cpu_bf16_autocast(T, fp32):
    """torch's CPU flash attention is slow in bf16 at short lengths: below 256 query positions (a
    CPU runtime's setting, CPU_FP32_ATTENTION_BELOW) it runs on the upcast inputs (a bf16 result, as
    autocast would give), from 256 on as autocast says."""
    from gpt.model import attention
    from gpt.runtime.devices import CPU_FP32_ATTENTION_BELOW as below

    g = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(2, 4, T, 32, generator=g).bfloat16() for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = attention._sdpa(q, k, v, below=below, is_causal=True)
    in_fp32 = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True).bfloat16()
    in_bf16 = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, in_fp32 if fp32 else in_bf16) and not torch.equal(in_fp32, in_bf16)
    assert torch.equal(attention._sdpa(q, k, v, below=below, is_causal=True), in_bf16)  # no autocast: as given


def test_the_model_under_cpu_bf16_autocast_attends_in_fp32_and_computes_in_bf16(monkeypatch):
    """The attention layer goes through that rule: a training forward of the quickstart's block
    under CPU bf16 autocast hands fp32 queries, keys and values to torch's SDPA, its matmuls bf16."""
    from gpt.model import attention

    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((q.dtype, k.dtype, v.dtype))
        return real(q, k, v, **kw)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    model = GPT(tiny(norm="rmsnorm", pos_encoding="rope", qk_norm=True, bias=False))
    devices.Runtime(torch.device("cpu"), torch.bfloat16, compile=False).tune(model)  # as training sets it
    x = torch.randint(0, 64, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = model(x, x)
        c_attn_out = model.transformer.h[0].attn.c_attn(torch.randn(2, 16, 16))
    loss.backward()
    assert seen == [(torch.float32,) * 3] * 2 and c_attn_out.dtype == torch.bfloat16 and torch.isfinite(loss)


def test_the_explicit_attention_path_gets_queries_and_keys_in_the_compute_dtype(monkeypatch):
    """Only the fused path upcasts: the explicit one (attention="manual", or attention maps) gets
    bf16 queries and keys under CPU bf16 autocast, where its matmuls compute anyway."""
    seen = []
    real = CausalSelfAttention._manual_attention

    def spy(self, q, k, v, mask=None):
        seen.append((q.dtype, k.dtype))
        return real(self, q, k, v, mask)

    monkeypatch.setattr(CausalSelfAttention, "_manual_attention", spy)
    model = GPT(tiny(norm="rmsnorm", pos_encoding="rope", qk_norm=True, bias=False, attention="manual"))
    x = torch.randint(0, 64, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = model(x, x)
    assert seen == [(torch.bfloat16, torch.bfloat16)] * 2 and torch.isfinite(loss)


def test_queries_and_keys_reach_fp32_attention_without_a_bf16_round_trip(monkeypatch):
    """Under CPU bf16 autocast, where attention runs in fp32, the QK-normed and rotated queries
    and keys stay fp32 from the norm on: not rounded to bf16 and cast back."""
    from gpt.model import attention

    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((q, k))
        return real(q, k, v, **kw)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    torch.manual_seed(0)
    model = GPT(tiny(norm="rmsnorm", pos_encoding="rope", qk_norm=True, bias=False))
    rt = devices.Runtime(torch.device("cpu"), torch.bfloat16, compile=False)
    rt.place(model)  # a CPU's setting: short attention in fp32 (CPU_FP32_ATTENTION_BELOW)
    x = torch.randint(0, 64, (2, 16))
    with rt.autocast():
        model(x, x)
    assert len(seen) == 2
    for q, k in seen:
        assert q.dtype == k.dtype == torch.float32
        assert not torch.equal(q, q.bfloat16().float()) and not torch.equal(k, k.bfloat16().float())


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
        model = GPT(GPTConfig(vocab_size=50257, vocab_multiple=1, block_size=1024, n_layer=12, n_head=12, n_embd=768))
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


@pytest.mark.parametrize("kw", [{}, dict(norm="rmsnorm", pos_encoding="rope", qk_norm=True, n_kv_head=1)])
def test_the_static_cache_steps_like_the_full_forward_with_padded_rows(kw):
    """The decoder's cache: a prompt then one-token steps, written by index at a tensor position,
    give each row the logits of its own full forward, a left-padded row included; its position
    lives on the device and advances by what each call stored."""
    from gpt.model.cache import StaticKVCache

    model = GPT(tiny(**kw)).eval()
    c = model.config
    idx = torch.randint(0, 64, (2, 12))
    idx[1, :3] = 0  # row 1 is 9 tokens after 3 padding columns
    cache = StaticKVCache(c.n_layer, c.n_kv_head, c.head_dim, 14, torch.tensor([0, 3]), torch.float32)
    first, _ = model(idx[:, :7], cache=cache)
    stepped = torch.cat([first, *(model(idx[:, t : t + 1], cache=cache)[0] for t in range(7, 12))], dim=1)
    assert int(cache.pos) == 12
    assert (stepped[:1] - model(idx[:1])[0]).abs().max().item() < 1e-5
    assert (stepped[1:, 3:] - model(idx[1:, 3:])[0]).abs().max().item() < 1e-5


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


# --- attention against the formulas, positional encodings, grouped-query attention -----------


def _numpy_attention(attn: CausalSelfAttention, x: np.ndarray) -> np.ndarray:
    """Causal multi-head softmax(QK^T / sqrt(d_k)) V, then the output projection, in NumPy."""
    W = attn.c_attn.weight.detach().double().numpy()
    b = attn.c_attn.bias.detach().double().numpy()
    Wo = attn.c_proj.weight.detach().double().numpy()
    bo = attn.c_proj.bias.detach().double().numpy()
    T, C = x.shape
    H, d = attn.n_head, C // attn.n_head
    Q, K, V = np.split(x @ W.T + b, 3, axis=1)  # Q = X Wq, K = X Wk, V = X Wv
    heads = []
    for h in range(H):
        q, k, v = (M[:, h * d : (h + 1) * d] for M in (Q, K, V))
        scores = q @ k.T / math.sqrt(d)
        scores[np.triu_indices(T, 1)] = -np.inf  # position t sees 0..t
        A = np.exp(scores - scores.max(axis=1, keepdims=True))
        A /= A.sum(axis=1, keepdims=True)
        heads.append(A @ v)
    return np.concatenate(heads, axis=1) @ Wo.T + bo  # concatenate heads, project


@pytest.mark.parametrize("impl", ["sdpa", "manual"])
def test_attention_matches_numpy_reference(impl):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=16, block_size=12, n_layer=1, n_head=4, n_embd=32, attention=impl)
    attn = CausalSelfAttention(cfg).eval()
    for p in attn.parameters():  # non-trivial biases too
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(1, 12, 32)
    ours = attn(x)[0].detach().double().numpy()
    assert np.abs(ours - _numpy_attention(attn, x[0].double().numpy())).max() < 1e-5


def test_attention_maps_are_causal_distributions():
    model = GPT(GPTConfig(vocab_size=16, block_size=10, n_layer=2, n_head=2, n_embd=16))
    maps = model.attention_maps(torch.randint(0, 16, (3, 10)))
    assert len(maps) == 2 and maps[0].shape == (3, 2, 10, 10)
    for A in maps:
        assert torch.allclose(A.sum(-1), torch.ones(3, 2, 10))
        assert torch.all(A.triu(1) == 0)
    assert all(not b.attn.capture and b.attn.last_weights is None for b in model.transformer.h)


@pytest.mark.parametrize("n_pos, dim", [(50, 16), (4096, 1024), (1024, 767)])
def test_sinusoidal_table_is_the_closed_form_to_float32_rounding(n_pos, dim):
    """Long positions and wide tables too: an angle computed in float32 is off by up to ~1e-4."""
    table = sinusoidal_table(n_pos, dim)
    for pos in (0, 1, 7, n_pos // 2 + 3, n_pos - 1):
        for i in (0, 1, dim // 4, (dim - 1) // 2):
            angle = pos / 10000 ** (2 * i / dim)
            assert math.isclose(table[pos, 2 * i].item(), math.sin(angle), abs_tol=6e-8)
            if 2 * i + 1 < dim:
                assert math.isclose(table[pos, 2 * i + 1].item(), math.cos(angle), abs_tol=6e-8)


def test_rope_tables_are_the_float32_angles_llama_was_trained_with():
    """cos/sin of p * theta^(-2i/d), the angle computed in float32 as Meta's and Hugging Face's
    Llama compute it (an imported model's logits are then bitwise transformers'): within float32
    rounding of the closed form for short contexts, and exactly float32's product for long ones."""
    cos, sin = rope_tables(4096, 128, 10000.0)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 128, 2).float() / 128))
    for pos in (0, 5, 2049, 4095):
        for i in (0, 1, 31, 63):
            angle = torch.tensor(float(pos)) * inv_freq[i]  # float32, as Llama
            assert cos[pos, i].item() == torch.cos(angle).item() and sin[pos, i].item() == torch.sin(angle).item()
            if pos < 64:
                assert math.isclose(cos[pos, i].item(), math.cos(pos * 10000.0 ** (-2 * i / 128)), abs_tol=2e-6)


def test_rope_scores_depend_only_on_relative_offset():
    cos, sin = rope_tables(64, 8, 10000.0)
    q, k = torch.randn(8), torch.randn(8)

    def score(m, n):
        rq = apply_rope(q.view(1, 1, 1, 8), cos[m], sin[m])
        rk = apply_rope(k.view(1, 1, 1, 8), cos[n], sin[n])
        return (rq * rk).sum().item()

    assert math.isclose(score(5, 2), score(25, 22), rel_tol=1e-5)
    assert math.isclose(score(9, 9), score(40, 40), rel_tol=1e-5)
    assert not math.isclose(score(5, 2), score(5, 4), rel_tol=1e-3)


@pytest.mark.parametrize("pos_encoding", ["rope", "sinusoidal", "none"])
def test_position_variants_are_causal_and_cache_exact(pos_encoding):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, block_size=12, n_layer=2, n_head=2, n_embd=16, pos_encoding=pos_encoding)).eval()
    assert ("wpe" in model.transformer) is False
    idx = torch.randint(0, 32, (2, 12))
    changed = idx.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 32
    assert torch.equal(model(idx)[0][:, :6], model(changed)[0][:, :6])
    cfgs = [SamplingSettings(max_new_tokens=30, temperature=0.0, kv_cache=c) for c in (True, False)]
    runs = [Decoder(model, [[1, 2, 3], [4]], c, [0, 0]) for c in cfgs]
    assert torch.equal(*[torch.stack([d.step() for _ in range(30)]) for d in runs])


def test_grouped_query_attention_equals_mha_with_shared_heads():
    torch.manual_seed(0)
    gqa = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=4, n_kv_head=2, n_embd=16)).eval()
    mha = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=4, n_embd=16)).eval()
    state = gqa.state_dict()
    d = 4  # head_dim; kv head j serves query heads 2j and 2j+1
    for name in [n for n in state if n.endswith("c_attn.weight") or n.endswith("c_attn.bias")]:
        q, k, v = state[name].split([16, 8, 8])
        widen = lambda t: t.view(2, d, *t.shape[1:]).repeat_interleave(2, dim=0).reshape(16, *t.shape[1:])  # noqa: E731
        state[name] = torch.cat([q, widen(k), widen(v)])
    mha.load_state_dict(state)
    idx = torch.randint(0, 32, (2, 8))
    assert torch.allclose(gqa(idx)[0], mha(idx)[0], atol=1e-5)
    assert gqa.transformer.h[0].attn.c_attn.weight.shape == (32, 16)  # K and V take half the space


# --- the block's options: each one's formula, and every one causal and cache-exact -------------

OPTIONS = {
    "rmsnorm": dict(norm="rmsnorm"),
    "swiglu": dict(mlp="swiglu"),
    "relu2": dict(mlp="relu2"),
    "qk_norm": dict(qk_norm=True, pos_encoding="rope"),
    "untied": dict(tie_embeddings=False),
    "no_bias": dict(bias=False),
    "softcap": dict(logit_softcap=3.0),
    "head_dim": dict(head_dim=4, n_head=2, n_kv_head=1, pos_encoding="rope"),
    "qkv_bias": dict(bias=False, qkv_bias=True),
    "llama": dict(norm="rmsnorm", mlp="swiglu", pos_encoding="rope", bias=False, tie_embeddings=False, n_kv_head=1),
    "modern": dict(norm="rmsnorm", mlp="relu2", pos_encoding="rope", bias=False, qk_norm=True, logit_softcap=15.0),
}


def _scrambled(model: GPT, std: float = 0.3) -> GPT:
    """Weights far from init (0.02 hides a wrong formula) and gains around 1."""
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(
                1 + 0.3 * torch.randn_like(p)
                if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight", "norm.weight"))
                else std * torch.randn_like(p)
            )
    return model


@pytest.mark.parametrize("option", list(OPTIONS))
def test_every_block_option_is_causal_and_exact_with_the_cache(option):
    model = _scrambled(GPT(tiny(**OPTIONS[option]))).eval()
    idx = torch.randint(0, 64, (2, 16))
    changed = idx.clone()
    changed[:, 9] = (changed[:, 9] + 1) % 64
    assert torch.equal(model(idx)[0][:, :9], model(changed)[0][:, :9])
    full, _ = model(idx)
    cache = KVCache(n_layer=2, max_len=16, pad=torch.zeros(2, dtype=torch.long))
    stepped = torch.cat([model(idx[:, :5], cache=cache)[0], *[model(idx[:, t : t + 1], cache=cache)[0] for t in range(5, 16)]], 1)
    assert (stepped - full).abs().max().item() < 1e-4 * full.abs().max().item()
    cfgs = [SamplingSettings(max_new_tokens=24, temperature=0.0, kv_cache=c) for c in (True, False)]
    runs = [Decoder(model, [[1, 2, 3], [4]], c, [0, 0]) for c in cfgs]
    assert torch.equal(*[torch.stack([d.step() for _ in range(24)]) for d in runs])


def test_rmsnorm_is_its_formula_computed_in_float32():
    from gpt.model import RMSNorm

    norm = RMSNorm(8, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 8))
    x = torch.randn(3, 8) * 5
    expected = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    assert torch.allclose(norm(x), expected, atol=1e-6)
    # bitwise the formula as the module spelled it before it called torch's fused kernel
    with torch.no_grad():
        spelled = norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
        assert torch.equal(norm(x), spelled)
    half = norm(x.bfloat16())  # normalised in float32, then cast back before the gain
    assert half.dtype == torch.float32 and torch.allclose(half, expected, atol=0.05)
    # torch's fused kernel computes it: its backward is the formula's too
    x.requires_grad_(True)
    upstream = torch.randn(3, 8)
    got = torch.autograd.grad((norm(x) * upstream).sum(), (x, norm.weight))
    formula = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    want = torch.autograd.grad((formula * upstream).sum(), (x, norm.weight))
    assert all(torch.allclose(g, w, atol=1e-5) for g, w in zip(got, want, strict=True))


def test_swiglu_and_relu2_are_their_formulas():
    torch.manual_seed(0)
    swiglu = GPT(tiny(mlp="swiglu", mlp_hidden=24)).transformer.h[0].mlp
    x = torch.randn(2, 5, 16)
    gate, up, down = swiglu.c_gate, swiglu.c_fc, swiglu.c_proj
    assert torch.allclose(swiglu(x), down(torch.nn.functional.silu(gate(x)) * up(x)), atol=1e-6)
    assert gate.weight.shape == up.weight.shape == (24, 16) and down.weight.shape == (16, 24)
    relu2 = GPT(tiny(mlp="relu2")).transformer.h[0].mlp
    assert torch.allclose(relu2(x), relu2.c_proj(torch.relu(relu2.c_fc(x)) ** 2), atol=1e-6)


def test_the_mlp_width_follows_llama_for_swiglu_unless_given():
    assert GPTConfig(n_embd=576, n_head=9, mlp="swiglu").mlp_hidden == 1536  # SmolLM2-135M
    assert GPTConfig(n_embd=4096, n_head=32, mlp="swiglu").mlp_hidden == 11008  # Llama 7B
    assert GPTConfig(n_embd=128, mlp="swiglu").mlp_hidden == 512 and GPTConfig(n_embd=128).mlp_hidden == 512
    assert GPTConfig(n_embd=128, mlp="swiglu", mlp_hidden=384).mlp_hidden == 384


def test_an_untied_head_is_its_own_matrix_and_counts():
    model = GPT(tiny(tie_embeddings=False))
    assert model.lm_head.weight is not model.transformer.wte.weight
    tied = GPT(tiny())
    assert model.num_params() == tied.num_params() + 64 * 16
    # non-embedding: without the position table and, untied, the token table (a lookup), but with
    # the head's matmul; tied, the one matrix is both: the same count
    assert model.num_params(non_embedding=True) == model.num_params() - 16 * 16 - 64 * 16 == tied.num_params(non_embedding=True)
    assert model.flops_per_token() == 6 * model.num_params(non_embedding=True) + 12 * 2 * 16 * 16


def test_softcap_bounds_the_logits_and_is_near_identity_for_small_ones():
    model = _scrambled(GPT(tiny(logit_softcap=2.0)), std=1.0).eval()
    logits, _ = model(torch.randint(0, 64, (2, 16)))
    assert 1.5 < logits.abs().max() <= 2.0  # saturating, never beyond
    plain = GPT(tiny()).eval()
    plain.load_state_dict(GPT(tiny(logit_softcap=1000.0)).state_dict())
    capped = GPT(tiny(logit_softcap=1000.0)).eval()
    capped.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 64, (1, 8))
    assert torch.allclose(plain(idx)[0], capped(idx)[0], atol=1e-5)


def test_qk_norm_makes_the_attention_weights_blind_to_the_inputs_scale():
    """With QK-norm every query and key has the norm's scale: multiplying the attention's input
    by 100 leaves its weights unchanged (and its output, V's, 100 times as large). Where it sits
    against RoPE is checked against transformers' Qwen3 (tests/test_interop.py)."""
    torch.manual_seed(0)
    cfg = tiny(qk_norm=True, pos_encoding="rope", bias=False, norm="rmsnorm")
    attn = _scrambled(GPT(cfg)).transformer.h[0].attn.eval()
    from gpt.model import rope_tables

    cos, sin = rope_tables(16, 8, 10000.0)
    rope = (cos[None, None, :8], sin[None, None, :8])
    x = torch.randn(1, 8, 16)
    y1, y100 = attn(x, rope=rope), attn(100 * x, rope=rope)
    # V scales by 100, the attention weights do not: the output is 100 times as large
    assert (100 * y1 - y100).abs().max() < 1e-5 * y100.abs().max()


def test_qkv_bias_alone_and_head_dim_shape_the_projections():
    attn = GPT(tiny(bias=False, qkv_bias=True, head_dim=4, n_head=2)).transformer.h[0].attn
    assert attn.c_attn.bias is not None and attn.c_proj.bias is None
    assert attn.c_attn.weight.shape == (3 * 2 * 4, 16) and attn.c_proj.weight.shape == (16, 8)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(norm="batchnorm"), "model.norm='batchnorm' is unknown; use one of layernorm, rmsnorm"),
        (dict(mlp="swiglu2"), "model.mlp='swiglu2' is unknown; use one of gelu, swiglu, relu2"),
        (dict(logit_softcap=0.0), "logit_softcap must be a number > 0"),
        (dict(norm_eps=-1.0), "norm_eps must be a number > 0"),
        (dict(mlp="swiglu", activation="gelu_tanh"), "activation=gelu_tanh picks mlp=gelu's GELU"),
        (dict(head_dim=3, pos_encoding="rope"), "head dimension 3 must be even"),
        (dict(qk_norm="yes"), "model.qk_norm must be true or false"),
    ],
)
def test_bad_block_options_are_one_line(kw, match):
    with pytest.raises(TinyGPTError, match=re.escape(match)):
        tiny(**kw)


def test_short_attention_runs_in_fp32_only_where_the_runtime_says_so(monkeypatch):
    """The model itself computes attention in the autocast dtype; a CPU runtime in bf16 sets its
    attention to fp32 below CPU_FP32_ATTENTION_BELOW positions (Runtime.tune), a float32 one
    changes nothing."""
    from gpt.model import attention
    from gpt.runtime.devices import CPU_FP32_ATTENTION_BELOW

    seen = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(
        attention.F, "scaled_dot_product_attention", lambda q, k, v, **kw: seen.append(q.dtype) or real(q, k, v, **kw)
    )
    model = GPT(tiny())
    x = torch.randint(0, 64, (1, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(x)
    assert set(seen) == {torch.bfloat16} and all(m.fp32_below == 0 for m in model.modules() if hasattr(m, "fp32_below"))
    devices.Runtime(torch.device("cpu"), torch.float32, compile=False).tune(model)
    assert all(m.fp32_below == 0 for m in model.modules() if hasattr(m, "fp32_below"))
    seen.clear()
    devices.Runtime(torch.device("cpu"), torch.bfloat16, compile=False).tune(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(x)
    assert set(seen) == {torch.float32} and model.transformer.h[0].attn.fp32_below == CPU_FP32_ATTENTION_BELOW
