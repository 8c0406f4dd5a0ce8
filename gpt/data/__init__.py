"""Data: text source -> tokenizer -> token shards (memmap) + meta.json -> batches.

`load_data` is the one call the trainer makes; it downloads and prepares on first use and
reuses prepared data (same fingerprint) afterwards. `python -m gpt.data data=<name>` prepares
ahead of time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpt.data.prepare import open_split, prepare as prepare_documents, tokenizer_of
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


def preparation_settings(data_cfg: dict, identity: str) -> dict:
    return {
        "identity": identity,
        "val_fraction": data_cfg.get("val_fraction", 0.1),
        "split_by": data_cfg.get("split_by", "documents"),
        "seed": data_cfg.get("seed", 1337),
        "max_docs": data_cfg.get("max_docs"),
        "max_tokens": data_cfg.get("max_tokens"),
        "shard_tokens": data_cfg.get("shard_tokens", 100_000_000),
        "num_proc": data_cfg.get("num_proc"),
    }


def load_data(data_cfg: dict, data_root: str | Path, log=print) -> Dataset:
    root = Path(data_root).expanduser()
    out_dir = root / data_cfg["name"]
    source = open_source(data_cfg["source"], root, log=log)
    tokenizer_spec = normalize_spec(dict(data_cfg.get("tokenizer") or {"kind": "char"}))
    meta = prepare_documents(source.documents, tokenizer_spec, out_dir, preparation_settings(data_cfg, source.identity), log=log)
    return Dataset(
        name=data_cfg["name"],
        train=open_split(out_dir, meta, "train"),
        val=open_split(out_dir, meta, "val"),
        tokenizer=tokenizer_of(meta),
        meta=meta,
    )
