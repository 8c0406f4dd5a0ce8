"""gpt/tokenizers/hf.py: a byte-level BPE trained on the corpus (deterministic, lossless, its
end-of-text unforgeable) and any tokenizer.json; their preparation, checkpoints and export.
Run: pytest tests/test_hf_tokenizer.py"""

from __future__ import annotations

import json
import random

import pytest

from gpt.config import TokenizerSettings
from gpt.errors import TinyGPTError
from gpt.evals.perplexity import token_bytes
from gpt.tokenizers import tokenizer_from_dict, tokenizer_identity
from gpt.tokenizers.bpe import train_bpe, training_sample
from gpt.tokenizers.hf import EOT, HFTokenizer
from helpers import DOCS, TEXT, data_settings, load, write_corpus

TRICKY = [
    "日本語のテキスト、中文文本",
    "emoji 😀👍🏽 and flags 🇩🇪",
    "Grüße aus Köln: Äpfel, Öl, Übermaß, ß",
    "tabs\tand   runs of spaces\n\n\n  and\r\nwindows lines",
    "control \x00\x01 chars and a lone combining \u0301 mark",
    "<|endoftext|> spelt out, <|endoftext|>twice<|endoftext|>",
]


def _corpus(n_docs: int = 30) -> list[str]:
    """Seeded pseudo-words: enough distinct pairs for a few hundred merges."""
    rng = random.Random(1)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyzäöü") for _ in range(rng.randint(2, 8))) for _ in range(300)]
    return [" ".join(rng.choice(words) for _ in range(200)) + "." for _ in range(n_docs)] + TRICKY


def _trained(vocab: int = 400):
    return train_bpe(_corpus(), vocab)


def test_training_is_deterministic_and_sized():
    a, b = _trained(), _trained()
    assert a.json_text == b.json_text and a.vocab_size == b.vocab_size == 400
    assert len(json.loads(a.json_text)["model"]["merges"]) == 400 - 257  # 256 bytes + end-of-text + merges
    assert _trained(300).json_text != a.json_text


def test_any_text_round_trips_and_end_of_text_is_never_produced_by_text():
    tok = _trained()
    rng = random.Random(0)
    alphabet = [chr(c) for c in range(1, 0x2FFFF) if not 0xD800 <= c <= 0xDFFF]
    texts = TRICKY + ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(200)]
    for text in texts:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert tok.eot_id not in ids
        assert token_bytes(tok, ids) == len(text.encode("utf-8"))  # bits per byte counts real bytes
    assert tok.eot_id == 0 and tok.tok.id_to_token(0) == EOT


def test_a_sample_takes_the_first_documents_and_leaves_the_rest():
    docs = iter(["aaaa", "bbbb", "cccc", "dddd"])
    assert training_sample(docs, None, 6) == ["aaaa", "bbbb"] and next(docs) == "cccc"
    assert training_sample(iter(["x", "y", "z"]), 2, None) == ["x", "y"]


def test_bad_settings_are_one_line_errors(tmp_path):
    with pytest.raises(TinyGPTError, match="vocab_size=200 is too small for a byte-level BPE: use >= 257"):
        TokenizerSettings(kind="bpe", vocab_size=200)
    with pytest.raises(TinyGPTError, match="vocab_size applies to kind=bpe .*not kind=tiktoken"):
        TokenizerSettings(kind="tiktoken", vocab_size=1000)
    assert TokenizerSettings(kind="bpe").vocab_size == 8192
    with pytest.raises(TinyGPTError, match="training sample is empty"):
        train_bpe(["", ""], 300)
    with pytest.raises(TinyGPTError, match="has no tokenizer.json"):
        HFTokenizer(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    with pytest.raises(TinyGPTError, match="is not a tokenizer.json the tokenizers library reads"):
        HFTokenizer(str(tmp_path))


def test_an_unknown_hub_tokenizer_offline_says_how_to_provide_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(TinyGPTError) as e:
        HFTokenizer("someone/no-such-tokenizer")
    assert "\n" not in str(e.value) and "pass data.tokenizer.name=<a folder holding tokenizer.json>" in str(e.value)


def _bpe_data(tmp_path, root, **tokenizer):
    corpus = tmp_path / "corpus"
    if not corpus.exists():
        write_corpus(corpus, "txt")
    spec = {"kind": "bpe", "vocab_size": 300, **tokenizer}
    return data_settings("bpe", {"kind": "local", "path": str(corpus)}, spec)


def test_preparation_trains_once_and_retrains_when_its_settings_change(tmp_path):
    root = tmp_path / "root"
    data = load(_bpe_data(tmp_path, root), root)
    assert data.tokenizer.kind == "bpe" and data.tokenizer.vocab_size == 300
    stream = [int(t) for split in (data.train, data.val) for shard in split for t in shard]
    assert stream.count(data.tokenizer.eot_id) == len(DOCS)  # each document ends with end-of-text
    meta = root / "bpe" / "meta.json"
    stamp = meta.stat().st_mtime_ns
    again = load(_bpe_data(tmp_path, root), root)  # the same settings: reused, not retrained
    assert meta.stat().st_mtime_ns == stamp and again.tokenizer.json_text == data.tokenizer.json_text
    bigger = load(_bpe_data(tmp_path, root, vocab_size=320), root)
    assert bigger.tokenizer.vocab_size == 320 and meta.stat().st_mtime_ns != stamp
    stamp = meta.stat().st_mtime_ns
    fewer = load(_bpe_data(tmp_path, root, vocab_size=320, train_docs=2), root)  # another training sample
    assert meta.stat().st_mtime_ns != stamp and fewer.tokenizer.json_text != bigger.tokenizer.json_text
    # the tokenizer travels in its dict form: rebuilt from it, it is the same tokenizer
    rebuilt = tokenizer_from_dict(fewer.tokenizer.to_dict())
    assert rebuilt.encode(TEXT[:500]) == fewer.tokenizer.encode(TEXT[:500])
    assert tokenizer_identity(rebuilt.to_dict()) == tokenizer_identity(fewer.tokenizer.to_dict())
    assert tokenizer_identity(rebuilt.to_dict()) != tokenizer_identity(bigger.tokenizer.to_dict())


def test_a_tokenizer_json_folder_prepares_data(tmp_path):
    trained = _trained(350)
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(trained.json_text)
    corpus = write_corpus(tmp_path / "corpus", "txt")
    settings = data_settings("hf", {"kind": "local", "path": str(corpus)}, {"kind": "hf", "name": str(folder)})
    data = load(settings, tmp_path / "root")
    assert data.tokenizer.kind == "hf" and data.tokenizer.vocab_size == 350
    assert data.tokenizer.encode(DOCS[0]) == trained.encode(DOCS[0])


def test_a_hugging_face_folder_with_its_own_tokenizer_json_loads_with_it(tmp_path):
    """A GPT-2-architecture folder whose vocabulary is not GPT-2's (not exported by tinygpt):
    its tokenizer.json is the model's tokenizer."""
    transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers")
    from gpt.checkpoints import loading

    trained = _trained(300)
    cfg = transformers.GPT2Config(vocab_size=300, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text(trained.json_text)
    loaded = loading.load(str(tmp_path))
    assert loaded.tokenizer().encode(TRICKY[2]) == trained.encode(TRICKY[2])


def _sentencepiece_style(tmp_path):
    """A Llama-style tokenizer: Metaspace (▁ before words), byte fallback, a BOS template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    specials = ["<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tok.train_from_iterator(_corpus(), trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    folder = tmp_path / "sp"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    return HFTokenizer(str(folder))


def test_bytes_are_counted_right_for_a_sentencepiece_style_tokenizer(tmp_path):
    tok = _sentencepiece_style(tmp_path)
    for text in ("the cat sat on the mat", "naïve € 日本", "aber die Straße"):
        ids = tok.encode(text)
        # Metaspace puts a space before the first word, which decoding strips: the text's first
        # token counts it (evaluation never scores a text's first token: it is context only)
        assert token_bytes(tok, ids) == len(text.encode("utf-8")) + 1
        assert token_bytes(tok, ids[1:]) == len(text.encode("utf-8")) - len(tok.decode(ids[:1]).encode("utf-8"))


def test_an_exported_tokenizer_adds_no_special_tokens(tmp_path):
    """A BOS template in the tokenizer.json would shift every id AutoTokenizer gives: the export
    drops it (tinygpt never adds special tokens)."""
    transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers")
    from gpt.interop.hf import write_fast_tokenizer_files

    tok = _sentencepiece_style(tmp_path)
    write_fast_tokenizer_files(tok, tmp_path / "out", 64)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    for text in ("the cat sat", "naïve € 日本"):
        assert hf(text)["input_ids"] == tok.encode(text)
