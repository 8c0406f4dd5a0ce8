"""Checkpoints: atomic save, safe load, and finding the run to sample from.

A checkpoint is a dict of tensors and plain Python values. It carries everything needed to
rebuild the model and its tokenizer, and it is loaded with `weights_only=True`: data, never code.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch

from gpt import __version__
from gpt.errors import TinyGPTError

CKPT_DIR = "checkpoints"
LAST = "last.pt"
BEST = "best.pt"
_COMPILED_PREFIX = "_orig_mod."


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module under torch.compile's wrapper, so saved keys have no `_orig_mod.` prefix."""
    return getattr(model, "_orig_mod", model)


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


def load(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    path = Path(path).expanduser()
    if not path.is_file():
        raise TinyGPTError(f"checkpoint {path} does not exist; pass an existing .pt file or a run directory")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TinyGPTError(f"cannot load checkpoint {path}: {first}") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "model_config" not in ckpt:
        raise TinyGPTError(f"{path} is not a tinygpt checkpoint (no model or model_config inside)")
    # Checkpoints written from a compiled model by older code carry the wrapper's prefix.
    ckpt["model"] = {k.removeprefix(_COMPILED_PREFIX): v for k, v in ckpt["model"].items()}
    return ckpt


def ensure_fresh_run_dir(run_dir: Path) -> None:
    """A new run never trains into (and so never overwrites) an earlier run's directory."""
    if any((Path(run_dir) / CKPT_DIR).glob("*.pt")):
        raise TinyGPTError(
            f"{run_dir} already holds a trained run; leave it as is and train into a new directory "
            f"(omit hydra.run.dir, or give it a new path)"
        )


def checkpoint_in_run(run_dir: Path) -> Path:
    """best.pt of a run directory, falling back to last.pt."""
    for name in (BEST, LAST):
        p = Path(run_dir) / CKPT_DIR / name
        if p.is_file():
            return p
    raise TinyGPTError(f"{run_dir} holds no checkpoint ({CKPT_DIR}/{BEST} or {LAST}); pass a finished run directory")


def latest_run(runs_root: str | Path) -> Path:
    """The most recently written run directory under runs_root (runs and sweep jobs alike)."""
    root = Path(runs_root).expanduser()
    candidates = [p.parent.parent for p in root.glob(f"**/{CKPT_DIR}/*.pt") if p.name in (BEST, LAST)]
    if not candidates:
        raise TinyGPTError(
            f"no trained run found under {root.resolve()}; train one first with `python train.py`, "
            f"or pass run_dir=<run directory> or ckpt=<checkpoint.pt>"
        )
    return max(set(candidates), key=lambda d: max(p.stat().st_mtime for p in (d / CKPT_DIR).glob("*.pt")))


def resolve(ckpt: str | None, run_dir: str | None, runs_root: str | Path) -> Path:
    """Which checkpoint to sample from: an explicit file, else a run directory, else the latest run."""
    if ckpt:
        p = Path(ckpt).expanduser()
        if not p.is_file():
            raise TinyGPTError(f"checkpoint {p} does not exist; check the path, or pass run_dir=<run directory>")
        return p
    if run_dir:
        d = Path(run_dir).expanduser()
        if not d.is_dir():
            raise TinyGPTError(f"run directory {d} does not exist; check the path, or omit run_dir to use the latest run")
        return checkpoint_in_run(d)
    return checkpoint_in_run(latest_run(runs_root))
