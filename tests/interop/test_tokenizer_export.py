"""Every tokenizer kind exports a transformers tokenizer (gpt/interop/hf.py write_tokenizer):
`AutoTokenizer.from_pretrained(export)` encodes 200 random pieces of the training text to
tinygpt's ids and decodes them back, for char, byte, tiktoken (GPT-2's ranks), a trained BPE and a
Hugging Face tokenizer.json; with the chat template, `apply_chat_template` gives tinygpt's ids on
50 random conversations. The model is the quickstart's block (its export carries modeling code,
hence trust_remote_code=True, as a user loads it).
Run: pytest tests/interop/test_tokenizer_export.py"""

from __future__ import annotations

import random

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers")

from gpt import interop  # noqa: E402
from gpt.chat.template import ChatTokenizer  # noqa: E402
from gpt.model import GPT, GPTConfig  # noqa: E402
from gpt.tokenizers import ByteTokenizer, CharTokenizer, TiktokenTokenizer  # noqa: E402
from gpt.tokenizers.bpe import train_bpe  # noqa: E402
from gpt.tokenizers.hf import HFTokenizer  # noqa: E402
from helpers import SHARED_TEXT, TEXT, random_conversation, template_ids  # noqa: E402

KINDS = ["char", "byte", "tiktoken", "bpe", "hf"]


@pytest.fixture(scope="module")
def text() -> str:
    """The training text: the real Tiny Shakespeare when it is there, else the stand-in."""
    return SHARED_TEXT.read_text()[:200_000] if SHARED_TEXT.is_file() else TEXT


def _hf_tokenizer(text: str) -> HFTokenizer:
    """A WordPiece-free, non-byte-level tokenizer.json as people bring from the Hub: BPE over
    Metaspace pieces with an unknown token, trained here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<|endoftext|>"]))
    return HFTokenizer(json_text=tok.to_str())


def _base(kind: str, text: str, request):
    if kind == "char":
        return CharTokenizer.fit(text)
    if kind == "byte":
        return ByteTokenizer()
    if kind == "tiktoken":
        return TiktokenTokenizer("gpt2", ranks_file=str(request.getfixturevalue("gpt2_ranks")))
    if kind == "bpe":
        return train_bpe([text], 400)
    return _hf_tokenizer(text)


def _export(tok, out):
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16)
    model = GPT(config.changed(norm="rmsnorm", pos_encoding="rope", qk_norm=True, bias=False))
    interop.export(model, tok, out)
    return transformers.AutoTokenizer.from_pretrained(str(out), trust_remote_code=True)


@pytest.mark.parametrize("chat", [False, True], ids=["plain", "chat"])
@pytest.mark.parametrize("kind", KINDS)
def test_the_exported_tokenizer_gives_tinygpts_ids(kind, chat, text, tmp_path, request):
    base = _base(kind, text, request)
    tok = ChatTokenizer(base) if chat else base
    hf = _export(tok, tmp_path / "hf")
    rng = random.Random(0)
    for _ in range(200):
        start = rng.randrange(len(text) - 300)
        piece = text[start : start + rng.randrange(1, 300)]
        ids = hf.encode(piece, add_special_tokens=False)
        assert ids == tok.encode(piece), piece
        if kind != "hf":  # Metaspace decoding drops a leading space of the piece, as it does for any such tokenizer
            assert hf.decode(ids) == piece
    if not chat:
        if kind in ("byte", "tiktoken", "bpe"):  # any text; end-of-text spelt out stays text
            odd = "héllo <|endoftext|> ✓"
            assert hf.encode(odd, add_special_tokens=False) == tok.encode(odd)
        return
    # (with a chat template, transformers reads special-token text as those tokens, since its
    # template is rendered as text; tinygpt never does: docs/chat.md says so)
    words = [w for w in text.split() if w.isalpha()][:2000]
    for _ in range(50):
        messages = random_conversation(rng, words)
        assert template_ids(hf.apply_chat_template(messages, tokenize=True)) == tok.render(messages)[0]
        asking = messages[:-1]
        assert template_ids(hf.apply_chat_template(asking, tokenize=True, add_generation_prompt=True)) == tok.prompt(asking)
