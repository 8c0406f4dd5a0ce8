"""gpt/interop/gguf.py: GGUF export, read back by independent readers: transformers'
`from_pretrained(..., gguf_file=)` (its own GGUF reader and llama.cpp's layout undone by its own
code) gives tinygpt's logits for every family (gpt2, llama with and without a tied head and
GQA, qwen2, qwen3); the tokens in the file spell tinygpt's pieces for every tokenizer kind, and
transformers' tokenizer read from the file encodes text to tinygpt's ids; llama.cpp itself
(llama-cpp-python, when installed) tokenizes like tinygpt and greedy-decodes tinygpt's tokens.
The command and its refusals: tests/apps/test_export.py.
Run: pytest tests/interop/test_gguf.py"""

from __future__ import annotations

import random

import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the dev extra installs gguf")
transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers")

from gpt.chat.template import ChatTokenizer  # noqa: E402
from gpt.interop import gguf as export_gguf  # noqa: E402
from gpt.interop import hf  # noqa: E402
from gpt.model import GPT, GPTConfig  # noqa: E402
from gpt.tokenizers import ByteTokenizer, CharTokenizer, TiktokenTokenizer  # noqa: E402
from gpt.tokenizers.bpe import train_bpe  # noqa: E402
from helpers import SHARED_TEXT, TEXT  # noqa: E402

LLAMA = dict(norm="rmsnorm", mlp="swiglu", mlp_hidden=96, pos_encoding="rope", bias=False)
FAMILIES = {
    "gpt2": ("gpt2", dict(activation="gelu_tanh")),
    "gpt2_untied": ("gpt2", dict(activation="gelu_tanh", tie_embeddings=False)),
    "llama": ("llama", dict(LLAMA, tie_embeddings=False, n_kv_head=2)),  # GQA, untied head
    "llama_tied": ("llama", dict(LLAMA)),
    "qwen2": ("qwen2", dict(LLAMA, qkv_bias=True, tie_embeddings=False)),
    "qwen3": ("qwen3", dict(LLAMA, qk_norm=True, head_dim=32)),  # head_dim != n_embd / n_head
}


@pytest.fixture(scope="module")
def text() -> str:
    return SHARED_TEXT.read_text()[:100_000] if SHARED_TEXT.is_file() else TEXT


def _model(vocab_size: int, scale: float = 0.3, **kw) -> GPT:
    """Weights far from init (~0.3) and norm gains 1 +- 0.3: at init's 0.02 a wrong layout hides
    below the tolerance."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=vocab_size, n_layer=2, n_head=4, n_embd=64, block_size=32, **kw)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            gain = p.dim() == 1 and name.endswith("weight")  # LayerNorm / RMSNorm / QK-norm gains
            p.normal_(1.0, scale) if gain else p.normal_(0.0, scale)
    return model


def _transformers(path, c):
    """transformers' model from the file. Its GGUF config mapping leaves out two fields llama.cpp
    reads (gpt2's context_length -> n_positions, qwen3's key_length -> head_dim) and falls back to
    GPT-2's 1024 positions and Qwen3's 128-wide heads: given here as the model's."""
    extra = {"n_positions": c.block_size} if c.pos_encoding == "learned" else {"head_dim": c.head_dim} if c.qk_norm else {}
    return transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, **extra).eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_transformers_reads_every_family_with_tinygpt_logits(tmp_path, text, family):
    arch, kw = FAMILIES[family]
    tok = CharTokenizer.fit(text)
    model = _model(tok.vocab_size, **kw)
    idx = torch.tensor([tok.encode(text[:32]), tok.encode(text[100:132])])
    with torch.no_grad():
        ours = model(idx)[0]
    # f16 and q8_0 round each weight (by ~5e-4 and ~4e-3 of it); at these weights the logits run to
    # tens, so their bounds are relative: what they catch is a tensor written wrong, not rounding.
    scale = ours.abs().max().item()
    for quant, tol in (("f32", 1e-4), ("f16", 1e-2 * scale), ("q8_0", 0.15 * scale)):
        out, written = export_gguf.export(model, tok, tmp_path / f"{family}-{quant}.gguf", quant)
        assert written == arch
        with torch.no_grad():
            diff = (_transformers(out, model.config)(idx).logits - ours).abs().max().item()
        assert diff <= tol, (quant, diff)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(out)).tensors}
    assert types["token_embd.weight"] == "Q8_0" and types["output_norm.weight"] == "F32"


def test_a_vocabulary_padded_for_speed_is_cut_to_the_tokenizer(tmp_path, text):
    """model.vocab_multiple pads the tables (here to a multiple of 100); the file holds the tokenizer's rows."""
    tok = CharTokenizer.fit(text)
    model = _model(tok.vocab_size, **FAMILIES["llama"][1], vocab_multiple=100)
    assert model.transformer.wte.weight.size(0) == 100 > tok.vocab_size
    out, _ = export_gguf.export(model, tok, tmp_path / "m.gguf")
    shapes = {t.name: list(t.shape) for t in gguf.GGUFReader(str(out)).tensors}
    assert shapes["token_embd.weight"] == [64, tok.vocab_size] == shapes["output.weight"]  # GGUF lists dims inner first
    idx = torch.tensor([tok.encode(text[:32])])
    with torch.no_grad():
        assert (_transformers(out, model.config)(idx).logits - model(idx)[0][..., : tok.vocab_size]).abs().max() <= 1e-4


def test_llama_s_rows_are_interleaved_as_llama_cpp_rotates_them(tmp_path, text, monkeypatch):
    """The planted mistake: q and k written in tinygpt's half-split order for the llama
    architecture (llama.cpp's llama rotates neighbouring channels) moves the logits far past 1e-4."""
    tok = CharTokenizer.fit(text)
    model = _model(tok.vocab_size, **FAMILIES["llama"][1])
    monkeypatch.setattr(export_gguf, "_interleave_halves", lambda w, heads: w)
    out, _ = export_gguf.export(model, tok, tmp_path / "m.gguf")
    idx = torch.tensor([tok.encode(text[:32])])
    with torch.no_grad():
        assert (_transformers(out, model.config)(idx).logits - model(idx)[0]).abs().max() > 1e-2


def _tokenizers(text, request, only: str | None = None) -> dict:
    """Every kind (or `only` that one): GPT-2's ranks are asked for only where tiktoken's is built,
    so that the others run where the ranks are absent."""
    chars = CharTokenizer.fit(text + "é—")  # a 2- and a 3-byte character: byte symbols merged
    kinds = {"char": chars, "byte": ByteTokenizer(), "bpe": train_bpe([text], 400), "chat": ChatTokenizer(chars)}
    if only in (None, "tiktoken"):
        kinds["tiktoken"] = TiktokenTokenizer("gpt2", ranks_file=str(request.getfixturevalue("gpt2_ranks")))
    return kinds


def _piece(tok, i: int) -> bytes:
    """The bytes id i stands for, as each tokenizer knows them (a piece may be part of a character)."""
    base = getattr(tok, "base", tok)
    if isinstance(base, ByteTokenizer):
        return bytes([i])
    if isinstance(base, TiktokenTokenizer):
        return base.enc.decode_single_token_bytes(i)
    if isinstance(base, CharTokenizer):
        return base.chars[i].encode()
    from_unicode = {ch: b for b, ch in hf.bytes_to_unicode().items()}
    return bytes(from_unicode[ch] for ch in base.tok.id_to_token(i))  # a byte-level BPE's vocabulary


@pytest.mark.parametrize("kind", ["char", "byte", "bpe", "chat", "tiktoken"])
def test_the_file_s_tokens_spell_tinygpt_s_pieces(tmp_path, text, request, kind):
    """Every id's token in the file is the piece tinygpt decodes it to, in GPT-2's byte alphabet;
    end-of-text and the chat template's tokens are control tokens; a chat model carries its
    template and ends at <|end|>."""
    tok = _tokenizers(text, request, kind)[kind]
    model = _model(tok.vocab_size, scale=0.02, **FAMILIES["llama_tied"][1])
    out, _ = export_gguf.export(model, tok, tmp_path / "m.gguf")
    fields = gguf.GGUFReader(str(out)).fields
    value = lambda key: fields[key].contents()  # noqa: E731
    tokens, types = value("tokenizer.ggml.tokens"), value("tokenizer.ggml.token_type")
    assert len(tokens) == tok.vocab_size == len(types)
    from_unicode = {ch: b for b, ch in hf.bytes_to_unicode().items()}
    special = set(getattr(tok, "special_ids", ())) | ({tok.eot_id} if tok.eot_id is not None else set())
    for i, (token, type_) in enumerate(zip(tokens, types)):
        if i in special:
            assert type_ == export_gguf.CONTROL and token == (tok.decode([i]) or "<|endoftext|>"), i
        else:
            assert type_ == export_gguf.NORMAL and bytes(from_unicode[ch] for ch in token) == _piece(tok, i), i
    assert value("tokenizer.ggml.model") == "gpt2" and value("tokenizer.ggml.pre") == "gpt-2"
    assert value("tokenizer.ggml.add_bos_token") is False
    if kind == "chat":
        assert value("tokenizer.ggml.eos_token_id") == tok.end_id and "<|assistant|>" in value("tokenizer.chat_template")


@pytest.mark.parametrize("kind", ["bpe", "tiktoken"])
def test_transformers_tokenizer_from_the_file_encodes_as_tinygpt(tmp_path, text, request, kind):
    """A BPE's merges travel in the file: transformers' tokenizer built from it alone gives
    tinygpt's ids on 100 random pieces of the text. (Char and byte vocabularies carry a merge
    that never applies, which llama.cpp needs and transformers' reader refuses: for transformers
    their Hugging Face folder holds the tokenizer.)"""
    tok = _tokenizers(text, request, kind)[kind]
    model = _model(tok.vocab_size, scale=0.02, **FAMILIES["gpt2"][1])
    out, _ = export_gguf.export(model, tok, tmp_path / "m.gguf")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=out.name)
    rng = random.Random(0)
    for _ in range(100):
        start = rng.randrange(len(text) - 200)
        piece = text[start : start + rng.randrange(1, 200)]
        assert theirs(piece, add_special_tokens=False)["input_ids"] == tok.encode(piece), piece


llama_cpp = None
try:  # llama-cpp-python builds llama.cpp from source (minutes): installed by hand, not by the dev extra
    import llama_cpp
except ImportError:
    pass


@pytest.mark.skipif(llama_cpp is None, reason="llama.cpp's check needs llama-cpp-python: pip install llama-cpp-python")
@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2", "qwen3"])
def test_llama_cpp_tokenizes_and_decodes_as_tinygpt(tmp_path, text, request, family):
    """llama.cpp itself: the file loads, its tokenizer gives tinygpt's ids for every kind, and
    16 greedy tokens from an f16 file equal tinygpt's."""
    arch, kw = FAMILIES[family]
    for kind, tok in _tokenizers(text, request).items():
        if kind == "chat":
            continue
        model = _model(tok.vocab_size, scale=0.02, **kw)
        out, _ = export_gguf.export(model, tok, tmp_path / f"{kind}.gguf", "f16")
        llm = llama_cpp.Llama(str(out), n_ctx=model.config.block_size, verbose=False, logits_all=False)
        piece = text[1000:1300]
        assert llm.tokenize(piece.encode(), add_bos=False, special=False) == tok.encode(piece), kind
    tok = CharTokenizer.fit(text)
    model = _model(tok.vocab_size, scale=0.1, **kw)
    out, _ = export_gguf.export(model, tok, tmp_path / "m.gguf", "f16")
    llm = llama_cpp.Llama(str(out), n_ctx=model.config.block_size, verbose=False)
    prompt = tok.encode(text[:8])
    theirs = []
    for t in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        theirs.append(t)
        if len(theirs) == 16:
            break
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(16):
            ids = torch.cat([ids, model(ids)[0][:, -1:].argmax(-1)], 1)
    assert theirs == ids[0, len(prompt) :].tolist()
