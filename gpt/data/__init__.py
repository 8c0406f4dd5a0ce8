"""Data: text source -> tokenizer -> token files + meta.json -> batches.

`load_data` is the one call the trainer makes; it downloads and prepares on first use and
reuses prepared data afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpt.data.download import ensure_file
from gpt.data.prepare import open_split, prepare_char, tokenizer_of
from gpt.errors import TinyGPTError
from gpt.tokenizer import Tokenizer


@dataclass
class Dataset:
    name: str
    train: np.ndarray
    val: np.ndarray
    tokenizer: Tokenizer
    meta: dict


def load_data(data_cfg: dict, data_root: str | Path, log=print) -> Dataset:
    root = Path(data_root).expanduser()
    if data_cfg.get("tokenizer") != "char":
        raise TinyGPTError(f"data.tokenizer={data_cfg.get('tokenizer')!r} is not supported; use data=shakespeare_char")
    val_fraction = float(data_cfg["val_fraction"])
    if not 0.0 < val_fraction < 1.0:
        raise TinyGPTError(f"data.val_fraction must be between 0 and 1 (exclusive), got {val_fraction}")

    src = data_cfg["source"]
    text_path = ensure_file(src["url"], root / src["filename"], src["sha256"], log=log)
    out_dir = root / data_cfg["name"]
    meta = prepare_char(text_path, out_dir, val_fraction, src["sha256"], log=log)
    return Dataset(
        name=data_cfg["name"],
        train=open_split(out_dir, meta, "train"),
        val=open_split(out_dir, meta, "val"),
        tokenizer=tokenizer_of(meta),
        meta=meta,
    )
