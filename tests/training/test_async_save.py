"""Checkpoints written off the step path (gpt.checkpoints.writer, train.async_save): training goes
on while a checkpoint is written, the file holds the state of its own step, a kill -9 mid-write
or a disk that fills mid-write loses nothing already saved, and the run resumes exactly.
Run: pytest tests/training/test_async_save.py"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import uuid
from pathlib import Path

import pytest
import torch

from gpt.checkpoints import checkpoint, runs
from gpt.training import train
from helpers import ENGINE_RUN, assert_one_line_error, compose, hooked_pythonpath, run_script

CKPT_10, CKPT_20 = runs.step_file(10), runs.step_file(20)


def _same(a, b) -> bool:
    """Bitwise equal nested states (tensors, dicts, lists, numbers)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


def test_training_goes_on_while_a_checkpoint_is_written_and_the_file_holds_its_own_step(tmp_path, data_root, monkeypatch):
    """ckpt-10's write is held back until step 15 has trained: the steps do not wait for it, and
    the file, written from the copy taken at step 10, is bitwise the one a blocking save writes
    (weights, AdamW moments, loader and random state). Fails if the steps wait for the write, or
    if the write reads the live state."""
    root, data_overrides = data_root
    common = [*ENGINE_RUN, *data_overrides, f"paths.data_dir={root}", "train.keep_last=5"]
    train(compose([*common, "train.async_save=false"], tmp_path / "blocking"))

    release, seen = threading.Event(), {}
    real = checkpoint.save

    def held_save(path, ckpt):
        if Path(path).name == CKPT_10:
            assert release.wait(120), "step 15 never came while ckpt-10 was held"
        real(path, ckpt)

    def on_step(step: int, loss: float) -> None:
        if step == 15:
            seen["ckpt-10 on disk at step 15"] = (tmp_path / "async" / "checkpoints" / CKPT_10).exists()
            release.set()

    monkeypatch.setattr(checkpoint, "save", held_save)
    train(compose(common, tmp_path / "async"), on_step=on_step)
    assert seen == {"ckpt-10 on disk at step 15": False}
    for name in (CKPT_10, CKPT_20, runs.step_file(30), runs.BEST):
        a = checkpoint.load(tmp_path / "blocking" / "checkpoints" / name).to_payload()
        b = checkpoint.load(tmp_path / "async" / "checkpoints" / name).to_payload()
        for payload in (a, b):  # the settings differ in train.async_save, the wall-clock times anyway
            payload.pop("config")
            for key in ("elapsed_s", "best_elapsed_s"):
                (payload.get("training") or {}).pop(key, None)
        assert _same(a, b), name


CLI_RUN = [*ENGINE_RUN, "train.keep_last=5"]


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def straight(tmp_path_factory, data_root) -> dict:
    """The summary of the run below, trained to step 30 with nothing going wrong."""
    root, data_overrides = data_root
    tmp = tmp_path_factory.mktemp("straight")
    proc = run_script("train.py", [*CLI_RUN, *data_overrides, f"hydra.run.dir={tmp / 'run'}"], tmp, root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return _summary(tmp / "run")


def _resumes_exactly(run_dir: Path, straight: dict, data_root) -> None:
    root, data_overrides = data_root
    proc = run_script("train.py", [*CLI_RUN, *data_overrides, f"hydra.run.dir={run_dir}"], run_dir.parent, root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "resuming from" in proc.stderr + proc.stdout and CKPT_10 in proc.stderr + proc.stdout, proc.stderr[-2000:]
    done = _summary(run_dir)
    assert (done["step"], done["final_val_loss"], done["best_val_loss"]) == (
        30,
        straight["final_val_loss"],
        straight["best_val_loss"],
    )


@pytest.mark.slow
def test_a_kill_9_during_a_background_write_keeps_the_previous_checkpoint_and_resumes_exactly(tmp_path, data_root, straight):
    """`python train.py` is killed (SIGKILL, by itself) when its writer thread has written 4 kB of
    ckpt-20: ckpt-10 loads, the half-written temporary is no checkpoint, and the same command
    resumes from ckpt-10 to the straight run's losses."""
    root, data_overrides = data_root
    hook = (
        "import os, signal\n"
        "from gpt.runtime import io\n"
        "class Dying:\n"
        "    def __init__(self, f): self.f, self.n = f, 0\n"
        "    def write(self, data):\n"
        "        self.n += len(data)\n"
        "        if self.n > 4096: os.kill(os.getpid(), signal.SIGKILL)\n"
        "        return self.f.write(data)\n"
        "    def __getattr__(self, name): return getattr(self.f, name)\n"
        "    def __enter__(self): return self\n"
        "    def __exit__(self, *exc): return self.f.__exit__(*exc)\n"
        "def dying_open(path, *a, **k):\n"
        "    f = open(path, *a, **k)\n"
        f"    return Dying(f) if os.path.basename(path).startswith('{CKPT_20}') else f\n"
        "io.open = dying_open\n"
    )
    run_dir = tmp_path / "run"
    env_hook = hooked_pythonpath(tmp_path / "hooks", hook)
    proc = _train_hooked([*CLI_RUN, *data_overrides, f"hydra.run.dir={run_dir}"], tmp_path, root, env_hook)
    assert proc.returncode == -9, (proc.returncode, proc.stderr[-2000:])
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names[:2] == [runs.BEST, CKPT_10] and len(names) == 3 and names[2].startswith(CKPT_20 + ".tmp-"), names
    assert checkpoint.load(run_dir / "checkpoints" / CKPT_10).step == 10
    assert runs.latest(run_dir).name == CKPT_10
    _resumes_exactly(run_dir, straight, data_root)


@pytest.fixture
def small_disk(tmp_path):
    """A 64 MiB tmpfs mounted for the test (a real filesystem that fills): root only."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.slow
def test_a_disk_that_fills_during_a_write_is_one_line_and_the_run_resumes_exactly(tmp_path, data_root, straight, small_disk):
    """The run directory lies on a real tmpfs; another program fills it just as ckpt-20 is written
    (a hook leaves 16 kB free: room for the logs, not for the checkpoint): `python train.py` ends in one line naming the folder, the space
    free and the space needed; ckpt-10 and best.pt are intact, nothing half-written is left;
    once space is freed the same command resumes from ckpt-10 to the straight run's losses."""
    root, data_overrides = data_root
    filler = small_disk / f"filler-{uuid.uuid4().hex}"
    hook = (
        "import os, shutil\n"
        "from gpt.checkpoints import checkpoint\n"
        "real = checkpoint.save\n"
        "def save(path, ckpt):\n"
        f"    if path.name == '{CKPT_20}':\n"
        f"        free = shutil.disk_usage({str(small_disk)!r}).free\n"
        f"        with open({str(filler)!r}, 'wb') as f:\n"
        "            f.write(b'x' * (free - 16384))\n"
        "    return real(path, ckpt)\n"
        "checkpoint.save = save\n"
    )
    run_dir = small_disk / "run"
    env_hook = hooked_pythonpath(tmp_path / "hooks", hook)
    proc = _train_hooked([*CLI_RUN, *data_overrides, f"hydra.run.dir={run_dir}"], tmp_path, root, env_hook)
    folder = run_dir / "checkpoints"
    assert_one_line_error(proc, f"{folder / CKPT_20} (No space left on device: {folder} has ", "the checkpoint needs about")
    assert "the previous checkpoints are kept" in proc.stderr
    assert sorted(p.name for p in folder.iterdir()) == [runs.BEST, CKPT_10]
    assert checkpoint.load(folder / CKPT_10).step == 10 and checkpoint.load(folder / runs.BEST).step == 10
    filler.unlink()
    _resumes_exactly(run_dir, straight, data_root)
    assert shutil.disk_usage(small_disk).free > 0


def _train_hooked(args: list[str], cwd: Path, root: Path, pythonpath: str) -> subprocess.CompletedProcess:
    import os
    import sys

    from helpers import REPO

    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "PYTHONUNBUFFERED": "1", "PYTHONPATH": pythonpath}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
