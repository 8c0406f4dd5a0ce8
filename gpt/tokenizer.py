"""Tokenizers behind one small interface.

Every tokenizer serialises to a plain dict (`to_dict`) that is stored in each checkpoint, so that
sampling rebuilds exactly the tokenizer the model was trained with and needs nothing else.
"""

from __future__ import annotations

from typing import Protocol

from gpt.errors import TinyGPTError


class Tokenizer(Protocol):
    kind: str

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def to_dict(self) -> dict: ...


class CharTokenizer:
    """One token per character; the alphabet is fitted on the training text (sorted, so the
    same text always gives the same ids)."""

    kind = "char"

    def __init__(self, chars: list[str]):
        if len(set(chars)) != len(chars) or any(len(c) != 1 for c in chars):
            raise ValueError("chars must be distinct single characters")
        self.chars = list(chars)
        self._stoi = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def fit(cls, text: str) -> "CharTokenizer":
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def unknown_chars(self, text: str) -> list[str]:
        return sorted(set(text) - self._stoi.keys())

    def encode(self, text: str) -> list[int]:
        unknown = self.unknown_chars(text)
        if unknown:
            shown = ", ".join(repr(c) for c in unknown[:10])
            more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
            raise TinyGPTError(
                f"text has characters outside this char-level vocabulary: {shown}{more}; "
                f"use only the model's {self.vocab_size} known characters"
            )
        return [self._stoi[c] for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] for i in ids)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "chars": self.chars}


_KINDS = {"char": CharTokenizer}


def tokenizer_from_dict(d: dict) -> Tokenizer:
    kind = d.get("kind")
    if kind not in _KINDS:
        raise TinyGPTError(
            f"unknown tokenizer kind {kind!r} in checkpoint or metadata; known: {', '.join(_KINDS)}"
        )
    params = {k: v for k, v in d.items() if k != "kind"}
    return _KINDS[kind](**params)
