"""gpt/data/prepare.py: documents -> token shards + meta.json, once: reuse, invalidation,
interruption (Ctrl-C, a crash mid-write, kill -9), splits, dtypes, caps, parallel workers.
Run: pytest tests/data/test_prepare.py"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gpt.data import prepare, shards
from gpt.data.shards import read_meta
from gpt.errors import TinyGPTError
from gpt.runtime import io
from helpers import REPO, TEXT, data_settings, load, write_corpus, write_ranks

SHA = hashlib.sha256(TEXT.encode()).hexdigest()


def _write_text(tmp_path) -> Path:
    p = tmp_path / "input.txt"
    p.write_text(TEXT)
    return p


def prep_char(src, out, val_fraction=0.1):
    settings = {"identity": SHA, "val_fraction": val_fraction, "split_by": "tail", "num_proc": 1}
    return prepare.prepare([src.read_text()], {"kind": "char"}, out, settings, log=lambda *_: None)


def _same(a, b):
    return {k: v for k, v in a.items() if k != "tokenize_seconds"} == {k: v for k, v in b.items() if k != "tokenize_seconds"}


def _stream(data) -> list[int]:
    return [int(t) for split in (data.train, data.val) for shard in split for t in shard]


def test_prepare_is_idempotent(tmp_path):
    src = _write_text(tmp_path)
    out = tmp_path / "prep"
    meta = prep_char(src, out)
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert prep_char(src, out) == meta
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps  # nothing rewritten
    (train,) = shards.open_split(out, meta, "train")
    (val,) = shards.open_split(out, meta, "val")
    assert len(train) + len(val) == len(TEXT) and len(val) == len(TEXT) - int(len(TEXT) * 0.9)
    tok = shards.tokenizer_of(meta)
    assert tok.decode(train.tolist()) + tok.decode(val.tolist()) == TEXT
    assert train.dtype == np.uint16


def test_prepare_survives_interruption(tmp_path, monkeypatch):
    src = _write_text(tmp_path)
    out = tmp_path / "prep"
    out.mkdir()  # a folder that was there (one this preparation made goes on failure: test_prepared_data_kept.py)
    reference = prep_char(src, tmp_path / "ref")

    real_write = prepare.write_tokens

    def dies_on_val(path, tokens):
        if path.name == "val-0000.bin":
            raise KeyboardInterrupt  # as if Ctrl-C arrived between the two splits
        real_write(path, tokens)

    monkeypatch.setattr(prepare, "write_tokens", dies_on_val)
    with pytest.raises(KeyboardInterrupt):
        prep_char(src, out)
    assert not (out / "meta.json").exists()
    assert shards.read_meta(out, reference["fingerprint"]) is None
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]

    monkeypatch.setattr(prepare, "write_tokens", real_write)
    meta = prep_char(src, out)
    assert _same(meta, reference)
    for split in shards.SPLITS:
        name = shards.shard_name(split, 0)
        assert (out / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()


def test_crash_inside_an_atomic_write_leaves_no_temporary(tmp_path, monkeypatch):
    src = _write_text(tmp_path)
    out = tmp_path / "prep"
    out.mkdir()  # a folder that was there (one this preparation made goes on failure)

    def no_rename(src_path, dst_path):
        raise OSError("disk vanished")

    monkeypatch.setattr(io.os, "replace", no_rename)
    with pytest.raises(OSError):
        prep_char(src, out)
    assert [p.name for p in out.iterdir()] == []


def test_truncated_tokens_or_changed_settings_trigger_reprepare(tmp_path):
    src = _write_text(tmp_path)
    out = tmp_path / "prep"
    meta = prep_char(src, out)
    full = (out / "train-0000.bin").read_bytes()
    (out / "train-0000.bin").write_bytes(full[:100])  # e.g. a disk filled up mid-copy
    assert shards.read_meta(out, meta["fingerprint"]) is None
    prep_char(src, out)
    assert (out / "train-0000.bin").read_bytes() == full
    other = prep_char(src, out, 0.2)
    assert other["fingerprint"] != meta["fingerprint"]
    assert json.loads((out / "meta.json").read_text())["settings"]["val_fraction"] == 0.2


def test_reuse_and_invalidation(tmp_path):
    folder = write_corpus(tmp_path / "corpus", "txt")
    settings = data_settings("c", {"kind": "local", "path": str(folder)}, {"kind": "byte"})
    first = load(settings, tmp_path / "root").meta
    out = tmp_path / "root" / "c"
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert load(settings, tmp_path / "root").meta == first
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps  # reused, nothing rewritten
    for change in ({"val_fraction": 0.5}, {"seed": 4}, {"max_docs": 5}):
        assert load(replace(settings, **change), tmp_path / "root").meta["fingerprint"] != first["fingerprint"]
    time.sleep(0.01)
    (folder / "doc00.txt").write_text("changed content")
    changed = load(settings, tmp_path / "root").meta
    assert changed["fingerprint"] != first["fingerprint"] and changed["documents"] == 12
    ranks = write_ranks(tmp_path / "r.tiktoken")
    bpe = load(
        data_settings("c", {"kind": "local", "path": str(folder)}, {"kind": "tiktoken", "ranks_file": str(ranks)}),
        tmp_path / "root",
    )
    assert bpe.meta["tokenizer"]["kind"] == "tiktoken"


def test_documents_split_is_seeded(tmp_path):
    folder = write_corpus(tmp_path / "corpus", "txt")
    base = data_settings("c", {"kind": "local", "path": str(folder)}, {"kind": "byte"})
    a = _stream(load(replace(base, name="a"), tmp_path / "root"))
    b = _stream(load(replace(base, name="b"), tmp_path / "root"))
    c = load(replace(base, name="c", seed=99), tmp_path / "root")
    assert a == b
    assert bytes(t for t in _stream(c) if t != 256) != bytes(t for t in a if t != 256)  # other docs in val
    assert c.meta["documents"] == 12 and round(12 * 0.25) == sum(1 for s in c.val for t in s if t == 256)


def test_uint32_when_the_vocabulary_exceeds_65536(tmp_path):
    ranks = write_ranks(tmp_path / "big.tiktoken", big=True)
    folder = write_corpus(tmp_path / "corpus", "txt")
    data = load(
        data_settings("big", {"kind": "local", "path": str(folder)}, {"kind": "tiktoken", "ranks_file": str(ranks)}),
        tmp_path / "root",
    )
    assert data.tokenizer.vocab_size > 65536 and data.meta["dtype"] == "uint32" and data.train[0].dtype == np.uint32
    assert data.tokenizer.eot_id in _stream(data) and max(_stream(data)) > 65535


def test_caps_limit_documents_and_tokens(tmp_path):
    folder = write_corpus(tmp_path / "corpus", "txt")
    base = data_settings("c", {"kind": "local", "path": str(folder)}, {"kind": "byte"})
    capped = load(replace(base, name="tok", max_tokens=500), tmp_path / "root")
    assert sum(capped.meta["tokens"].values()) == 500
    docs = load(replace(base, name="docs", max_docs=5), tmp_path / "root")
    assert docs.meta["documents"] == 5 and _stream(docs).count(256) == 5


def test_one_and_two_processes_prepare_the_same_stream(tmp_path):
    folder = write_corpus(tmp_path / "corpus", "txt")
    ranks = write_ranks(tmp_path / "r.tiktoken")
    tok = {"kind": "tiktoken", "ranks_file": str(ranks)}
    one = load(data_settings("one", {"kind": "local", "path": str(folder)}, tok, num_proc=1), tmp_path / "root")
    two = load(data_settings("two", {"kind": "local", "path": str(folder)}, tok, num_proc=2), tmp_path / "root")
    assert _stream(one) == _stream(two) and one.meta["fingerprint"] == two.meta["fingerprint"]


_PREPARE = """
import sys
from gpt.config import DataSettings, from_dict
from gpt.data import load_data
cfg = {"name": "big", "tokenizer": {"kind": "byte"}, "source": {"kind": "local", "path": sys.argv[1], "doc_unit": "line"},
       "val_fraction": 0.1, "split_by": "documents", "seed": 5, "num_proc": 2, "shard_tokens": 300000}
load_data(from_dict(DataSettings, cfg), sys.argv[2], log=lambda *a: None)
"""


def _children(pid: int) -> list[int]:
    """The processes `pid` started (Linux: /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _alive(pid: int) -> bool:
    """Running or asleep: not gone, nor a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the workers through /proc")
def test_killed_preparation_reruns_to_the_identical_stream(tmp_path):
    corpus = tmp_path / "corpus.txt"
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    corpus.write_text("\n".join(" ".join(rng.choice(words, 30)) for _ in range(60000)))
    ref_root, root = tmp_path / "ref", tmp_path / "root"
    subprocess.run([sys.executable, "-c", _PREPARE, str(corpus), str(ref_root)], check=True, cwd=REPO)

    proc = subprocess.Popen([sys.executable, "-c", _PREPARE, str(corpus), str(root)], cwd=REPO)
    deadline = time.time() + 60
    while not list((root / "big").glob("stream.tmp-*")) and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # well inside the tokenizing pass
    workers = _children(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # its tokenizing workers end with it (they slept on for good, waiting on the pool's queue)
    deadline = time.time() + 10
    while [w for w in workers if _alive(w)] and time.time() < deadline:
        time.sleep(0.05)
    assert workers and not [w for w in workers if _alive(w)], workers
    ref_meta = json.loads((ref_root / "big" / "meta.json").read_text())
    assert read_meta(root / "big", ref_meta["fingerprint"]) is None  # nothing that passes for complete data

    subprocess.run([sys.executable, "-c", _PREPARE, str(corpus), str(root)], check=True, cwd=REPO)
    meta = json.loads((root / "big" / "meta.json").read_text())
    assert meta["shards"] == ref_meta["shards"] and len(meta["shards"]["train"]) > 1
    for f in sorted((ref_root / "big").glob("*.bin")):
        assert (root / "big" / f.name).read_bytes() == f.read_bytes()
    assert not list((root / "big").glob("*.tmp-*"))


def test_a_data_folder_that_cannot_be_written_is_refused_before_anything_is_deleted(tmp_path, monkeypatch):
    """As root, file modes do not stop writes, so the permission answer is what is patched."""
    src, out = _write_text(tmp_path), tmp_path / "prepared"
    prep_char(src, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(io.os, "access", lambda path, mode: False)
    with pytest.raises(TinyGPTError, match=r"cannot write into .*prepared \(permission denied\); .*TINYGPT_DATA_DIR"):
        prep_char(src, out, val_fraction=0.2)  # other settings: would re-prepare
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.parametrize("damage", ["zeroed middle", "random bytes"])
def test_a_shard_damaged_since_preparation_is_prepared_again_not_trained_on(tmp_path, damage):
    """Same size, other bytes: sizes alone passed it (zeros trained on silently; random ids failed
    with an IndexError at the first batch). The shard's CRC-32 in meta.json catches it."""
    import numpy as np

    src = _write_text(tmp_path)
    out = tmp_path / "prep"
    meta = prep_char(src, out)
    shard = out / "train-0000.bin"
    full = shard.read_bytes()
    middle = slice(len(full) // 3, 2 * len(full) // 3)
    broken = bytearray(full)
    broken[middle] = (
        bytes(len(broken[middle])) if damage == "zeroed middle" else np.random.default_rng(0).bytes(len(broken[middle]))
    )
    shard.write_bytes(bytes(broken))
    notices = []
    assert shards.read_meta(out, meta["fingerprint"], log=notices.append) is None
    assert "train-0000.bin no longer matches its checksum" in notices[0]
    assert shards.read_meta(out, meta["fingerprint"], verify=shards.SIZES) is not None  # the cheap path other ranks take
    prep_char(src, out)
    assert shard.read_bytes() == full


def test_a_start_reads_only_the_shards_whose_stamp_changed(tmp_path, monkeypatch):
    """Shards checked once (or just written) are not read again while their size and mtime stay:
    a start on a large corpus costs no CRC pass. A shard written since is checked (and stamped
    anew); data.verify=true (FULL) checks every shard, also damage that kept the mtime."""
    import os

    src = _write_text(tmp_path)
    out = tmp_path / "prep"
    meta = prep_char(src, out)
    read = []
    real = shards.crc32
    monkeypatch.setattr(shards, "crc32", lambda path, *a: (read.append(path.name), real(path, *a))[1])
    assert shards.read_meta(out, meta["fingerprint"]) == meta and read == []  # stamped when written
    shard = out / "train-0000.bin"
    shard.write_bytes(shard.read_bytes())  # same bytes, written again: its mtime moves
    assert shards.read_meta(out, meta["fingerprint"]) == meta and read == ["train-0000.bin"]
    assert shards.read_meta(out, meta["fingerprint"]) == meta and read == ["train-0000.bin"]  # stamped anew
    assert shards.read_meta(out, meta["fingerprint"], verify=shards.FULL) == meta
    assert read == ["train-0000.bin", "train-0000.bin", "val-0000.bin"]
    # A byte changed and the mtime set back (as cp -p or rsync -a would): the ctime moved, checked.
    before = shard.stat()
    data = bytearray(shard.read_bytes())
    data[10] ^= 0xFF
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    notices = []
    assert shards.read_meta(out, meta["fingerprint"], log=notices.append) is None
    assert "train-0000.bin no longer matches its checksum" in notices[0]
    # Damage no stamp sees (bit rot under an unchanged inode): a stamp that vouches for the
    # damaged file, forged here; only FULL reads it.
    raw = (out / "meta.json").read_bytes()
    shards.write_stamps(out, raw, {name: shards.stamp(out / name) for name in ("train-0000.bin", "val-0000.bin")})
    assert shards.read_meta(out, meta["fingerprint"]) == meta
    notices.clear()
    assert shards.read_meta(out, meta["fingerprint"], verify=shards.FULL, log=notices.append) is None
    assert "train-0000.bin no longer matches its checksum" in notices[0]


def test_stamps_of_another_preparation_or_an_unwritable_folder_mean_a_full_check(tmp_path, monkeypatch):
    src = _write_text(tmp_path)
    out = tmp_path / "prep"
    prep_char(src, out)
    old_stamps = (out / shards.STAMPS).read_text()
    meta = prep_char(src, out, 0.2)  # prepared again: other shards, another meta
    (out / shards.STAMPS).write_text(old_stamps)  # a stale record must not vouch for the new shards
    read = []
    real = shards.crc32
    monkeypatch.setattr(shards, "crc32", lambda path, *a: (read.append(path.name), real(path, *a))[1])
    assert shards.read_meta(out, meta["fingerprint"]) == meta and sorted(read) == ["train-0000.bin", "val-0000.bin"]
    (out / shards.STAMPS).unlink()
    monkeypatch.setattr(prepare.io, "write_json", lambda *a, **k: (_ for _ in ()).throw(PermissionError(13, "read-only")))
    read.clear()
    for _ in range(2):  # a read-only data root: no stamps, every start checks, nothing fails
        assert shards.read_meta(out, meta["fingerprint"]) == meta
    assert len(read) == 4


def test_a_meta_that_is_not_an_object_reads_as_unprepared(tmp_path):
    src = _write_text(tmp_path)
    out = tmp_path / "prep"
    meta = prep_char(src, out)
    for text in ("[1, 2]", '"meta"', "null", "{bad json"):
        (out / "meta.json").write_text(text)
        assert shards.read_meta(out, meta["fingerprint"]) is None


def test_preparing_in_this_process_leaves_its_signal_handlers_alone(tmp_path):
    """num_proc=1 encodes in the calling process: the trainer's clean-stop handler for SIGTERM
    must still be there afterwards (the pool workers' reset is theirs alone)."""

    def handler(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        prep_char(_write_text(tmp_path), tmp_path / "prep")
        assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_bpe_that_cannot_be_trained_leaves_the_prepared_data(tmp_path):
    src = _write_text(tmp_path)
    out = tmp_path / "prep"
    settings = {"identity": SHA, "val_fraction": 0.1, "split_by": "tail", "num_proc": 1}
    meta = prepare.prepare([src.read_text()], {"kind": "bpe", "vocab_size": 300}, out, settings, log=lambda *_: None)
    with pytest.raises(TinyGPTError, match="vocab_size=100 is too small"):
        prepare.prepare([src.read_text()], {"kind": "bpe", "vocab_size": 100}, out, settings, log=lambda *_: None)
    assert read_meta(out, meta["fingerprint"]) == meta  # the earlier preparation, intact


def test_encoding_stopped_early_reads_a_window_ahead_and_leaves_no_process(tmp_path):
    """A consumer that stops early (data.max_tokens) closes the worker processes' stream: it
    returns at once, no worker is left, and only a window of documents past what was used was
    read (multiprocessing.Pool's imap read the whole corpus ahead, and closing it hung in
    terminate() 3 times in 10 on a busy machine)."""
    import multiprocessing
    import threading

    from gpt.data import prepare
    from gpt.tokenizers import ByteTokenizer

    read = []

    def docs():
        for i in range(200 * prepare._CHUNK_DOCS):
            read.append(i)
            yield f"document {i} " * 20

    stream = prepare.encode_documents(docs(), ByteTokenizer(), num_proc=2)
    whole = prepare.encode_documents((f"document {i} " * 20 for i in range(3 * prepare._CHUNK_DOCS)), ByteTokenizer(), 1)
    first = next(stream)
    assert np.array_equal(first[0], next(whole)[0])  # in document order
    closed = threading.Thread(target=stream.close)
    closed.start()
    closed.join(timeout=60)
    assert not closed.is_alive() and not multiprocessing.active_children()
    assert len(read) <= (2 * 2 + 1) * prepare._CHUNK_DOCS


def test_a_single_document_is_split_by_its_tail(tmp_path):
    """One file is one document, which cannot be split by documents (the default): its last
    val_fraction validates, as data.split_by=tail would have it, and the line says so."""
    text = tmp_path / "roman.txt"
    text.write_text("Of arms and the man I sing, who first from the shores of Troy came. " * 40)
    said: list[str] = []
    base = data_settings("one", {"kind": "local", "path": str(text)}, {"kind": "byte"})
    from gpt.data import load_data

    one = load_data(base, tmp_path / "root", log=said.append)
    tail = load(replace(base, name="tail", split_by="tail"), tmp_path / "root")
    assert [s.tolist() for s in one.train] == [s.tolist() for s in tail.train]
    assert [s.tolist() for s in one.val] == [s.tolist() for s in tail.val] and sum(len(s) for s in one.val) > 0
    assert any("one document: its last 25% validates (as data.split_by=tail)" in line for line in said), said
