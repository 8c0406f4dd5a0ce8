"""Tokenizers: round trips, dict form, unknown characters. Run: pytest tests/test_tokenizer.py"""

import json

import pytest

from gpt.errors import TinyGPTError
from gpt.tokenizers import ByteTokenizer, CharTokenizer, TiktokenTokenizer, tokenizer_from_dict, tokenizer_identity
from helpers import write_ranks


def test_char_round_trip_and_sorted_alphabet():
    text = "To be, or not to be: that is the question.\n"
    tok = CharTokenizer.fit(text)
    assert tok.chars == sorted(set(text))
    assert tok.decode(tok.encode(text)) == text
    assert tok.vocab_size == len(set(text))


def test_dict_form_rebuilds_identical_tokenizer():
    tok = CharTokenizer.fit("hello world\n")
    again = tokenizer_from_dict(tok.to_dict())
    assert again.encode("world hello") == tok.encode("world hello")


def test_unknown_characters_are_named():
    tok = CharTokenizer.fit("abc")
    with pytest.raises(TinyGPTError, match="'z'"):
        tok.encode("abz")


def test_unknown_kind_in_dict():
    with pytest.raises(TinyGPTError, match="unknown tokenizer kind"):
        tokenizer_from_dict({"kind": "sentencepiece"})


# --- byte and tiktoken --------------------------------------------------------------------------

UNICODE = "Ünïcödé ✓ — 日本語のテキスト, emoji 🦜🚀, Ελληνικά, العربية\n\ttabs and  spaces <|endoftext|>"


def test_byte_and_tiktoken_round_trip_arbitrary_unicode(tmp_path):
    for tok in (ByteTokenizer(), TiktokenTokenizer("gpt2", ranks_file=str(write_ranks(tmp_path / "r.tiktoken")))):
        ids = tok.encode(UNICODE)
        assert tok.decode(ids) == UNICODE
        assert tok.eot_id not in ids  # the literal "<|endoftext|>" in text is not the control token
        again = tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))  # as stored in meta / checkpoints
        assert again.encode(UNICODE) == ids and again.vocab_size == tok.vocab_size


def test_tiny_ranks_file_builds_a_working_encoding(tmp_path):
    tok = TiktokenTokenizer("gpt2", ranks_file=str(write_ranks(tmp_path / "r.tiktoken")))
    assert tok.vocab_size == 256 + 10 + 1 and tok.eot_id == 266
    ids = tok.encode("the band and the hand")
    assert tok.decode(ids) == "the band and the hand"
    assert len(ids) < len("the band and the hand")  # merges were applied


def test_real_gpt2_encoding(gpt2_ranks):
    by_name = TiktokenTokenizer("gpt2")  # from the seeded tiktoken cache
    by_file = TiktokenTokenizer("gpt2", ranks_file=str(gpt2_ranks))
    assert by_name.encode("Hello world") == by_file.encode("Hello world") == [15496, 995]
    assert by_name.vocab_size == 50257 and by_name.eot_id == 50256
    assert by_file.decode(by_file.encode(UNICODE)) == UNICODE


def test_unknown_encoding_and_offline_failure(tmp_path, monkeypatch):
    with pytest.raises(TinyGPTError, match="unknown"):
        TiktokenTokenizer("gpt5")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))
    import tiktoken.registry

    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    monkeypatch.setattr(tiktoken.load, "read_file", lambda url: (_ for _ in ()).throw(ConnectionError("offline")))
    with pytest.raises(TinyGPTError, match="ranks_file"):
        TiktokenTokenizer("cl100k_base")


def test_ranks_files_of_different_vocabularies_are_different_tokenizers(tmp_path):
    small = TiktokenTokenizer("gpt2", ranks_file=str(write_ranks(tmp_path / "small.tiktoken", extra_pairs=4)))
    large = TiktokenTokenizer("gpt2", ranks_file=str(write_ranks(tmp_path / "large.tiktoken", extra_pairs=10)))
    assert tokenizer_identity(small.to_dict()) != tokenizer_identity(large.to_dict())
    moved = dict(small.to_dict(), ranks_file=str(tmp_path / "elsewhere.tiktoken"))
    with pytest.raises(TinyGPTError, match="provide that ranks file|cannot load"):
        tokenizer_from_dict(moved)  # never silently replaced by another vocabulary


def test_a_char_vocabulary_not_yet_fitted_is_described_without_a_count():
    """Refusals compare a run's tokenizer with settings whose alphabet is not read yet: 'char',
    not 'char (0 characters)'."""
    from gpt.tokenizers import describe

    assert describe({"kind": "char"}) == "char"
    assert describe({"kind": "char", "chars": "abc"}) == "char (3 characters)"


def test_two_bpes_of_the_same_settings_say_that_their_merges_differ():
    """A BPE fitted again on a changed corpus prints as the old one did ('bpe (300 tokens)'): a
    refusal of the pair says what does differ (the merges, by their tokenizer.json's hash) and
    how to get them back, not 'bpe (300 tokens) vs bpe (300 tokens)'."""
    from gpt.tokenizers import difference, require_same
    from gpt.tokenizers.bpe import train_bpe

    text = ["the quick brown fox jumps over the lazy dog " * 20]
    old, new = train_bpe(text, 270).to_dict(), train_bpe([*text, "zebra quartz " * 30], 270).to_dict()
    said = difference(old, new)
    assert "other merges" in said and "put the text back as it was" in said, said
    assert said.count("bpe (270 tokens)") == 1
    with pytest.raises(TinyGPTError, match="other merges .tokenizer.json sha256 [0-9a-f]{12} vs [0-9a-f]{12}"):
        require_same(old, new, "the checkpoint's tokenizer differs from this data's", "fix")
