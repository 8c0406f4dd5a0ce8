"""gpt/checkpoints/shards.py: sharded checkpoints (format 4) in one process: placeholders and
tensors apart and back (a tied weight stays one), the file read whole or as shapes only, an older
tinygpt's refusal, a missing or cut-short shard refused in one line (and set aside with its
folder when a run resumes), a failed save keeping what was there, leftovers of a killed save
removed, retention. The same written by FSDP2 processes: tests/test_fsdp.py.
Run: pytest tests/test_shards.py"""

from __future__ import annotations

import shutil

import pytest
import torch

from gpt.checkpoints import checkpoint, runs, shards
from gpt.checkpoints.checkpoint import Checkpoint, TrainingState
from gpt.checkpoints.loading import model_from_checkpoint
from gpt.errors import TinyGPTError
from gpt.model import GPT, GPTConfig
from gpt.training.claim import newest_resumable, resumable
from helpers import assert_one_line_error, run_script


def _trained():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=8, block_size=4, n_layer=1, n_head=1, n_embd=8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randint(0, 8, (2, 4)), torch.randint(0, 8, (2, 4)))[1].backward()
    optimizer.step()
    return model, optimizer


def _save_sharded(path, model, optimizer, step=3) -> Checkpoint:
    skeleton, tensors = shards.split({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    record = shards.write(path, tensors, is_main=True)
    training = TrainingState(optimizer=skeleton["optimizer"], scaler={}, loader={}, rng=[{}])
    ckpt = Checkpoint(
        model=skeleton["model"],
        model_config=model.config.to_dict(),
        tokenizer={"kind": "char", "chars": list("abcdefgh")},
        step=step,
        training=training,
        shards=record,
    )
    checkpoint.save(path, ckpt)
    return ckpt


def test_a_sharded_checkpoint_reads_back_whole_or_as_shapes(tmp_path):
    model, optimizer = _trained()
    path = tmp_path / runs.CKPT_DIR / runs.step_file(3)
    written = _save_sharded(path, model, optimizer)
    assert written.model["lm_head.weight"] is written.model["transformer.wte.weight"]  # one placeholder for the tied pair
    assert (path.parent / "ckpt-0000003.shards" / ".metadata").is_file()
    raw = torch.load(path, weights_only=True)
    assert raw["format"] == 4 and all(t.is_meta for t in raw["model"].values())  # the file holds no tensor data

    back = checkpoint.load(path)
    assert back.shards is None  # read whole: to every reader, a whole checkpoint
    assert all(torch.equal(back.model[k], v) for k, v in model.state_dict().items())
    assert back.model["lm_head.weight"] is back.model["transformer.wte.weight"]  # tied: one tensor, as saved unsharded
    saved_state, state = back.training.optimizer["state"], optimizer.state_dict()["state"]
    assert all(torch.equal(saved_state[i][k], v) for i in state for k, v in state[i].items())
    assert back.training.optimizer["param_groups"] == optimizer.state_dict()["param_groups"]

    shapes = checkpoint.load(path, mmap=True)  # what resume checks read: no tensor is read
    assert shapes.shards is not None and all(t.is_meta for t in shapes.model.values())
    assert next(model_from_checkpoint(shapes).parameters()).is_meta
    resumable(path)  # its shapes fit its own model
    one = model_from_checkpoint(back)
    assert all(torch.equal(one.state_dict()[k], v) for k, v in model.state_dict().items())


def test_the_weights_alone_are_read_without_the_optimizer_state(tmp_path, monkeypatch):
    """sample, eval, serve and export (gpt.checkpoints.loading) read a sharded step checkpoint's
    weights and leave its optimizer state (twice the weights under AdamW) on disk."""
    from gpt.checkpoints import loading

    model, optimizer = _trained()
    path = tmp_path / runs.CKPT_DIR / runs.step_file(3)
    _save_sharded(path, model, optimizer)
    read = []
    real_read = shards.read
    monkeypatch.setattr(
        shards, "read", lambda folder, targets, collective: read.append(sorted(targets)) or real_read(folder, targets, collective)
    )

    weights = checkpoint.load(path, training=False)
    assert weights.training is None and weights.shards is None
    assert all(torch.equal(weights.model[k], v) for k, v in model.state_dict().items())
    assert read and all(key.startswith("/model/") for key in read[-1])

    before = len(read)
    loaded = loading.load(str(path))
    assert len(read) == before + 1 and all(key.startswith("/model/") for key in read[-1])
    assert all(torch.equal(loaded.model.state_dict()[k], v) for k, v in model.state_dict().items())
    assert any(key.startswith("/optimizer/") for key in shards.placeholders(checkpoint.load(path, mmap=True).sharded_state()))


def test_a_whole_checkpoint_is_still_format_3(tmp_path):
    model, _ = _trained()
    ckpt = Checkpoint(model=model.state_dict(), model_config=model.config.to_dict(), tokenizer={"kind": "char", "chars": []})
    checkpoint.save(tmp_path / "whole.pt", ckpt)
    raw = torch.load(tmp_path / "whole.pt", weights_only=True)
    assert raw["format"] == 3 and "shards" not in raw  # what every tinygpt that reads 3 reads


def test_a_tinygpt_that_reads_up_to_3_refuses_a_sharded_checkpoint_in_one_line(tmp_path, monkeypatch):
    model, optimizer = _trained()
    path = tmp_path / "ckpt-0000003.pt"
    _save_sharded(path, model, optimizer)
    monkeypatch.setattr(checkpoint, "FORMAT", 3)  # the reader of an earlier tinygpt: Checkpoint.from_payload's check
    with pytest.raises(TinyGPTError) as e:
        checkpoint.load(path)
    assert "checkpoint format 4" in str(e.value) and "upgrade tinygpt" in str(e.value) and "\n" not in str(e.value)


def test_missing_or_cut_short_shards_are_refused_in_one_line(tmp_path):
    model, optimizer = _trained()
    path = tmp_path / "ckpt-0000003.pt"
    _save_sharded(path, model, optimizer)
    folder = path.with_suffix(".shards")
    shard = folder / "__0_0.distcp"

    copy = tmp_path / "elsewhere" / path.name  # the file copied without its folder
    copy.parent.mkdir()
    shutil.copy(path, copy)
    for mmap in (False, True):
        with pytest.raises(TinyGPTError, match=r"shards folder ckpt-0000003\.shards/ is missing: copy that folder"):
            checkpoint.load(copy, mmap=mmap)

    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(TinyGPTError, match=r"__0_0\.distcp is [\d,]+ bytes, written as [\d,]+ \(damaged or cut short\)"):
        checkpoint.load(path, mmap=True)
    shard.unlink()
    with pytest.raises(TinyGPTError, match=r"__0_0\.distcp is missing"):
        checkpoint.load(path)

    # the right sizes, the wrong bytes (another run's shards put in its place): refused when read
    shard.write_bytes(b"\0" * len(data))
    with pytest.raises(TinyGPTError, match=r"cannot load the shards in .*ckpt-0000003\.shards: .*damaged"):
        checkpoint.load(path)


def test_a_damaged_newest_sharded_checkpoint_is_set_aside_with_its_folder(tmp_path):
    model, optimizer = _trained()
    folder = tmp_path / runs.CKPT_DIR
    _save_sharded(folder / runs.step_file(2), model, optimizer, step=2)
    _save_sharded(folder / runs.step_file(4), model, optimizer, step=4)
    (folder / "ckpt-0000004.shards" / "__0_0.distcp").unlink()
    path, ckpt, refused = newest_resumable(tmp_path)
    assert path.name == "ckpt-0000002.pt" and ckpt.step == 2
    assert [p.name for p, _ in refused] == ["ckpt-0000004.pt"] and "is missing" in refused[0][1]
    runs.set_aside(refused[0][0])
    assert {p.name for p in folder.iterdir()} == {
        "ckpt-0000002.pt", "ckpt-0000002.shards", "ckpt-0000004.pt.damaged", "ckpt-0000004.shards.damaged"
    }  # fmt: skip
    # set aside again (a later save of step 4 damaged too): both get the next free mark, even where
    # only the folder's name is taken
    (folder / "ckpt-0000004.pt.damaged").rename(folder / "ckpt-0000004.pt")
    (folder / "ckpt-0000004.shards").mkdir()
    assert runs.set_aside(folder / "ckpt-0000004.pt").name == "ckpt-0000004.pt.damaged-2"
    assert (folder / "ckpt-0000004.shards.damaged-2").is_dir() and (folder / "ckpt-0000004.shards.damaged").is_dir()


def test_a_failed_sharded_save_keeps_the_checkpoint_that_was_there(tmp_path, monkeypatch):
    model, optimizer = _trained()
    path = tmp_path / "ckpt-0000003.pt"
    _save_sharded(path, model, optimizer)
    before = checkpoint.load(path).model

    import torch.distributed.checkpoint as dcp  # (shards imports it where it writes)

    class FullDisk(dcp.FileSystemWriter):  # the disk fills inside DCP, which wraps the error
        def write_data(self, plan, planner):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(dcp, "FileSystemWriter", FullDisk)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    with pytest.raises(
        TinyGPTError, match=r"cannot write the shards of checkpoint .*No space left on device.*kept: free space"
    ) as e:
        _save_sharded(path, model, optimizer)
    assert "\n" not in str(e.value)
    again = checkpoint.load(path).model
    assert all(torch.equal(before[k], again[k]) for k in before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-0000003.pt", "ckpt-0000003.shards"]  # no temporary left

    monkeypatch.undo()  # a save that works replaces it, file and folder
    _save_sharded(path, model, optimizer)
    replaced = checkpoint.load(path).model
    assert all(torch.equal(replaced[k], v) for k, v in model.state_dict().items())


def test_leftovers_of_a_killed_sharded_save_are_removed_and_retention_takes_folders(tmp_path):
    model, optimizer = _trained()
    folder = tmp_path / runs.CKPT_DIR
    for step in (2, 4, 6):
        _save_sharded(folder / runs.step_file(step), model, optimizer, step=step)
    # killed while the processes wrote (a temporary folder), and after the rename, before the file
    shutil.copytree(folder / "ckpt-0000006.shards", folder / "ckpt-0000008.shards.tmp-4242")
    shutil.copytree(folder / "ckpt-0000006.shards", folder / "ckpt-0000010.shards")
    # an older folder without its file is not a save cut short (a save cut short is the newest): it stays
    shutil.copytree(folder / "ckpt-0000006.shards", folder / "ckpt-0000001.shards")
    runs.remove_leftovers(tmp_path)
    names = {p.name for p in folder.iterdir()}
    assert names == {f"ckpt-000000{s}.{kind}" for s in (2, 4, 6) for kind in ("pt", "shards")} | {"ckpt-0000001.shards"}
    shutil.rmtree(folder / "ckpt-0000001.shards")
    assert runs.latest(tmp_path).name == "ckpt-0000006.pt"
    runs.prune(tmp_path, keep_last=1)
    assert {p.name for p in folder.iterdir()} == {"ckpt-0000006.pt", "ckpt-0000006.shards"}


def test_the_commands_refuse_a_sharded_checkpoint_without_its_shards_in_one_line(tmp_path, data_root):
    """sample.py and train.py resume= given a sharded checkpoint file copied without its folder:
    one line that says what to copy, no traceback, nothing written."""
    model, optimizer = _trained()
    path = tmp_path / "run" / runs.CKPT_DIR / runs.step_file(3)
    _save_sharded(path, model, optimizer)
    lone = tmp_path / "copied" / path.name
    lone.parent.mkdir()
    shutil.copy(path, lone)
    root, _ = data_root
    needle = "shards folder ckpt-0000003.shards/ is missing: copy that folder beside the file"
    assert_one_line_error(run_script("sample.py", [f"ckpt={lone}", "max_new_tokens=4"], tmp_path, root), needle)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    proc = run_script("train.py", [f"resume={lone}", f"hydra.run.dir={tmp_path / 'new'}"], tmp_path, root)
    assert_one_line_error(proc, needle)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
