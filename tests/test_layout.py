"""gpt/generation/layout.py: linear weights re-laid input-major for decoding on a CPU keep their
values, shapes and ties, and decode the same tokens; the commands that only decode (sample, chat,
serve) decode with them. The speed it buys is measured by benchmarks/generate_vs_hf.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from gpt.config import SamplingSettings
from gpt.config.model import RNNConfig
from gpt.generation import Decoder, input_major
from gpt.model import GPT, GPTConfig
from gpt.model.rnn import RecurrentLM
from helpers import relaid

GPT2 = dict(bias=True)
LLAMA = dict(bias=False, norm="rmsnorm", mlp="swiglu", pos_encoding="rope", n_kv_head=1, qk_norm=True, tie_embeddings=False)


def linear_weights(model: nn.Module) -> list[nn.Parameter]:
    unique = {id(m.weight): m.weight for m in model.modules() if isinstance(m, nn.Linear)}
    return list(unique.values())


def _decode(model, temperature: float, n: int = 24) -> torch.Tensor:
    cfg = SamplingSettings(max_new_tokens=n, temperature=temperature, kv_cache=True)
    dec = Decoder(model, [[1, 2, 3], [4, 5, 6, 7, 8]], cfg, seeds=[0, 1])  # two lengths: padding, a mask
    return torch.stack([dec.step() for _ in range(n)], dim=1)


@pytest.mark.parametrize("kw", [GPT2, LLAMA], ids=["gpt2", "llama"])
def test_relaid_weights_keep_values_and_ties_and_decode_the_same(kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=70, block_size=32, n_layer=2, n_head=2, n_embd=32, **kw)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(10)  # outputs that depend on the context (see test_generation._model)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    x = torch.randint(0, 70, (3, 20))
    with torch.no_grad():
        logits = model(x)[0]
        greedy, sampled = _decode(model, 0.0), _decode(model, 1.0)

    assert input_major(model) == len(linear_weights(model)) > 0
    assert relaid(model)
    for name, p in model.named_parameters():
        assert p.shape == before[name].shape and torch.equal(p, before[name]), name
    assert (model.lm_head.weight is model.transformer.wte.weight) == model.config.tie_embeddings
    with torch.no_grad():
        torch.testing.assert_close(model(x)[0], logits, rtol=1e-5, atol=1e-5)
        assert torch.equal(_decode(model, 0.0), greedy)
        assert torch.equal(_decode(model, 1.0), sampled)
    assert input_major(model) == 0  # laid out already: nothing to do


def test_a_recurrent_model_keeps_its_recurrence_and_relays_its_head():
    torch.manual_seed(0)
    model = RecurrentLM(RNNConfig(arch="lstm", vocab_size=50, n_embd=16, n_hidden=24)).eval()
    x = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        logits = model(x)[0]
        assert input_major(model) == len(linear_weights(model))
        torch.testing.assert_close(model(x)[0], logits, rtol=1e-5, atol=1e-5)
    assert relaid(model)


def test_weights_on_another_device_stay_as_they_are():
    model = GPT(GPTConfig(vocab_size=70, block_size=16, n_layer=1, n_head=2, n_embd=32)).to("meta")
    assert input_major(model) == 0
    assert all(w.is_contiguous() for w in linear_weights(model))
