"""A run directory's checkpoints: `checkpoints/ckpt-<step>.pt` (full training state, the newest
few kept) and `checkpoints/best.pt` (the weights of the best val loss); their names, retention,
clean-up after a crash, and finding the run or checkpoint a command means."""

from __future__ import annotations

import re
import shutil
from datetime import datetime
from pathlib import Path

from gpt.errors import TinyGPTError
from gpt.runtime.io import temporary_owner

CKPT_DIR = "checkpoints"
RUN_STAMP = "%Y-%m-%d_%H-%M-%S-%f"  # run folder names; configs/hydra/default.yaml names them alike (tested)
BEST = "best.pt"
SHARDS = ".shards"  # a sharded checkpoint's folder: the file's name with this suffix
_STEP_FILE = re.compile(r"^ckpt-(\d+)\.pt$")


def new_run_dir(runs_dir: str | Path) -> Path:
    """A fresh run directory, named as Hydra names them (configs/hydra/default.yaml): to the
    microsecond, so parallel launches never share one."""
    return (Path(runs_dir).expanduser() / "runs" / datetime.now().strftime(RUN_STAMP)).absolute()


def step_file(step: int) -> str:
    return f"ckpt-{step:07d}.pt"


def step_checkpoints(run_dir: Path) -> list[Path]:
    """The run's full-state checkpoints, oldest first."""
    folder = Path(run_dir) / CKPT_DIR
    found = [(int(m.group(1)), p) for p in folder.glob("ckpt-*.pt") if (m := _STEP_FILE.match(p.name))]
    return [p for _, p in sorted(found)]


def latest(run_dir: Path) -> Path | None:
    ckpts = step_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def prune(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` step checkpoints (best.pt is separate and stays);
    a sharded one's folder goes after its file (the file is what makes it a checkpoint)."""
    for old in step_checkpoints(run_dir)[:-keep_last]:
        old.unlink(missing_ok=True)
        shutil.rmtree(shards_folder(old), ignore_errors=True)


def shards_folder(path: Path) -> Path:
    """Where a sharded checkpoint's tensors lie (gpt.checkpoints.shards): ckpt-0000100.shards/."""
    return path.with_suffix(SHARDS)


def set_aside(path: Path) -> Path:
    """Rename a checkpoint that cannot be used to `<name>.damaged` (kept for a look, out of the way
    of retention and resuming); returns the new path."""
    folder = shards_folder(path)
    target, n = path.with_name(path.name + ".damaged"), 1
    while target.exists() or folder.with_name(folder.name + target.name.removeprefix(path.name)).exists():
        n += 1
        target = path.with_name(f"{path.name}.damaged-{n}")
    if folder.is_dir():  # a sharded checkpoint's tensors go aside with it, under the same mark, first
        folder.rename(folder.with_name(folder.name + target.name.removeprefix(path.name)))
    path.rename(target)
    return target


def remove_leftovers(run_dir: Path) -> None:
    """Delete temporaries of writes that a crash or kill -9 cut short (never complete files), and
    the shards folders of sharded saves cut short before their checkpoint file was written."""
    folder = Path(run_dir) / CKPT_DIR
    for tmp in folder.glob("*.pt.tmp-*"):
        if temporary_owner(tmp) is not None:
            tmp.unlink(missing_ok=True)
    for tmp in folder.glob(f"*{SHARDS}.tmp-*"):
        if temporary_owner(tmp) is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    # A save cut short after its folder was renamed, before its file was written: always the
    # newest step (an older folder without its file is someone's doing, and stays).
    newest = latest(run_dir)
    for shards in folder.glob(f"ckpt-*{SHARDS}"):
        m = _STEP_FILE.match(shards.with_suffix(".pt").name)
        newer = m is not None and (newest is None or int(m.group(1)) > int(_STEP_FILE.match(newest.name).group(1)))
        if newer and shards.is_dir() and not shards.with_suffix(".pt").exists():
            shutil.rmtree(shards, ignore_errors=True)


def has_run(run_dir: Path) -> bool:
    return any((Path(run_dir) / CKPT_DIR).glob("*.pt"))


def checkpoint_in_run(run_dir: Path) -> Path:
    """best.pt of a run directory, falling back to its newest step checkpoint."""
    best = Path(run_dir) / CKPT_DIR / BEST
    found = best if best.is_file() else latest(run_dir)
    if found is None:
        raise TinyGPTError(
            f"{run_dir} holds no checkpoint ({CKPT_DIR}/{BEST} or ckpt-*.pt); pass a run directory that has trained"
        )
    return found


def candidates_in_run(run_dir: Path) -> list[Path]:
    """The checkpoints a reader of a run may use, in order of preference: best.pt, then the step
    checkpoints newest first."""
    best = Path(run_dir) / CKPT_DIR / BEST
    return [best] * best.is_file() + step_checkpoints(run_dir)[::-1]


def runs_under(root: str | Path) -> set[Path]:
    """Every run directory (plain run or sweep job) below `root` holding a checkpoint of ours."""
    return {
        p.parent.parent for p in Path(root).expanduser().glob(f"**/{CKPT_DIR}/*.pt") if p.name == BEST or _STEP_FILE.match(p.name)
    }


def latest_run(runs_root: str | Path) -> Path:
    """The run directory (plain run or sweep job) whose checkpoint was written most recently."""
    root = Path(runs_root).expanduser()
    candidates = runs_under(root)
    if not candidates:
        raise TinyGPTError(
            f"no trained run found under {root.resolve()}; train one first with `python train.py`, "
            f"or pass run_dir=<run directory> or ckpt=<checkpoint.pt>"
        )
    return max(candidates, key=lambda d: max(p.stat().st_mtime for p in (d / CKPT_DIR).glob("*.pt")))


def resolve(ckpt: str | None, run_dir: str | None, runs_root: str | Path) -> Path:
    """Which checkpoint a command means: an explicit file, else a run directory, else the latest run."""
    if ckpt:
        p = Path(ckpt).expanduser()
        if p.is_dir():
            raise TinyGPTError(f"ckpt={p} is a directory; pass run_dir={p} for a run directory, or a .pt file as ckpt")
        if not p.is_file():
            raise TinyGPTError(f"checkpoint {p} does not exist; check the path, or pass run_dir=<run directory>")
        return p
    if run_dir:
        d = Path(run_dir).expanduser()
        if d.is_file():
            raise TinyGPTError(f"run_dir={d} is a file; pass ckpt={d} for a checkpoint file, or its run's folder as run_dir")
        if not d.is_dir():
            raise TinyGPTError(f"run directory {d} does not exist; check the path, or omit run_dir to use the latest run")
        return checkpoint_in_run(d)
    return checkpoint_in_run(latest_run(runs_root))
