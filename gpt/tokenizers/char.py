"""One token per character, the alphabet fitted on the corpus (kind `char`)."""

from __future__ import annotations

from gpt.errors import TinyGPTError


class CharTokenizer:
    """One token per character; the alphabet is fitted on the training text (sorted, so the
    same text always gives the same ids)."""

    kind = "char"
    eot_id = None

    def __init__(self, chars: list[str]):
        if len(set(chars)) != len(chars) or any(len(c) != 1 for c in chars):
            raise ValueError("chars must be distinct single characters")
        self.chars = list(chars)
        self._stoi = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def fit(cls, text: str) -> CharTokenizer:
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
