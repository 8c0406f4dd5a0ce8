"""Random training windows from a token array."""

from __future__ import annotations

import numpy as np
import torch


class RandomWindows:
    """Batches of `batch_size` random windows of block_size + 1 tokens; x is the first
    block_size tokens of each window and y the same shifted by one (next-token targets).

    Positions come from a seeded torch.Generator, so the batch sequence is reproducible.
    """

    def __init__(self, tokens: np.ndarray, block_size: int, batch_size: int, device: torch.device, seed: int):
        if len(tokens) < block_size + 1:
            raise ValueError(f"{len(tokens)} tokens cannot fill one window of {block_size + 1}")
        self.tokens = tokens
        self.block_size = block_size
        self.batch_size = batch_size
        self.device = device
        self.generator = torch.Generator().manual_seed(seed)
        self._offsets = np.arange(block_size + 1)
        # Pinned host memory lets the copy to the GPU overlap with compute.
        self._pin = device.type == "cuda"

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(len(self.tokens) - self.block_size, (self.batch_size,), generator=self.generator)
        windows = torch.from_numpy(self.tokens[starts.numpy()[:, None] + self._offsets].astype(np.int64))
        if self._pin:
            windows = windows.pin_memory()
        windows = windows.to(self.device, non_blocking=True)
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
