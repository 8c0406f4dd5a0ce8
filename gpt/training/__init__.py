"""Training: `build_run` (gpt.training.setup) builds everything once, `Trainer` (gpt.training.loop)
runs the loop, and `train` does both for a settings object.

    from gpt.config import ...; from gpt.training import train
    summary = train(settings)           # or from the command line: tinygpt train key=value ...
"""

from __future__ import annotations

import time
from pathlib import Path

from gpt.config import RunConfig
from gpt.errors import RunRefused, TinyGPTError, out_of_memory
from gpt.runtime import devices, distributed
from gpt.runtime.preemption import StopRequest
from gpt.runtime.runlock import RunLock
from gpt.tracking import logger, record_failure
from gpt.training.loop import EvalHook, StepHook, Trainer
from gpt.training.setup import Run, build_run
from gpt.training.step import train_step

__all__ = ["Run", "Trainer", "build_run", "train", "train_step"]


def train(
    cfg: RunConfig, on_step: StepHook | None = None, on_eval: EvalHook | None = None, overrides=(), resume_point=None
) -> dict:
    """Train per `cfg` (resuming if its run directory holds a checkpoint); returns the run's
    summary (status, best and final val loss, steps, speed: what summary.json holds). Raises
    `Preempted` after a SIGTERM / Ctrl-C stop has saved its checkpoint. Always releases the
    process group and, between the jobs of a multirun, the memory. `resume_point`: where the run
    continues from, when the caller found it already (gpt.checkpoints.loading.resume_point)."""
    started = time.time()
    lock, stop = None, None
    try:
        if cfg.paths.output_dir and distributed.from_env().is_main:  # one writer per run directory
            lock = RunLock(Path(cfg.paths.output_dir).expanduser(), log=logger.warning)
            try:
                lock.acquire()
            except TinyGPTError as e:
                raise RunRefused(str(e)) from None
        # A signal during set-up ends as cleanly as one in the loop; under torchrun it is only
        # flagged (a rank that left alone would strand the others), and every rank stops at the
        # loop's first check (gpt.runtime.preemption).
        dist = distributed.from_env()
        stop = StopRequest(log=logger.warning if dist.is_main else (lambda *a: None), deferred=dist.enabled)
        stop.__enter__()
        try:
            run = build_run(cfg, resume_point)
        except Exception as e:  # recorded, so that a sweep lists the run (never over a run's own record)
            refusal = e if isinstance(e, TinyGPTError) else out_of_memory(e)
            if refusal is None:
                raise
            if cfg.paths.output_dir and distributed.from_env().is_main:
                record_failure(Path(cfg.paths.output_dir), str(refusal), overrides=list(overrides))
            raise RunRefused(str(refusal)) from None
        return Trainer(run, overrides, started).fit(on_step, on_eval, stop=stop)
    finally:
        if stop is not None:
            stop.__exit__(None, None, None)
        if lock is not None:
            lock.release()
        distributed.shutdown()
        devices.free_memory()
