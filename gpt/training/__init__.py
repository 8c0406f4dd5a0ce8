"""Training, the steps below the command line's parse (gpt/apps/train.py), in files named for them:

    claim.py    claim: the checks that need no data, the run directory locked, new / resumed /
                finetune decided once (`claim` -> Claim, with its ResumePoint)
    build.py    build: what a run is made of (Run, Progress), built once (`build_run`); the model on the
                meta device where it is sharded, then wrapped (parallel.py), then its weights
    parallel.py whole, DDP or FSDP2: decided once, applied in one place
    loop.py     train: `Trainer` runs steps, evals, checkpoints, records, clean stops
    step.py     one optimizer step and the non-finite guard
    saving.py   what a checkpoint of the run holds, and when a state is fit to save
    optim.py    parameter groups, AdamW and Muon (torch.optim optimizers), the LR schedule
    finetune.py initial weights, context crop, freezing, LoRA, the chat template's new tokens

`train` does claim, build and train for a settings object, the same for the command line and for
`gpt.train`; a mistake raises TinyGPTError where it is found (the command line prints it once).

    from gpt.config import ...; from gpt.training import train
    summary = train(settings)           # or from the command line: tinygpt train key=value ...
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from gpt.checkpoints import runs
from gpt.config import RunConfig
from gpt.errors import RunRefused, TinyGPTError, one_line, out_of_memory
from gpt.runtime import alarm, devices, distributed
from gpt.runtime.preemption import Preempted, StopRequest
from gpt.tracking import logger
from gpt.tracking.records import record_failure
from gpt.training import claim as claims
from gpt.training.build import Run, build_run
from gpt.training.claim import Claim, preflight
from gpt.training.loop import EvalHook, StepHook, Trainer
from gpt.training.step import train_step

__all__ = ["Claim", "Run", "Trainer", "build_run", "preflight", "train", "train_step"]


def train(
    cfg: RunConfig, on_step: StepHook | None = None, on_eval: EvalHook | None = None, overrides=None, claimed: Claim | None = None
) -> dict:
    """Train per `cfg` (resuming if its run directory holds a checkpoint); returns the run's
    summary (status, best and final val loss, steps, speed: what summary.json holds). Raises
    `Preempted` after a SIGTERM / Ctrl-C stop has saved its checkpoint. `claimed`: the run
    directory, taken by the caller already (`claim`); else it is taken here (on rank 0; a run
    without paths.output_dir gets a new directory under paths.runs_dir/runs). Always releases
    the claim, the process group and, between the jobs of a multirun, the memory. `overrides`:
    what the command line (or gpt.train) passed, recorded in summary.json; None for settings
    built in Python."""
    started = time.time()
    dist = distributed.from_env()
    # A signal during set-up ends as cleanly as one in the loop; under torchrun it is only flagged
    # (a rank that left alone would strand the others), and every rank stops at the loop's first
    # check (gpt.runtime.preemption).
    stop = StopRequest(log=logger.warning if dist.is_main else (lambda *a: None), deferred=dist.enabled)
    stop.__enter__()

    def last_words(reason: str) -> None:  # another process failed and this one is ended (gpt.runtime.alarm)
        if claimed is not None:
            claimed.release()
            _record_failure(cfg, dist, reason, overrides)

    words = alarm.last_words(last_words)
    words.__enter__()
    try:
        distributed.meet(dist)  # before rank 0 alone claims the directory: a failure there reaches the others too
        try:
            if claimed is None and dist.is_main:  # one writer per run directory
                out = cfg.paths.output_dir
                out_dir = Path(out).expanduser() if out else runs.new_run_dir(cfg.paths.runs_dir)
                cfg = replace(cfg, paths=replace(cfg.paths, output_dir=str(out_dir)))
                claimed = claims.claim(cfg, out_dir, log=logger.warning)
            run = build_run(cfg, claimed, None if overrides is None else list(overrides))
        except RunRefused:  # another process holds the run directory: nothing of its may be touched
            raise
        except Exception as e:  # recorded, so that a sweep lists the run (never over a run's own record)
            refusal = e if isinstance(e, TinyGPTError) else out_of_memory(e)
            if refusal is None:
                raise
            _record_failure(cfg, dist, str(refusal), overrides)
            raise RunRefused(str(refusal)) from None
        return Trainer(run, overrides or (), started).fit(on_step, on_eval, stop=stop)
    except Preempted:  # every rank stopped at one step: nothing to tell the others
        raise
    except BaseException as e:
        if alarm.peer_gone(e):  # another process failed first: its reason is the run's (gpt.runtime.alarm)
            told = alarm.news(wait_s=alarm.GRACE_S)
            if told is not None:
                _record_failure(cfg, dist, told, overrides, replaces=alarm.cut_short(e))  # what the trainer recorded
        else:  # the other processes stop now instead of waiting for this one
            alarm.announce(one_line(out_of_memory(e) or e))
        raise
    finally:
        words.__exit__(None, None, None)
        stop.__exit__(None, None, None)
        if claimed is not None:
            claimed.release()
        distributed.shutdown()
        # The next job of a multirun (a sweep, a scaling study) compiles its own model afresh:
        # left in place, dynamo's guards on this one's modules and settings make each job a
        # recompile, and past torch._dynamo.config.recompile_limit (8) the rest run eager, silently.
        if "torch._dynamo" in sys.modules:  # (importing it only to reset it would cost a second)
            torch.compiler.reset()
        devices.free_memory()


def _record_failure(cfg: RunConfig, dist: distributed.Dist, reason: str, overrides, replaces: str | None = None) -> None:
    if cfg.paths.output_dir and dist.is_main:
        record_failure(Path(cfg.paths.output_dir), reason, replaces=replaces, overrides=list(overrides or ()))
