"""Checkpoints: atomic save, safe load, compiled-model keys, run discovery.
Run: pytest tests/test_checkpoint.py"""

from __future__ import annotations

import os
import pickle
import time

import pytest
import torch

from gpt import checkpoint
from gpt.errors import TinyGPTError
from gpt.model import GPT, GPTConfig


def _payload(model):
    return {"model": model.state_dict(), "model_config": model.config.to_dict(), "tokenizer": {"kind": "char", "chars": list("ab")}, "step": 3}


def test_round_trip_and_version(tmp_path):
    model = GPT(GPTConfig(vocab_size=2, block_size=4, n_layer=1, n_head=1, n_embd=8))
    checkpoint.save(tmp_path / "c.pt", _payload(model))
    ckpt = checkpoint.load(tmp_path / "c.pt")
    assert ckpt["step"] == 3 and "tinygpt_version" in ckpt
    assert all(torch.equal(ckpt["model"][k], v) for k, v in model.state_dict().items())
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary left over


def test_failed_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    model = GPT(GPTConfig(vocab_size=2, block_size=4, n_layer=1, n_head=1, n_embd=8))
    checkpoint.save(tmp_path / "c.pt", _payload(model))
    good = (tmp_path / "c.pt").read_bytes()

    def crash(obj, f):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError):
        checkpoint.save(tmp_path / "c.pt", _payload(model))
    assert (tmp_path / "c.pt").read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


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
    model = GPT(GPTConfig(vocab_size=2, block_size=4, n_layer=1, n_head=1, n_embd=8))
    old_style = _payload(model)
    old_style["model"] = {f"_orig_mod.{k}": v for k, v in model.state_dict().items()}
    torch.save(old_style, tmp_path / "old.pt")
    fresh = GPT(model.config)
    fresh.load_state_dict(checkpoint.load(tmp_path / "old.pt")["model"])


def test_latest_run_and_resolution(tmp_path):
    with pytest.raises(TinyGPTError, match="no trained run found"):
        checkpoint.latest_run(tmp_path)
    for age, name in enumerate(("runs/b", "sweeps/s/0", "runs/a")):  # runs/b is the newest
        d = tmp_path / name / checkpoint.CKPT_DIR
        d.mkdir(parents=True)
        for step in (10, 20):
            (d / checkpoint.step_file(step)).write_bytes(b"x")
            stamp = time.time() - 100 * age
            os.utime(d / checkpoint.step_file(step), (stamp, stamp))
    (tmp_path / "runs" / "c").mkdir()  # a run that failed before its first checkpoint
    assert checkpoint.latest_run(tmp_path) == tmp_path / "runs" / "b"
    assert checkpoint.resolve(None, None, tmp_path) == tmp_path / "runs/b/checkpoints/ckpt-0000020.pt"
    (tmp_path / "runs/b/checkpoints/best.pt").write_bytes(b"x")
    assert checkpoint.resolve(None, None, tmp_path) == tmp_path / "runs/b/checkpoints/best.pt"
    assert checkpoint.resolve(None, str(tmp_path / "runs" / "a"), tmp_path) == tmp_path / "runs/a/checkpoints/ckpt-0000020.pt"
    with pytest.raises(TinyGPTError, match="holds no checkpoint"):
        checkpoint.resolve(None, str(tmp_path / "runs" / "c"), tmp_path)
    with pytest.raises(TinyGPTError, match="does not exist"):
        checkpoint.resolve(str(tmp_path / "nope.pt"), None, tmp_path)


def test_retention_and_resume_sources(tmp_path):
    for step in (5, 10, 15, 20):
        (tmp_path / checkpoint.CKPT_DIR).mkdir(exist_ok=True)
        (tmp_path / checkpoint.CKPT_DIR / checkpoint.step_file(step)).write_bytes(b"x")
    (tmp_path / checkpoint.CKPT_DIR / checkpoint.BEST).write_bytes(b"x")
    checkpoint.prune(tmp_path, keep_last=2)
    assert sorted(p.name for p in (tmp_path / checkpoint.CKPT_DIR).iterdir()) == ["best.pt", "ckpt-0000015.pt", "ckpt-0000020.pt"]
    assert checkpoint.resume_source("auto", tmp_path) == checkpoint.latest(tmp_path)
    assert checkpoint.resume_source("auto", tmp_path / "fresh") is None
    assert checkpoint.resume_source(str(tmp_path), tmp_path / "fresh") == tmp_path / "checkpoints/ckpt-0000020.pt"
    with pytest.raises(TinyGPTError, match="resume=false"):
        checkpoint.resume_source(False, tmp_path)
    with pytest.raises(TinyGPTError, match="neither"):
        checkpoint.resume_source("nowhere", tmp_path)
    # the newest checkpoint of this very directory, named explicitly: that is plain resuming
    newest = tmp_path / "checkpoints/ckpt-0000020.pt"
    assert checkpoint.resume_source(str(newest), tmp_path) == newest


@pytest.mark.parametrize("source", ["older_here", "other_run"])
def test_resume_refuses_to_mix_trajectories_in_one_directory(tmp_path, source):
    """Continuing from an older checkpoint (or another run) inside a directory holding a run would
    overwrite its ckpt-<step> files or let retention prune them: refused, nothing touched."""
    run, other = tmp_path / "run", tmp_path / "other"
    launched_fresh = {"model": {}, "model_config": {}, "config": {"resume": "auto"}}
    for d, steps in ((run, (10, 20)), (other, (5,))):
        for step in steps:
            checkpoint.save(d / checkpoint.CKPT_DIR / checkpoint.step_file(step), launched_fresh)
    src = run / checkpoint.CKPT_DIR / checkpoint.step_file(10) if source == "older_here" else other
    with pytest.raises(TinyGPTError, match="already holds a run .*ckpt-0000020.pt.*new directory"):
        checkpoint.resume_source(str(src), run)
    assert sorted(p.name for p in (run / checkpoint.CKPT_DIR).iterdir()) == ["ckpt-0000010.pt", "ckpt-0000020.pt"]


def test_a_run_started_from_another_continues_its_own_checkpoints(tmp_path):
    """`resume=A` into B, preempted, rerun with the same overrides (what the stop message says):
    B's newest checkpoint is the one to continue, not A's again."""
    a, b = tmp_path / "A", tmp_path / "B"
    checkpoint.save(a / checkpoint.CKPT_DIR / checkpoint.step_file(500), {"model": {}, "model_config": {}, "config": {}})
    assert checkpoint.resume_source(str(a), b) == checkpoint.latest(a)  # first launch: B is empty
    launched_with = {"model": {}, "model_config": {}, "config": {"resume": str(a)}}
    checkpoint.save(b / checkpoint.CKPT_DIR / checkpoint.step_file(750), launched_with)
    assert checkpoint.resume_source(str(a), b) == b / checkpoint.CKPT_DIR / checkpoint.step_file(750)
    # B launched from elsewhere: continuing it from A would mix trajectories
    other = {"model": {}, "model_config": {}, "config": {"resume": str(tmp_path / "C")}}
    checkpoint.save(b / checkpoint.CKPT_DIR / checkpoint.step_file(1000), other)
    with pytest.raises(TinyGPTError, match="already holds a run"):
        checkpoint.resume_source(str(a), b)


def test_unwrap_compiled_and_ddp_style_wrappers():
    model = GPT(GPTConfig(vocab_size=2, block_size=4, n_layer=1, n_head=1, n_embd=8))

    class Wrapper(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

    assert checkpoint.unwrap(Wrapper(model)) is model
    assert list(checkpoint.unwrap(Wrapper(model)).state_dict()) == list(model.state_dict())
