"""A byte-level BPE trained on the corpus it tokenizes (kind `bpe`), by the Hugging Face
`tokenizers` library's Rust trainer (parallel, deterministic for a given sample): nothing here
re-implements BPE. It keeps its whole tokenizer.json, as every `hf` tokenizer does."""

from __future__ import annotations

from collections.abc import Iterator

from gpt.errors import TinyGPTError
from gpt.tokenizers.hf import EOT, HFTokenizer

MIN_VOCAB = 256 + 1  # every byte, and end-of-text


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
