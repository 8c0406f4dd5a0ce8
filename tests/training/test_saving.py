"""gpt/training/saving.py: what a run's checkpoints hold and when a state is saved at all (not
inside a non-finite streak, not with overflowed weights, one line on a full disk).
Run: pytest tests/training/test_saving.py"""

from __future__ import annotations

import logging

import pytest
import torch

from gpt.checkpoints import checkpoint, runs
from gpt.errors import TinyGPTError
from gpt.training import train
from gpt.training.claim import resumable
from helpers import ENGINE_RUN, assert_one_line_error, compose, poison_forward, run_script


def test_an_eval_inside_a_bad_streak_saves_nothing_and_prunes_nothing(tmp_path, data_root, monkeypatch, caplog):
    """Non-finite steps from 13 on, an eval at 20 inside the streak: no ckpt-20 (it would have
    pruned the good ones under keep_last), and the checkpoint the error names loads, finite."""
    root, data_overrides = data_root
    poison_forward(monkeypatch, set(range(13, 1000)))
    caplog.set_level(logging.INFO, logger="tinygpt")
    cfg = compose(
        [*ENGINE_RUN, *data_overrides, f"paths.data_dir={root}", "train.max_bad_steps=12", "train.keep_last=1"], tmp_path
    )
    with pytest.raises(TinyGPTError, match=r"diverged: 12 non-finite steps in a row at step 24.*ckpt-0000010\.pt"):
        train(cfg)
    assert "step 20 not saved (non-finite loss or weights)" in caplog.text
    assert [p.name for p in runs.step_checkpoints(tmp_path)] == ["ckpt-0000010.pt"]
    assert all(torch.isfinite(v).all() for v in checkpoint.load(runs.latest(tmp_path)).model.values())


def test_a_learning_rate_that_blows_the_weights_up_leaves_the_good_checkpoints(tmp_path, data_root, caplog):
    """Resumed with a learning rate of 1e30 and evals every 2 steps: the weights overflow, and
    no eval saves them; the checkpoint named as last good is the one the run resumed from."""
    root, data_overrides = data_root
    base = [*ENGINE_RUN, *data_overrides, f"paths.data_dir={root}", "train.max_iters=10"]
    train(compose(base, tmp_path))
    good = checkpoint.load(runs.latest(tmp_path))
    caplog.set_level(logging.INFO, logger="tinygpt")
    wild = [*base, "train.max_iters=30", "train.eval_interval=2", "optim.lr=1e30", "optim.muon_lr=1e30", "train.max_bad_steps=4"]
    with pytest.raises(TinyGPTError, match=r"diverged.*the last good checkpoint is .*ckpt-0000010\.pt"):
        train(compose(wild, tmp_path))
    assert "not saved (non-finite loss or weights)" in caplog.text
    kept = runs.step_checkpoints(tmp_path)
    assert [p.name for p in kept] == ["ckpt-0000010.pt"]
    again = checkpoint.load(kept[0])
    assert all(torch.equal(again.model[k], v) for k, v in good.model.items())


def test_a_full_disk_stops_the_run_in_one_line_and_keeps_the_previous_checkpoint(tmp_path, data_root, monkeypatch):
    """The disk fills while ckpt-20 is written (the write patched to fail as a full disk does; a
    300 kB tmpfs gives the same, see the README): one TinyGPTError, ckpt-10 intact and loadable,
    no temporary left."""
    import errno
    import os

    root, data_overrides = data_root
    real = torch.save

    def save(obj, f):
        if str(getattr(f, "name", "")).split("/")[-1].startswith("ckpt-0000020.pt"):
            f.write(b"partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(obj, f)

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(
        TinyGPTError, match=r"ckpt-0000020\.pt \(No space left on device: .* free, .*; the previous checkpoints are kept"
    ):
        train(compose([*ENGINE_RUN, *data_overrides, f"paths.data_dir={root}"], tmp_path))
    assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("ckpt")] == ["ckpt-0000010.pt"]
    assert resumable(tmp_path / "checkpoints" / "ckpt-0000010.pt").step == 10


def test_a_run_diverging_before_its_first_save_says_its_step_0_eval_saved_none(tmp_path, data_root):
    """The step-0 eval ran, no checkpoint yet (step 0 saves none): the message says so, not that
    no eval was reached."""
    root, data_overrides = data_root
    wild = [
        *ENGINE_RUN,
        *data_overrides,
        f"paths.data_dir={root}",
        "optim.lr=1e30",
        "optim.muon_lr=1e30",
        "train.max_bad_steps=4",
    ]
    with pytest.raises(TinyGPTError) as error:
        train(compose(wild, tmp_path))
    assert "training diverged" in str(error.value) and not runs.step_checkpoints(tmp_path)
    assert "no checkpoint was saved yet (the eval at step 0 saves none)" in str(error.value)
    assert "no eval reached" not in str(error.value)


def test_a_run_resumed_from_another_diverging_before_its_first_save_names_where_it_resumed_from(tmp_path, data_root):
    """`resume=<another run>` (or one of its checkpoints) into a new folder, diverging before this
    run saves: the one line names the checkpoint it continued from, the last good state there is."""
    root, data_overrides = data_root
    quick = ["debug=tiny", "data=shakespeare_char", "train.sample_tokens=0", *data_overrides]
    first = run_script("train.py", [*quick, "train.max_iters=10", f"hydra.run.dir={tmp_path / 'a'}"], tmp_path, root)
    assert first.returncode == 0, first.stderr[-2000:]
    wild = [*quick, "train.max_iters=30", "optim.lr=1e30", "optim.muon_lr=1e30", "train.max_bad_steps=2"]
    for n, resume in enumerate((tmp_path / "a", tmp_path / "a" / "checkpoints" / "ckpt-0000010.pt")):
        proc = run_script("train.py", [*wild, f"resume={resume}", f"hydra.run.dir={tmp_path / str(n)}"], tmp_path, root)
        assert_one_line_error(
            proc,
            "training diverged",
            f"no checkpoint was saved yet (no eval reached yet); it resumed from {tmp_path / 'a' / 'checkpoints' / 'ckpt-0000010.pt'};",
        )
        assert not runs.step_checkpoints(tmp_path / str(n))
