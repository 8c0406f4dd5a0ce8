"""Prepared data on disk, the format: token shards (memmap-able .bin files of uint16, or uint32
when the vocabulary needs it) and meta.json, which is the commit marker.

meta.json is written last, atomically, and only a meta whose fingerprint matches the requested
settings *and* whose files have the recorded sizes and CRC-32 checksums counts as prepared data
(a shard damaged since, same size or not, is prepared again). A crash, Ctrl-C or kill -9 at any
moment leaves nothing that passes.

Reading every shard for its checksum at every start would cost minutes on a large corpus, so a
file checked once is stamped (`verified.json`: its size, mtime, inode and ctime, with the hash of
the meta it was checked against), and later starts check the CRC of a file only when its stamp
changed: any write to a shard, or a copy put in its place, changes it. `verify=FULL`
(data.verify=true) checks every shard anyway, for damage no stamp sees (bit rot on the disk).
Text shards (gpt.data.prepare) and prepared conversations (gpt.data.chat) both keep it this way.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from pathlib import Path

import numpy as np

from gpt.errors import TinyGPTError
from gpt.runtime import io
from gpt.tokenizers import Tokenizer, describe, tokenizer_from_dict

FORMAT_VERSION = 2
SPLITS = ("train", "val")


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def fingerprint(settings: dict) -> str:
    blob = json.dumps({"format": FORMAT_VERSION, **settings}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def shard_name(split: str, i: int) -> str:
    return f"{split}-{i:04d}.bin"


FULL, STAMP, SIZES = "full", "stamp", "sizes"  # how read_meta checks the shards
STAMPS = "verified.json"


def read_meta(out_dir: Path, expected_fingerprint: str, verify: str = STAMP, log=print) -> dict | None:
    """The meta of complete, matching, intact prepared data in out_dir, or None. Every shard must
    have its recorded size; `verify` says how its bytes are checked against its CRC-32: FULL every
    shard, STAMP those whose size or mtime changed since they were last checked (see the
    module's docstring), SIZES none (another process of this node just checked them). Data
    prepared before CRCs were recorded is taken on its sizes. Says which shard failed."""
    try:
        raw = (out_dir / "meta.json").read_bytes()
        meta = json.loads(raw)
        if not isinstance(meta, dict) or meta.get("fingerprint") != expected_fingerprint:
            return None
        itemsize = np.dtype(meta["dtype"]).itemsize
        stamps = read_stamps(out_dir, raw) if verify == STAMP else {}
        checked = {}
        for split in SPLITS:
            sums = meta.get("crc32", {}).get(split) if verify != SIZES else None
            for i, n in enumerate(meta["shards"][split]):
                path = out_dir / shard_name(split, i)
                if not path.exists() or path.stat().st_size != n * itemsize:
                    return None
                if sums is None:
                    continue
                seen = stamp(path)
                if stamps.get(path.name) != seen and crc32(path) != sums[i]:
                    log(f"notice: {path} no longer matches its checksum (damaged since it was prepared); preparing again")
                    return None
                checked[path.name] = seen
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
        return None
    if checked and checked != stamps:
        write_stamps(out_dir, raw, checked)
    return meta


def stamp(path: Path) -> list[int]:
    """Size, mtime, and the inode and ctime, which no copy can restore (cp -p, rsync -a and tar
    set the mtime back, not the ctime): a shard replaced or rewritten in any way has a new stamp."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def read_stamps(out_dir: Path, meta_bytes: bytes) -> dict:
    """The stamps of the shards last checked against this very meta ({} if none, or another's)."""
    try:
        record = json.loads((out_dir / STAMPS).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(record, dict) or record.get("meta") != _digest(meta_bytes) or not isinstance(record.get("shards"), dict):
        return {}
    return record["shards"]


def write_stamps(out_dir: Path, meta_bytes: bytes, stamps: dict) -> None:
    """Record the shards just checked (or written). A data root that cannot be written (shared,
    read-only) just gets no stamps: every start then checks every shard, as before."""
    try:
        io.write_json(out_dir / STAMPS, {"meta": _digest(meta_bytes), "shards": stamps})
    except OSError:
        pass


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def crc32(path: Path, chunk: int = 16 << 20) -> int:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            crc = zlib.crc32(block, crc)
    return crc


def open_split(out_dir: Path, meta: dict, split: str) -> list[np.memmap]:
    """The shards of a split as read-only memmaps: nothing is loaded into RAM."""
    dtype = np.dtype(meta["dtype"])
    return [np.memmap(out_dir / shard_name(split, i), dtype=dtype, mode="r") for i, n in enumerate(meta["shards"][split]) if n]


def tokenizer_of(meta: dict) -> Tokenizer:
    return tokenizer_from_dict(meta["tokenizer"])


def write_tokens(path: Path, tokens: np.ndarray) -> None:
    io.write_bytes(path, tokens.tobytes())


class PreparedOtherwise(TinyGPTError):
    """Prepared data of other settings is where these would go, and the caller may not replace it."""


def replacing(out_dir: Path, expected_fingerprint: str, settings: dict, replace: bool) -> tuple[str, str] | None:
    """Before preparing into out_dir: what complete prepared data of other settings there (a
    corpus changed under its data.name, another tokenizer) differs in, and the notice to say once
    it is prepared again in its place; refused with it where `replace` is False (a command that
    only reads prepared data: tinygpt eval). None for a folder without a meta, or one with this
    fingerprint (damaged shards: read_meta said so)."""
    try:
        old = json.loads((out_dir / "meta.json").read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(old, dict) or old.get("fingerprint") == expected_fingerprint:
        return None
    before = old.get("settings") if isinstance(old.get("settings"), dict) else {}
    changes = what_differs(before, settings)
    if not replace:
        raise PreparedOtherwise(f"{out_dir} holds data prepared with other settings than these ({changes})")
    identity = str(before.get("identity")), str(settings.get("identity"))
    return changes, (
        f"notice: {out_dir} holds data prepared with other settings ({changes}); preparing it again, in its place"
        + (_split_moves(identity[1], settings) if identity[0] != identity[1] and not _same_files(*identity) else "")
    )


def _split_moves(identity: str, settings: dict) -> str:
    """How a changed corpus changes what validates (nothing, for a folder moved with its files as
    they were): documents drawn into train and val again, or the cut in the one token stream of a
    tail split (one document: gpt.data.prepare splits it so whatever data.split_by says)."""
    if settings.get("split_by") != "tail" and not _one_document(identity):
        return "; documents may move between train and val (a resumed run may validate on some it trained on)"
    one = "one document, split by its tail" if settings.get("split_by") != "tail" else "split by the tail"
    cut = f"the cut before the last {float(settings.get('val_fraction') or 0.1):.0%} (val) may move in the text"
    return f"; {one}: {cut} (a resumed run may validate on text it trained on)"


def changes_of(old: dict, new: dict) -> list[str]:
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


def what_differs(old: dict, new: dict) -> str:
    """The settings of two preparations, compared: 'the corpus: 1 file added (c.txt); tokenizer:
    char there, byte here'."""
    parts = []
    for key in changes_of(old, new):
        there, here = old.get(key), new.get(key)
        if key == "identity":
            parts.append(_source_change(str(there), str(here)))
        elif key == "tokenizer" and isinstance(there, dict) and isinstance(here, dict):
            a, b = _described(there), _described(here)
            parts.append(f"tokenizer: {a} there, {b} here" if a != b else "tokenizer: other settings of the same kind")
        elif key == "chat":
            parts.append("another chat template")
        else:
            parts.append(f"data.{key}: {there} there, {here} here")
    return "; ".join(parts) or "an earlier format of prepared data"


def _described(identity: dict) -> str:
    try:
        return describe(identity)
    except TinyGPTError:
        return str(identity.get("kind"))


def _source_change(there: str, here: str) -> str:
    """How a source's identity changed (gpt.data.sources): which local files, else the two."""
    a, b = _local_files(there), _local_files(here)
    if a is None or b is None or there.split(" ", 3)[:3] != here.split(" ", 3)[:3]:
        return f"the source: {there[:80]} there, {here[:80]} here"
    (root_a, a), (root_b, b) = _relative(a), _relative(b)  # a folder moved holds the same files
    added, removed = sorted(set(b) - set(a)), sorted(set(a) - set(b))
    changed = sorted(f for f in set(a) & set(b) if a[f] != b[f])
    named = lambda files: ", ".join(Path(f).name for f in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")  # noqa: E731
    said = [
        f"{len(fs)} {what} ({named(fs)})" for fs, what in ((added, "added"), (removed, "removed"), (changed, "changed")) if fs
    ]
    moved = f"the corpus moved from {root_a} to {root_b}" if root_a != root_b else ""
    if not said:
        return f"{moved} (the same files)" if moved else "the corpus: the same files"
    files = f"files changed since: {', '.join(said)}"
    return f"{moved}, and its {files}" if moved else f"the corpus's {files}"


def _same_files(there: str, here: str) -> bool:
    a, b = _local_files(there), _local_files(here)
    return a is not None and b is not None and _relative(a)[1] == _relative(b)[1]


def _one_document(identity: str) -> bool:
    """Whether a source of this identity is one document, split by its tail whatever data.split_by
    says (gpt.data.prepare): a download, or one local text file read whole."""
    files = list(_local_files(identity) or ())
    whole = identity.startswith("local file ") and len(files) == 1 and Path(files[0]).suffix in (".txt", ".md")
    return identity.startswith("url ") or whole


def _relative(files: dict) -> tuple[str, dict]:
    """The folder the files share, and the files by their path in it."""
    if not files:
        return "", files
    root = os.path.commonpath(list(files))
    root = os.path.dirname(root) if root in files else root  # one file: its folder
    return root, {os.path.relpath(f, root): v for f, v in files.items()}


def _local_files(identity: str) -> dict | None:
    """{path: size and mtime} of a local source's identity ('local <unit> <field> <path>:<size>:<mtime>;...')."""
    words = identity.split(" ", 3)
    if len(words) < 4 or words[0] != "local":
        return None
    return {
        p: f"{size}:{mtime}" for p, size, mtime in (item.rsplit(":", 2) for item in words[3].split(";") if item.count(":") >= 2)
    }
