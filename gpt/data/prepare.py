"""Turn a text file into token files (memmap-able .bin) plus a meta.json, once.

`meta.json` is the commit marker: it is written last, atomically, and only a meta whose
fingerprint matches the requested settings *and* whose token files have the recorded sizes
counts as prepared data. Anything else (a crash mid-way, a kill -9, changed settings) is
prepared again from scratch.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from gpt.tokenizer import CharTokenizer, tokenizer_from_dict

FORMAT_VERSION = 1
SPLITS = ("train", "val")


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def fingerprint(settings: dict) -> str:
    blob = json.dumps({"format": FORMAT_VERSION, **settings}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def read_meta(out_dir: Path, expected_fingerprint: str) -> dict | None:
    """The meta of complete, matching prepared data in out_dir, or None."""
    try:
        meta = json.loads((out_dir / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    if meta.get("fingerprint") != expected_fingerprint:
        return None
    itemsize = np.dtype(meta["dtype"]).itemsize
    for split in SPLITS:
        path = out_dir / f"{split}.bin"
        if not path.exists() or path.stat().st_size != meta["tokens"][split] * itemsize:
            return None
    return meta


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _write_tokens(path: Path, tokens: np.ndarray) -> None:
    _atomic_write_bytes(path, tokens.tobytes())


def prepare_char(text_path: Path, out_dir: Path, val_fraction: float, source_sha256: str, log=print) -> dict:
    """Character-level preparation: fit the alphabet on the whole text, split the first
    (1 - val_fraction) of it for training and the rest for validation."""
    settings = {"tokenizer": "char", "source_sha256": source_sha256, "val_fraction": val_fraction}
    fp = fingerprint(settings)
    meta = read_meta(out_dir, fp)
    if meta is not None:
        return meta

    log(f"preparing {text_path} -> {out_dir} (char-level, val_fraction={val_fraction})")
    out_dir.mkdir(parents=True, exist_ok=True)
    # Invalidate first: from here until the new meta lands, the folder reads as unprepared.
    (out_dir / "meta.json").unlink(missing_ok=True)

    text = Path(text_path).read_text(encoding="utf-8")
    tok = CharTokenizer.fit(text)
    dtype = token_dtype(tok.vocab_size)
    ids = np.array(tok.encode(text), dtype=dtype)
    n_train = int(len(ids) * (1.0 - val_fraction))
    parts = {"train": ids[:n_train], "val": ids[n_train:]}
    for split in SPLITS:
        _write_tokens(out_dir / f"{split}.bin", parts[split])

    meta = {
        "format": FORMAT_VERSION,
        "fingerprint": fp,
        "settings": settings,
        "tokenizer": tok.to_dict(),
        "dtype": dtype.name,
        "tokens": {split: int(len(parts[split])) for split in SPLITS},
    }
    _atomic_write_bytes(out_dir / "meta.json", json.dumps(meta, indent=1).encode())
    return meta


def open_split(out_dir: Path, meta: dict, split: str) -> np.memmap:
    return np.memmap(out_dir / f"{split}.bin", dtype=np.dtype(meta["dtype"]), mode="r")


def tokenizer_of(meta: dict):
    return tokenizer_from_dict(meta["tokenizer"])
