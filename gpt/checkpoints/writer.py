"""Checkpoints written off the step path: the state is copied into host buffers (the only pause
the steps see), and a thread writes the copy while training goes on.

torch.save of a 124M run's state (1.5 GB of weights and AdamW moments) blocks for seconds; a
copy into buffers kept from the previous save takes a tenth of a second on two CPU cores. The
buffers are kept for the run (host memory the size of the state; pinned on a GPU, so the copy
is a DMA) and are allocated, and their pages touched, before the first save needs them: a fresh
1.5 GB allocation faults its pages in at about the cost of the save itself.

One write is in flight at a time: the next save, and the end of the run, wait for it first and
learn its error. A write is as atomic as a blocking one (gpt.checkpoints.checkpoint.save): a
kill -9 mid-write leaves the previous checkpoint and a temporary that readers ignore. (torch's
own async writer, torch.distributed.checkpoint.async_save, writes DCP folders, not the single
file every reader of a whole checkpoint knows.)
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

import torch

from gpt.checkpoints.checkpoint import Checkpoint
from gpt.errors import TinyGPTError


class Writer:
    """Writes one checkpoint job at a time in a thread, from a snapshot of its tensors."""

    def __init__(self, device: torch.device):
        self.pinned = device.type == "cuda"
        self._buffers: list[torch.Tensor] = []  # one uint8 tensor per distinct storage, in the order met
        self._thread: threading.Thread | None = None
        self._error: TinyGPTError | None = None
        self.ready = False  # buffers prepared (or allocated by a save)

    def prepare(self, ckpts: list[Checkpoint]) -> None:
        """Allocate buffers for these checkpoints' tensors in the background, so that the first
        save only copies. Call once the state to be saved exists (AdamW's moments: after a step)."""
        sizes, self.ready = _sizes(ckpts), True
        self.wait()
        self._start(lambda: self._allocate(sizes))

    def submit(self, jobs: list[tuple[object, Checkpoint]], then: Callable[[], None] = lambda: None) -> None:
        """Snapshot every checkpoint of `jobs` ([(path, Checkpoint)]) now, then write them in order
        in the thread (gpt.checkpoints.checkpoint.save), then run `then` (e.g. pruning)."""
        from gpt.checkpoints.checkpoint import save

        self.wait()
        self.ready = True
        memo: dict[int, torch.Tensor] = {}
        copies = [(path, _walk(ckpt, lambda t: self._copy(t, memo))) for path, ckpt in jobs]
        if self.pinned:
            torch.cuda.current_stream().synchronize()  # the non-blocking copies have landed

        def write() -> None:
            for path, ckpt in copies:
                save(path, ckpt)
            then()

        self._start(write)

    @property
    def failed(self) -> bool:
        """Whether the last write failed (a read of a flag: no wait, no device sync)."""
        return self._error is not None

    def wait(self) -> TinyGPTError | None:
        """Block until the write in flight (if any) is done; its error, once (None if it wrote)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        return error

    # --- internals --------------------------------------------------------------------------------

    def _start(self, work: Callable[[], None]) -> None:
        def run() -> None:
            try:
                work()
            except TinyGPTError as e:
                self._error = e
            except Exception as e:  # noqa: BLE001 - any failure must reach the step loop, not die with the thread
                self._error = TinyGPTError(f"the checkpoint writer failed: {type(e).__name__}: {e}")

        # Not a daemon: an interpreter exiting normally finishes the write before it goes.
        self._thread = threading.Thread(target=run, name="tinygpt-checkpoint-writer")
        self._thread.start()

    def _allocate(self, sizes: list[int]) -> None:
        for i, size in enumerate(sizes):
            if i >= len(self._buffers) or self._buffers[i].numel() != size:
                self._allocate_one(i, size).zero_()  # touch every page now, not in a save's copy

    def _copy(self, t: torch.Tensor, memo: dict[int, torch.Tensor]) -> torch.Tensor:
        """`t` as a view of a host buffer holding a copy of its storage. Tensors sharing a storage
        (tied embeddings, views) share one copy, so the file keeps them shared as torch.save does."""
        storage = t.untyped_storage()
        key = storage.data_ptr()
        buf = memo.get(key)
        if buf is None:
            i = len(memo)
            if i >= len(self._buffers) or self._buffers[i].numel() != storage.nbytes():
                self._allocate_one(i, storage.nbytes())
            buf = memo[key] = self._buffers[i]
            source = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
            buf.copy_(source, non_blocking=self.pinned)
        return torch.empty(0, dtype=t.dtype).set_(buf.untyped_storage(), t.storage_offset(), t.size(), t.stride())

    def _allocate_one(self, i: int, size: int) -> torch.Tensor:
        buf = torch.empty(size, dtype=torch.uint8, pin_memory=self.pinned)
        if i < len(self._buffers):
            self._buffers[i] = buf
        else:
            self._buffers.append(buf)
        return buf


def _sizes(ckpts: list[Checkpoint]) -> list[int]:
    """The bytes of each distinct storage the checkpoints' tensors lie in, in the order `_copy`
    meets them."""
    seen: dict[int, int] = {}

    def note(t: torch.Tensor) -> torch.Tensor:
        seen.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        return t

    for ckpt in ckpts:
        _walk(ckpt, note)
    return list(seen.values())


def _walk(value: object, copy: Callable[[torch.Tensor], torch.Tensor]) -> object:
    """`value` with every tensor replaced by `copy(tensor)` and its containers rebuilt (the live
    ones change as training goes on); other values are immutable or made fresh for a save."""
    if isinstance(value, torch.Tensor):
        return copy(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # Checkpoint, TrainingState
        return dataclasses.replace(value, **{f.name: _walk(getattr(value, f.name), copy) for f in dataclasses.fields(value)})
    if isinstance(value, dict):
        return {k: _walk(v, copy) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_walk(v, copy) for v in value)
    return value
