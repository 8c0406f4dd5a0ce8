"""gpt/data: prepared data under a data.name is not lost or replaced unsaid: tokens prepared from
local files stay usable once the files are gone; a preparation of other settings (another
tokenizer, a changed corpus) is replaced with a notice saying what differs, or refused where the
caller only reads (tinygpt eval); a command refused for its tokenizer (a resume on a changed
corpus, an eval on data of another) prepares nothing first.
Run: pytest tests/data/test_prepared_data_kept.py"""

from __future__ import annotations

import os
import shutil

import pytest

from gpt.data import load_data
from gpt.data.shards import PreparedOtherwise
from gpt.errors import TinyGPTError
from gpt.tokenizers import require_same
from helpers import TEXT, assert_one_line_error, data_settings, load, run_script, write_corpus


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


@pytest.mark.parametrize("tokenizer", [{"kind": "char"}, {"kind": "bpe", "vocab_size": 300}], ids=["char", "bpe"])
def test_a_tokenizer_fitted_on_a_changed_corpus_is_refused_before_anything_is_written(tmp_path, tokenizer):
    """load_data's check_tokenizer (a resumed run's checkpoint): a char alphabet or BPE fitted on
    the corpus as it is now is checked once fitted, before the data prepared from the old text
    goes; under a fresh name, no folder is left."""
    corpus, root = write_corpus(tmp_path / "corpus", "txt"), tmp_path / "root"

    def settings(name):
        return data_settings(name, {"kind": "local", "path": str(corpus)}, tokenizer)

    old = load(settings("notes"), root).tokenizer.to_dict()
    before = {p.name: p.read_bytes() for p in (root / "notes").iterdir()}
    (corpus / "doc03.txt").write_text("Zebras quarrel, QUIXOTIC and jazzy: ~{|}~ " * 20)

    def same(spec):
        require_same(old, spec, "the checkpoint's tokenizer differs from this data's", "put it back")

    for name in ("notes", "fresh"):
        with pytest.raises(TinyGPTError, match="the checkpoint's tokenizer differs from this data's"):
            load_data(settings(name), root, log=lambda *a: None, check_tokenizer=same)
    assert {p.name: p.read_bytes() for p in (root / "notes").iterdir()} == before
    assert not (root / "fresh").exists()


def _char_run(tmp_path, corpus, *more):
    args = [
        "debug=tiny",
        "data=local",
        f"data.source.path={corpus}",
        "data.name=notes",
        "data.tokenizer.kind=char",
        "train.sample_tokens=0",
        f"hydra.run.dir={tmp_path / 'run'}",
        *more,
    ]
    return run_script("train.py", args, tmp_path, tmp_path / "root")


def test_a_resume_refused_for_its_changed_corpus_leaves_the_prepared_data_as_it_was(tmp_path):
    """A char run resumed after a file of its corpus gained characters: refused (the alphabet is
    not the checkpoint's) before the data under data.name is prepared again, so what another
    run of that name reads stays byte for byte; with the text put back, the run resumes."""
    corpus = write_corpus(tmp_path / "corpus", "txt")
    first = _char_run(tmp_path, corpus, "train.max_iters=2")
    assert first.returncode == 0, first.stderr[-2000:]
    prepared = tmp_path / "root" / "notes"
    before = {p.name: p.read_bytes() for p in prepared.iterdir()}
    text = (corpus / "doc03.txt").read_text()
    (corpus / "doc03.txt").write_text(text + " Zebras quarrel: QUIXOTIC!")
    refused = _char_run(tmp_path, corpus, "train.max_iters=4")
    assert_one_line_error(refused, "the checkpoint's tokenizer differs from this data's", "only the data has '!'")
    assert "preparing it again" not in refused.stdout + refused.stderr
    assert {p.name: p.read_bytes() for p in prepared.iterdir()} == before
    (corpus / "doc03.txt").write_text(text)
    again = _char_run(tmp_path, corpus, "train.max_iters=4")
    assert again.returncode == 0 and "resuming from" in again.stdout, again.stderr[-2000:]


def test_eval_refuses_data_of_another_tokenizer_before_preparing_it(tmp_path):
    """`tinygpt eval data=...` naming data the model cannot read (another tokenizer kind: known
    at once; a char alphabet fitted on other text: once fitted) is refused before any of it is
    prepared: no folder under the data root."""
    corpus, root = write_corpus(tmp_path / "corpus", "txt"), tmp_path / "root"
    run = _char_run(tmp_path, corpus, "train.max_iters=2")
    assert run.returncode == 0, run.stderr[-2000:]
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.txt").write_text("Zebras quarrel: QUIXOTIC! " * 40)
    for tokenizer, says in (("byte", "vs byte)"), ("char", "only the data has '!'")):
        args = [f"run_dir={tmp_path / 'run'}", "data=local", f"data.source.path={other}", "data.name=other"]
        proc = run_script("eval", [*args, f"data.tokenizer.kind={tokenizer}"], tmp_path, root)
        assert_one_line_error(proc, "data other uses another tokenizer than the model (char (", says)
        assert not (root / "other").exists()


def test_a_source_failing_mid_way_leaves_the_earlier_preparation_as_it_was(tmp_path):
    """A corpus whose reading fails after its first documents (a bad record deep in a large JSONL
    file fails only as it is reached) is refused with the data prepared there before byte for
    byte as it was: the old shards go only once every document is tokenized."""
    from gpt.data.prepare import prepare

    out = tmp_path / "notes"
    settings = {"identity": "test", "val_fraction": 0.25, "split_by": "documents", "seed": 3, "num_proc": 1}
    docs = [f"document {i}: " + "some words " * 20 for i in range(8)]
    first = prepare(docs, {"kind": "byte"}, out, settings, log=lambda *a: None)
    before = {f.name: f.read_bytes() for f in out.iterdir()}

    def failing():
        yield from docs[:5]
        raise TinyGPTError("corpus/part.jsonl line 500001: not JSON")

    with pytest.raises(TinyGPTError, match="line 500001"):
        prepare(failing(), {"kind": "byte"}, out, {**settings, "seed": 4}, log=lambda *a: None)
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before  # no temporary left either
    assert prepare(docs, {"kind": "byte"}, out, settings, log=lambda *a: None) == first


def test_a_failed_preparation_under_a_new_name_leaves_no_folder_and_a_killed_ones_stream_goes(tmp_path):
    """A preparation under a data.name nothing was prepared under, whose corpus fails part-way,
    leaves no folder behind (it left an empty one); the temporary stream of a preparation killed
    while reading (its process gone) is removed by the next run that takes the earlier data,
    which left it there for good once the old data stayed usable through such a kill."""
    import subprocess
    import sys

    from gpt.data.prepare import prepare

    settings = {"identity": "test", "val_fraction": 0.25, "split_by": "documents", "seed": 3, "num_proc": 1}
    docs = [f"document {i}: " + "some words " * 20 for i in range(8)]

    def failing():
        yield from docs[:5]
        raise TinyGPTError("corpus/part.jsonl line 500001: not JSON")

    with pytest.raises(TinyGPTError, match="line 500001"):
        prepare(failing(), {"kind": "byte"}, tmp_path / "new", settings, log=lambda *a: None)
    assert not (tmp_path / "new").exists()
    out = tmp_path / "notes"
    prepare(docs, {"kind": "byte"}, out, settings, log=lambda *a: None)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead, live = out / f"stream.tmp-{int(gone.stdout)}", out / f"stream.tmp-{os.getpid()}"
    dead.write_bytes(b"\0" * 64)
    live.write_bytes(b"\0" * 64)  # a process preparing right now: its file stays
    prepare(docs, {"kind": "byte"}, out, settings, log=lambda *a: None)
    assert not dead.exists() and live.exists()
