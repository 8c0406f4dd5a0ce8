"""gpt/model/rnn.py: one step of each recurrent model equals its textbook equations, and the fused
kernels equal the explicit steps. Run: pytest tests/test_rnn.py"""

from __future__ import annotations

import pytest
import torch

from gpt.model.rnn import RecurrentLM, RNNConfig, RNNState


def _hand_step(arch, x, h, c, w_ih, w_hh, b_ih, b_hh):
    """The textbook equations, written independently of gpt/model/rnn.py."""
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


@pytest.mark.parametrize("arch", ["rnn", "lstm", "gru"])
@pytest.mark.parametrize("impl", ["fused", "explicit"])
def test_the_recurrence_runs_in_float32_under_bf16_autocast(arch, impl):
    """Under autocast the recurrence computes in float32 (cuDNN's RNNs would run in fp16 with no
    loss scaling, the explicit steps' matmuls in bf16): its outputs at every step, and the state
    it carries, equal those without autocast bit for bit; only the LM head runs in bf16. CUDA's
    own case: tests/test_cuda.py."""
    torch.manual_seed(0)
    model = RecurrentLM(RNNConfig(arch=arch, vocab_size=10, n_layer=2, n_embd=6, n_hidden=5, impl=impl)).eval()
    idx = torch.randint(0, 10, (3, 9))
    seen = []  # what the recurrence hands the LM head
    model.lm_head.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    plain, mixed = RNNState(), RNNState()
    model(idx, cache=plain)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(idx, targets=idx, cache=mixed)
    assert seen[1].dtype == torch.float32 and torch.equal(seen[1], seen[0])
    assert mixed.h.dtype == torch.float32 and torch.equal(mixed.h, plain.h)
    if arch == "lstm":
        assert mixed.c.dtype == torch.float32 and torch.equal(mixed.c, plain.c)
    assert logits.dtype == torch.bfloat16  # the head still takes autocast's speed-up
    loss.backward()  # and trains: float32 gradients, finite
    assert all(p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all() for p in model.rnn.parameters())


@pytest.mark.parametrize("arch", ["rnn", "lstm", "gru"])
@pytest.mark.parametrize("impl", ["fused", "explicit"])
def test_a_float64_recurrent_model_runs_in_float64(arch, impl):
    """model.double() (a gradient check, a numerics study) runs: the recurrence is at least
    float32, never cast down from the model's own float64."""
    torch.manual_seed(0)
    model = RecurrentLM(RNNConfig(arch=arch, vocab_size=10, n_layer=2, n_embd=6, n_hidden=5, impl=impl)).double()
    idx = torch.randint(0, 10, (2, 4))
    state = RNNState()
    logits, loss = model(idx, targets=idx, cache=state)
    assert logits.dtype == torch.float64 and loss.dtype == torch.float64 and state.h.dtype == torch.float64
    logits, _ = model(idx[:, :1], cache=state)  # and from its float64 state
    assert logits.dtype == torch.float64
    loss.backward()
    assert all(p.grad.dtype == torch.float64 for p in model.parameters())
