"""UTF-8 bytes as tokens (kind `byte`): any text round-trips, no vocabulary to fit."""

from __future__ import annotations


class ByteTokenizer:
    """UTF-8 bytes as tokens (0..255) and end-of-text as 256."""

    kind = "byte"
    eot_id = 256

    @property
    def vocab_size(self) -> int:
        return 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        # A model can emit bytes that do not form valid UTF-8: show U+FFFD instead of failing.
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def to_dict(self) -> dict:
        return {"kind": self.kind}
