"""gpt/data/sources.py: local files, Hub datasets, save_to_disk folders, and clear errors that
leave nothing behind. Run: pytest tests/data/test_sources.py"""

from __future__ import annotations

import pytest

from gpt.errors import TinyGPTError
from helpers import DOCS, data_settings, load, write_corpus


def _stream(data) -> list[int]:
    return [int(t) for split in (data.train, data.val) for shard in split for t in shard]


@pytest.mark.parametrize("kind", ["txt", "md", "jsonl", "parquet"])
def test_local_sources_prepare_the_same_documents(tmp_path, kind):
    folder = write_corpus(tmp_path / "corpus", kind)
    source = {"kind": "local", "path": str(folder), "doc_unit": "file", "text_field": "body"}
    data = load(data_settings("c", source, {"kind": "byte"}), tmp_path / "root")
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
    data = load(data_settings("lines", source, {"kind": "byte"}), tmp_path / "root")
    assert data.meta["documents"] == 4  # empty lines are not documents


def test_hub_code_path_with_a_local_dataset_and_save_to_disk(tmp_path):
    """A dataset folder loaded by datasets.load_dataset (exactly what a Hub name goes through) and
    a dataset saved with save_to_disk give the same tokens as the same records from .jsonl."""
    import datasets

    folder = write_corpus(tmp_path / "hubstyle", "jsonl")
    tok = {"kind": "byte"}
    via_hub = load(
        data_settings("h", {"kind": "hub", "path": str(folder), "split": "train", "text_field": "body"}, tok), tmp_path / "root"
    )
    datasets.Dataset.from_dict({"body": DOCS}).save_to_disk(str(tmp_path / "saved"))
    via_disk = load(
        data_settings("d", {"kind": "disk", "path": str(tmp_path / "saved"), "text_field": "body"}, tok), tmp_path / "root"
    )
    via_local = load(data_settings("l", {"kind": "local", "path": str(folder), "text_field": "body"}, tok), tmp_path / "root")
    assert _stream(via_hub) == _stream(via_disk) == _stream(via_local)


@pytest.mark.parametrize(
    "source, match",
    [
        ({"kind": "local", "path": "/nonexistent/corpus"}, "no such file or folder"),
        ({"kind": "local", "path": "EMPTY"}, "holds no .txt"),
        ({"kind": "local", "path": "BLANKS"}, "corpus is empty"),
        ({"kind": "local", "path": "JSONL", "text_field": "content"}, "no text field 'content'; its fields are id, body"),
        ({"kind": "local", "path": "JSONL", "text_field": "id"}, "text field 'id' holds int values .*, not text"),
        (
            {"kind": "hub", "path": "someone/not-downloaded-here"},
            "cannot reach Hub dataset someone/not-downloaded-here.*save_to_disk",
        ),
        ({"kind": "disk", "path": "/nonexistent/saved"}, "does not exist"),
        ({"kind": "url"}, "data.source.url is required"),
        ({"kind": "ftp"}, "data.source.kind='ftp' is unknown"),
    ],
)
def test_data_errors_are_clear_and_leave_nothing_behind(tmp_path, source, match, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "empty").mkdir()
    (tmp_path / "blanks").mkdir()
    (tmp_path / "blanks" / "a.txt").write_text("")
    jsonl = write_corpus(tmp_path / "jsonl", "jsonl")
    source = dict(source)
    if "path" in source:
        source["path"] = {"EMPTY": str(tmp_path / "empty"), "BLANKS": str(tmp_path / "blanks"), "JSONL": str(jsonl)}.get(
            source["path"], source["path"]
        )
    with pytest.raises(TinyGPTError, match=match):
        load(data_settings("bad", source, {"kind": "byte"}), tmp_path / "root")
    out = tmp_path / "root" / "bad"
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet"])
def test_local_files_leave_no_copy_outside_the_data_root_and_no_foreign_progress_bars(tmp_path, kind):
    """Local files are streamed: nothing lands in the Hugging Face cache (an Arrow copy as large
    as the corpus did), and a plain log holds our own lines only."""
    import os
    import subprocess
    import sys

    from helpers import REPO

    folder = write_corpus(tmp_path / "corpus", kind)
    home = tmp_path / "home"
    env = {**os.environ, "HOME": str(home), "TINYGPT_DATA_DIR": str(tmp_path / "root"), "PYTHONPATH": str(REPO)}
    for var in ("HF_HOME", "HF_DATASETS_CACHE", "XDG_CACHE_HOME"):
        env.pop(var, None)
    args = ["data=local", f"data.source.path={folder}", "data.source.text_field=body", "data.tokenizer.kind=byte"]
    proc = subprocess.run(
        [sys.executable, "-m", "gpt", "prepare", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert "12 documents" in proc.stdout
    assert not [p for p in home.rglob("*") if p.is_file()]  # no ~/.cache/huggingface/datasets copies
    assert "Generating" not in proc.stderr and "it/s]" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("kind, total", [("txt", 12), ("parquet", 12), ("jsonl", None)])
def test_the_progress_bar_knows_the_number_of_documents_where_the_source_can_tell(tmp_path, kind, total, capsys):
    from gpt.data import prepare
    from gpt.data.sources import open_source

    folder = write_corpus(tmp_path / "corpus", kind)
    settings = data_settings("c", {"kind": "local", "path": str(folder), "text_field": "body"}, {"kind": "byte"})
    source = open_source(settings.source, tmp_path / "root")
    prep = {"identity": source.identity, "val_fraction": 0.25, "split_by": "documents", "seed": 3, "num_proc": 1}
    prepare.prepare(source.documents, {"kind": "byte"}, tmp_path / "root" / "c", prep, log=lambda *_: None, progress=True)
    assert source.documents.total == total
    bar = capsys.readouterr().err
    assert ("12/12" in bar and "100%" in bar) if total else ("12 docs" in bar and "%" not in bar), bar


def test_a_malformed_jsonl_line_is_named_by_its_file_and_line(tmp_path):
    """`tinygpt prepare` on a folder whose second .jsonl file has a bad line 31: the one-line error
    names that file and line (datasets' said 'in row 30' of the folder, counted from 0 in its
    block), and a line that is JSON but not a record is named as well."""
    import json

    from helpers import assert_one_line_error, run_script

    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS * 4))
    lines = [json.dumps({"text": f"record {i}"}) for i in range(30)] + ['{"text": "no closing quote}', '{"text": "x"}']
    (folder / "b.jsonl").write_text("\n".join(lines) + "\n")
    args = ["data=local", f"data.source.path={folder}", "data.name=records", "data.tokenizer.kind=byte"]
    proc = run_script("prepare", args, tmp_path, tmp_path / "root")
    assert_one_line_error(proc, f"cannot read {folder / 'b.jsonl'} line 31: not JSON (Unterminated string", "fix or remove")
    lines[30] = "[1, 2]"
    (folder / "b.jsonl").write_text("\n".join(lines) + "\n")
    proc = run_script("prepare", args, tmp_path, tmp_path / "root")
    assert_one_line_error(proc, f"cannot read {folder / 'b.jsonl'} line 31: not a JSON object ('[1, 2]')")
