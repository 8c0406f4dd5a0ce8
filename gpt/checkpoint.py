"""Checkpoints: atomic save, safe load, retention, and finding runs to resume or sample from.

A run directory holds `checkpoints/ckpt-<step>.pt` (full training state, the newest few kept)
and `checkpoints/best.pt` (weights of the best validation loss, for sampling). A checkpoint is
a dict of tensors and plain Python values that carries everything needed to rebuild the model
and its tokenizer; it is loaded with `weights_only=True`: data, never code.
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import torch

from gpt import __version__
from gpt.errors import TinyGPTError

CKPT_DIR = "checkpoints"
RUNS_DIR = "outputs"  # paths.runs_dir's default, for the tools that run without Hydra
BEST = "best.pt"
_STEP_FILE = re.compile(r"^ckpt-(\d+)\.pt$")
_COMPILED_PREFIX = "_orig_mod."


def step_file(step: int) -> str:
    return f"ckpt-{step:07d}.pt"


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module under torch.compile's and DDP's wrappers, so saved keys carry no prefix."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if inner is None:
            return model
        model = inner


def save(path: Path, payload: dict) -> None:
    """Write to a temporary file, fsync, then rename: a crash mid-write never clobbers the
    previous checkpoint at `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save({**payload, "tinygpt_version": __version__}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load(path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = False) -> dict:
    """mmap=True maps the tensors instead of reading them: cheap when only the metadata is needed."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise TinyGPTError(f"checkpoint {path} does not exist; pass an existing .pt file or a run directory")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TinyGPTError(f"cannot load checkpoint {path}: {first}") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "model_config" not in ckpt:
        raise TinyGPTError(f"{path} is not a tinygpt checkpoint (no model or model_config inside)")
    # Checkpoints written from a compiled model by older code carry the wrapper's prefix.
    ckpt["model"] = {k.removeprefix(_COMPILED_PREFIX): v for k, v in ckpt["model"].items()}
    return ckpt


def step_checkpoints(run_dir: Path) -> list[Path]:
    """The run's full-state checkpoints, oldest first."""
    folder = Path(run_dir) / CKPT_DIR
    found = [(int(m.group(1)), p) for p in folder.glob("ckpt-*.pt") if (m := _STEP_FILE.match(p.name))]
    return [p for _, p in sorted(found)]


def latest(run_dir: Path) -> Path | None:
    ckpts = step_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def prune(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` step checkpoints (best.pt is separate and stays)."""
    for old in step_checkpoints(run_dir)[:-keep_last]:
        old.unlink(missing_ok=True)


def remove_leftovers(run_dir: Path) -> None:
    """Delete temporaries of writes that a crash or kill -9 cut short (never complete files)."""
    for tmp in (Path(run_dir) / CKPT_DIR).glob("*.pt.tmp-*"):
        tmp.unlink(missing_ok=True)


def has_run(run_dir: Path) -> bool:
    return any((Path(run_dir) / CKPT_DIR).glob("*.pt"))


def checkpoint_in_run(run_dir: Path) -> Path:
    """best.pt of a run directory, falling back to its newest step checkpoint."""
    best = Path(run_dir) / CKPT_DIR / BEST
    found = best if best.is_file() else latest(run_dir)
    if found is None:
        raise TinyGPTError(f"{run_dir} holds no checkpoint ({CKPT_DIR}/{BEST} or ckpt-*.pt); pass a run directory that has trained")
    return found


def latest_run(runs_root: str | Path) -> Path:
    """The run directory (plain run or sweep job) whose checkpoint was written most recently."""
    root = Path(runs_root).expanduser()
    candidates = {p.parent.parent for p in root.glob(f"**/{CKPT_DIR}/*.pt") if p.name == BEST or _STEP_FILE.match(p.name)}
    if not candidates:
        raise TinyGPTError(
            f"no trained run found under {root.resolve()}; train one first with `python train.py`, "
            f"or pass run_dir=<run directory> or ckpt=<checkpoint.pt>"
        )
    return max(candidates, key=lambda d: max(p.stat().st_mtime for p in (d / CKPT_DIR).glob("*.pt")))


def resolve(ckpt: str | None, run_dir: str | None, runs_root: str | Path) -> Path:
    """Which checkpoint to sample from: an explicit file, else a run directory, else the latest run."""
    if ckpt:
        p = Path(ckpt).expanduser()
        if p.is_dir():
            raise TinyGPTError(f"ckpt={p} is a directory; pass run_dir={p} for a run directory, or a .pt file as ckpt")
        if not p.is_file():
            raise TinyGPTError(f"checkpoint {p} does not exist; check the path, or pass run_dir=<run directory>")
        return p
    if run_dir:
        d = Path(run_dir).expanduser()
        if not d.is_dir():
            raise TinyGPTError(f"run directory {d} does not exist; check the path, or omit run_dir to use the latest run")
        return checkpoint_in_run(d)
    return checkpoint_in_run(latest_run(runs_root))


def resume_source(resume, out_dir: Path) -> Path | None:
    """The checkpoint a training run starts from, per `resume`:
    auto  - this run directory's newest checkpoint if it has one (rerunning a run continues it),
    false - none; refuse to train into a directory that already holds a run,
    path  - that checkpoint file, or the newest checkpoint of that run directory (the run
            continues in the new directory; the old one is only read)."""
    if resume in (None, "auto", True):
        return latest(out_dir)
    if resume is False or resume in ("false", "never"):
        if has_run(out_dir):
            raise TinyGPTError(f"{out_dir} already holds a run and resume=false; train into a new directory or use resume=auto")
        return None
    p = Path(str(resume)).expanduser()
    if p.is_file():
        source = p
    elif p.is_dir():
        source = latest(p)
        if source is None:
            raise TinyGPTError(f"resume={p}: the directory holds no ckpt-*.pt checkpoint to resume from")
    else:
        raise TinyGPTError(f"resume={resume!r} is neither auto, false, a checkpoint file nor a run directory")
    own = latest(out_dir)
    if own is None or source.resolve() == own.resolve():
        return source
    # This directory's run began from `resume` and has saved since (preempted, rerun with the
    # same overrides): continue it, not the starting point again.
    if source.resolve().parent != own.resolve().parent and _same_path(_started_from(own), resume):
        return own
    # Any other trajectory here would overwrite its ckpt-<step> files (same step names) or have
    # them pruned (retention keeps the highest steps): refuse rather than lose them.
    raise TinyGPTError(
        f"{out_dir} already holds a run (newest checkpoint {own.name}); continuing from {source} there would "
        f"overwrite or prune its checkpoints: train into a new directory, or use resume=auto to continue that run"
    )


def _started_from(ckpt: Path):
    """The `resume` setting the checkpoint's run was launched with (weights mapped, not read)."""
    return (load(ckpt, mmap=True).get("config") or {}).get("resume")


def _same_path(a, b) -> bool:
    if not isinstance(a, str) or not isinstance(b, str):
        return False
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
