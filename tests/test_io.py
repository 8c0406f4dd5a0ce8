"""gpt/runtime/io.py: a write is all or nothing, whatever goes wrong in the middle.
Run: pytest tests/test_io.py"""

from __future__ import annotations

import os
import stat

import pytest

from gpt.runtime import io


def test_atomic_write_replaces_only_when_complete(tmp_path):
    path = tmp_path / "deep" / "file.bin"
    io.write_bytes(path, b"first")
    assert path.read_bytes() == b"first"
    with pytest.raises(RuntimeError):
        with io.atomic_write(path) as f:
            f.write(b"half of the second")
            raise RuntimeError("interrupted")
    assert path.read_bytes() == b"first"
    assert sorted(p.name for p in path.parent.iterdir()) == ["file.bin"]  # no temporary left


def test_the_bytes_are_synced_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    """The data on disk before the name points at it; then the folder, so that a power loss
    cannot lose the rename itself."""
    calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        calls.append("fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    monkeypatch.setattr(io.os, "fsync", fsync)
    monkeypatch.setattr(io.os, "replace", lambda a, b: (calls.append("replace"), real_replace(a, b)))
    io.write_json(tmp_path / "x.json", {"a": 1})
    assert calls == ["fsync file", "replace", "fsync folder"] and (tmp_path / "x.json").read_text() == '{\n "a": 1\n}'


def test_temporaries_name_their_writer():
    path = io.temporary_of(io.Path("/x/ckpt-1.pt"))
    assert io.temporary_owner(path) == os.getpid()
    assert io.temporary_owner(io.Path("/x/ckpt-1.pt")) is None
    assert io.temporary_owner(io.Path("/x/a.tmp-abc")) is None
