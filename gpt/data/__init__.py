"""Data: text source -> tokenizer -> token shards (memmap) + meta.json -> batches.

`load_data` is the one call the trainer makes; it downloads and prepares on first use and
reuses prepared data (same fingerprint) afterwards. `python -m gpt.data data=<name>` prepares
ahead of time. Conversations (records with `messages`, or Alpaca's fields) are prepared by
gpt.data.chat with the chat template's loss mask instead.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from gpt.config import DataSettings
from gpt.data.prepare import FULL, STAMP, open_split, tokenizer_of
from gpt.data.prepare import prepare as prepare_documents
from gpt.data.sources import open_source
from gpt.tokenizers import Tokenizer, normalize_spec


@dataclass
class Dataset:
    name: str
    train: list[np.ndarray]  # shards (memmaps)
    val: list[np.ndarray]
    tokenizer: Tokenizer
    meta: dict
    chat: dict | None = None  # conversations: {"train": ChatSplit, "val": ChatSplit}

    @staticmethod
    def tokens(shards: list[np.ndarray]) -> int:
        return sum(len(s) for s in shards)


def preparation_settings(data: DataSettings, identity: str) -> dict:
    """What decides the prepared tokens (with the tokenizer): the fingerprint's input."""
    keys = ("val_fraction", "split_by", "seed", "max_docs", "max_tokens", "shard_tokens", "num_proc")
    return {"identity": identity, **{k: getattr(data, k) for k in keys}}


def load_data(
    data: DataSettings, data_root: str | Path, log=print, verify: str | None = None, base_tokenizer: dict | None = None
) -> Dataset:
    """Prepared data for `data` under `data_root`, preparing it first if need be (or again, if a
    shard was damaged since). `verify`: how the shards' checksums are checked (gpt.data.prepare's
    FULL, STAMP or SIZES); None: FULL if data.verify, else STAMP. `base_tokenizer`: the dict form
    of the tokenizer of the model a run starts from (init_from); conversations are tokenized
    with it (plus the chat template) whatever data.tokenizer says."""
    verify = verify or (FULL if data.verify else STAMP)
    root = Path(data_root).expanduser()
    out_dir = root / data.name
    source = open_source(data.source, root, log=log)
    if is_chat(data, root):
        return _load_conversations(data, root, source.identity, base_tokenizer, log)
    tokenizer_spec = normalize_spec(asdict(data.tokenizer))
    meta = prepare_documents(
        source.documents, tokenizer_spec, out_dir, preparation_settings(data, source.identity), log=log, verify=verify
    )
    return Dataset(
        name=data.name,
        train=open_split(out_dir, meta, "train"),
        val=open_split(out_dir, meta, "val"),
        tokenizer=tokenizer_of(meta),
        meta=meta,
    )


def is_chat(data: DataSettings, data_root: Path) -> bool:
    """Whether the source holds conversations: data.format=chat, or with format=auto, local
    record files or a save_to_disk folder whose first record has `messages` or Alpaca's fields
    (read cheaply: one line, one row). Other sources (a download, the Hub) are text unless
    data.format=chat says otherwise: guessing would touch the network."""
    if data.format != "auto":
        return data.format == "chat"
    from gpt.data.chat import is_conversation
    from gpt.data.sources import first_record

    return is_conversation(first_record(data.source, data_root))


def _load_conversations(data: DataSettings, root: Path, identity: str, base_tokenizer: dict | None, log) -> Dataset:
    from gpt.data.chat import open_chat_split, prepare_conversations
    from gpt.data.sources import records

    spec = normalize_spec(base_tokenizer if base_tokenizer is not None else asdict(data.tokenizer))
    if base_tokenizer is not None:
        log("conversations are tokenized with the base model's tokenizer (init_from) and the chat template")
    settings = {"identity": identity, "val_fraction": data.val_fraction, "seed": data.seed, "max_docs": data.max_docs}
    out_dir = root / data.name
    meta = prepare_conversations(_Lazy(lambda: records(data.source, root, log)), spec, out_dir, settings, log)
    chat = {split: open_chat_split(out_dir, meta, split) for split in ("train", "val")}
    return Dataset(data.name, [chat["train"].tokens], [chat["val"].tokens], tokenizer_of(meta), meta, chat)


class _Lazy:
    """An iterable opened when iteration starts: prepared data that matches reads no record."""

    def __init__(self, open_items):
        self._open = open_items

    def __iter__(self):
        return iter(self._open())
