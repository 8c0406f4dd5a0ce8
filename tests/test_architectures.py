"""Architectures: attention against a NumPy reference, positional encodings, grouped-query
attention, the recurrent baselines' equations, and every architecture through the entry points.
Run: pytest tests/test_architectures.py"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import TINY_RUN, run_script
from gpt import checkpoint
from gpt.generation import Decoder, SamplingConfig
from gpt.model import GPT, CausalSelfAttention, GPTConfig, apply_rope, rope_tables, sinusoidal_table
from gpt.rnn import RecurrentLM, RNNConfig


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


def test_sinusoidal_table_is_the_closed_form():
    table = sinusoidal_table(50, 16)
    for pos in (0, 1, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert math.isclose(table[pos, 2 * i].item(), math.sin(angle), abs_tol=1e-6)
            assert math.isclose(table[pos, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-6)


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
    cfgs = [SamplingConfig(max_new_tokens=30, temperature=0.0, use_cache=c) for c in (True, False)]
    runs = [Decoder(model, [[1, 2, 3], [4]], c, [0, 0]) for c in cfgs]
    assert torch.equal(*[torch.stack([d.step() for _ in range(30)]) for d in runs])


def test_grouped_query_attention_equals_mha_with_shared_heads():
    torch.manual_seed(0)
    gqa = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=4, n_kv_head=2, n_embd=16)).eval()
    mha = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=4, n_embd=16)).eval()
    state = gqa.state_dict()
    for name in [n for n in state if n.endswith("c_attn.weight") or n.endswith("c_attn.bias")]:
        q, k, v = state[name].split([16, 8, 8])
        d = 4  # head_dim; kv head j serves query heads 2j and 2j+1
        widen = lambda t: t.view(2, d, *t.shape[1:]).repeat_interleave(2, dim=0).reshape(16, *t.shape[1:])  # noqa: E731
        state[name] = torch.cat([q, widen(k), widen(v)])
    mha.load_state_dict(state)
    idx = torch.randint(0, 32, (2, 8))
    assert torch.allclose(gqa(idx)[0], mha(idx)[0], atol=1e-5)
    assert gqa.transformer.h[0].attn.c_attn.weight.shape == (32, 16)  # K and V take half the space


def _hand_step(arch, x, h, c, w_ih, w_hh, b_ih, b_hh):
    """The textbook equations, written independently of gpt/rnn.py."""
    sig = torch.sigmoid
    if arch == "rnn":
        return torch.tanh(w_ih @ x + b_ih + w_hh @ h + b_hh), None
    H = h.numel()
    Wi, Wh = w_ih.view(-1, H, x.numel()), w_hh.view(-1, H, H)
    bi, bh = b_ih.view(-1, H), b_hh.view(-1, H)
    gate = lambda n, act: act(Wi[n] @ x + bi[n] + Wh[n] @ h + bh[n])  # noqa: E731
    if arch == "lstm":
        i, f, g, o = gate(0, sig), gate(1, sig), gate(2, torch.tanh), gate(3, sig)
        c = f * c + i * g
        return o * torch.tanh(c), c
    r, z = gate(0, sig), gate(1, sig)
    n = torch.tanh(Wi[2] @ x + bi[2] + r * (Wh[2] @ h + bh[2]))
    return (1 - z) * n + z * h, None


@pytest.mark.parametrize("arch", ["rnn", "lstm", "gru"])
@pytest.mark.parametrize("impl", ["fused", "explicit"])
def test_recurrent_step_equals_its_equations(arch, impl):
    torch.manual_seed(0)
    model = RecurrentLM(RNNConfig(arch=arch, vocab_size=10, n_layer=1, n_embd=6, n_hidden=5, impl=impl)).eval()
    w = [getattr(model.rnn, f"{n}_l0").detach() for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    x = model.embedding.weight[3].detach()
    h0, c0 = torch.randn(5), torch.randn(5)
    from gpt.rnn import RNNState

    state = RNNState(h0.view(1, 1, 5), c0.view(1, 1, 5) if arch == "lstm" else None)
    logits, _ = model(torch.tensor([[3]]), cache=state)
    h1, c1 = _hand_step(arch, x, h0, c0, *w)
    assert torch.allclose(state.h.view(5), h1, atol=1e-6)
    if arch == "lstm":
        assert torch.allclose(state.c.view(5), c1, atol=1e-6)
    # y_t = V h_t (+ bias): the logits come from the new hidden state
    assert torch.allclose(logits.view(10), model.lm_head.weight @ h1 + model.lm_head.bias, atol=1e-5)


@pytest.mark.parametrize("arch", ["rnn", "lstm", "gru"])
def test_fused_and_explicit_recurrences_agree_over_a_sequence(arch):
    torch.manual_seed(0)
    fused = RecurrentLM(RNNConfig(arch=arch, vocab_size=10, n_layer=2, n_embd=6, n_hidden=5)).eval()
    explicit = RecurrentLM(RNNConfig(arch=arch, vocab_size=10, n_layer=2, n_embd=6, n_hidden=5, impl="explicit")).eval()
    explicit.load_state_dict(fused.state_dict())
    idx = torch.randint(0, 10, (3, 9))
    assert torch.allclose(fused(idx)[0], explicit(idx)[0], atol=1e-5)


ARCH_RUNS = {
    "lstm": ["model=lstm", "model.n_hidden=16", "model.n_embd=8", "model.block_size=16"],
    "gru": ["model=gru", "model.n_hidden=16", "model.n_embd=8", "model.block_size=16"],
    "rnn": ["model=rnn", "model.n_hidden=16", "model.n_embd=8", "model.block_size=16", "model.n_layer=1"],
    "gpt-rope-gqa": [*TINY_RUN[:5], "model.pos_encoding=rope", "model.n_kv_head=1"],
    "gpt-sinusoidal-manual": [*TINY_RUN[:5], "model.pos_encoding=sinusoidal", "model.attention=manual"],
    "gpt-no-positions": [*TINY_RUN[:5], "model.pos_encoding=none"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ARCH_RUNS))
def test_architecture_trains_resumes_and_samples(name, tmp_path, data_root):
    root, data_overrides = data_root
    run_dir = tmp_path / "run"
    common = [*ARCH_RUNS[name], *data_overrides, "train.batch_size=4", "train.eval_iters=2", "train.eval_interval=4",
              "train.log_interval=2", "train.sample_tokens=10", f"hydra.run.dir={run_dir}"]
    first = run_script("train.py", [*common, "train.max_iters=4", "optim.decay_iters=8"], tmp_path, root)
    assert first.returncode == 0, first.stderr[-2000:]
    again = run_script("train.py", [*common, "train.max_iters=8", "optim.decay_iters=8"], tmp_path, root)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming from" in again.stdout and "at step 4" in again.stdout
    assert checkpoint.load(checkpoint.latest(run_dir))["step"] == 8
    sample = run_script("sample.py", [f"run_dir={run_dir}", "num_samples=2", "max_new_tokens=40", "prompt=ROMEO:"], tmp_path, root)
    assert sample.returncode == 0, sample.stderr[-2000:]
    assert sample.stdout.count("ROMEO:") == 2
