"""gpt/data: prepared data under a data.name is not lost or replaced unsaid: tokens prepared from
local files stay usable once the files are gone; a preparation of other settings (another
tokenizer, a changed corpus) is replaced with a notice saying what differs, or refused where the
caller only reads (tinygpt eval).
Run: pytest tests/data/test_prepared_data_kept.py"""

from __future__ import annotations

import shutil

import pytest

from gpt.data import load_data
from gpt.data.shards import PreparedOtherwise
from gpt.errors import TinyGPTError
from helpers import TEXT, data_settings, load, write_corpus


def _local(name: str, path, kind: str = "byte", **kw):
    return data_settings(name, {"kind": "local", "path": str(path)}, {"kind": kind}, **kw)


def test_prepared_local_data_is_used_once_its_files_are_gone(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", "txt")
    root = tmp_path / "root"
    first = load(_local("notes", corpus), root)
    shutil.move(corpus, tmp_path / "moved")
    again = load(_local("notes", corpus), root)  # nothing asks for another preparation: the tokens as they are
    assert again.meta == first.meta and [list(s) for s in again.val] == [list(s) for s in first.val]
    # a setting that decides the tokens changed: that needs the files, and says what differs
    with pytest.raises(TinyGPTError) as changed:
        load(_local("notes", corpus, seed=4), root)
    message = str(changed.value)
    assert "no such file or folder" in message and "data.seed: 3 there, 4 here" in message and "\n" not in message
    assert load(_local("notes", corpus), root).meta == first.meta  # the refusal left them as they were
    # other files than these were prepared there: the missing path is the error, as before
    with pytest.raises(TinyGPTError, match="no such file or folder"):
        load(_local("notes", tmp_path / "elsewhere"), root)


def test_a_changed_corpus_or_tokenizer_is_prepared_again_saying_what_differs(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", "txt")
    root = tmp_path / "root"
    load(_local("notes", corpus), root)
    (corpus / "zz-new.txt").write_text("A document added since the data was prepared.")
    said = []
    load_data(_local("notes", corpus), root, log=said.append)
    notice = [m for m in said if m.startswith("notice:")]
    assert len(notice) == 1 and "1 added (zz-new.txt)" in notice[0] and "documents may move between train and val" in notice[0]
    said.clear()  # the folder moved, its files as they were: said so, and the split stays
    before = load(_local("notes", corpus), root)
    shutil.move(corpus, tmp_path / "moved")
    moved = load_data(_local("notes", tmp_path / "moved"), root, log=said.append)
    notice = [m for m in said if m.startswith("notice:")]
    assert len(notice) == 1 and f"the corpus moved from {corpus} to {tmp_path / 'moved'} (the same files)" in notice[0]
    assert "added" not in notice[0] and "documents may move" not in notice[0]
    assert [list(s) for s in moved.val] == [list(s) for s in before.val]
    corpus = tmp_path / "moved"
    said.clear()
    load_data(_local("notes", corpus, kind="char"), root, log=said.append)
    assert any("tokenizer: byte there, char here" in m for m in said if m.startswith("notice:"))


def test_a_reader_refuses_to_prepare_over_data_of_other_settings(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", "txt")
    root = tmp_path / "root"
    meta = load(_local("notes", corpus, kind="char"), root).meta
    with pytest.raises(PreparedOtherwise, match="tokenizer: char there, byte here"):
        load_data(_local("notes", corpus), root, log=lambda *a: None, replace=False)
    assert load(_local("notes", corpus, kind="char"), root).meta == meta  # untouched
    # nothing prepared there yet: a reader prepares it
    assert load_data(_local("fresh", corpus), root, log=lambda *a: None, replace=False).meta["tokenizer"]["kind"] == "byte"


def test_a_changed_one_document_corpus_says_its_cut_may_move_not_its_documents(tmp_path):
    """One document is split by its tail whatever data.split_by says: its notice speaks of the cut
    before the val tail, not of documents moving between train and val (there is one)."""
    one, root = tmp_path / "one.txt", tmp_path / "root"
    one.write_text(TEXT)
    load(_local("one", one), root)
    one.write_text(TEXT + "An epilogue, added since.\n")
    said = []
    load_data(_local("one", one), root, log=said.append)
    notice = [m for m in said if m.startswith("notice:")]
    assert len(notice) == 1 and "1 changed (one.txt)" in notice[0], said
    assert "documents may move" not in notice[0]
    assert "one document, split by its tail: the cut before the last 25% (val) may move in the text" in notice[0]
    corpus = write_corpus(tmp_path / "corpus", "txt")  # many documents split by the tail: the same cut
    load(_local("notes", corpus, split_by="tail"), root)
    (corpus / "zz-new.txt").write_text("A document added since the data was prepared.")
    said.clear()
    load_data(_local("notes", corpus, split_by="tail"), root, log=said.append)
    assert any("; split by the tail: the cut before the last 25% (val) may move" in m for m in said), said
