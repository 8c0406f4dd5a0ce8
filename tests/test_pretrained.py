"""gpt/pretrained.py: GPT-2 weights in and out in Hugging Face's format, checked against
transformers' own GPT2LMHeadModel. Run: pytest tests/test_pretrained.py"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers")
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from gpt.errors import TinyGPTError  # noqa: E402
from gpt.model import GPT, GPTConfig  # noqa: E402
from gpt.pretrained import export_hf, load_hf_gpt2  # noqa: E402
from gpt.tokenizer import CharTokenizer, TiktokenTokenizer  # noqa: E402


def _random_hf(vocab=64, activation="gelu_new") -> GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=vocab,
        n_positions=16,
        n_embd=32,
        n_layer=2,
        n_head=4,
        activation_function=activation,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # non-trivial biases and norms, so a transposition mistake shows
        for name, p in model.named_parameters():
            if "bias" in name or "ln_" in name:
                p.normal_(0, 0.1)
    return model


@pytest.mark.parametrize("safetensors", [True, False])
def test_hf_gpt2_loads_with_identical_logits(tmp_path, safetensors):
    hf = _random_hf()
    hf.save_pretrained(tmp_path, safe_serialization=safetensors)
    ours, tokenizer = load_hf_gpt2(str(tmp_path))
    assert tokenizer is None  # a 64-token vocabulary is not GPT-2's
    assert ours.config.activation == "gelu_tanh" and ours.config.n_head == 4
    idx = torch.randint(0, 64, (3, 16))
    with torch.no_grad():
        diff = (ours.eval()(idx)[0] - hf(idx).logits).abs().max().item()
    assert diff <= 1e-5


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
def test_export_loads_in_transformers_with_identical_logits(tmp_path, activation):
    torch.manual_seed(0)
    ours = GPT(GPTConfig(vocab_size=65, block_size=16, n_layer=2, n_head=2, n_embd=32, activation=activation)).eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if "bias" in name:
                p.normal_(0, 0.1)
    export_hf(ours, CharTokenizer([chr(32 + i) for i in range(65)]), tmp_path)
    hf = GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    idx = torch.randint(0, 65, (3, 16))
    with torch.no_grad():
        assert (ours(idx)[0] - hf(idx).logits).abs().max().item() <= 1e-5
    back, tokenizer = load_hf_gpt2(str(tmp_path))  # our own export comes back with its tokenizer
    assert tokenizer["kind"] == "char" and torch.equal(back(idx)[0], ours(idx)[0])


def test_gpt2_tokenizer_files_match_tiktoken(tmp_path, gpt2_ranks):
    from transformers import GPT2Tokenizer

    tok = TiktokenTokenizer("gpt2")
    export_hf(GPT(GPTConfig(vocab_size=50257, block_size=8, n_layer=1, n_head=1, n_embd=8)), tok, tmp_path)
    hf_tok = GPT2Tokenizer.from_pretrained(tmp_path)
    text = "Hello world! To be, or not to be: that is the question.\n  Ünïcödé 日本語 🦜 1234"
    assert hf_tok.encode(text) == tok.encode(text)
    assert hf_tok.eos_token_id == 50256


def test_export_refuses_what_gpt2_cannot_hold(tmp_path):
    rope = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8, pos_encoding="rope"))
    with pytest.raises(TinyGPTError, match="learned positions"):
        export_hf(rope, CharTokenizer(list("abcdefghijklmnop")), tmp_path)


def test_offline_gpt2_download_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(TinyGPTError, match="cannot download gpt2.*config.json"):
        load_hf_gpt2("gpt2")


def test_hub_layout_with_unprefixed_keys_and_mask_buffers(tmp_path):
    """The files on the Hub for gpt2 predate transformers' current layout: keys without the
    `transformer.` prefix, attention-mask buffers, pytorch_model.bin."""
    hf = _random_hf()
    state = {}
    for key, value in hf.state_dict().items():
        if key == "lm_head.weight":
            continue
        state[key.removeprefix("transformer.")] = value
    for i in range(2):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 16, 16))
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state, tmp_path / "pytorch_model.bin")
    hf.config.to_json_file(tmp_path / "config.json")
    ours, _ = load_hf_gpt2(str(tmp_path))
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        assert (ours.eval()(idx)[0] - hf(idx).logits).abs().max().item() <= 1e-5
