"""Any tokenizer.json of the Hugging Face `tokenizers` library, from the Hub or a folder (kind
`hf`); the byte-level BPE trained on a corpus (kind `bpe`, gpt.tokenizers.bpe) is one too.

Both keep the whole tokenizer.json in their dict form, so prepared data, every checkpoint and an
export carry the exact tokenizer and nothing else is needed to sample, evaluate or export. The
merges are learnt by the library's Rust trainer (parallel, deterministic for a given sample);
nothing here re-implements BPE.

Text is encoded as ordinary text: "<|endoftext|>" spelt out in a document is seven ordinary
pieces, never the end-of-text id (as with tiktoken), so a corpus cannot forge document ends.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from gpt.errors import TinyGPTError

EOT = "<|endoftext|>"
# the end-of-text names common tokenizers use, most specific first
_EOT_NAMES = (EOT, "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>")


class HFTokenizer:
    """Any tokenizer.json: by Hub name or local folder (`name`), or from its JSON text."""

    kind = "hf"

    def __init__(self, name: str | None = None, json_text: str | None = None):
        self.name = name
        self._with_specials = None
        self.json_text = json_text if json_text is not None else _fetch(name)
        self.tok = _parse(self.json_text, name or "the tokenizer")
        self.tok.encode_special_tokens = True  # ordinary text never turns into a control token
        self.eot_id = next((i for i in map(self.tok.token_to_id, _EOT_NAMES) if i is not None), None)
        spec = json.loads(self.json_text).get("pre_tokenizer") or {}
        self.byte_level = "ByteLevel" in {spec.get("type")} | {p.get("type") for p in spec.get("pretokenizers", [])}

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def encode_with_specials(self, text: str) -> list[int]:
        """Text that spells special tokens as those tokens: for what a chat template writes,
        never for what a user wrote (gpt.chat.hf_template)."""
        if getattr(self, "_with_specials", None) is None:
            self._with_specials = _parse(self.json_text, self.name or "the tokenizer")  # encode_special_tokens off
        return self._with_specials.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False)  # broken UTF-8 pieces become U+FFFD

    def piece_bytes(self, i: int) -> int:
        """UTF-8 bytes token i stands for (0 for end-of-text): a byte-level token's characters are
        one byte each; other tokenizers' pieces are measured decoded."""
        if i == self.eot_id:
            return 0
        piece = self.tok.id_to_token(i) or ""
        if self.byte_level:
            return len(piece)
        if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", piece):  # SentencePiece's byte fallback: one byte
            return 1
        return len(piece.replace("\u2581", " ").encode("utf-8"))  # ▁ is the space before a word

    def to_dict(self) -> dict:
        return {"kind": self.kind, "name": self.name, "json_text": self.json_text, "vocab_size": self.vocab_size}


def _fetch(name: str | None) -> str:
    """tokenizer.json's text from a local folder (or file), else from the Hub."""
    if not name:
        raise TinyGPTError("data.tokenizer.name is required for kind=hf: a Hub id (gpt2) or a folder with tokenizer.json")
    path = Path(name).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
        if not path.is_file():
            raise TinyGPTError(f"{path.parent} has no tokenizer.json; point data.tokenizer.name at a folder that has one")
    if path.is_file():
        return path.read_text(encoding="utf-8")
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(name, "tokenizer.json")).read_text(encoding="utf-8")
    except Exception as e:  # the hub client raises its own errors for offline, missing repo, missing file
        raise TinyGPTError(
            f"cannot get tokenizer {name!r} from the Hugging Face Hub ({type(e).__name__}); offline, download its "
            f"tokenizer.json once with network or pass data.tokenizer.name=<a folder holding tokenizer.json>"
        ) from None


def _parse(json_text: str, where: str):
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_str(json_text)
    except Exception as e:  # the Rust side reports parse errors as plain Exceptions
        raise TinyGPTError(
            f"{where} is not a tokenizer.json the tokenizers library reads ({str(e).splitlines()[0][:120]})"
        ) from None
