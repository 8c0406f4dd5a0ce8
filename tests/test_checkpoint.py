"""gpt/checkpoints/checkpoint.py: the format (versioned, older read, newer refused), atomic save, safe load,
compiled-model keys, retention, run discovery, where a run resumes from.
Run: pytest tests/test_checkpoint.py"""

from __future__ import annotations

import errno
import os
import pickle
import re
import subprocess
import sys
import time

import pytest
import torch

from gpt.checkpoints import checkpoint, runs
from gpt.checkpoints.checkpoint import Checkpoint, TrainingState
from gpt.errors import TinyGPTError
from gpt.model import GPT, GPTConfig
from gpt.training.claim import AUTO, NEVER, parse_resume, resumable, resume_source
from helpers import REPO, corrupted_variants


def _model():
    return GPT(GPTConfig(vocab_size=2, block_size=4, n_layer=1, n_head=1, n_embd=8))


def _ckpt(model=None, **kw) -> Checkpoint:
    model = model or _model()
    return Checkpoint(
        model=model.state_dict(),
        model_config=model.config.to_dict(),
        tokenizer={"kind": "char", "chars": list("ab")},
        step=3,
        **kw,
    )


def test_round_trip_keeps_every_field(tmp_path):
    model = _model()
    state = TrainingState(
        optimizer={"state": {}, "param_groups": []},
        scaler={},
        loader={"generator": torch.ones(3)},
        rng=[{"torch": torch.zeros(2)}],
        bad_steps=2,
        bad_in_a_row=1,
    )
    saved = _ckpt(model, best_val_loss=1.5, config={"seed": 7}, lora={"rank": 2, "alpha": 4.0}, training=state)
    checkpoint.save(tmp_path / "c.pt", saved)
    back = checkpoint.load(tmp_path / "c.pt")
    assert (back.step, back.best_val_loss, back.config, back.lora) == (3, 1.5, {"seed": 7}, {"rank": 2, "alpha": 4.0})
    assert (
        back.training.bad_steps == 2
        and back.training.bad_in_a_row == 1
        and torch.equal(back.training.loader["generator"], torch.ones(3))
    )
    assert all(torch.equal(back.model[k], v) for k, v in model.state_dict().items())
    raw = torch.load(tmp_path / "c.pt", weights_only=True)
    assert raw["format"] == 3 and raw["tinygpt_version"]  # whole; 4 is sharded (tests/test_shards.py)
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary left over


def test_format_1_is_read_and_a_newer_format_refused(tmp_path):
    """Format 1 (tinygpt 0.1, no `format` key) kept the training state at the top level."""
    model = _model()
    old = {
        "model": model.state_dict(),
        "model_config": model.config.to_dict(),
        "tokenizer": {"kind": "byte"},
        "step": 9,
        "best_val_loss": 2.0,
        "config": {},
        "optimizer": {"state": {}, "param_groups": []},
        "scaler": {},
        "loader": {"generator": torch.ones(1)},
        "rng": {"torch": torch.zeros(1)},
        "bad_steps": 1,
        "bad_in_a_row": 0,
        "lora": None,
        "tinygpt_version": "0.1.0",
    }
    torch.save(old, tmp_path / "old.pt")
    ckpt = checkpoint.load(tmp_path / "old.pt")
    assert ckpt.step == 9 and ckpt.training.bad_steps == 1 and ckpt.training.rng == [{"torch": torch.zeros(1)}]
    torch.save({k: v for k, v in old.items() if k not in ("optimizer", "scaler", "loader", "rng")}, tmp_path / "best.pt")
    assert checkpoint.load(tmp_path / "best.pt").training is None  # weights only

    newer = {**_ckpt(model).to_payload(), "format": checkpoint.FORMAT + 1, "tinygpt_version": "9.0.0"}
    torch.save(newer, tmp_path / "new.pt")
    with pytest.raises(TinyGPTError, match=f"tinygpt 9.0.0 in checkpoint format {checkpoint.FORMAT + 1}.*upgrade tinygpt"):
        checkpoint.load(tmp_path / "new.pt")
    for fmt in (0, -5, "2", None, True, 2.0):  # no tinygpt wrote these: not read as some version
        torch.save({**_ckpt(model).to_payload(), "format": fmt}, tmp_path / "odd.pt")
        with pytest.raises(TinyGPTError, match=rf"is not a tinygpt checkpoint \(its format is {re.escape(repr(fmt))};"):
            checkpoint.load(tmp_path / "odd.pt")


def test_not_a_checkpoint(tmp_path):
    torch.save({"weights": torch.ones(1)}, tmp_path / "other.pt")
    with pytest.raises(TinyGPTError, match="not a tinygpt checkpoint.*model, model_config, tokenizer"):
        checkpoint.load(tmp_path / "other.pt")
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(TinyGPTError, match="not a tinygpt checkpoint"):
        checkpoint.load(tmp_path / "list.pt")
    (tmp_path / "text.pt").write_text("hello")
    with pytest.raises(TinyGPTError, match="cannot load checkpoint"):
        checkpoint.load(tmp_path / "text.pt")


class _FillingFile:
    """A file on a disk with `room` bytes left: writes beyond it fail as a full disk's do."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.f.__exit__(*exc)


def test_a_save_onto_a_full_disk_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    """torch's own zip writer on a disk that fills mid-write (it raises RuntimeError "unexpected
    pos", the OSError only its context): one TinyGPTError naming the folder, the space free and
    the space needed; the previous file as it was, no temporary left."""
    from gpt.runtime import io

    checkpoint.save(tmp_path / "c.pt", _ckpt())
    good = (tmp_path / "c.pt").read_bytes()
    monkeypatch.setattr(io, "open", lambda *a, **k: _FillingFile(open(*a, **k), room=2000), raising=False)
    with pytest.raises(TinyGPTError) as error:
        checkpoint.save(tmp_path / "c.pt", _ckpt())
    message = str(error.value)
    assert "\n" not in message and f"c.pt (No space left on device: {tmp_path} has " in message, message
    assert re.search(r"the checkpoint needs about \d+ KiB\); the previous checkpoints are kept: free space", message), message
    assert (tmp_path / "c.pt").read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


def test_a_save_failing_for_another_reason_is_not_called_a_full_disk(tmp_path, monkeypatch):
    def broken(obj, f):
        raise RuntimeError("a bug in a writer")

    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(RuntimeError, match="a bug in a writer"):
        checkpoint.save(tmp_path / "c.pt", _ckpt())
    assert not list(tmp_path.iterdir())


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_malicious_pickle_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        pickle.dump({"model": {}, "model_config": _Exploit()}, f, protocol=2)
    with pytest.raises(TinyGPTError, match="cannot load checkpoint"):
        checkpoint.load(path)
    assert not (tmp_path / "pwned").exists()


def test_compiled_prefix_is_stripped(tmp_path):
    model = _model()
    old_style = _ckpt(model).to_payload()
    old_style["model"] = {f"_orig_mod.{k}": v for k, v in model.state_dict().items()}
    torch.save(old_style, tmp_path / "old.pt")
    fresh = GPT(model.config)
    fresh.load_state_dict(checkpoint.load(tmp_path / "old.pt").model)


def test_latest_run_and_resolution(tmp_path):
    with pytest.raises(TinyGPTError, match="no trained run found"):
        runs.latest_run(tmp_path)
    for age, name in enumerate(("runs/b", "sweeps/s/0", "runs/a")):  # runs/b is the newest
        d = tmp_path / name / runs.CKPT_DIR
        d.mkdir(parents=True)
        for step in (10, 20):
            (d / runs.step_file(step)).write_bytes(b"x")
            stamp = time.time() - 100 * age
            os.utime(d / runs.step_file(step), (stamp, stamp))
    (tmp_path / "runs" / "c").mkdir()  # a run that failed before its first checkpoint
    (tmp_path / "notes" / runs.CKPT_DIR).mkdir(parents=True)  # a stray .pt is no run (serve's models=all)
    (tmp_path / "notes" / runs.CKPT_DIR / "scratch.pt").write_bytes(b"x")
    assert runs.runs_under(tmp_path) == {tmp_path / n for n in ("runs/a", "runs/b", "sweeps/s/0")}
    assert runs.latest_run(tmp_path) == tmp_path / "runs" / "b"
    assert runs.resolve(None, None, tmp_path) == tmp_path / "runs/b/checkpoints/ckpt-0000020.pt"
    (tmp_path / "runs/b/checkpoints/best.pt").write_bytes(b"x")
    assert runs.resolve(None, None, tmp_path) == tmp_path / "runs/b/checkpoints/best.pt"
    assert runs.resolve(None, str(tmp_path / "runs" / "a"), tmp_path) == tmp_path / "runs/a/checkpoints/ckpt-0000020.pt"
    with pytest.raises(TinyGPTError, match="holds no checkpoint"):
        runs.resolve(None, str(tmp_path / "runs" / "c"), tmp_path)
    with pytest.raises(TinyGPTError, match="does not exist"):
        runs.resolve(str(tmp_path / "nope.pt"), None, tmp_path)


def test_new_run_dirs_are_distinct_and_named_as_hydra_names_them(tmp_path):
    assert runs.new_run_dir(tmp_path) != runs.new_run_dir(tmp_path)
    hydra_dirs = (REPO / "configs" / "hydra" / "default.yaml").read_text()
    assert hydra_dirs.count("${now:" + runs.RUN_STAMP + "}") == 2  # runs and sweeps


def test_leftovers_are_only_temporaries(tmp_path):
    folder = tmp_path / runs.CKPT_DIR
    folder.mkdir()
    (folder / "ckpt-0000010.pt.tmp-123").write_bytes(b"half")
    (folder / "ckpt-0000010.pt").write_bytes(b"x")
    (folder / "notes.pt.tmp-mine").write_bytes(b"not ours")
    runs.remove_leftovers(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == ["ckpt-0000010.pt", "notes.pt.tmp-mine"]


def test_resume_setting_is_parsed_in_one_place(tmp_path):
    for value in ("auto", "Auto", "true", True, None, "null"):
        assert parse_resume(value) == AUTO
    for value in ("false", "False", False, "never"):
        assert parse_resume(value) == NEVER
    with pytest.raises(TinyGPTError, match="resume= is empty"):
        parse_resume("")
    assert parse_resume("~/runs/a") == (tmp_path.home() / "runs/a")


def test_retention_and_resume_sources(tmp_path):
    for step in (5, 10, 15, 20):
        (tmp_path / runs.CKPT_DIR).mkdir(exist_ok=True)
        (tmp_path / runs.CKPT_DIR / runs.step_file(step)).write_bytes(b"x")
    (tmp_path / runs.CKPT_DIR / runs.BEST).write_bytes(b"x")
    runs.prune(tmp_path, keep_last=2)
    assert sorted(p.name for p in (tmp_path / runs.CKPT_DIR).iterdir()) == ["best.pt", "ckpt-0000015.pt", "ckpt-0000020.pt"]
    assert resume_source("auto", tmp_path) == runs.latest(tmp_path)
    assert resume_source("auto", tmp_path / "fresh") is None
    assert resume_source(str(tmp_path), tmp_path / "fresh") == tmp_path / "checkpoints/ckpt-0000020.pt"
    with pytest.raises(TinyGPTError, match="resume=false"):
        resume_source("False", tmp_path)
    with pytest.raises(TinyGPTError, match="neither"):
        resume_source("nowhere", tmp_path)
    # the newest checkpoint of this very directory, named explicitly: that is plain resuming
    newest = tmp_path / "checkpoints/ckpt-0000020.pt"
    assert resume_source(str(newest), tmp_path) == newest


def _launched_with(resume: str) -> Checkpoint:
    return Checkpoint(model={}, model_config={}, tokenizer={"kind": "byte"}, config={"resume": resume})


@pytest.mark.parametrize("source", ["older_here", "other_run"])
def test_resume_refuses_to_mix_trajectories_in_one_directory(tmp_path, source):
    """Continuing from an older checkpoint (or another run) inside a directory holding a run would
    overwrite its ckpt-<step> files or let retention prune them: refused, nothing touched."""
    run, other = tmp_path / "run", tmp_path / "other"
    for d, steps in ((run, (10, 20)), (other, (5,))):
        for step in steps:
            checkpoint.save(d / runs.CKPT_DIR / runs.step_file(step), _launched_with("auto"))
    src = run / runs.CKPT_DIR / runs.step_file(10) if source == "older_here" else other
    with pytest.raises(TinyGPTError, match="already holds a run .*ckpt-0000020.pt.*new directory"):
        resume_source(str(src), run)
    assert sorted(p.name for p in (run / runs.CKPT_DIR).iterdir()) == ["ckpt-0000010.pt", "ckpt-0000020.pt"]


def test_a_run_started_from_another_continues_its_own_checkpoints(tmp_path):
    """`resume=A` into B, preempted, rerun with the same overrides (what the stop message says):
    B's newest checkpoint is the one to continue, not A's again."""
    a, b = tmp_path / "A", tmp_path / "B"
    checkpoint.save(a / runs.CKPT_DIR / runs.step_file(500), _launched_with("auto"))
    assert resume_source(str(a), b) == runs.latest(a)  # first launch: B is empty
    checkpoint.save(b / runs.CKPT_DIR / runs.step_file(750), _launched_with(str(a)))
    assert resume_source(str(a), b) == b / runs.CKPT_DIR / runs.step_file(750)
    # B launched from elsewhere: continuing it from A would mix trajectories
    checkpoint.save(b / runs.CKPT_DIR / runs.step_file(1000), _launched_with(str(tmp_path / "C")))
    with pytest.raises(TinyGPTError, match="already holds a run"):
        resume_source(str(a), b)


def test_unwrap_compiled_and_ddp_style_wrappers():
    model = _model()

    class Wrapper(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

    assert checkpoint.unwrap(Wrapper(model)) is model
    assert list(checkpoint.unwrap(Wrapper(model)).state_dict()) == list(model.state_dict())


_WRITER = """
import sys, torch
from gpt.checkpoints import checkpoint
ckpt = checkpoint.Checkpoint(model={"w": torch.randn(3_000_000)}, model_config={}, tokenizer={"kind": "byte"})
while True:
    ckpt.step += 1
    checkpoint.save(sys.argv[1], ckpt)
    print(ckpt.step, flush=True)
"""


@pytest.mark.parametrize("delay", [0.05, 0.2, 0.45])
def test_sigkill_while_writing_keeps_a_loadable_checkpoint(tmp_path, delay):
    path = tmp_path / "checkpoints" / runs.step_file(7)
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    proc.stdout.readline()  # one complete checkpoint exists
    time.sleep(delay)  # ...and the writer is somewhere in the middle of another
    proc.kill()
    proc.wait()
    ckpt = checkpoint.load(path)
    assert ckpt.step >= 1 and ckpt.model["w"].shape == (3_000_000,)
    assert runs.latest(tmp_path) == path  # a leftover temporary is never taken for a checkpoint


def test_300_damaged_checkpoints_load_identically_or_are_refused_in_one_line(tmp_path):
    """A damaged checkpoint either loads with exactly the weights saved (the damage hit bytes that
    carry nothing, e.g. a zip timestamp) or is refused with a TinyGPTError: never another
    exception, never torch's advice to load with weights_only=False, never wrong weights (torch
    does not check the zip's CRC-32 itself; a flipped bit in a tensor loaded silently before)."""

    model = _model()
    state = TrainingState(optimizer={"state": {}, "param_groups": []}, scaler={}, loader={"step": 1}, rng=[{}])
    checkpoint.save(tmp_path / "good.pt", _ckpt(model, training=state))
    good = (tmp_path / "good.pt").read_bytes()
    outcomes = {"identical": 0, "refused": 0}
    for kind, data in corrupted_variants(good, 300):
        path = tmp_path / "damaged.pt"
        path.write_bytes(data)
        for load in (checkpoint.load, resumable):
            try:
                ckpt = load(path)
            except TinyGPTError as e:
                message = str(e)
                assert "\n" not in message and "weights_only" not in message and str(path) in message, (kind, message)
                outcomes["refused"] += 1
                continue
            assert ckpt.step == 3 and all(torch.equal(ckpt.model[k], v) for k, v in model.state_dict().items()), kind
            outcomes["identical"] += 1
    assert outcomes["refused"] > 500  # nearly all damage is seen


def test_a_record_marked_as_a_folder_is_refused(tmp_path):
    """One bit of a record's attributes in the zip's central directory (which no CRC covers) marks
    it as a folder; torch then reads no bytes for that tensor and would load whatever memory
    held. Found by the 300 variants above once the record's layout moved."""
    import struct
    import zipfile

    model = _model()
    checkpoint.save(tmp_path / "c.pt", _ckpt(model))
    data = bytearray((tmp_path / "c.pt").read_bytes())
    with zipfile.ZipFile(tmp_path / "c.pt") as archive:
        target = next(i for i in archive.infolist() if "/data/" in i.filename)
    record = bytes(data).index(b"PK\x01\x02")  # the central directory's first record
    while True:  # walk the central directory to the target's record
        name_len, extra_len, comment_len = struct.unpack("<HHH", data[record + 28 : record + 34])
        if data[record + 46 : record + 46 + name_len].decode() == target.filename:
            break
        record += 46 + name_len + extra_len + comment_len
    data[record + 38] |= 0x10  # external attributes: the MS-DOS folder bit
    (tmp_path / "c.pt").write_bytes(bytes(data))
    with pytest.raises(TinyGPTError, match=rf"the file is damaged \({target.filename} is marked as a folder\)"):
        checkpoint.load(tmp_path / "c.pt")


def test_a_flipped_bit_in_a_weight_is_refused_by_its_checksum(tmp_path):
    model = _model()
    checkpoint.save(tmp_path / "c.pt", _ckpt(model))
    data = bytearray((tmp_path / "c.pt").read_bytes())
    weight = model.state_dict()["lm_head.weight"].numpy().tobytes()[:64]
    at = bytes(data).index(weight)  # the tensor's bytes, stored as they are
    data[at + 5] ^= 0x10
    (tmp_path / "c.pt").write_bytes(bytes(data))
    with pytest.raises(TinyGPTError, match=r"the file is damaged \(.*fails its checksum\)"):
        checkpoint.load(tmp_path / "c.pt")
