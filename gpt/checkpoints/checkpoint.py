"""Checkpoints: what one holds (the format, versioned), atomic save, safe load, retention, and
finding the run or checkpoint a command means.

A run directory holds `checkpoints/ckpt-<step>.pt` (full training state, the newest few kept)
and `checkpoints/best.pt` (weights of the best validation loss, for sampling and export). Both
are a `Checkpoint`; everything else in tinygpt reads checkpoints through this class, never by
raw keys. Files are loaded with `weights_only=True`: a checkpoint is data, never code.

Format history (`format` in the file):
  1  tinygpt 0.1 (no `format` key): training state (optimizer, scaler, loader, rng, bad_steps,
     bad_in_a_row, lora) at the top level.
  2  `format` and `tinygpt_version` keys; the training state under `training`.
  3  the training state records the CPU thread count it was trained with (a resume keeps it:
     gpt.runtime.threads) and the run's elapsed wall time (`elapsed_s`, and `best_elapsed_s` at its best
     val loss). From 3 on, training-state keys this tinygpt does not know are ignored, so a
     later optional key needs no new format.
"""

from __future__ import annotations

import math
import pickle
import re
import zipfile
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import TypeVar

import torch

from gpt.errors import TinyGPTError
from gpt.runtime.io import atomic_write, temporary_owner
from gpt.version import __version__

T = TypeVar("T")

FORMAT = 3
CKPT_DIR = "checkpoints"
RUN_STAMP = "%Y-%m-%d_%H-%M-%S-%f"  # run folder names; configs/hydra/default.yaml names them alike (tested)
BEST = "best.pt"
_STEP_FILE = re.compile(r"^ckpt-(\d+)\.pt$")
_COMPILED_PREFIX = "_orig_mod."


@dataclass
class TrainingState:
    """What resuming needs beyond the weights; step checkpoints only."""

    optimizer: dict
    scaler: dict
    loader: dict
    rng: list[dict]  # every rank's random state, indexed by rank
    bad_steps: int = 0  # non-finite steps skipped so far
    bad_in_a_row: int = 0
    threads: int | None = None  # CPU threads it was trained with (None: unknown, format < 3)
    elapsed_s: float = 0.0  # wall-clock seconds the run took to reach this step, over all its resumes
    best_elapsed_s: float | None = None  # elapsed_s when the best val loss so far was reached


@dataclass
class Checkpoint:
    model: dict[str, torch.Tensor]  # state dict of the unwrapped model
    model_config: dict  # architectures.config_to_dict form
    tokenizer: dict  # the tokenizer's dict form
    step: int = 0
    best_val_loss: float = math.inf
    last_eval: dict = field(default_factory=dict)  # {"train", "val"} losses of the newest eval (a resumed run reports them)
    config: dict = field(default_factory=dict)  # the run's settings, as plain data
    lora: dict | None = None  # {"rank", "alpha"} when `model` holds unmerged LoRA adapters
    training: TrainingState | None = None  # None: weights only (best.pt, imports)
    tinygpt_version: str = __version__  # of the writer; newer formats name it in the refusal

    def settings(self, section: str, cls: type[T]) -> tuple[T | None, list[str]]:
        """The run's recorded `section` settings as `cls` (None when not recorded), read leniently:
        keys this tinygpt does not know (written by another version) are left out and returned."""
        from gpt.config import from_dict

        recorded, ignored = self.config.get(section), []
        if not isinstance(recorded, dict) or not recorded:
            return None, ignored
        return from_dict(cls, recorded, section, ignored), ignored

    def to_payload(self) -> dict:
        # Not dataclasses.asdict: it would deep-copy every tensor of the optimizer state.
        payload = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.training is not None:
            payload["training"] = {f.name: getattr(self.training, f.name) for f in fields(self.training)}
        return {"format": FORMAT, **payload}

    @classmethod
    def from_payload(cls, payload: dict, where: Path | str = "checkpoint") -> Checkpoint:
        fmt = payload.get("format", 1)
        if isinstance(fmt, bool) or not isinstance(fmt, int) or fmt < 1:  # no tinygpt ever wrote that
            raise TinyGPTError(f"{where} is not a tinygpt checkpoint (its format is {fmt!r}; tinygpt writes 1 to {FORMAT})")
        if fmt > FORMAT:
            raise TinyGPTError(
                f"{where} was written by tinygpt {payload.get('tinygpt_version', '?')} in checkpoint format {fmt}; this "
                f"tinygpt ({__version__}) reads formats up to {FORMAT}: upgrade tinygpt (pip install -U tinygpt)"
            )
        if fmt == 1:
            payload = _upgrade_from_1(payload)
        missing = [k for k in ("model", "model_config", "tokenizer") if k not in payload]
        if missing:
            raise TinyGPTError(f"{where} is not a tinygpt checkpoint (no {', '.join(missing)} inside)")
        known = {f.name for f in fields(cls)}
        ckpt = cls(**{k: v for k, v in payload.items() if k in known})
        if isinstance(ckpt.training, dict):
            state = {f.name for f in fields(TrainingState)}
            ckpt.training = TrainingState(**{k: v for k, v in ckpt.training.items() if k in state})
        # Checkpoints written from a compiled model by older code carry the wrapper's prefix.
        ckpt.model = {k.removeprefix(_COMPILED_PREFIX): v for k, v in ckpt.model.items()}
        return ckpt


def _upgrade_from_1(old: dict) -> dict:
    new = {k: v for k, v in old.items() if k not in ("optimizer", "scaler", "loader", "rng", "bad_steps", "bad_in_a_row")}
    new.setdefault("tinygpt_version", "0.1.0")
    if "optimizer" in old:
        rng = old.get("rng")
        new["training"] = {
            "optimizer": old["optimizer"],
            "scaler": old.get("scaler") or {},
            "loader": old["loader"],
            "rng": rng if isinstance(rng, list) else [rng],
            "bad_steps": old.get("bad_steps", 0),
            "bad_in_a_row": old.get("bad_in_a_row", 0),
        }
    return new


def save(path: str | Path, ckpt: Checkpoint) -> None:
    """Atomic: a crash or a full disk mid-write never clobbers the previous file at `path`. The
    zip records of the file carry CRC-32 checksums (forced on: `load` checks them)."""
    crc = getattr(torch.serialization, "get_crc32_options", lambda: True)()
    if not crc:
        torch.serialization.set_crc32_options(True)
    try:
        with atomic_write(path) as f:
            torch.save(ckpt.to_payload(), f)
    except OSError as e:
        raise TinyGPTError(
            f"cannot write checkpoint {path} ({e.strerror or e}); the previous one is kept: free space or "
            f"choose another paths.runs_dir / hydra.run.dir"
        ) from None
    finally:
        if not crc:
            torch.serialization.set_crc32_options(False)


def _check_sums(path: Path) -> None:
    """Every record of the checkpoint's zip archive against its CRC-32: torch reads records
    without checking, so a flipped bit in a tensor would load as a wrong weight, silently.
    (Files that are not zip archives are left to torch.load, which refuses or reads them.)"""
    try:
        if not zipfile.is_zipfile(path):
            return
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, RuntimeError) as e:
        raise TinyGPTError(f"cannot load checkpoint {path}: the file is damaged or cut short ({e})") from None
    if bad is not None:
        raise TinyGPTError(f"cannot load checkpoint {path}: the file is damaged ({bad} fails its checksum)")


def load(path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = False) -> Checkpoint:
    """mmap=True maps the tensors instead of reading them: cheap when only the metadata is needed."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise TinyGPTError(f"checkpoint {path} does not exist; pass an existing .pt file or a run directory")
    _check_sums(path)
    try:
        try:
            payload = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
        except RuntimeError as e:
            if not (mmap and "mmap can only be used" in str(e)):
                raise
            payload = torch.load(path, map_location=map_location, weights_only=True)  # an old-style file: read it
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, KeyError, IndexError, TypeError, OSError) as e:
        # Not a file torch wrote (a text file, a truncated copy): the unpickler fails in many ways.
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        first = first.split(". ")[0]  # torch's zip reader goes on for sentences
        # torch's own advice (e.g. to load with weights_only=False) is not passed on: unsafe.
        if isinstance(e, (KeyError, IndexError, TypeError, EOFError)) or "torch.save" in first or "weights_only" in first:
            first = "it is not a file written by torch.save, or it was cut short"
        elif isinstance(e, OSError) and not isinstance(e, PermissionError):
            first = f"the file is damaged or cut short ({e.strerror or first})"
        elif "PytorchStreamReader" in first:
            first = f"the file is damaged or cut short ({first.removeprefix('PytorchStreamReader ')})"
        raise TinyGPTError(f"cannot load checkpoint {path}: {first}") from None
    if not isinstance(payload, dict):
        raise TinyGPTError(f"{path} is not a tinygpt checkpoint (it holds a {type(payload).__name__})")
    return Checkpoint.from_payload(payload, path)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module under torch.compile's and DDP's wrappers, so saved keys carry no prefix."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if inner is None:
            return model
        model = inner


# --- a run directory's checkpoints ------------------------------------------------------------


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
    """Delete all but the newest `keep_last` step checkpoints (best.pt is separate and stays)."""
    for old in step_checkpoints(run_dir)[:-keep_last]:
        old.unlink(missing_ok=True)


def set_aside(path: Path) -> Path:
    """Rename a checkpoint that cannot be used to `<name>.damaged` (kept for a look, out of the way
    of retention and resuming); returns the new path."""
    target, n = path.with_name(path.name + ".damaged"), 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.damaged-{n}")
    path.rename(target)
    return target


def remove_leftovers(run_dir: Path) -> None:
    """Delete temporaries of writes that a crash or kill -9 cut short (never complete files)."""
    for tmp in (Path(run_dir) / CKPT_DIR).glob("*.pt.tmp-*"):
        if temporary_owner(tmp) is not None:
            tmp.unlink(missing_ok=True)


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
        if not d.is_dir():
            raise TinyGPTError(f"run directory {d} does not exist; check the path, or omit run_dir to use the latest run")
        return checkpoint_in_run(d)
    return checkpoint_in_run(latest_run(runs_root))


# --- where a training run starts from ----------------------------------------------------------

AUTO, NEVER = "auto", "never"


def parse_resume(value) -> str | Path:
    """The `resume` setting, read in this one place: AUTO, NEVER, or the path it names."""
    text = str(value).strip()
    if value is not None and text == "":
        raise TinyGPTError("resume= is empty; use resume=auto, resume=false, or a checkpoint / run directory")
    if value is None or text.lower() in ("auto", "true", "none", "null"):
        return AUTO
    if text.lower() in ("false", "never"):
        return NEVER
    return Path(text).expanduser()


def resume_source(resume, out_dir: Path, newest=latest, peek=None) -> Path | None:
    """The checkpoint a training run starts from, per `resume`:
    auto  - this run directory's newest checkpoint if it has one (rerunning a run continues it),
    false - none; refuse to train into a directory that already holds a run,
    path  - that checkpoint file, or the newest checkpoint of that run directory (the run
            continues in the new directory; the old one is only read).
    `peek(path)`: the checkpoint at path, when the caller has it already (read here otherwise)."""
    mode = parse_resume(resume)
    if mode == AUTO:
        return newest(out_dir)
    if mode == NEVER:
        if has_run(out_dir):
            raise TinyGPTError(f"{out_dir} already holds a run and resume=false; train into a new directory or use resume=auto")
        return None
    if mode.is_file():
        source = mode
    elif mode.is_dir():
        source = latest(mode)
        if source is None:
            raise TinyGPTError(f"resume={mode}: the directory holds no ckpt-*.pt checkpoint to resume from")
    else:
        raise TinyGPTError(f"resume={resume!r} is neither auto, false, a checkpoint file nor a run directory")
    own = newest(out_dir)
    if own is None or source.resolve() == own.resolve():
        return source
    # This directory's run began from `resume` and has saved since (preempted, rerun with the
    # same overrides): continue it, not the starting point again.
    peek = peek or (lambda path: load(path, mmap=True))
    if source.resolve().parent != own.resolve().parent and _same_path(peek(own).config.get("resume"), resume):
        return own
    # Any other trajectory here would overwrite its ckpt-<step> files (same step names) or have
    # them pruned (retention keeps the highest steps): refuse rather than lose them.
    raise TinyGPTError(
        f"{out_dir} already holds a run (newest checkpoint {own.name}); continuing from {source} there would "
        f"overwrite or prune its checkpoints: train into a new directory, or use resume=auto to continue that run"
    )


def _same_path(a, b) -> bool:
    if not isinstance(a, str) or not isinstance(b, str):
        return False
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
