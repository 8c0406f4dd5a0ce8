"""gpt/data/download.py: a checksummed download from a local HTTP server, never a half-written
or wrong file. Run: pytest tests/data/test_download.py"""

from __future__ import annotations

import hashlib

import pytest

from gpt.data import download
from gpt.errors import TinyGPTError
from helpers import TEXT, data_settings, load

SHA = hashlib.sha256(TEXT.encode()).hexdigest()


def test_download_verifies_checksum(server, tmp_path):
    base, hits = server
    dest = tmp_path / "ts" / "input.txt"
    download.ensure_file(f"{base}/input.txt", dest, SHA, log=lambda *_: None)
    assert dest.read_text() == TEXT and hits == ["/input.txt"]
    # present with the right checksum: no second request
    download.ensure_file(f"{base}/input.txt", dest, SHA, log=lambda *_: None)
    assert hits == ["/input.txt"]


def test_download_rejects_wrong_checksum_and_keeps_nothing(server, tmp_path):
    base, _ = server
    dest = tmp_path / "input.txt"
    with pytest.raises(TinyGPTError, match="sha256"):
        download.ensure_file(f"{base}/input.txt", dest, "0" * 64, log=lambda *_: None)
    assert list(tmp_path.iterdir()) == []


def test_download_http_error_and_unreachable(server, tmp_path):
    base, _ = server
    with pytest.raises(TinyGPTError, match="could not download"):
        download.ensure_file(f"{base}/missing.txt", tmp_path / "a.txt", SHA, log=lambda *_: None)
    with pytest.raises(TinyGPTError, match="without network, put the file at"):
        download.ensure_file("http://127.0.0.1:9/input.txt", tmp_path / "b.txt", SHA, timeout=5, log=lambda *_: None)
    assert list(tmp_path.iterdir()) == []


def test_existing_file_with_wrong_checksum_is_not_overwritten(tmp_path):
    dest = tmp_path / "input.txt"
    dest.write_text("my own notes")
    with pytest.raises(TinyGPTError, match="move it away"):
        download.ensure_file("http://127.0.0.1:9/x", dest, SHA, log=lambda *_: None)
    assert dest.read_text() == "my own notes"


def test_load_data_end_to_end_with_download(server, tmp_path):
    base, _ = server
    source = {"kind": "url", "url": f"{base}/input.txt", "sha256": SHA, "filename": "corpus/input.txt"}
    data = load(data_settings("tiny", source, {"kind": "char"}, split_by="tail", val_fraction=0.1), tmp_path)
    assert (tmp_path / "corpus" / "input.txt").is_file() and (tmp_path / "tiny" / "meta.json").is_file()
    assert data.tokenizer.decode(data.train[0][:14].tolist()) == "First Citizen:"
