"""Atomic writes: a file is either its old complete self or its new complete self, never half.

Everything tinygpt writes that a later run reads (checkpoints, token shards, meta.json,
summary.json, downloads) goes through `atomic_write`: write a temporary file next to the
target, flush and fsync it, then rename it over the target. A crash, Ctrl-C or kill -9 at any
moment leaves at most a temporary named `<name>.tmp-<pid>`, which readers never mistake for the
real file and which `is_temporary` / `temporary_owner` let a cleaner recognise.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

TMP_MARK = ".tmp-"


def temporary_of(path: Path) -> Path:
    return path.with_name(f"{path.name}{TMP_MARK}{os.getpid()}")


def temporary_owner(path: Path) -> int | None:
    """The pid that was writing this temporary, or None if `path` is not one of ours."""
    stem, mark, pid = path.name.rpartition(TMP_MARK)
    return int(pid) if mark and stem and pid.isdigit() else None


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "wb", **open_kwargs) -> Iterator[IO]:
    """Open a temporary file for writing; on a clean exit of the block it replaces `path`. If
    the block raises (a failed checksum, a full disk, Ctrl-C), `path` is left as it was and the
    temporary is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_of(path)
    try:
        with open(tmp, mode, **open_kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
        _sync_dir(path.parent)  # ... and the new name is on disk too, not only in the page cache
    finally:
        tmp.unlink(missing_ok=True)


def _sync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # Windows cannot open a directory; its rename is durable by other means
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems (network, FUSE) refuse to sync a directory
        pass
    finally:
        os.close(fd)


def writable_dir(path: str | Path, hint: str) -> Path:
    """`path` as a directory this process can write into (created if need be), or a TinyGPTError
    that says why not and how to fix it (`hint`), before anything is written there."""
    from gpt.errors import TinyGPTError

    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TinyGPTError(f"cannot create the folder {path} ({e.strerror or e}); {hint}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise TinyGPTError(f"cannot write into {path} (permission denied); {hint}")
    return path


def write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_write(path) as f:
        f.write(data)


def write_json(path: str | Path, data, indent: int = 1) -> None:
    write_bytes(path, json.dumps(data, indent=indent, default=str).encode())
