"""One optimizer step: forward/backward over the micro-batches, clipping, and the guard that
skips an update whose loss or gradients are not finite (and stops a run that keeps diverging)."""

from __future__ import annotations

import contextlib
import math

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from gpt.checkpoints import runs
from gpt.errors import TinyGPTError
from gpt.runtime import distributed
from gpt.tracking import logger
from gpt.training.state import Run


def train_step(model, batches, optimizer, scaler, rt, accum_steps: int, grad_clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward/backward over `accum_steps` micro-batches, then clip. Returns (mean loss, grad
    norm) as tensors, without stepping the optimizer: the caller first checks they are finite.
    Reading them forces a host sync, so the caller decides when."""
    total = torch.zeros((), device=rt.device)
    for micro in range(accum_steps):
        x, y = batches.next()
        # Under DDP, gradients are all-reduced on the last micro-batch only.
        sync = micro == accum_steps - 1 or not isinstance(model, DDP)
        with contextlib.nullcontext() if sync else model.no_sync():
            with rt.autocast():  # the forward pass only; backward runs in the dtypes it recorded
                _, loss = model(x, y)
            # Each micro-batch contributes 1/accum_steps, so the summed gradient is the mean
            # over the whole batch, as if it had been one forward pass.
            scaler.scale(loss / accum_steps).backward()
        total += loss.detach()
    scaler.unscale_(optimizer)  # clip and measure true gradients, not loss-scaled ones
    params = [p for group in optimizer.param_groups for p in group["params"]]
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else math.inf)
    return total / accum_steps, norm


def apply_or_skip(run: Run, loss: torch.Tensor, norm: torch.Tensor, max_bad_steps: int) -> None:
    """Step the optimizer, unless the loss or gradients are not finite: then skip the update
    (the data moves on), and stop after `max_bad_steps` such steps in a row."""
    p = run.progress
    # With fp16 loss scaling, overflowing gradients are routine (the scaler skips those steps).
    watched = loss if run.scaler.is_enabled() else torch.stack([loss.float(), norm.float()])
    bad = not bool(torch.isfinite(watched).all())  # the one host sync of the step
    if distributed.any_true(bad, run.dist, run.rt.device):
        run.optimizer.zero_grad(set_to_none=True)
        run.scaler.update()
        p.bad_in_a_row += 1
        p.bad_total += 1
        logger.warning(f"step {p.step + 1}: non-finite loss or gradient, update skipped ({p.bad_in_a_row} in a row)")
        if p.bad_in_a_row >= max_bad_steps:
            last = runs.latest(run.out_dir) or "none (no eval reached yet)"
            raise TinyGPTError(
                f"training diverged: {p.bad_in_a_row} non-finite steps in a row at step {p.step + 1}; "
                f"the last good checkpoint is {last}; lower optim.lr or train.grad_clip"
            )
        return
    p.bad_in_a_row = 0
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.optimizer.zero_grad(set_to_none=True)
