"""Sharded checkpoints (format 4, written by FSDP2 runs): each process writes its own shards of the
weights and optimizer state through torch.distributed.checkpoint (DCP) into a folder beside the
checkpoint file, `ckpt-<step>.shards/`, and the file itself holds everything else, with a
placeholder (a meta tensor: shape and dtype, no data) where each tensor was.

DCP does the writing, the reading and the resharding (a checkpoint saved by N processes loads
into M); this module adds what a tinygpt checkpoint promises on top of it: the folder is written
under a temporary name and renamed only when every process has finished, and the file, written
last and atomically, is what makes the checkpoint exist, so a run killed mid-save resumes from the
previous one; the size of every file is recorded, so a folder copied in part or cut short is
refused in one line, not half-read; and one process alone (sample, eval, serve, export, a resume
without FSDP) reads the whole tensors back.
"""

from __future__ import annotations

import os
import shutil
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from gpt.checkpoints.runs import shards_folder
from gpt.errors import TinyGPTError
from gpt.runtime.io import temporary_of


def split(state) -> tuple[object, dict[str, torch.Tensor]]:
    """(`state` with a meta placeholder of the same shape and dtype in place of each tensor, the
    tensors by key). A tensor that appears twice (a tied weight) is stored once: both places hold
    the same placeholder object, which pickling keeps as one."""
    flat: dict[str, torch.Tensor] = {}
    seen: dict[object, torch.Tensor] = {}

    def walk(value, key: str):
        if isinstance(value, torch.Tensor):
            same = _identity(value)
            if same not in seen:
                flat[key] = value
                seen[same] = torch.empty(value.shape, dtype=value.dtype, device="meta")
            return seen[same]
        if isinstance(value, dict):
            return {k: walk(v, f"{key}/{k}") for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(walk(v, f"{key}/{i}") for i, v in enumerate(value))
        return value

    return walk(state, ""), flat


def _identity(t: torch.Tensor) -> object:
    """What makes two tensors one: a state dict holds a tied weight as two tensor objects (one
    detached view per name) over the same memory; a placeholder (no memory) is itself. By the
    storage, not the tensor's own data_ptr: that is 0 for a view of no elements, which is what a
    process holding no rows of a small tied table has (FSDP2 cuts by rows), and then that process
    alone would see two tensors, and the processes would disagree on what to write."""
    local = t.to_local() if _is_dtensor(t) else t
    storage = local.untyped_storage().data_ptr() if not local.is_meta else 0
    if storage == 0:
        return id(t)
    return (storage, local.storage_offset(), local.dtype, tuple(t.shape), local.stride())


def _is_dtensor(t: torch.Tensor) -> bool:
    # torch.distributed.tensor and DCP are imported where a sharded checkpoint is written or read,
    # not with this module: every sample, eval, serve and export start imports it, and the two
    # cost 0.38 s of sample.py's ~1.5 s of imports. No DTensor exists before its module is loaded.
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def placeholders(skeleton) -> dict[str, torch.Tensor]:
    """The placeholders of a `split` skeleton by key, each once (the keys `split` gave)."""
    return split(skeleton)[1]


def fill(skeleton, tensors: dict[str, torch.Tensor]):
    """`skeleton` with each placeholder replaced by the tensor of its key (one tensor for a tied pair)."""
    by_id = {id(p): tensors[k] for k, p in placeholders(skeleton).items()}

    def walk(value):
        if isinstance(value, torch.Tensor):
            return by_id[id(value)]
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(walk(v) for v in value)
        return value

    return walk(skeleton)


def write(path: Path, tensors: dict[str, torch.Tensor], is_main: bool) -> dict:
    """The tensors (sharded DTensors are written by the processes holding them, a plain tensor by
    one of them) into `path`'s shards folder. A collective: every process calls it with the same
    keys. Returns the record the checkpoint file keeps: the folder's name and each file's size.
    The file at `path` must be written after this returns (it is what makes the checkpoint)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    folder = shards_folder(path)
    tmp = Path(_broadcast(str(temporary_of(folder)) if is_main else None))  # rank 0's name, for everyone
    failed = None
    try:
        with warnings.catch_warnings():  # one process alone (no torchrun) writes every shard: the intent
            warnings.simplefilter("ignore", UserWarning)
            dcp.save(tensors, storage_writer=dcp.FileSystemWriter(tmp, sync_files=True))
    except (CheckpointException, OSError, RuntimeError, ValueError) as e:  # DCP gathers every rank's failure
        failed = e
    record = None
    if is_main and failed is None:
        try:
            record = {"folder": folder.name, "files": {f.name: f.stat().st_size for f in sorted(tmp.iterdir())}}
            # A checkpoint of this step written before (a rerun) stops existing before its folder goes.
            path.unlink(missing_ok=True)
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(tmp, folder)
        except OSError as e:
            failed = e
    if failed is not None:
        if is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        failed = _os_error(failed) or failed
        if isinstance(failed, OSError):
            raise TinyGPTError(
                f"cannot write the shards of checkpoint {path} ({failed.strerror or failed}); the previous checkpoints are "
                f"kept: free space or choose another paths.runs_dir / hydra.run.dir"
            )
        raise TinyGPTError(f"cannot write the shards of checkpoint {path} ({_reason(failed)}); the previous checkpoints are kept")
    return record


def check(path: Path, record: dict) -> Path:
    """The shards folder of the checkpoint file at `path`, if it holds every file the checkpoint
    recorded at its recorded size; else a TinyGPTError that says what is missing."""
    if not isinstance(record, dict) or not isinstance(record.get("files"), dict) or not record.get("folder"):
        raise TinyGPTError(f"cannot load checkpoint {path}: it is sharded but does not say where its shards are (damaged)")
    folder = path.parent / str(record["folder"])
    if not folder.is_dir():
        raise TinyGPTError(
            f"cannot load checkpoint {path}: it is sharded (written under distributed=fsdp) and its shards folder "
            f"{folder.name}/ is missing: copy that folder beside the file"
        )
    for name, size in record["files"].items():
        f = folder / name
        if not f.is_file() or f.stat().st_size != size:
            what = "missing" if not f.is_file() else f"{f.stat().st_size:,} bytes, written as {size:,}"
            raise TinyGPTError(f"cannot load checkpoint {path}: its shard {folder.name}/{name} is {what} (damaged or cut short)")
    return folder


def read(folder: Path, targets: dict[str, torch.Tensor], collective: bool) -> None:
    """Fill `targets` (by key, in place) from the shards in `folder`: whole tensors in one
    process (`collective` false), or this process's shards of sharded DTensors, every process
    calling (`collective` true). DCP reads, from each file, only the pieces each target needs."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with warnings.catch_warnings():  # DCP warns that one process reads alone, which is the intent
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(targets, storage_reader=dcp.FileSystemReader(folder), no_dist=not collective)
    except (CheckpointException, OSError, RuntimeError, ValueError, KeyError, EOFError) as e:
        raise TinyGPTError(f"cannot load the shards in {folder}: {_reason(e)} (damaged, or not written by this run)") from None


def _os_error(e: BaseException) -> OSError | None:
    """The OSError behind a failure (a full disk), where DCP wrapped a rank's in its
    CheckpointException (its `failures`: rank -> the exception, with its stack)."""
    if isinstance(e, OSError):
        return e
    for failure in getattr(e, "failures", {}).values() if _from_dcp(e) else ():
        inner = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(inner, OSError):
            return inner
    return None


def _reason(e: BaseException) -> str:
    """The line that says what went wrong: for DCP's CheckpointException (each failed rank's
    traceback), the last line of the first traceback."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if _from_dcp(e):
        lines = [line for line in lines if not line.startswith(("File ", "Traceback", "^", "CheckpointException"))] or lines
        return lines[-1][:300] if lines else type(e).__name__
    return lines[0][:300] if lines else type(e).__name__


def _from_dcp(e: BaseException) -> bool:
    from torch.distributed.checkpoint.api import CheckpointException  # loaded already: e came from DCP's calls

    return isinstance(e, CheckpointException)


def read_whole(folder: Path, skeleton):
    """`skeleton` with its tensors read whole, on the CPU, in this one process."""
    targets = {k: torch.empty(p.shape, dtype=p.dtype) for k, p in placeholders(skeleton).items()}
    read(folder, targets, collective=False)
    return fill(skeleton, targets)


def read_sharded(folder: Path, skeleton, target: Callable[[str, torch.Tensor], torch.Tensor]):
    """`skeleton` with each placeholder replaced by `target(key, placeholder)` (a live parameter,
    or a new tensor sharded like one) filled from the shards: a collective."""
    targets = {k: target(k, p) for k, p in placeholders(skeleton).items()}
    read(folder, targets, collective=True)
    return fill(skeleton, targets)


def _broadcast(value):
    if dist.is_available() and dist.is_initialized():
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    return value
