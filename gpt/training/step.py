"""One optimizer step: forward/backward over the micro-batches, clipping, and the guard that
skips an update whose loss or gradients are not finite (and stops a run that keeps diverging).

Nothing here reads a value back from the device: on a GPU the host queues the step and moves on
to build the next batches while the device computes. Whether a step was skipped is decided on
the device (`Optimizers.step_unless`) and read by the trainer every few steps (`Guard`)."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from gpt.checkpoints import runs
from gpt.errors import TinyGPTError
from gpt.runtime import distributed
from gpt.tracking import logger
from gpt.training.build import Run
from gpt.training.parallel import whole


@dataclass
class StepResult:
    # the loss per trained token (a device scalar); under DDP with conversations, this rank's share
    # scaled so that the mean over ranks (distributed.mean) is the step's mean per trained token
    loss: torch.Tensor
    norm: torch.Tensor  # gradient norm before clipping (a device scalar)
    tokens: int  # real (non-padding) input tokens this rank trained on


def train_step(model, batches, optimizer, scaler, rt, accum_steps: int, grad_clip: float, dist=None) -> StepResult:
    """Forward/backward over `accum_steps` micro-batches, then clip; the optimizer is not stepped
    (the caller guards that). Every trained token weighs the same in the step's gradient, across
    micro-batches and ranks: conversations padded to their longest member train different numbers
    of tokens per micro-batch, and a mean per micro-batch would let a short reply's tokens count
    more than a long one's."""
    # All of the step's micro-batches first: their trained-token counts weight the losses, and on
    # a GPU they are built while the device still runs the previous step.
    micro = [batches.next() for _ in range(accum_steps)]
    weights = _token_weights([b.trained for b in micro], accum_steps, rt.device, dist)
    total = torch.zeros((), device=rt.device)
    for i, batch in enumerate(micro):
        # Under DDP, gradients are all-reduced on the last micro-batch only. Under FSDP2 they are
        # reduce-scattered after every one: held back, they would be whole on every process (4
        # bytes a parameter, what sharding is for saving), so accumulation costs communication.
        last = i == accum_steps - 1
        with contextlib.nullcontext() if last or not isinstance(model, DDP) else model.no_sync():
            with rt.autocast():  # the forward pass only; backward runs in the dtypes it recorded
                _, loss = model(batch.x, batch.y)
            if batch.trained == 0:  # nothing to learn from (a mean over no tokens is NaN): a zero gradient
                loss = loss.nan_to_num(0.0)
            scaler.scale(loss * weights[i]).backward()
        total += loss.detach() * weights[i]
    scaler.unscale_(optimizer)  # clip and measure true gradients, not loss-scaled ones
    params = [p for group in optimizer.param_groups for p in group["params"]]
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else math.inf)
    norm = whole(norm)  # sharded: the norm over every process's shards, reduced when read whole
    return StepResult(total, norm, sum(b.tokens for b in micro))


def _token_weights(trained: list[int | None], accum_steps: int, device, dist) -> list:
    """Each micro-batch's weight in the step: 1/accum_steps for text (every window trains all its
    tokens), else its share of the trained tokens of the whole step on every rank, times the
    ranks (DDP averages the ranks' gradients). The step's total is summed on the device: no sync."""
    if trained[0] is None:
        return [1.0 / accum_steps] * accum_steps
    local = torch.tensor(float(sum(trained)), device=device)
    world = dist.world_size if dist is not None and dist.enabled else 1
    if world > 1:
        torch.distributed.all_reduce(local, op=torch.distributed.ReduceOp.SUM)
    return [n * world / local.clamp(min=1.0) for n in trained]


@dataclass
class Guard:
    """The non-finite guard's books. Each step's verdict stays on the device until `settle` reads
    them all at once (every log interval, before an eval or a save, at a stop): the skip itself
    happened on the device at the step, so reading late changes what is logged when, not what is
    trained."""

    pending: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (step, 1.0 if skipped)

    def settle(self, run: Run, max_bad_steps: int, evaluated: bool = False) -> None:
        """Count the skipped steps since the last read, warn, and stop a diverged run.
        `evaluated`: whether this start has run an eval (its message then says why no checkpoint)."""
        if not self.pending:
            return
        steps = [s for s, _ in self.pending]
        verdicts = torch.stack([flag for _, flag in self.pending]).tolist()  # the one host read
        self.pending.clear()
        p = run.progress
        for step, bad in zip(steps, verdicts):
            if not bad:
                p.bad_in_a_row = 0
                continue
            p.bad_in_a_row += 1
            p.bad_total += 1
            logger.warning(f"step {step}: non-finite loss or gradient, update skipped ({p.bad_in_a_row} in a row)")
            if p.bad_in_a_row >= max_bad_steps:
                last = runs.latest(run.out_dir)
                # step 0's eval saves no checkpoint: the first is saved at the next eval
                where = (
                    f"the last good checkpoint is {last}"
                    if last is not None
                    else "no checkpoint was saved yet (the eval at step 0 saves none)"
                    if evaluated
                    else "no checkpoint was saved yet (no eval reached yet)"
                )
                if last is None and run.resumed_from is not None:
                    where += f"; it resumed from {run.resumed_from}"  # another run's: the one to resume from again
                raise TinyGPTError(
                    f"training diverged: {p.bad_in_a_row} non-finite steps in a row at step {step}; "
                    f"{where}; lower optim.lr or train.grad_clip"
                )


def apply_or_skip(run: Run, result: StepResult, guard: Guard) -> None:
    """Step the optimizer, unless the loss or gradients are not finite: then the update is skipped
    (the data moves on), decided on the device; `guard` settles the books later."""
    step = run.progress.step + 1
    if run.scaler.is_enabled():
        # fp16 loss scaling: overflowing gradients are routine and the scaler skips those steps
        # itself (reading its own flag); the guard watches the loss.
        bad = torch.isfinite(result.loss).logical_not().float()
        bad = distributed.max_tensor(bad, run.dist)
        if not bool(bad):
            run.scaler.step(run.optimizer)
        run.scaler.update()
    else:
        # (the norm of offloaded gradients is computed in host memory: brought beside the loss)
        norm = result.norm.float().to(result.loss.device)
        bad = torch.isfinite(torch.stack([result.loss.float(), norm])).all().logical_not().float()
        bad = distributed.max_tensor(bad, run.dist)  # the same verdict on every rank, still on the device
        if run.rt.device.type == "cpu" and not run.parallel.sharded:
            # On a CPU a read is no sync (nothing runs ahead of the host), and skipping by a branch
            # spares step_unless's masking (~1% of the quickstart's step): the same result.
            # (Sharded, the masking runs, on a CPU too: what a GPU runs is what the tests see.)
            if not bool(bad):
                run.optimizer.step()
        else:
            run.optimizer.step_unless(bad)
    run.optimizer.zero_grad(set_to_none=True)
    guard.pending.append((step, bad.detach()))
