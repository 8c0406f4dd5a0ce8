"""A model whose vocabulary is padded (model.vocab_multiple) exports with the tokenizer's true
vocabulary in each format, transformers reproduces its logits, and no padded id is ever sampled.
Run: pytest tests/interop/test_padded_export.py"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers")

from gpt import interop  # noqa: E402
from gpt.config import SamplingSettings  # noqa: E402
from gpt.generation import generate  # noqa: E402
from gpt.model import GPT, GPTConfig  # noqa: E402
from gpt.tokenizers import ByteTokenizer  # noqa: E402

LLAMA = dict(norm="rmsnorm", mlp="swiglu", pos_encoding="rope", bias=False, tie_embeddings=False)
FORMATS = {
    "gpt2": dict(),  # GPT-2's block: GPT2LMHeadModel
    "llama": LLAMA,  # Llama's: LlamaForCausalLM
    "tinygpt": dict(LLAMA, qk_norm=True, mlp="relu2", logit_softcap=15.0),  # tinygpt's own modeling code
}


def _padded(block: dict) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=257, vocab_multiple=64, block_size=16, n_layer=2, n_head=2, n_embd=32, **block)
    model = GPT(config).eval()
    assert model.transformer.wte.weight.size(0) == 320
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "ln" in name or "norm" in name else 0.0, 0.3)
        # rows past the tokenizer's: were they exported or sampled, they would win every draw
        model.transformer.wte.weight[257:] = 50.0
        model.lm_head.weight[257:] = 50.0
    return model


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_padded_model_exports_its_true_vocabulary(fmt, tmp_path):
    model = _padded(FORMATS[fmt])
    out, cls = interop.export(model, ByteTokenizer(), tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=fmt == "tinygpt").eval()
    assert hf.config.vocab_size == 257 and hf.get_output_embeddings().weight.size(0) == 257
    idx = torch.randint(0, 257, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(idx)[0], hf(idx).logits
    assert ours.shape == theirs.shape == (2, 12, 257)
    assert (ours - theirs).abs().max().item() <= 1e-4


def test_a_padded_id_is_never_sampled(monkeypatch):
    from gpt.generation import decoder

    model = _padded(FORMATS["gpt2"])
    drawn, real = [], decoder.next_tokens
    monkeypatch.setattr(decoder, "next_tokens", lambda *a, **k: drawn.append(real(*a, **k)) or drawn[-1])
    generate(model, ByteTokenizer(), ["abc"] * 4, SamplingSettings(max_new_tokens=30, temperature=2.0, seed=0))
    assert len(drawn) == 30 and max(int(ids.max()) for ids in drawn) < 257
