"""Tokenizers: round trips, dict form, unknown characters. Run: pytest tests/test_tokenizer.py"""

import pytest

from gpt.errors import TinyGPTError
from gpt.tokenizer import CharTokenizer, tokenizer_from_dict


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
