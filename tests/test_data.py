"""Data: download with checksum from a local HTTP server, preparation that survives interruption,
batches. Run: pytest tests/test_data.py"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from gpt.data import download, load_data, prepare
from gpt.data.loader import RandomWindows
from gpt.errors import TinyGPTError

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 50
SHA = hashlib.sha256(TEXT.encode()).hexdigest()


@pytest.fixture
def server():
    """Serves TEXT at /input.txt on 127.0.0.1 and counts the requests."""
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            if self.path != "/input.txt":
                self.send_error(404)
                return
            body = TEXT.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", hits
    httpd.shutdown()
    httpd.server_close()


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


def _write_text(tmp_path) -> Path:
    p = tmp_path / "input.txt"
    p.write_text(TEXT)
    return p


def prep_char(src, out, val_fraction=0.1):
    settings = {"identity": SHA, "val_fraction": val_fraction, "split_by": "tail", "num_proc": 1}
    return prepare.prepare([src.read_text()], {"kind": "char"}, out, settings, log=lambda *_: None)


def _same(a, b):
    return {k: v for k, v in a.items() if k != "tokenize_seconds"} == {k: v for k, v in b.items() if k != "tokenize_seconds"}


def test_prepare_is_idempotent(tmp_path):
    src = _write_text(tmp_path)
    out = tmp_path / "prep"
    meta = prep_char(src, out)
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert prep_char(src, out) == meta
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps  # nothing rewritten
    (train,) = prepare.open_split(out, meta, "train")
    (val,) = prepare.open_split(out, meta, "val")
    assert len(train) + len(val) == len(TEXT) and len(val) == len(TEXT) - int(len(TEXT) * 0.9)
    tok = prepare.tokenizer_of(meta)
    assert tok.decode(train.tolist()) + tok.decode(val.tolist()) == TEXT
    assert train.dtype == np.uint16


def test_prepare_survives_interruption(tmp_path, monkeypatch):
    src = _write_text(tmp_path)
    out = tmp_path / "prep"
    reference = prep_char(src, tmp_path / "ref")

    real_write = prepare._write_tokens

    def dies_on_val(path, tokens):
        if path.name == "val-0000.bin":
            raise KeyboardInterrupt  # as if Ctrl-C arrived between the two splits
        real_write(path, tokens)

    monkeypatch.setattr(prepare, "_write_tokens", dies_on_val)
    with pytest.raises(KeyboardInterrupt):
        prep_char(src, out)
    assert not (out / "meta.json").exists()
    assert prepare.read_meta(out, reference["fingerprint"]) is None
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]

    monkeypatch.setattr(prepare, "_write_tokens", real_write)
    meta = prep_char(src, out)
    assert _same(meta, reference)
    for split in prepare.SPLITS:
        name = prepare.shard_name(split, 0)
        assert (out / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()


def test_crash_inside_an_atomic_write_leaves_no_temporary(tmp_path, monkeypatch):
    src = _write_text(tmp_path)
    out = tmp_path / "prep"

    def no_rename(src_path, dst_path):
        raise OSError("disk vanished")

    monkeypatch.setattr(prepare.os, "replace", no_rename)
    with pytest.raises(OSError):
        prep_char(src, out)
    assert [p.name for p in out.iterdir()] == []


def test_truncated_tokens_or_changed_settings_trigger_reprepare(tmp_path):
    src = _write_text(tmp_path)
    out = tmp_path / "prep"
    meta = prep_char(src, out)
    full = (out / "train-0000.bin").read_bytes()
    (out / "train-0000.bin").write_bytes(full[:100])  # e.g. a disk filled up mid-copy
    assert prepare.read_meta(out, meta["fingerprint"]) is None
    prep_char(src, out)
    assert (out / "train-0000.bin").read_bytes() == full
    other = prep_char(src, out, 0.2)
    assert other["fingerprint"] != meta["fingerprint"]
    assert json.loads((out / "meta.json").read_text())["settings"]["val_fraction"] == 0.2


def test_load_data_end_to_end_with_download(server, tmp_path):
    base, _ = server
    cfg = {
        "name": "tiny",
        "tokenizer": {"kind": "char"},
        "val_fraction": 0.1,
        "split_by": "tail",
        "source": {"kind": "url", "url": f"{base}/input.txt", "sha256": SHA, "filename": "corpus/input.txt"},
    }
    data = load_data(cfg, tmp_path, log=lambda *_: None)
    assert (tmp_path / "corpus" / "input.txt").is_file() and (tmp_path / "tiny" / "meta.json").is_file()
    assert data.tokenizer.decode(data.train[0][:14].tolist()) == "First Citizen:"


def test_random_windows_are_shifted_and_reproducible():
    tokens = np.arange(1000, dtype=np.uint16)
    a = RandomWindows(tokens, block_size=8, batch_size=5, device=torch.device("cpu"), seed=7)
    b = RandomWindows(tokens, block_size=8, batch_size=5, device=torch.device("cpu"), seed=7)
    x, y = a.next()
    assert x.shape == y.shape == (5, 8) and x.dtype == torch.long
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)
    assert torch.equal(x, b.next()[0])
    assert int(x.max()) < 1000 - 1
