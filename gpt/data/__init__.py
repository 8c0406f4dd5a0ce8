"""Data: text source -> tokenizer -> token shards (memmap) + meta.json -> batches.

`load_data` is the one call the trainer makes; it downloads and prepares on first use and
reuses prepared data (same fingerprint) afterwards. `python -m gpt.data data=<name>` prepares
ahead of time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from gpt.config import DataSettings
from gpt.data.prepare import FULL, STAMP, open_split, tokenizer_of
from gpt.data.prepare import prepare as prepare_documents
from gpt.data.sources import open_source
from gpt.tokenizer import Tokenizer, normalize_spec


@dataclass
class Dataset:
    name: str
    train: list[np.ndarray]  # shards (memmaps)
    val: list[np.ndarray]
    tokenizer: Tokenizer
    meta: dict

    @staticmethod
    def tokens(shards: list[np.ndarray]) -> int:
        return sum(len(s) for s in shards)


def preparation_settings(data: DataSettings, identity: str) -> dict:
    """What decides the prepared tokens (with the tokenizer): the fingerprint's input."""
    keys = ("val_fraction", "split_by", "seed", "max_docs", "max_tokens", "shard_tokens", "num_proc")
    return {"identity": identity, **{k: getattr(data, k) for k in keys}}


def load_data(data: DataSettings, data_root: str | Path, log=print, verify: str | None = None) -> Dataset:
    """Prepared data for `data` under `data_root`, preparing it first if need be (or again, if a
    shard was damaged since). `verify`: how the shards' checksums are checked (gpt.data.prepare's
    FULL, STAMP or SIZES); None: FULL if data.verify, else STAMP."""
    verify = verify or (FULL if data.verify else STAMP)
    root = Path(data_root).expanduser()
    out_dir = root / data.name
    source = open_source(data.source, root, log=log)
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
