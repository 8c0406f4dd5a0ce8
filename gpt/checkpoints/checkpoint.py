"""The checkpoint: what one holds (the format, versioned), atomic save and safe load.

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
  4  sharded (written by FSDP2 runs, step checkpoints only): the weights and the optimizer
     state lie in a folder beside the file, written by every process through
     torch.distributed.checkpoint (gpt.checkpoints.shards); the file holds a placeholder for each
     tensor and `shards`, the folder's name and its files' sizes. Unsharded runs still write 3;
     a tinygpt that reads only up to 3 refuses a 4 in one line (upgrade).
Older files are upgraded as they load, by the rows of one table (`_UPGRADES`).
"""

from __future__ import annotations

import errno
import math
import pickle
import shutil
import zipfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TypeVar

import torch

from gpt.errors import TinyGPTError
from gpt.runtime.io import atomic_write
from gpt.version import __version__

T = TypeVar("T")

FORMAT = 4  # the newest this tinygpt reads; it writes 3, or 4 where sharded
_WHOLE = 3
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
    dtype: str | None = None  # compute dtype it was trained in ("bfloat16"; None: unknown, an older checkpoint)
    device_type: str | None = None  # the kind of device it was trained on ("cuda"), which `dtype` was chosen for
    ns_dtype: str | None = None  # Muon's Newton-Schulz dtype (None: no Muon, or unknown)
    elapsed_s: float = 0.0  # wall-clock seconds the run took to reach this step, over all its resumes
    best_elapsed_s: float | None = None  # elapsed_s when the best val loss so far was reached
    tokens_seen: int | None = None  # training tokens over all its resumes (None: not counted, older)


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
    shards: dict | None = None  # format 4: {"folder", "files": {name: bytes}}; the tensors above are placeholders

    def settings(self, section: str, cls: type[T]) -> tuple[T | None, list[str]]:
        """The run's recorded `section` settings as `cls` (None when not recorded), read leniently:
        keys this tinygpt does not know (written by another version) are left out and returned."""
        from gpt.config import from_dict

        recorded, ignored = self.config.get(section), []
        if not isinstance(recorded, dict) or not recorded:
            return None, ignored
        return from_dict(cls, recorded, section, ignored), ignored

    def sharded_state(self) -> dict:
        """What a sharded checkpoint keeps in its shards folder (gpt.checkpoints.shards), as one
        dict: the weights, and the optimizer state of a step checkpoint."""
        return {"model": self.model} | ({"optimizer": self.training.optimizer} if self.training is not None else {})

    def set_sharded_state(self, state: dict) -> None:
        self.model = state["model"]
        if self.training is not None:
            self.training.optimizer = state["optimizer"]

    def to_payload(self) -> dict:
        # Not dataclasses.asdict: it would deep-copy every tensor of the optimizer state.
        payload = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.training is not None:
            payload["training"] = {f.name: getattr(self.training, f.name) for f in fields(self.training)}
        if self.shards is None:  # a whole checkpoint stays what every reader of format 3 knows
            del payload["shards"]
        return {"format": FORMAT if self.shards else _WHOLE, **payload}

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
        for formats, upgrade in _UPGRADES:
            if fmt in formats:
                payload = upgrade(payload)
        missing = [k for k in ("model", "model_config", "tokenizer") if k not in payload]
        if missing:
            raise TinyGPTError(f"{where} is not a tinygpt checkpoint (no {', '.join(missing)} inside)")
        if fmt == 4 and not payload.get("shards"):
            raise TinyGPTError(f"{where} is damaged: a sharded checkpoint (format 4) that does not name its shards")
        known = {f.name for f in fields(cls)}
        ckpt = cls(**{k: v for k, v in payload.items() if k in known})
        if isinstance(ckpt.training, dict):
            state = {f.name for f in fields(TrainingState)}
            ckpt.training = TrainingState(**{k: v for k, v in ckpt.training.items() if k in state})
        return ckpt


def _nest_training_state(old: dict) -> dict:
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


def _drop_compiled_prefix(old: dict) -> dict:
    if not isinstance(old.get("model"), dict):  # not a checkpoint: refused below, saying so
        return old
    return {**old, "model": {k.removeprefix(_COMPILED_PREFIX): v for k, v in old["model"].items()}}


# How an older checkpoint is read today, in one table: (the formats it applies to, the upgrade),
# applied in order on every load. What a later format added as an optional field (threads,
# dtype, elapsed_s, tokens_seen, ...) needs no row: its default says "unknown", and the reader
# of each field says what unknown means. (A run's settings from before optim.min_lr_ratio are
# read where the schedule is resolved: gpt.training.build.)
_UPGRADES = (
    (range(1, 2), _nest_training_state),  # format 1 kept the training state at the top level
    # earlier writers saved a compiled model's keys with torch.compile's prefix (which format
    # they wrote was not recorded with it: every one is read so)
    (range(1, FORMAT + 1), _drop_compiled_prefix),
)


def save(path: str | Path, ckpt: Checkpoint) -> None:
    """Atomic: a crash or a full disk mid-write never clobbers the previous file at `path`. The
    zip records of the file carry CRC-32 checksums (forced on: `load` checks them)."""
    crc = getattr(torch.serialization, "get_crc32_options", lambda: True)()
    if not crc:
        torch.serialization.set_crc32_options(True)
    payload = ckpt.to_payload()
    try:
        with atomic_write(path) as f:
            torch.save(payload, f)
    except (OSError, RuntimeError) as e:
        # torch's zip writer turns a failed write into RuntimeError("... unexpected pos ...") with
        # the OSError as its context; any other RuntimeError is not the disk's and goes up as it is.
        cause = e if isinstance(e, OSError) else e.__context__
        if not isinstance(cause, OSError):
            raise
        raise TinyGPTError(_unwritable(Path(path), cause, payload)) from None
    finally:
        if not crc:
            torch.serialization.set_crc32_options(False)


def _unwritable(path: Path, e: OSError, payload: dict) -> str:
    """Why `path` could not be written, in one line; on a full disk, the space free beside the
    space the checkpoint needs (its tensors' bytes: the rest is kilobytes)."""
    why = e.strerror or str(e)
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        storages: dict[int, int] = {}
        for t in _tensors(payload):
            storages.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        free = shutil.disk_usage(path.parent).free
        why = f"{why}: {path.parent} has {_size(free)} free, the checkpoint needs about {_size(sum(storages.values()))}"
    return (
        f"cannot write checkpoint {path} ({why}); the previous checkpoints are kept: free space or choose another "
        f"paths.runs_dir / hydra.run.dir, then resume"
    )


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [t for v in value for t in _tensors(v)] if isinstance(value, (list, tuple)) else []


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{max(n, 1) / 2**10:.0f} KiB"


def _check_sums(path: Path) -> None:
    """Every record of the checkpoint's zip archive against its CRC-32: torch reads records
    without checking, so a flipped bit in a tensor would load as a wrong weight, silently. A
    record marked as a folder is damage too: torch.save marks none, and torch's reader gives a
    folder no bytes, so its tensor would load as whatever memory held (the central directory's
    attributes carry no checksum). (Files that are not zip archives are left to torch.load, which
    refuses or reads them.)"""
    try:
        if not zipfile.is_zipfile(path):
            return
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
            folders = [i.filename for i in archive.infolist() if i.external_attr & 0x10 or (i.external_attr >> 16) & 0o040000]
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, RuntimeError) as e:
        raise TinyGPTError(f"cannot load checkpoint {path}: the file is damaged or cut short ({e})") from None
    if bad is not None:
        raise TinyGPTError(f"cannot load checkpoint {path}: the file is damaged ({bad} fails its checksum)")
    if folders:
        raise TinyGPTError(f"cannot load checkpoint {path}: the file is damaged ({folders[0]} is marked as a folder)")


def load(path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = False, training: bool = True) -> Checkpoint:
    """mmap=True maps the tensors instead of reading them: cheap when only the metadata is needed.
    A sharded checkpoint (format 4) is checked for all its shards; with mmap=True its tensors stay
    placeholders (meta tensors: shapes and dtypes), else they are read whole, in this process.
    training=False: the weights alone (sample, eval, serve, export, a finetune's start), without
    the training state: a sharded step checkpoint's optimizer state (twice the weights under
    AdamW) is not read, a whole one's is mapped, never read."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise TinyGPTError(f"checkpoint {path} does not exist; pass an existing .pt file or a run directory")
    _check_sums(path)
    mapped = mmap or not training  # (the weights alone: the optimizer state's pages are never touched)
    try:
        try:
            payload = torch.load(path, map_location=map_location, weights_only=True, mmap=mapped)
        except RuntimeError as e:
            if not (mapped and "mmap can only be used" in str(e)):
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
    ckpt = Checkpoint.from_payload(payload, path)
    if not training:
        ckpt.training = None
    if ckpt.shards is not None:
        from gpt.checkpoints import shards  # (a whole checkpoint's reader never needs DCP)

        folder = shards.check(path, ckpt.shards)
        if not mmap:
            ckpt.set_sharded_state(shards.read_whole(folder, ckpt.sharded_state()))
            ckpt.shards = None  # its tensors are real now: to every reader, a whole checkpoint
    return ckpt


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module under torch.compile's and DDP's wrappers, so saved keys carry no prefix."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if inner is None:
            return model
        model = inner
