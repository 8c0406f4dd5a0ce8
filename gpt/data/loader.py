"""What training draws: a `Batch`, from `Batches` (random windows of tokens here, whole
conversations in gpt.data.chat)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch


@dataclass
class Batch:
    """One micro-batch: inputs `x` (B, T), next-token targets `y` (-1 where nothing is trained:
    a chat's prompt, padding), the real input tokens it holds (what tokens/s counts) and the
    targets it trains (what a step weights its loss by; None when every target trains: text)."""

    x: torch.Tensor
    y: torch.Tensor
    tokens: int
    trained: int | None = None


class Batches(Protocol):
    """A rank's stream of batches, resumable from its state."""

    def next(self) -> Batch: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class RandomWindows:
    """Batches of `batch_size` random windows of block_size + 1 tokens; x is the first
    block_size tokens of each window and y the same shifted by one (next-token targets).

    Under DDP every rank draws the same global batch of batch_size * world_size windows from
    an identically seeded generator and keeps its own slice. So the data seen is a function of
    (seed, step, rank), a 2-process run sees exactly the batches of a 1-process run with twice
    the batch size, and the generator's state is all a checkpoint needs to resume the stream.
    """

    def __init__(
        self,
        tokens: np.ndarray | list[np.ndarray],
        block_size: int,
        batch_size: int,
        device: torch.device,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
    ):
        self.shards = [tokens] if isinstance(tokens, np.ndarray) else list(tokens)
        # A window never crosses shards: shard i offers len - block_size start positions, and
        # starts are drawn uniformly over all of them (so every token is equally likely).
        self._starts = np.cumsum([max(0, len(s) - block_size) for s in self.shards])
        if len(self._starts) == 0 or self._starts[-1] == 0:
            raise ValueError(f"no shard holds a window of {block_size + 1} tokens")
        self.block_size = block_size
        self.batch_size = batch_size
        self.device = device
        self.rows = slice(rank * batch_size, (rank + 1) * batch_size)
        self.global_batch = batch_size * world_size
        self.generator = torch.Generator().manual_seed(seed)
        self._offsets = np.arange(block_size + 1)
        # Pinned host memory lets the copy to the GPU overlap with compute.
        self._pin = device.type == "cuda"

    def next(self) -> Batch:
        draws = torch.randint(int(self._starts[-1]), (self.global_batch,), generator=self.generator)
        draws = draws[self.rows].numpy()
        if len(self.shards) == 1:
            rows = self.shards[0][draws[:, None] + self._offsets]
        else:
            which = np.searchsorted(self._starts, draws, side="right")
            local = draws - np.concatenate([[0], self._starts[:-1]])[which]
            rows = np.stack([self.shards[w][o : o + self.block_size + 1] for w, o in zip(which, local)])
        windows = torch.from_numpy(rows.astype(np.int64))
        if self._pin:
            windows = windows.pin_memory()
        windows = windows.to(self.device, non_blocking=True)
        x = windows[:, :-1].contiguous()
        return Batch(x, windows[:, 1:].contiguous(), tokens=x.numel())

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


class Prefetched:
    """`batches` one micro-batch ahead on a GPU: while the step computes, the next batch is
    drawn on the host and copied (from pinned memory, non-blocking) on a stream of its own, so
    the step never waits for its input's copy behind the previous step's kernels. The state is
    the one before the batch held ahead was drawn: a checkpoint resumes at that batch, as the
    stream without prefetching would. (torch's DataLoader prefetches through worker processes
    and pins, but hands the copy to the device to the caller: this is that copy.) On a CPU there
    is nothing to overlap, and the same order of batches (`stream` None) is what tests check."""

    def __init__(self, batches: Batches, device: torch.device):
        self.inner = batches
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._ahead: tuple[dict, Batch, torch.cuda.Event | None] | None = None

    def next(self) -> Batch:
        if self._ahead is None:
            self._ahead = self._draw()
        _, batch, ready = self._ahead
        if ready is not None:
            main = torch.cuda.current_stream(self.stream.device)
            main.wait_event(ready)  # the step's kernels wait on the device for the copy, the host does not
            for t in (batch.x, batch.y):
                t.record_stream(main)  # memory made on the copy stream, freed only after the step used it
        self._ahead = self._draw()
        return batch

    def _draw(self) -> tuple[dict, Batch, torch.cuda.Event | None]:
        state = self.inner.state_dict()
        if self.stream is None:
            return state, self.inner.next(), None
        with torch.cuda.stream(self.stream):
            batch = self.inner.next()
            ready = torch.cuda.Event()
            ready.record(self.stream)
        return state, batch, ready

    def state_dict(self) -> dict:
        return self._ahead[0] if self._ahead is not None else self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)
        self._ahead = None
