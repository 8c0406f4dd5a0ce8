"""Fetch a file once, verify its checksum, and never leave a half-written file behind."""

from __future__ import annotations

import hashlib
import urllib.error
import urllib.request
from pathlib import Path

from gpt.errors import TinyGPTError
from gpt.runtime.io import atomic_write, writable_dir

_CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def ensure_file(url: str, dest: Path, sha256: str, timeout: float = 30.0, log=print) -> Path:
    """Return `dest`, downloading it from `url` first unless a file with `sha256` is already there.

    Offline users drop the file in place themselves; it is then used as is. The download goes to
    a temporary name and is renamed into place only after the checksum matched, so an interrupted
    or corrupted transfer never looks like a finished one.
    """
    dest = Path(dest)
    if dest.is_dir():
        raise TinyGPTError(f"{dest} is a folder where the downloaded file belongs; move it away")
    if dest.exists():
        actual = file_sha256(dest)
        if actual == sha256:
            return dest
        raise TinyGPTError(
            f"{dest} exists but its sha256 is {actual[:12]}…, expected {sha256[:12]}…; "
            f"move it away (it is not the expected file) and tinygpt will download a fresh copy"
        )

    writable_dir(dest.parent, "set paths.data_dir=<folder> or TINYGPT_DATA_DIR to a folder you can write")
    log(f"downloading {url} -> {dest}")
    h = hashlib.sha256()
    try:
        # Written under a temporary name, which becomes `dest` only when the whole file arrived
        # with the right checksum; a failure, or Ctrl-C, leaves nothing behind.
        with atomic_write(dest) as out, urllib.request.urlopen(url, timeout=timeout) as response:
            for chunk in iter(lambda: response.read(_CHUNK), b""):
                h.update(chunk)
                out.write(chunk)
            if h.hexdigest() != sha256:
                raise _ChecksumMismatch(h.hexdigest())
    except _ChecksumMismatch as e:
        raise TinyGPTError(
            f"the file downloaded from {url} has sha256 {e.args[0][:12]}…, expected "
            f"{sha256[:12]}…; it was discarded. Check the URL (data.source.url) or the checksum"
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise TinyGPTError(
            f"could not download {url} ({reason}); without network, put the file at {dest} "
            f"(sha256 {sha256[:12]}…) or set TINYGPT_DATA_DIR to a folder that holds it"
        ) from None
    return dest


class _ChecksumMismatch(Exception):
    pass
