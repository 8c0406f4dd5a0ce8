"""Tokenizers (byte, tiktoken by name and from a ranks file) and preparation from every kind of
source into token shards: reuse, invalidation, interruption, dtypes, errors.
Run: pytest tests/test_data_sources.py"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import REPO, TINY_RUN, compose, run_script
from gpt.data import load_data
from gpt.data.loader import RandomWindows
from gpt.data.prepare import read_meta
from gpt.errors import TinyGPTError
from gpt.tokenizer import ByteTokenizer, TiktokenTokenizer, tokenizer_from_dict
from gpt.trainer import train

UNICODE = "Ünïcödé ✓ — 日本語のテキスト, emoji 🦜🚀, Ελληνικά, العربية\n\ttabs and  spaces <|endoftext|>"


def write_ranks(path: Path, extra_pairs: int = 40, big: bool = False) -> Path:
    """A tiny BPE ranks file in tiktoken's format: every single byte, then some merges."""
    tokens = [bytes([b]) for b in range(256)]
    if big:  # every 2-byte pair and then some: a vocabulary beyond uint16
        tokens += [bytes([a, b]) for a in range(256) for b in range(256)] + [b"the", b"and", b" of"]
    else:
        tokens += [b"th", b"he", b"the", b" t", b"an", b"nd", b"and", b"in", b"er", b" a"][:extra_pairs]
    path.write_text("".join(f"{base64.b64encode(t).decode()} {rank}\n" for rank, t in enumerate(tokens)))
    return path


def test_byte_and_tiktoken_round_trip_arbitrary_unicode(tmp_path):
    for tok in (ByteTokenizer(), TiktokenTokenizer("gpt2", ranks_file=str(write_ranks(tmp_path / "r.tiktoken")))):
        ids = tok.encode(UNICODE)
        assert tok.decode(ids) == UNICODE
        assert tok.eot_id not in ids  # the literal "<|endoftext|>" in text is not the control token
        again = tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))  # as stored in meta / checkpoints
        assert again.encode(UNICODE) == ids and again.vocab_size == tok.vocab_size


def test_tiny_ranks_file_builds_a_working_encoding(tmp_path):
    tok = TiktokenTokenizer("gpt2", ranks_file=str(write_ranks(tmp_path / "r.tiktoken")))
    assert tok.vocab_size == 256 + 10 + 1 and tok.eot_id == 266
    ids = tok.encode("the band and the hand")
    assert tok.decode(ids) == "the band and the hand"
    assert len(ids) < len("the band and the hand")  # merges were applied


def test_real_gpt2_encoding(gpt2_ranks):
    if gpt2_ranks is None:
        pytest.skip("GPT-2's ranks file is not in ../shared")
    by_name = TiktokenTokenizer("gpt2")  # from the seeded tiktoken cache
    by_file = TiktokenTokenizer("gpt2", ranks_file=str(gpt2_ranks))
    assert by_name.encode("Hello world") == by_file.encode("Hello world") == [15496, 995]
    assert by_name.vocab_size == 50257 and by_name.eot_id == 50256
    assert by_file.decode(by_file.encode(UNICODE)) == UNICODE


def test_unknown_encoding_and_offline_failure(tmp_path, monkeypatch):
    with pytest.raises(TinyGPTError, match="unknown"):
        TiktokenTokenizer("gpt5")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))
    import tiktoken.registry

    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    monkeypatch.setattr(tiktoken.load, "read_file", lambda url: (_ for _ in ()).throw(ConnectionError("offline")))
    with pytest.raises(TinyGPTError, match="ranks_file"):
        TiktokenTokenizer("cl100k_base")


def _cfg(name, source, tokenizer, **kw):
    return {"name": name, "tokenizer": tokenizer, "source": source, "val_fraction": 0.25, "split_by": "documents",
            "seed": 3, "num_proc": 1, **kw}


def _stream(data) -> list[int]:
    return [int(t) for split in (data.train, data.val) for shard in split for t in shard]


DOCS = [f"Document {i}: the quick brown fox jumps over the lazy dog {i * 7}.\nSecond line of {i}." for i in range(12)]


def _write_corpus(folder: Path, kind: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if kind in ("txt", "md"):
        for i, doc in enumerate(DOCS):
            (folder / f"doc{i:02d}.{kind}").write_text(doc)
    elif kind == "jsonl":
        (folder / "part.jsonl").write_text("".join(json.dumps({"id": i, "body": d}) + "\n" for i, d in enumerate(DOCS)))
    elif kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"id": list(range(len(DOCS))), "body": DOCS}), folder / "part.parquet")
    return folder


@pytest.mark.parametrize("kind", ["txt", "md", "jsonl", "parquet"])
def test_local_sources_prepare_the_same_documents(tmp_path, kind):
    folder = _write_corpus(tmp_path / "corpus", kind)
    source = {"kind": "local", "path": str(folder), "doc_unit": "file", "text_field": "body"}
    data = load_data(_cfg("c", source, {"kind": "byte"}), tmp_path / "root", log=lambda *a: None)
    meta = data.meta
    assert meta["documents"] == 12 and meta["dtype"] == "uint16"
    # every document is there once, each followed by end-of-text (256)
    stream = _stream(data)
    assert stream.count(256) == 12
    decoded = bytes(t for t in stream if t != 256).decode()
    assert all(doc in decoded for doc in DOCS)
    assert len(data.val) == 1 and sum(len(s) for s in data.val) > 0


def test_lines_as_documents_and_glob(tmp_path):
    (tmp_path / "a.txt").write_text("one\ntwo\n\nthree\n")
    (tmp_path / "b.txt").write_text("four\n")
    source = {"kind": "local", "path": str(tmp_path / "*.txt"), "doc_unit": "line"}
    data = load_data(_cfg("lines", source, {"kind": "byte"}), tmp_path / "root", log=lambda *a: None)
    assert data.meta["documents"] == 4  # empty lines are not documents


def test_hub_code_path_with_a_local_dataset_and_save_to_disk(tmp_path):
    """A dataset folder loaded by datasets.load_dataset (exactly what a Hub name goes through) and
    a dataset saved with save_to_disk give the same tokens as the same records from .jsonl."""
    import datasets

    folder = _write_corpus(tmp_path / "hubstyle", "jsonl")
    tok = {"kind": "byte"}
    via_hub = load_data(_cfg("h", {"kind": "hub", "path": str(folder), "split": "train", "text_field": "body"}, tok),
                        tmp_path / "root", log=lambda *a: None)
    datasets.Dataset.from_dict({"body": DOCS}).save_to_disk(str(tmp_path / "saved"))
    via_disk = load_data(_cfg("d", {"kind": "disk", "path": str(tmp_path / "saved"), "text_field": "body"}, tok),
                         tmp_path / "root", log=lambda *a: None)
    via_local = load_data(_cfg("l", {"kind": "local", "path": str(folder), "text_field": "body"}, tok),
                          tmp_path / "root", log=lambda *a: None)
    assert _stream(via_hub) == _stream(via_disk) == _stream(via_local)


def test_reuse_and_invalidation(tmp_path):
    folder = _write_corpus(tmp_path / "corpus", "txt")
    cfg = _cfg("c", {"kind": "local", "path": str(folder)}, {"kind": "byte"})
    first = load_data(cfg, tmp_path / "root", log=lambda *a: None).meta
    out = tmp_path / "root" / "c"
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert load_data(cfg, tmp_path / "root", log=lambda *a: None).meta == first
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps  # reused, nothing rewritten
    for change in ({"val_fraction": 0.5}, {"seed": 4}, {"max_docs": 5}):
        assert load_data({**cfg, **change}, tmp_path / "root", log=lambda *a: None).meta["fingerprint"] != first["fingerprint"]
    time.sleep(0.01)
    (folder / "doc00.txt").write_text("changed content")
    changed = load_data(cfg, tmp_path / "root", log=lambda *a: None).meta
    assert changed["fingerprint"] != first["fingerprint"] and changed["documents"] == 12
    ranks = write_ranks(tmp_path / "r.tiktoken")
    bpe = load_data({**cfg, "tokenizer": {"kind": "tiktoken", "name": "gpt2", "ranks_file": str(ranks)}}, tmp_path / "root", log=lambda *a: None)
    assert bpe.meta["tokenizer"]["kind"] == "tiktoken"


def test_documents_split_is_seeded(tmp_path):
    folder = _write_corpus(tmp_path / "corpus", "txt")
    base = _cfg("c", {"kind": "local", "path": str(folder)}, {"kind": "byte"})
    a = _stream(load_data({**base, "name": "a"}, tmp_path / "root", log=lambda *a: None))
    b = _stream(load_data({**base, "name": "b"}, tmp_path / "root", log=lambda *a: None))
    c = load_data({**base, "name": "c", "seed": 99}, tmp_path / "root", log=lambda *a: None)
    assert a == b
    assert bytes(t for t in _stream(c) if t != 256) != bytes(t for t in a if t != 256)  # other docs in val
    assert c.meta["documents"] == 12 and round(12 * 0.25) == sum(1 for s in c.val for t in s if t == 256)


def test_uint32_when_the_vocabulary_exceeds_65536(tmp_path):
    ranks = write_ranks(tmp_path / "big.tiktoken", big=True)
    folder = _write_corpus(tmp_path / "corpus", "txt")
    data = load_data(_cfg("big", {"kind": "local", "path": str(folder)}, {"kind": "tiktoken", "name": "gpt2", "ranks_file": str(ranks)}),
                     tmp_path / "root", log=lambda *a: None)
    assert data.tokenizer.vocab_size > 65536 and data.meta["dtype"] == "uint32" and data.train[0].dtype == np.uint32
    assert data.tokenizer.eot_id in _stream(data) and max(_stream(data)) > 65535


def test_shards_and_windows_across_them(tmp_path):
    folder = _write_corpus(tmp_path / "corpus", "txt")
    data = load_data(_cfg("s", {"kind": "local", "path": str(folder)}, {"kind": "byte"}, shard_tokens=200),
                     tmp_path / "root", log=lambda *a: None)
    assert len(data.train) > 2 and all(len(s) <= 200 for s in data.train)
    a = RandomWindows(data.train, 16, 32, torch.device("cpu"), seed=1)
    b = RandomWindows(data.train, 16, 32, torch.device("cpu"), seed=1)
    x, y = a.next()
    assert torch.equal(x, b.next()[0]) and torch.equal(x[:, 1:], y[:, :-1])
    joined = [np.asarray(s).tolist() for s in data.train]
    for row in x.tolist():  # every window lies inside one shard
        assert any(any(s[i : i + 16] == row for i in range(len(s) - 15)) for s in joined)


@pytest.mark.parametrize(
    "source, match",
    [
        ({"kind": "local", "path": "/nonexistent/corpus"}, "no such file or folder"),
        ({"kind": "local", "path": "EMPTY"}, "holds no .txt"),
        ({"kind": "local", "path": "BLANKS"}, "corpus is empty"),
        ({"kind": "local", "path": "JSONL", "text_field": "content"}, "no text field 'content'; its fields are id, body"),
        ({"kind": "hub", "path": "someone/not-downloaded-here"}, "cannot reach Hub dataset someone/not-downloaded-here.*save_to_disk"),
        ({"kind": "disk", "path": "/nonexistent/saved"}, "does not exist"),
    ],
)
def test_data_errors_are_clear_and_leave_nothing_behind(tmp_path, source, match, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "empty").mkdir()
    (tmp_path / "blanks").mkdir()
    (tmp_path / "blanks" / "a.txt").write_text("")
    jsonl = _write_corpus(tmp_path / "jsonl", "jsonl")
    source = dict(source)
    source["path"] = {"EMPTY": str(tmp_path / "empty"), "BLANKS": str(tmp_path / "blanks"), "JSONL": str(jsonl)}.get(source["path"], source["path"])
    with pytest.raises(TinyGPTError, match=match):
        load_data(_cfg("bad", source, {"kind": "byte"}), tmp_path / "root", log=lambda *a: None)
    out = tmp_path / "root" / "bad"
    assert not out.exists() or not any(out.iterdir())


_PREPARE = """
import sys
from gpt.data import load_data
cfg = {"name": "big", "tokenizer": {"kind": "byte"}, "source": {"kind": "local", "path": sys.argv[1], "doc_unit": "line"},
       "val_fraction": 0.1, "split_by": "documents", "seed": 5, "num_proc": 2, "shard_tokens": 300000}
load_data(cfg, sys.argv[2], log=lambda *a: None)
"""


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
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ref_meta = json.loads((ref_root / "big" / "meta.json").read_text())
    assert read_meta(root / "big", ref_meta["fingerprint"]) is None  # nothing that passes for complete data

    subprocess.run([sys.executable, "-c", _PREPARE, str(corpus), str(root)], check=True, cwd=REPO)
    meta = json.loads((root / "big" / "meta.json").read_text())
    assert meta["shards"] == ref_meta["shards"] and len(meta["shards"]["train"]) > 1
    for f in sorted((ref_root / "big").glob("*.bin")):
        assert (root / "big" / f.name).read_bytes() == f.read_bytes()
    assert not list((root / "big").glob("*.tmp-*"))


def test_corpus_shorter_than_a_window_and_tokenizer_mismatch(tmp_path):
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    for i in range(4):
        (tiny / f"{i}.txt").write_text(f"tiny {i}")
    base = [*TINY_RUN, "data=local", f"data.source.path={tiny}", "data.name=tiny", "data.tokenizer.kind=byte",
            f"paths.data_dir={tmp_path / 'root'}", "data.val_fraction=0.25"]
    with pytest.raises(TinyGPTError, match="block_size=16 is longer than the val split"):
        train(compose(base, tmp_path / "run1"))

    text = tmp_path / "text"
    _write_corpus(text, "txt")
    ok = [*TINY_RUN, "data=local", f"data.source.path={text}", "data.name=text", f"paths.data_dir={tmp_path / 'root'}",
          "train.max_iters=4", "train.eval_interval=2", "train.sample_tokens=0"]
    train(compose([*ok, "data.tokenizer.kind=byte"], tmp_path / "run2"))
    ranks = write_ranks(tmp_path / "r.tiktoken")
    other = [*ok, "data.tokenizer.kind=tiktoken", f"+data.tokenizer.ranks_file={ranks}", "data.name=text_bpe", "train.max_iters=6"]
    with pytest.raises(TinyGPTError, match="tokenizer differs"):
        train(compose(other, tmp_path / "run2"))


@pytest.mark.slow
def test_prepare_command_and_bpe_training(tmp_path, data_root, gpt2_ranks):
    if gpt2_ranks is None:
        pytest.skip("GPT-2's ranks file is not in ../shared")
    root, data_overrides = data_root
    prep = subprocess.run([sys.executable, "-m", "gpt.data", "data=shakespeare", *data_overrides],
                          cwd=REPO, capture_output=True, text=True, env={**os.environ, "TINYGPT_DATA_DIR": str(root)})
    assert prep.returncode == 0, prep.stderr
    assert "tokenizer tiktoken" in prep.stdout
    proc = run_script("train.py", ["data=shakespeare", *data_overrides, *TINY_RUN], tmp_path, root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "vocab 50257" in proc.stdout and "preparing" not in proc.stdout.lower()  # reused what gpt.data prepared
    sample = run_script("sample.py", ["num_samples=1", "max_new_tokens=20", "prompt=ROMEO:"], tmp_path, root)
    assert sample.returncode == 0 and "ROMEO:" in sample.stdout


def test_caps_limit_documents_and_tokens(tmp_path):
    folder = _write_corpus(tmp_path / "corpus", "txt")
    base = _cfg("c", {"kind": "local", "path": str(folder)}, {"kind": "byte"})
    capped = load_data({**base, "name": "tok", "max_tokens": 500}, tmp_path / "root", log=lambda *a: None)
    assert sum(capped.meta["tokens"].values()) == 500
    docs = load_data({**base, "name": "docs", "max_docs": 5}, tmp_path / "root", log=lambda *a: None)
    assert docs.meta["documents"] == 5 and _stream(docs).count(256) == 5


def test_tiny_bpe_end_to_end_train_and_sample(tmp_path):
    """An Encoding from a ranks file the test wrote: prepare, train, checkpoint, sample."""
    from gpt.generation import SamplingConfig, generate
    from gpt.sampling import load_model

    from gpt import checkpoint

    ranks = write_ranks(tmp_path / "r.tiktoken")
    corpus = _write_corpus(tmp_path / "corpus", "txt")
    overrides = [*TINY_RUN, "data=local", f"data.source.path={corpus}", "data.name=tinybpe",
                 f"data.tokenizer.ranks_file={ranks}", f"paths.data_dir={tmp_path / 'root'}",
                 "train.max_iters=6", "train.eval_interval=3", "train.sample_tokens=0"]
    train(compose(overrides, tmp_path / "run"))
    model, tok, ckpt = load_model(checkpoint.checkpoint_in_run(tmp_path / "run"), torch.device("cpu"))
    assert ckpt["tokenizer"] == {"kind": "tiktoken", "name": "gpt2", "ranks_file": str(ranks), "vocab_size": 267}
    assert tok.vocab_size == 267 and model.config.vocab_size == 267
    text = generate(model, tok, ["the "], SamplingConfig(max_new_tokens=20, temperature=1.0))[0][0]
    assert isinstance(text, str) and len(text) > 0


def test_ranks_files_of_different_vocabularies_are_different_tokenizers(tmp_path):
    from gpt.tokenizer import tokenizer_identity

    small = TiktokenTokenizer("gpt2", ranks_file=str(write_ranks(tmp_path / "small.tiktoken", extra_pairs=4)))
    large = TiktokenTokenizer("gpt2", ranks_file=str(write_ranks(tmp_path / "large.tiktoken", extra_pairs=10)))
    assert tokenizer_identity(small.to_dict()) != tokenizer_identity(large.to_dict())
    moved = dict(small.to_dict(), ranks_file=str(tmp_path / "elsewhere.tiktoken"))
    with pytest.raises(TinyGPTError, match="provide that ranks file|cannot load"):
        tokenizer_from_dict(moved)  # never silently replaced by another vocabulary


def test_one_and_two_processes_prepare_the_same_stream(tmp_path):
    folder = _write_corpus(tmp_path / "corpus", "txt")
    ranks = write_ranks(tmp_path / "r.tiktoken")
    tok = {"kind": "tiktoken", "name": "gpt2", "ranks_file": str(ranks)}
    one = load_data(_cfg("one", {"kind": "local", "path": str(folder)}, tok, num_proc=1), tmp_path / "root", log=lambda *a: None)
    two = load_data(_cfg("two", {"kind": "local", "path": str(folder)}, tok, num_proc=2), tmp_path / "root", log=lambda *a: None)
    assert _stream(one) == _stream(two) and one.meta["fingerprint"] == two.meta["fingerprint"]


def test_bits_per_byte_counts_bytes_per_token(tmp_path):
    from gpt.eval import token_bytes

    tok = TiktokenTokenizer("gpt2", ranks_file=str(write_ranks(tmp_path / "r.tiktoken")))
    ids = tok.encode("héllo 日本") + [tok.eot_id]
    assert token_bytes(tok, ids) == len("héllo 日本".encode())  # end-of-text counts nothing
    assert token_bytes(ByteTokenizer(), list("日".encode()) + [256]) == 3
