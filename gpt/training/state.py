"""What a training run is made of once it is built (`Run`), and where it stands (`Progress`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from gpt.checkpoints import runs
from gpt.config import RunConfig
from gpt.data import Dataset
from gpt.runtime import devices, distributed
from gpt.training.schedule import CosineSchedule

EVAL_PASS_TOKENS = 4096  # the most tokens an eval's forward pass takes by concatenating batches (Run.eval_group)


@dataclass
class Progress:
    """Where training stands: saved in every step checkpoint."""

    step: int = 0
    best_val: float = math.inf
    bad_total: int = 0  # non-finite steps skipped so far
    bad_in_a_row: int = 0
    last_eval: dict[str, float] = field(default_factory=dict)  # {"train", "val"} of the newest eval
    elapsed_s: float = 0.0  # wall-clock seconds the run took to reach the state saved or restored last
    best_elapsed_s: float | None = None  # elapsed seconds when best_val was reached
    # training tokens so far, over every resume (a resume may run another number of processes,
    # so not step x this run's tokens per step); None: a checkpoint from before they were counted
    tokens_seen: int | None = 0


@dataclass(kw_only=True)
class Run:
    """Everything a run needs, built once by gpt.training.setup.build_run."""

    cfg: RunConfig  # the settings as resolved for this run (horizon, schedule, finetuning, paths)
    dist: distributed.Dist
    rt: devices.Runtime
    out_dir: Path
    data: Dataset  # text or conversations, behind one interface
    model: nn.Module  # the plain model: what is saved, sampled from and measured
    model_config: Any  # GPTConfig or RNNConfig
    lora: dict | None  # {"rank", "alpha"} while LoRA adapters are trained
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    schedule: CosineSchedule
    batches: Any  # this rank's training batches (Dataset.batches)
    step_model: nn.Module  # compiled and/or DDP-wrapped: the training forward
    eval_model: nn.Module  # compiled only: evaluation needs no gradient sync
    log: Callable[[str], None]  # rank 0 prints; the others are quiet
    progress: Progress = field(default_factory=Progress)  # restored when resuming
    tasks: dict[str, list] = field(default_factory=dict)  # train.eval_tasks' items (gpt.evals.tasks.Example), rank 0
    resumed_from: Path | None = None  # the checkpoint this start continued from (set-up's choice)

    @property
    def ckpt_dir(self) -> Path:
        return self.out_dir / runs.CKPT_DIR

    def batches_for(self, split: str, batch_size: int, seed: int):
        """This rank's batches of a split, as training draws them."""
        return self.data.batches(
            split, self.model_config.block_size, batch_size, self.rt.device, seed, self.dist.rank, self.dist.world_size
        )

    @property
    def eval_group(self) -> int:
        """How many of an eval's batches go through one forward pass. Small batches of text (the
        quickstart's: 12 x 64 tokens) are short passes that each pay the model's per-pass overhead;
        concatenated up to EVAL_PASS_TOKENS tokens, they take less time (the quickstart's eval,
        its 50 batches a split in 10 passes of 5: 527 ms against 664, medians of 8 on this 2-core
        CPU; passes of 10 batches took 553) and give the same mean (batches of one shape, every
        token weighing the same). A divisor of train.eval_iters: every pass one shape, one graph
        where compiled. Conversations (of other widths, and trained ids) and batches of that size
        already: one at a time."""
        ts = self.cfg.train
        fits = EVAL_PASS_TOKENS // (ts.batch_size * self.model_config.block_size)
        if self.data.kind != "text" or fits < 2:
            return 1
        return max(d for d in range(1, min(fits, ts.eval_iters) + 1) if ts.eval_iters % d == 0)

    @property
    def tokens_per_step(self) -> int:
        ts = self.cfg.train
        return ts.batch_size * self.model_config.block_size * ts.grad_accum_steps * self.dist.world_size


def quiet(*args, **kwargs) -> None:
    """A log for ranks other than 0."""
