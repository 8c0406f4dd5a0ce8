"""Tokenizers of the Hugging Face `tokenizers` library: a byte-level BPE trained on your corpus
(kind `bpe`), or any tokenizer.json from the Hub or a folder (kind `hf`).

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
from collections.abc import Iterator
from pathlib import Path

from gpt.errors import TinyGPTError

EOT = "<|endoftext|>"
# the end-of-text names common tokenizers use, most specific first
_EOT_NAMES = (EOT, "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>")
MIN_VOCAB = 256 + 1  # every byte, and end-of-text


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


class TrainedBPE(HFTokenizer):
    """A byte-level BPE learnt from the corpus it tokenizes (`train_bpe`); the settings it was
    trained with stay in its dict form."""

    kind = "bpe"

    def __init__(
        self,
        json_text: str | None = None,
        vocab_size: int | None = None,
        train_docs: int | None = None,
        train_bytes: int | None = None,
    ):
        if json_text is None:
            raise TinyGPTError("a bpe tokenizer is trained when its data is prepared; prepare the data first (tinygpt prepare)")
        super().__init__(None, json_text)
        self.settings = {"train_docs": train_docs, "train_bytes": train_bytes}

    def to_dict(self) -> dict:
        return {"kind": self.kind, "json_text": self.json_text, "vocab_size": self.vocab_size, **self.settings}


def training_sample(documents: Iterator[str], train_docs: int | None, train_bytes: int | None) -> list[str]:
    """The first `train_docs` documents / `train_bytes` bytes, taken from the iterator (the rest
    stays in it): the merges settle long before a large corpus ends, and only the sample is held
    in memory."""
    sample, size = [], 0
    while not (train_docs and len(sample) >= train_docs) and not (train_bytes and size >= train_bytes):
        doc = next(documents, None)
        if doc is None:
            break
        sample.append(doc)
        size += len(doc.encode("utf-8"))
    return sample


def train_bpe(sample: list[str], vocab_size: int, train_docs: int | None = None, train_bytes: int | None = None) -> TrainedBPE:
    """A byte-level BPE of `vocab_size` tokens with an end-of-text token, trained on `sample`
    (the settings that chose the sample are recorded with it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < MIN_VOCAB:
        raise TinyGPTError(
            f"data.tokenizer.vocab_size={vocab_size} is too small: a byte-level BPE needs >= {MIN_VOCAB} (256 bytes + end-of-text)"
        )
    if not any(sample):
        raise TinyGPTError("the BPE training sample is empty; check data.source and data.tokenizer.train_docs / train_bytes")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's split: words with their leading space
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte, seen in the sample or not: any text encodes
        show_progress=False,
    )
    tok.train_from_iterator(sample, trainer)
    return TrainedBPE(tok.to_str(), vocab_size, train_docs, train_bytes)


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
